"""One MNIST training step (forward + backward + Adam) at batch 64: cn.Autodiff(cn.NumPy())
against PyTorch CPU eager, same weights, same real digits, same thread count, side by side.

Prints one JSON line per model:
    {"bench": "train_step", "model", "batch", "threads", "cinders_ms", "torch_ms", "ratio",
     "cinders_forward_ms", "cinders_backward_ms", "cinders_optimizer_ms", "max_param_diff"}
ratio = cinders_ms / torch_ms (goal: <= 1.0 MLP, <= 2.0 CNN). Timings are best-of-R means over
blocks of steps, cinders and torch blocks interleaved so both see the same machine load.
max_param_diff: largest difference between the two frameworks' parameters after one identical
step from identical weights (they must compute the same thing).
With --profile, also one JSON line per hot function of the cinders step (cProfile, own time).

With --wasm, the CNN's step on cn.Autodiff(cn.Wasm()) instead, once per engine (native, wasmtime):
conv2d's gradients composed (unfold2d/fold2d + matmul, cn.Wasm() with conv2d_backward_kernels
off) against its backward kernels (runtime.h), blocks interleaved, one JSON line per engine:
    {"bench": "train_step_wasm", "engine", "batch", "composed_ms", "direct_ms", "ratio",
     "composed_backward_ms", "direct_backward_ms", "backward_ratio", "max_grad_diff", "load"}
ratio = composed_ms / direct_ms (> 1: the kernels are faster); max_grad_diff: the largest
difference between the two paths' gradients from the same weights; load: the 1-minute load average.
Then one line per convolution of the CNN, its forward and backward alone, the same two ways:
    {"bench": "train_step_wasm_conv", "engine", "layer", "x", "w", "composed_ms", "direct_ms",
     "ratio", "load"}

    python benchmarks/train_step.py [--threads 1] [--repeat 5] [--steps 20] [--profile] [--wasm]
"""

import argparse
import cProfile
import json
import os
import pstats
import sys
import time


def parse():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1, help="BLAS/torch threads for both (default 1)")
    parser.add_argument("--repeat", type=int, default=5, help="blocks per side; the best counts")
    parser.add_argument("--steps", type=int, default=20, help="steps per block")
    parser.add_argument("--models", default="mlp,cnn")
    parser.add_argument("--profile", action="store_true", help="where the cinders step spends its time")
    parser.add_argument("--wasm", action="store_true",
                        help="the CNN on cn.Wasm(): composed conv backward vs its kernels, per engine")
    return parser.parse_args()


ARGS = parse()
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = str(ARGS.threads)  # before NumPy and torch load their thread pools

import numpy as np  # noqa: E402
import torch  # noqa: E402

import cinders as cn  # noqa: E402
from cinders.data.mnist import MnistDigits  # noqa: E402
from cinders.models.mnist import MnistCNN, MnistMLP  # noqa: E402
from cinders.nn import functional as F  # noqa: E402

torch.set_num_threads(ARGS.threads)
BATCH = 64


def torch_model(name):
    if name == "mlp":
        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 128), torch.nn.ReLU(),
                                   torch.nn.Linear(128, 10))
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(1568, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))


class ComposedConvBackward(cn.Wasm):
    """cn.Wasm() without its conv backward kernels declared: cn.Autodiff composes conv2d's
    gradients from unfold2d, fold2d and matmul (the reference path)."""
    conv2d_backward_kernels = False


class Pair:
    """The same model, weights, optimizer and batch in both frameworks."""

    def __init__(self, name, images, labels, inner=None):
        backend = self.backend = cn.Autodiff(cn.NumPy() if inner is None else inner)
        cn.manual_seed(0)
        self.model = (MnistMLP() if name == "mlp" else MnistCNN()).to(backend)
        self.opt = cn.optim.Adam(1e-3)
        self.tmodel = torch_model(name)
        # torch's Sequential keys ("1.weight") are ours without the "layers." prefix.
        self.tmodel.load_state_dict({k[len("layers."):]: torch.from_numpy(v.numpy().copy())
                                     for k, v in self.model.state_dict().items()})
        self.topt = torch.optim.Adam(self.tmodel.parameters(), 1e-3)
        self.x = cn.tensor(images, backend=backend)
        self.y = cn.tensor(labels, backend=backend)
        self.tx = torch.from_numpy(images.copy())
        self.ty = torch.from_numpy(labels.astype(np.int64))

    def cinders_step(self):
        loss = F.cross_entropy(self.model(self.x), self.y)
        grads = loss.backward()
        self.model = self.opt.step(self.model, grads)

    def torch_step(self):
        self.topt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(self.tmodel(self.tx), self.ty)
        loss.backward()
        self.topt.step()

    def max_param_diff(self):
        theirs = self.tmodel.state_dict()
        return max(float(np.abs(v.numpy() - theirs[k[len("layers."):]].numpy()).max())
                   for k, v in self.model.state_dict().items())

    def phases_ms(self, steps):
        """Mean ms of forward+loss, backward and optimizer step of the cinders step."""
        total = [0.0, 0.0, 0.0]
        for _ in range(steps):
            # (synchronize: a backend that queues kernels, cn.Wasm(), runs them there)
            t0 = time.perf_counter()
            loss = F.cross_entropy(self.model(self.x), self.y)
            self.backend.synchronize()
            t1 = time.perf_counter()
            grads = loss.backward()
            self.backend.synchronize()
            t2 = time.perf_counter()
            self.model = self.opt.step(self.model, grads)
            self.backend.synchronize()
            t3 = time.perf_counter()
            for i, dt in enumerate((t1 - t0, t2 - t1, t3 - t2)):
                total[i] += dt
        return [round(t / steps * 1e3, 3) for t in total]


def block_ms(fn, steps):
    start = time.perf_counter()
    for _ in range(steps):
        fn()
    return (time.perf_counter() - start) / steps * 1e3


def profile(pair, name, steps):
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        pair.cinders_step()
    prof.disable()
    stats = pstats.Stats(prof)
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:15]
    for (path, line, func), (_, ncalls, tottime, cumtime, _) in rows:
        where = "%s:%d(%s)" % (os.path.relpath(path) if path.startswith("/") else path, line, func)
        print(json.dumps({"profile": name, "function": where, "own_ms_per_step": round(tottime / steps * 1e3, 3),
                          "cum_ms_per_step": round(cumtime / steps * 1e3, 3),
                          "calls_per_step": round(ncalls / steps, 1)}), flush=True)


# The MNIST CNN's two convolutions at BATCH: input, weight, and whether the input needs a gradient
CONV_LAYERS = {"conv1": ((BATCH, 1, 28, 28), (16, 1, 3, 3), False),
               "conv2": ((BATCH, 16, 14, 14), (32, 16, 3, 3), True)}


def conv_layer_step(inner, x_shape, w_shape, input_grad):
    """One convolution's forward and backward (dx where the model needs it, dw, dbias)."""
    backend = cn.Autodiff(inner)
    rng = np.random.default_rng(0)
    x = cn.tensor(rng.random(x_shape, dtype=np.float32), backend=backend)
    x = x.require_grad() if input_grad else x
    w = cn.tensor(rng.standard_normal(w_shape, dtype=np.float32) * 0.1, backend=backend).require_grad()
    b = cn.tensor(np.zeros(w_shape[0], np.float32), backend=backend).require_grad()
    shape = (x_shape[0], w_shape[0]) + x_shape[2:]
    upstream = cn.tensor(rng.standard_normal(shape, dtype=np.float32), backend=backend)

    def step():
        (cn.conv2d(x, w, b, padding=1) * upstream).sum().backward()
        inner.synchronize()
    return step


def side_by_side(fns, repeat, steps):
    """Best block mean (ms) of each function, blocks interleaved."""
    best = [float("inf")] * len(fns)
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            best[i] = min(best[i], block_ms(fn, steps))
    return best


def wasm_rows(images, labels):
    """The CNN step on each cn.Wasm() engine, composed conv backward against the kernels, then
    each of its convolutions alone (forward + backward)."""
    for engine in ("native", "wasmtime"):
        makers = (lambda: ComposedConvBackward(engine=engine), lambda: cn.Wasm(engine=engine))
        check = [Pair("cnn", images, labels, make()) for make in makers]
        grads = []
        for pair in check:
            found = F.cross_entropy(pair.model(pair.x), pair.y).backward()
            grads.append([p.grad(found).numpy() for p in pair.model.parameters()])
        diff = max(float(np.abs(a - b).max()) for a, b in zip(*grads))
        pairs = [Pair("cnn", images, labels, make()) for make in makers]
        for _ in range(2):
            for pair in pairs:
                pair.cinders_step()
        best = side_by_side([pair.cinders_step for pair in pairs], ARGS.repeat, ARGS.steps)
        backward = [min(pair.phases_ms(ARGS.steps)[1] for _ in range(ARGS.repeat)) for pair in pairs]
        print(json.dumps({"bench": "train_step_wasm", "engine": engine, "batch": BATCH,
                          "composed_ms": round(best[0], 3), "direct_ms": round(best[1], 3),
                          "ratio": round(best[0] / best[1], 3), "composed_backward_ms": backward[0],
                          "direct_backward_ms": backward[1],
                          "backward_ratio": round(backward[0] / backward[1], 3),
                          "max_grad_diff": float("%.3g" % diff), "load": os.getloadavg()[0]}),
              flush=True)
        for layer, (x_shape, w_shape, input_grad) in CONV_LAYERS.items():
            steps = [conv_layer_step(make(), x_shape, w_shape, input_grad) for make in makers]
            for step in steps:
                step()
            best = side_by_side(steps, ARGS.repeat, ARGS.steps)
            print(json.dumps({"bench": "train_step_wasm_conv", "engine": engine, "layer": layer,
                              "x": x_shape, "w": w_shape, "composed_ms": round(best[0], 3),
                              "direct_ms": round(best[1], 3), "ratio": round(best[0] / best[1], 3),
                              "load": os.getloadavg()[0]}), flush=True)


def main():
    heldout = MnistDigits("train")
    images = np.stack([heldout[i][0] for i in range(0, BATCH * 100, 100)]).reshape(BATCH, 1, 28, 28)
    labels = np.asarray([heldout.labels[i] for i in range(0, BATCH * 100, 100)], dtype=np.int32)
    if ARGS.wasm:
        wasm_rows(images, labels)
        return 0
    for name in ARGS.models.split(","):
        check = Pair(name, images, labels)
        check.cinders_step()
        check.torch_step()
        diff = check.max_param_diff()
        pair = Pair(name, images, labels)
        for _ in range(3):  # warm up: lazy imports, allocator, torch's kernels
            pair.cinders_step()
            pair.torch_step()
        best_c = best_t = float("inf")
        for _ in range(ARGS.repeat):
            best_c = min(best_c, block_ms(pair.cinders_step, ARGS.steps))
            best_t = min(best_t, block_ms(pair.torch_step, ARGS.steps))
        forward, backward, optim = pair.phases_ms(ARGS.steps)
        print(json.dumps({"bench": "train_step", "model": name, "batch": BATCH, "threads": ARGS.threads,
                          "cinders_ms": round(best_c, 3), "torch_ms": round(best_t, 3),
                          "ratio": round(best_c / best_t, 3), "cinders_forward_ms": forward,
                          "cinders_backward_ms": backward, "cinders_optimizer_ms": optim,
                          "max_param_diff": float("%.3g" % diff)}), flush=True)
        if ARGS.profile:
            profile(pair, name, ARGS.steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
