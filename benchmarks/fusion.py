"""cn.Fusion against the unfused backend and PyTorch, side by side, one JSON line per case.

    {"bench": "gelu" | "layernorm_gelu", "variant": "fused" | "unfused" | "torch",
     "elements", "launches", "wall_ms", "gpu_ms", "gbps", "vs_torch", ...}
    {"bench": "mnist_cnn_train_step", "variant": "fused" | "unfused", "batch", "launches",
     "step_ms", "speedup"}

gelu is the custom chain `x * ((x / SQRT_2).erf() + 1) / 2` on 2^24 floats; layernorm_gelu is
layer_norm over the last dim (1024) followed by that gelu. Effective bandwidth counts the bytes
the op must move at least (read the input, write the output; LayerNorm's weight and bias too)
divided by the GPU time of its kernels (timestamp queries; wall-clock when the adapter has
none). wall_ms is one call plus waiting for it, Python included. torch rows appear when a CUDA
PyTorch is installed (torch.nn.functional.gelu / layer_norm on the same data, CUDA events).

    python benchmarks/fusion.py            # 2^24 floats, MNIST batch 64 (a real GPU)
    python benchmarks/fusion.py --small    # 2^16 floats, batch 8, few repeats (lavapipe)
"""

import argparse
import json
import math
import statistics
import time

import numpy as np

import cinders as cn
from cinders.nn import functional as F

SQRT_2 = math.sqrt(2.0)


def custom_gelu(x):
    return x * ((x / SQRT_2).erf() + 1) / 2


def layernorm_gelu(x, w, b):
    return custom_gelu(F.layer_norm(x, (x.shape[-1],), w, b))


def measure(backend, run, repeat):
    """(launches, wall seconds per call, GPU seconds per call or None) of run()."""
    run()
    backend.synchronize()
    # GPU time per call from timestamps, the median over `repeat` calls: steady state, where
    # outputs come from the buffer pool (a single timed call after one warm-up writes a fresh
    # buffer, and on an H200 that first use added ~10 us to a 38 us kernel).
    gpus = []
    for _ in range(repeat):
        with cn.profile(backend) as p:
            run()
        gpus.append(p.gpu_time)
    launches = p.kernel_launches
    gpu = statistics.median(gpus) if None not in gpus else None
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        backend.synchronize()
        times.append(time.perf_counter() - start)
    return launches, statistics.median(times), gpu


def torch_time(fn, repeat):
    import torch
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeat):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / repeat


def cuda_torch():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def _gbps(nbytes, seconds):
    value = nbytes / seconds / 1e9
    return round(value, 1) if value >= 10 else round(value, 4)


def emit(row):
    print(json.dumps(row), flush=True)


def elementwise_benches(args, device_name):
    torch = cuda_torch()
    n = 1 << (16 if args.small else 24)
    width = 1024 if n >= 1 << 20 else 256
    rng = np.random.default_rng(0)
    x_np = rng.standard_normal(n, dtype=np.float32)
    w_np = rng.standard_normal(width, dtype=np.float32)
    b_np = rng.standard_normal(width, dtype=np.float32)
    cases = [
        ("gelu", lambda be: (cn.tensor(x_np, backend=be),), custom_gelu, 8 * n),
        ("layernorm_gelu",
         lambda be: (cn.tensor(x_np.reshape(-1, width), backend=be), cn.tensor(w_np, backend=be),
                     cn.tensor(b_np, backend=be)),
         layernorm_gelu, 8 * n + 8 * width),
    ]
    for name, make_inputs, fn, nbytes in cases:
        torch_seconds = None
        reference = None
        if torch is not None:
            xt = torch.from_numpy(x_np).cuda()
            if name == "gelu":
                def run_torch():
                    return torch.nn.functional.gelu(xt)
            else:
                xt2 = xt.reshape(-1, width)
                wt, bt = torch.from_numpy(w_np).cuda(), torch.from_numpy(b_np).cuda()

                def run_torch():
                    return torch.nn.functional.gelu(
                        torch.nn.functional.layer_norm(xt2, (width,), wt, bt))
            torch_seconds = torch_time(run_torch, args.repeat)
            reference = run_torch().cpu().numpy()
            emit({"bench": name, "variant": "torch", "elements": n, "launches": None,
                  "wall_ms": None, "gpu_ms": round(torch_seconds * 1e3, 4),
                  "gbps": _gbps(nbytes, torch_seconds), "vs_torch": 1.0,
                  "device": torch.cuda.get_device_name()})
        for variant, backend in (("fused", cn.Fusion(cn.Wgpu())), ("unfused", cn.Wgpu())):
            inputs = make_inputs(backend)
            out = {}

            def run():
                out["y"] = fn(*inputs)
                if isinstance(backend, cn.Fusion):  # compute the lazy result (no readback)
                    backend.realize(out["y"])

            launches, wall, gpu = measure(backend, run, args.repeat)
            seconds = gpu if gpu else wall
            diff = None
            if reference is not None:
                diff = float(np.max(np.abs(out["y"].numpy().reshape(reference.shape) - reference)))
            emit({"bench": name, "variant": variant, "elements": n, "launches": launches,
                  "wall_ms": round(wall * 1e3, 4), "gpu_ms": round(gpu * 1e3, 4) if gpu else None,
                  "gbps": _gbps(nbytes, seconds),
                  "vs_torch": round(torch_seconds / seconds, 4) if torch_seconds else None,
                  "max_abs_diff_vs_torch": diff, "device": device_name})


def mnist_bench(args):
    from cinders.models.mnist import MnistCNN
    batch = 8 if args.small else args.batch
    steps = 3 if args.small else args.steps
    rng = np.random.default_rng(0)
    x_np = rng.random((batch, 1, 28, 28), dtype=np.float32)
    y_np = rng.integers(0, 10, batch).astype(np.int32)
    results = {}
    for variant, backend in (("fused", cn.Autodiff(cn.Fusion(cn.Wgpu()))),
                             ("unfused", cn.Autodiff(cn.Wgpu()))):
        cn.manual_seed(0)
        model = MnistCNN().to(backend)
        opt = cn.optim.SGD(0.01, momentum=0.9)
        x, y = cn.tensor(x_np, backend=backend), cn.tensor(y_np, backend=backend)
        state = {"model": model}

        def step():
            loss = F.cross_entropy(state["model"](x), y)
            state["model"] = opt.step(state["model"], loss.backward())
            return loss

        for _ in range(2):  # warm up: kernels compiled, matmul variants tuned, pool filled
            step().item()
        with cn.profile(backend) as p:
            step()
            state["model"](x).sum().item()  # flush the pending parameter updates
        launches = p.kernel_launches
        times = []
        loss = None
        for _ in range(steps):
            start = time.perf_counter()
            loss = step().item()
            times.append(time.perf_counter() - start)
        results[variant] = statistics.median(times)
        emit({"bench": "mnist_cnn_train_step", "variant": variant, "batch": batch,
              "launches_step_plus_forward": launches, "step_ms": round(results[variant] * 1e3, 3),
              "loss": loss, "device": backend.inner.device.name if variant == "unfused"
              else backend.inner.inner.device.name})
    emit({"bench": "mnist_cnn_train_step", "variant": "speedup", "batch": batch,
          "speedup": round(results["unfused"] / results["fused"], 3)})


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="small sizes, few repeats (lavapipe)")
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    if args.small:
        args.repeat = min(args.repeat, 3)
    elementwise_benches(args, cn.Wgpu().device.name)
    mnist_bench(args)


if __name__ == "__main__":
    main()
