"""Models on the GPU: cinders uncaptured, cinders captured (cn.capture) and PyTorch eager, side by
side in one run, on the same weights.

One JSON line per (model, stack):
    {"bench": "gpu_models", "model", "stack", "uncaptured_ms", "captured_ms", "torch_ms",
     "captured_vs_torch", "uncaptured_vs_torch", "capture_speedup", "max_abs_diff", "device",
     "torch_device"}
Latency is one call plus reading its result back to the host (logits, or a training step's
loss), median of --repeat calls after warm-up (which includes the capture's first three calls).
Models: MNIST CNN inference at batch 1 and 256; a TransformerEncoderLayer (d=256, 4 heads, ff
1024, batch 8 x 128 tokens, eval); a conv stack 3->32->64->128 (3x3, ReLU) on 32x3x64x64; the
MNIST CNN training step (batch 64, cross-entropy, SGD with momentum). Stacks: "wgpu" =
cn.Wgpu(), "fusion-wgpu" = cn.Fusion(cn.Wgpu()) (training: under cn.Autodiff). The training
step also runs each stack with cn.Wgpu's conv backward kernels undeclared ("...-composed":
Autodiff's composed unfold2d/fold2d + matmul gradients), just before the same stack with them;
the kernels' row then holds "uncaptured_vs_composed" and "captured_vs_composed" (< 1: faster).

    python benchmarks/gpu_models.py                 # a real GPU
    python benchmarks/gpu_models.py --small         # few repeats, small shapes: lavapipe
"""

import argparse
import json
import statistics
import time

import numpy as np

import cinders as cn
import cinders.nn.functional as F
from cinders import nn
from cinders.models.mnist import MnistCNN
from cinders.wgpu import Wgpu
from timing import median_ms



def conv_stack(backend=None):
    return nn.Sequential(nn.Conv2d(3, 32, 3, padding=1, backend=backend), nn.ReLU(),
                         nn.Conv2d(32, 64, 3, padding=1, backend=backend), nn.ReLU(),
                         nn.Conv2d(64, 128, 3, padding=1, backend=backend), nn.ReLU())


def torch_twin(name, model, torch, device):
    """The same architecture in torch with the cinders model's weights (None: no torch)."""
    tnn = torch.nn
    if name.startswith("mnist"):
        net = tnn.Sequential(
            tnn.Conv2d(1, 16, 3, padding=1), tnn.ReLU(), tnn.MaxPool2d(2),
            tnn.Conv2d(16, 32, 3, padding=1), tnn.ReLU(), tnn.MaxPool2d(2),
            tnn.Flatten(), tnn.Linear(32 * 7 * 7, 128), tnn.ReLU(), tnn.Linear(128, 10))
        prefix = "layers."
    elif name == "transformer_layer":
        net = tnn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True)
        prefix = ""
    else:
        net = tnn.Sequential(tnn.Conv2d(3, 32, 3, padding=1), tnn.ReLU(),
                             tnn.Conv2d(32, 64, 3, padding=1), tnn.ReLU(),
                             tnn.Conv2d(64, 128, 3, padding=1), tnn.ReLU())
        prefix = "layers." if any(k.startswith("layers.") for k in model.state_dict()) else ""
    state = {k[len(prefix):]: torch.from_numpy(np.asarray(v.numpy(), dtype=np.float32))
             for k, v in model.state_dict().items()}
    net.load_state_dict(state)
    return net.to(device)


def inference_rows(name, make_model, shape, stacks, repeat, torch, device):
    rng = np.random.default_rng(0)
    x_np = rng.random(shape, dtype=np.float32)
    net = None
    for stack, make_backend in stacks:
        backend = make_backend()
        cn.manual_seed(0)
        model = make_model().to(backend).eval()
        fast = cn.capture(model)
        x = cn.tensor(x_np, backend=backend)
        uncaptured = median_ms(lambda: model(x).numpy(), repeat, warm=4)
        captured = median_ms(lambda: fast(x).numpy(), repeat, warm=4)
        ours = fast(x).numpy()
        theirs = diff = None
        if torch is not None:
            if net is None:
                net = torch_twin(name, model, torch, device).eval()
            xt = torch.from_numpy(x_np).to(device)

            def run_torch():
                with torch.no_grad():
                    return net(xt).cpu().numpy()
            theirs = median_ms(run_torch, repeat, warm=4)
            diff = float(np.max(np.abs(ours - run_torch())))
        emit(name, stack, uncaptured, captured, theirs, diff, backend, device,
             _launches(backend, fast, x))


def _launches(backend, fast, *args):
    with cn.profile(backend) as p:
        out = fast(*args)
        out = out[-1] if isinstance(out, tuple) else out
        out.numpy()
    return {"kernels_per_replay": p.kernel_launches, "submits_per_replay": p.submits,
            "peak_bytes": backend.memory_stats()["peak_bytes"], **_breakdown(backend, fast, *args)}


def _breakdown(backend, fast, *args, repeat=20):
    """Where a captured call's time goes: the replay call itself (Python, encoding, submit),
    the GPU work after it, and reading the result back (median ms of each)."""
    call, gpu, read = [], [], []
    for _ in range(repeat):
        backend.synchronize()
        t0 = time.perf_counter()
        out = fast(*args)
        t1 = time.perf_counter()
        backend.synchronize()
        t2 = time.perf_counter()
        (out[-1] if isinstance(out, tuple) else out).numpy()
        t3 = time.perf_counter()
        call.append(t1 - t0), gpu.append(t2 - t1), read.append(t3 - t2)
    ms = lambda v: round(statistics.median(v) * 1e3, 4)  # noqa: E731
    return {"replay_call_ms": ms(call), "gpu_wait_ms": ms(gpu), "readback_ms": ms(read)}


class ComposedConvBackward(Wgpu):
    """cn.Wgpu() without its conv backward kernels declared: cn.Autodiff composes conv2d's
    gradients from unfold2d, fold2d and matmul (the reference path), for the side-by-side row."""
    conv2d_backward_kernels = False


def training_stacks(stacks):
    """Each stack preceded by its twin on ComposedConvBackward ("<stack>-composed")."""
    composed = {"wgpu": ComposedConvBackward,
                "fusion-wgpu": lambda: cn.Fusion(ComposedConvBackward())}
    return [row for stack in stacks for row in ((stack[0] + "-composed", composed[stack[0]]), stack)]


def training_rows(batch, stacks, repeat, torch, device):
    rng = np.random.default_rng(0)
    composed = {}
    x_np = rng.random((batch, 1, 28, 28), dtype=np.float32)
    y_np = rng.integers(0, 10, batch).astype(np.int32)
    for stack, make_backend in stacks:
        backend = cn.Autodiff(make_backend())
        cn.manual_seed(0)
        model = MnistCNN().to(backend)
        opt = cn.optim.SGD(lr=0.01, momentum=0.9)
        x, y = cn.tensor(x_np, backend=backend), cn.tensor(y_np, backend=backend)

        def step(x, y):
            loss = F.cross_entropy(model(x), y)
            opt.step(model, loss.backward())
            return loss
        fast = cn.capture(step)
        uncaptured = median_ms(lambda: step(x, y).numpy(), repeat, warm=4)
        captured = median_ms(lambda: fast(x, y).numpy(), repeat, warm=4)
        theirs = None
        if torch is not None:
            net = torch_twin("mnist", model, torch, device).train()
            topt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
            xt, yt = torch.from_numpy(x_np).to(device), torch.from_numpy(y_np).long().to(device)

            def run_torch():
                topt.zero_grad()
                loss = torch.nn.functional.cross_entropy(net(xt), yt)
                loss.backward()
                topt.step()
                return loss.detach().cpu().numpy()
            theirs = median_ms(run_torch, repeat, warm=4)
        extra = _launches(backend, fast, x, y)
        if stack.endswith("-composed"):
            composed[stack[:-len("-composed")]] = (uncaptured, captured)
        elif stack in composed:
            reference = composed[stack]
            extra.update(uncaptured_vs_composed=round(uncaptured / reference[0], 3),
                         captured_vs_composed=round(captured / reference[1], 3))
        emit("mnist_cnn_train_step_b%d" % batch, "autodiff-" + stack, uncaptured, captured, theirs,
             None, backend, device, extra)


def emit(model, stack, uncaptured, captured, theirs, diff, backend, device, extra):
    row = {"bench": "gpu_models", "model": model, "stack": stack,
           "uncaptured_ms": round(uncaptured, 4), "captured_ms": round(captured, 4),
           "torch_ms": round(theirs, 4) if theirs else None,
           "captured_vs_torch": round(captured / theirs, 3) if theirs else None,
           "uncaptured_vs_torch": round(uncaptured / theirs, 3) if theirs else None,
           "capture_speedup": round(uncaptured / captured, 3), "max_abs_diff": diff,
           "device": _base(backend).device.name,
           "torch_device": device}
    row.update(extra)
    print(json.dumps(row), flush=True)


def _base(backend):
    while backend.inner is not None:
        backend = backend.inner
    return backend


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="few repeats, small shapes (lavapipe)")
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--only", nargs="*", default=None,
                        help="models: mnist, transformer, conv, train")
    args = parser.parse_args()
    repeat = 3 if args.small else args.repeat
    only = set(args.only or ["mnist", "transformer", "conv", "train"])
    try:
        import torch
        device = "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:
        torch, device = None, "none"
    stacks = [("wgpu", Wgpu), ("fusion-wgpu", lambda: cn.Fusion(Wgpu()))]
    if "mnist" in only:
        for batch in ((1, 8) if args.small else (1, 256)):
            inference_rows("mnist_cnn_b%d" % batch, MnistCNN, (batch, 1, 28, 28), stacks, repeat,
                           torch, device)
    if "transformer" in only:
        tokens = 16 if args.small else 128
        inference_rows("transformer_layer", lambda: nn.TransformerEncoderLayer(
            256, 4, 1024, dropout=0.0, batch_first=True), (8, tokens, 256), stacks, repeat,
            torch, device)
    if "conv" in only:
        shape = (2, 3, 16, 16) if args.small else (32, 3, 64, 64)
        inference_rows("conv_stack", conv_stack, shape, stacks, repeat, torch, device)
    if "train" in only:
        training_rows(8 if args.small else 64, training_stacks(stacks), repeat, torch, device)


if __name__ == "__main__":
    main()
