"""cn.Fusion against the unfused backend and PyTorch, side by side, one JSON line per case.

    {"bench": "gelu" | "layernorm_gelu", "variant": "fused" | "unfused" | "torch",
     "elements", "launches", "wall_ms", "gpu_ms", "gbps", "vs_torch", ...}
    {"bench": "mnist_cnn_train_step", "variant": "fused" | "unfused", "mode": "uncaptured" |
     "captured", "batch", "launches", "host_ms", "host_cpu_ms", "host_cpu_min_ms", "step_ms"}
    {"bench": "mnist_cnn_train_step", "variant": "speedup", "mode", "host_speedup",
     "host_cpu_speedup", "step_speedup"}   (unfused / fused: > 1 means fused is faster)

gelu is the custom chain `x * ((x / SQRT_2).erf() + 1) / 2` on 2^24 floats; layernorm_gelu is
layer_norm over the last dim (1024) followed by that gelu. Effective bandwidth counts the bytes
the op must move at least (read the input, write the output; LayerNorm's weight and bias too)
divided by the GPU time of its kernels (timestamp queries; wall-clock when the adapter has
none). wall_ms is one call plus waiting for it, Python included. torch rows appear when a CUDA
PyTorch is installed (torch.nn.functional.gelu / layer_norm on the same data, CUDA events).

    python benchmarks/fusion.py            # 2^24 floats, MNIST batch 64 (a real GPU)
    python benchmarks/fusion.py --small    # 2^16 floats, batch 8, few repeats (lavapipe)
    python benchmarks/fusion.py --only train --batch 2 --steps 40   # host time per step
    python benchmarks/fusion.py --only train --batch 2 --profile    # ... and where it goes
"""

import argparse
import collections
import cProfile
import json
import math
import os
import pstats
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
    """The MNIST CNN training step on both stacks, uncaptured and captured, timed in turns (one
    step of each per round: every stack sees the same machine load). host_ms is the step's
    Python up to its submit (the loss computed on the device, nothing waited for), host_cpu_ms
    the same span in this thread's CPU time (what the GPU's work, or a software adapter's
    threads, cannot inflate; its minimum too: the least a shared machine's load added), step_ms
    the step with its loss read back. Each (stack, mode) has
    its own model: an uncaptured step replacing the weights would make a capture record again."""
    from cinders.models.mnist import MnistCNN
    batch = 8 if args.small else args.batch
    steps = 5 if args.small else args.steps
    rng = np.random.default_rng(0)
    x_np = rng.random((batch, 1, 28, 28), dtype=np.float32)
    y_np = rng.integers(0, 10, batch).astype(np.int32)
    cases = {}
    for variant in ("fused", "unfused"):
        for mode in ("uncaptured", "captured"):
            base = cn.Wgpu()
            fusion = cn.Fusion(base) if variant == "fused" else None
            backend = cn.Autodiff(fusion or base)
            cn.manual_seed(0)
            model = MnistCNN().to(backend)
            opt = cn.optim.SGD(0.01, momentum=0.9)
            x, y = cn.tensor(x_np, backend=backend), cn.tensor(y_np, backend=backend)

            def step(x, y, model=model, opt=opt):
                loss = F.cross_entropy(model(x), y)
                opt.step(model, loss.backward())
                return loss

            def submit(loss, backend=backend, fusion=fusion, base=base):
                if fusion is not None:  # compute the lazy loss (and what it waits on) now
                    fusion.realize(backend.to_inner(loss))
                base.device.flush()     # encode and submit; the GPU works on

            step(x, y).item()  # the optimizer's state exists before a capture sees the step
            run = cn.capture(step) if mode == "captured" else step
            cases[(variant, mode)] = (backend, run, submit, x, y)
    launches = {}
    for key, (backend, run, submit, x, y) in cases.items():
        for _ in range(4):  # warm up: kernels compiled, pool filled, the capture recorded
            run(x, y).item()
        with cn.profile(backend) as p:
            run(x, y).item()
        launches[key] = p.kernel_launches
    times = {key: ([], [], []) for key in cases}
    for _ in range(steps):
        for key, (backend, run, submit, x, y) in cases.items():
            backend.synchronize()
            wall, cpu = time.perf_counter(), time.thread_time()
            loss = run(x, y)
            submit(loss)
            host, host_cpu = time.perf_counter(), time.thread_time()
            loss.item()
            done = time.perf_counter()
            for series, value in zip(times[key], (host - wall, host_cpu - cpu, done - wall)):
                series.append(value * 1e3)
    if args.profile:
        for (variant, mode), case in cases.items():
            if mode == "uncaptured":
                profile_step(variant, case, steps)
    ms = {key: [statistics.median(series) for series in times[key]] for key in cases}
    device = cn.Wgpu().device.name
    for (variant, mode), (host, host_cpu, step_ms) in ms.items():
        emit({"bench": "mnist_cnn_train_step", "variant": variant, "mode": mode, "batch": batch,
              "launches": launches[(variant, mode)], "host_ms": round(host, 3),
              "host_cpu_ms": round(host_cpu, 3),
              "host_cpu_min_ms": round(min(times[(variant, mode)][1]), 3),
              "step_ms": round(step_ms, 3), "device": device})
    for mode in ("uncaptured", "captured"):
        fused, unfused = ms[("fused", mode)], ms[("unfused", mode)]
        emit({"bench": "mnist_cnn_train_step", "variant": "speedup", "mode": mode, "batch": batch,
              "host_speedup": round(unfused[0] / fused[0], 3),
              "host_cpu_speedup": round(unfused[1] / fused[1], 3),
              "step_speedup": round(unfused[2] / fused[2], 3)})


def profile_step(variant, case, steps):
    """Where an uncaptured step's host time goes (cProfile on this thread's CPU clock, so
    inflated by the profiler, roughly per call: compare shares, not totals): own time per step
    by the file's folder (cn.Fusion's graph, the Wgpu runner and launch path, wgpu-py...), then
    the hottest functions. One JSON line each."""
    backend, run, submit, x, y = case
    prof = cProfile.Profile(time.thread_time)
    for _ in range(steps):
        backend.synchronize()
        prof.enable()
        submit(run(x, y))
        prof.disable()
    stats = pstats.Stats(prof).stats
    folders = collections.Counter()
    for (path, _, _), (_, _, own, _, _) in stats.items():
        folders[_folder(path)] += own
    for folder, own in folders.most_common(10):
        emit({"bench": "mnist_cnn_train_step_profile", "variant": variant, "folder": folder,
              "own_ms_per_step": round(own / steps * 1e3, 3)})
    rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:15]
    for (path, line, name), (_, calls, own, cum, _) in rows:
        emit({"bench": "mnist_cnn_train_step_profile", "variant": variant,
              "function": "%s/%s:%d(%s)" % (_folder(path), os.path.basename(path), line, name),
              "own_ms_per_step": round(own / steps * 1e3, 3),
              "cum_ms_per_step": round(cum / steps * 1e3, 3),
              "calls_per_step": round(calls / steps, 1)})


_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _folder(path):
    """A profiled file's folder in this repository (core/fusion, wgpu_backend, ...), its
    installed package (wgpu, cffi), or "python" (the standard library, builtins)."""
    if path.startswith(_ROOT + os.sep):
        return os.path.dirname(os.path.relpath(path, _ROOT))
    if "site-packages" + os.sep in path:
        return path.split("site-packages" + os.sep, 1)[1].split(os.sep)[0]
    return "python"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="small sizes, few repeats (lavapipe)")
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--only", choices=("elementwise", "train"), default=None,
                        help="run one part: the elementwise chains, or the training step")
    parser.add_argument("--profile", action="store_true",
                        help="also where each uncaptured step's host time goes (cProfile)")
    args = parser.parse_args()
    if args.small:
        args.repeat = min(args.repeat, 3)
    if args.only != "train":
        elementwise_benches(args, cn.Wgpu().device.name)
    if args.only != "elementwise":
        mnist_bench(args)


if __name__ == "__main__":
    main()
