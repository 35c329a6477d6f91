"""Data-parallel training throughput: one device against two (or more), same global batch, same
model and data, one run. JSON lines (and --out FILE).

    .venv/bin/python benchmarks/data_parallel.py [--backend numpy|python|wgpu]
        [--models cnn,transformer] [--batch 128] [--steps 20] [--adapters 0,1] [--devices 2]
        [--out results.jsonl]
    models: cnn, mlp (MNIST-sized images), transformer (a 2-layer encoder on 32-token sequences)

--backend wgpu trains on cn.Autodiff(cn.Wgpu(adapter=A)) per adapter of --adapters (on a
machine with two GPUs: `--adapters 0,1`; the indices are wgpu's enumerate_adapters order, or a
substring of an adapter's description; an adapter named twice gets a second device of its own,
cn.Wgpu(adapter=A, instance=1): `--adapters 0,0` on one GPU); CPU backends use --devices
copies of the backend. --remote puts each device behind a `cinders serve-backend` child
process on 127.0.0.1 (its --backend; with wgpu, one server per adapter of --adapters) and the
model on the first: weights and gradients then go from server to server, and the rows add
the bytes the client received per step (the losses only).
Rows, per model: per configuration (devices=1, devices=N) samples_per_s (median step over
--steps after two warm-up steps), the loss after each step (the loss curve) and the devices;
then a ratio row (N devices / 1) and the largest loss difference between the two runs (they
train the same model on the same batches, so it is float rounding). Data: seeded synthetic
28x28 images (or tokens) whose labels are learnable (make_batches), so no files are needed.
"""

import argparse
import json
import secrets
import statistics
import time

import numpy as np

import cinders as cn
from cinders.models.mnist import MnistCNN, MnistMLP
from cinders.nn import functional as F
from cinders.train.data_parallel import DataParallel


class TinyTransformer(cn.nn.Module):
    """A small transformer classifier: token embedding, two encoder layers (d 64, 4 heads, no
    dropout: the runs must match), mean over the sequence, a linear head."""

    def __init__(self, vocab=64, d_model=64, classes=10):
        super().__init__()
        self.embed = cn.nn.Embedding(vocab, d_model)
        self.layers = [cn.nn.TransformerEncoderLayer(d_model, 4, 128, dropout=0.0, batch_first=True)
                       for _ in range(2)]
        self.head = cn.nn.Linear(d_model, classes)

    def forward(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(x.mean(axis=1))


MODELS = {"cnn": MnistCNN, "mlp": MnistMLP, "transformer": TinyTransformer}


def make_batches(model, args):
    """Seeded data a model can learn, so the loss curve falls: for the MNIST models noise with a
    bright 7x7 patch whose place is the label; for the transformer 32 tokens, the first 16 of
    them equal to the label mod 10."""
    rng = np.random.default_rng(0)
    batches = []
    for _ in range(args.steps + 2):
        y = rng.integers(0, 10, args.batch).astype(np.int32)
        if model == "transformer":
            x = rng.integers(0, 64, (args.batch, 32)).astype(np.int32)
            x[:, :16] = y[:, None] + 10 * rng.integers(0, 6, (args.batch, 16))
        else:
            x = rng.random((args.batch, 1, 28, 28), dtype=np.float32) * 0.3
            for i, label in enumerate(y):
                r, c = (label // 4) * 9, (label % 4) * 7
                x[i, 0, r:r + 7, c:c + 7] = 1.0
        batches.append((x, y))
    return batches


def emit(row, out):
    line = json.dumps(row, sort_keys=True)
    print(line, flush=True)
    if out:
        with open(out, "a") as f:
            f.write(line + "\n")


def device_list(args, servers):
    if args.remote:
        from remote import serve  # benchmarks/remote.py: the server child, with this environment
        token = secrets.token_hex(16)
        options = ([["--adapter", a] for a in args.adapters.split(",")] if args.backend == "wgpu"
                   else [[]] * args.devices)
        for opts in options:
            servers.append(serve(args.backend, token, opts))
        return [cn.Autodiff(cn.Remote(url, token=token)) for _, url in servers]
    if args.backend == "wgpu":
        from cinders.wgpu import Wgpu
        adapters = [int(a) if a.isdigit() else a for a in args.adapters.split(",")]
        return [cn.Autodiff(Wgpu(adapter=a, instance=adapters[:k].count(a))) for k, a in enumerate(adapters)]
    make = {"numpy": cn.NumPy, "python": cn.Python}[args.backend]
    return [cn.Autodiff(make()) for _ in range(args.devices)]


def received(devices):
    """Bytes the client has received from the servers of the Remote devices (0 for local ones)."""
    return sum(d.inner.bytes_received for d in devices if d.inner.sends_to_peers)


def run(name, devices, args, batches):
    """(samples per second, losses, bytes received per timed step) of training `name`."""
    home = devices[0]
    cn.manual_seed(0)
    model = MODELS[name]().to(home)
    opt = cn.optim.Adam(1e-3)
    step = DataParallel(model, devices)
    times, losses, before = [], [], 0
    for i, (x, y) in enumerate(batches):
        x, y = cn.tensor(x, backend=home), cn.tensor(y, backend=home)
        if i == 2:
            before = received(devices)
        t0 = time.perf_counter()
        model, _, loss = step.step(model, opt, F.cross_entropy, x, y)
        losses.append(loss.item())
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return args.batch / statistics.median(times), losses, (received(devices) - before) / len(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="numpy", choices=["numpy", "python", "wgpu"])
    parser.add_argument("--models", default="cnn,transformer",
                        help="comma-separated, of: %s" % ", ".join(sorted(MODELS)))
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--devices", type=int, default=2, help="copies of a CPU backend")
    parser.add_argument("--adapters", default="0,1", help="wgpu adapters, comma-separated")
    parser.add_argument("--remote", action="store_true",
                        help="each device behind a serve-backend child on 127.0.0.1, the model on the first")
    parser.add_argument("--out")
    args = parser.parse_args()
    models = args.models.split(",")
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        parser.error("--models: unknown %s (choose from %s)" % (", ".join(unknown), ", ".join(sorted(MODELS))))
    servers = []
    try:
        devices = device_list(args, servers)
        for name in models:
            batches = make_batches(name, args)
            results = {}
            for count in (1, len(devices)):
                rate, losses, bytes_in = run(name, devices[:count], args, batches)
                results[count] = rate, losses
                row = {"bench": "data_parallel", "backend": args.backend, "model": name, "batch": args.batch,
                       "devices": count, "device_list": [repr(d) for d in devices[:count]],
                       "samples_per_s": round(rate, 1), "losses": [round(v, 5) for v in losses]}
                if args.remote:
                    row["client_bytes_received_per_step"] = round(bytes_in)
                emit(row, args.out)
            (one, l1), (many, ln) = results[1], results[len(devices)]
            emit({"bench": "data_parallel", "backend": args.backend, "model": name, "devices": len(devices),
                  "remote": args.remote, "ratio_throughput": round(many / one, 2),
                  "max_loss_difference": float(max(abs(a - b) for a, b in zip(l1, ln)))}, args.out)
    finally:
        for child, _ in servers:
            child.terminate()
            child.wait(10)


if __name__ == "__main__":
    main()
