"""float32 matmul on cn.Wgpu() against PyTorch on the same GPU (TF32 off), side by side.

One JSON line per (size, variant):
    {"bench": "matmul", "n", "variant", "cinders_tflops", "kernel_tflops", "torch_tflops", "ratio",
     "kernel_ratio", "device", "torch_device", "max_rel_err"}
variant "auto" is what cn.Wgpu() picks (autotuned on first use and cached on disk); with
--variants every generated matmul kernel is timed as well. Throughput is measured over `reps`
back-to-back products followed by one synchronisation (best of --repeat blocks): it includes
Python and submission. kernel_tflops comes from the GPU timestamps of one profiled product (the
kernel alone; None where the adapter has no timestamp queries), kernel_ratio compares it with
torch's throughput.

    python benchmarks/gpu_matmul.py                 # 1024, 2048, 4096 (a real GPU)
    python benchmarks/gpu_matmul.py --small         # 128, 256: runs on lavapipe in seconds
    python benchmarks/gpu_matmul.py --variants
"""

import argparse
import json
import time

import numpy as np

import cinders as cn
from cinders import dtypes


def best_seconds(run, sync, reps, repeat):
    run()
    sync()  # warm up: compile, autotune, pool
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(reps):
            run()
        sync()
        best = min(best, (time.perf_counter() - start) / reps)
    return best


def torch_matmul(n, reps, repeat, a_np, b_np):
    try:
        import torch
    except ImportError:
        return None, "none"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    a = torch.from_numpy(a_np).to(device)
    b = torch.from_numpy(b_np).to(device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    return best_seconds(lambda: torch.matmul(a, b), sync, reps, repeat), device


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="sizes 128 and 256 (lavapipe)")
    parser.add_argument("--sizes", type=int, nargs="*")
    parser.add_argument("--variants", action="store_true", help="also time every kernel variant")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    sizes = args.sizes or ((128, 256) if args.small else (1024, 2048, 4096))
    backend = cn.Wgpu()
    from cinders.wgpu.matmul import VARIANTS

    rng = np.random.default_rng(0)
    for n in sizes:
        a_np = rng.standard_normal((n, n)).astype(np.float32)
        b_np = rng.standard_normal((n, n)).astype(np.float32)
        a = backend.from_flat(a_np.reshape(-1).tolist(), (n, n), dtypes.float32)
        b = backend.from_flat(b_np.reshape(-1).tolist(), (n, n), dtypes.float32)
        flops = 2.0 * n ** 3
        reps = max(3, min(50, int(1e12 / flops))) if not args.small else 3
        torch_s, torch_device = torch_matmul(n, reps, args.repeat, a_np, b_np)
        want = a_np.astype(np.float64) @ b_np
        runs = {"auto": lambda: backend.matmul(a, b)}
        if args.variants:
            for name in VARIANTS:
                runs[name] = (lambda v: lambda: backend._matmul_variant(v, a, b, (), n, n, n))(name)
        for variant, run in runs.items():
            seconds = best_seconds(run, backend.synchronize, reps, args.repeat)
            with cn.profile(backend) as prof:
                run()
                backend.synchronize()
            kernel_s = prof.gpu_time
            got = backend.to_numpy(run())
            err = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
            tflops = flops / seconds / 1e12
            torch_tflops = flops / torch_s / 1e12 if torch_s else None
            print(json.dumps({
                "bench": "matmul", "n": n, "variant": variant,
                "cinders_tflops": round(tflops, 4),
                "torch_tflops": round(torch_tflops, 4) if torch_tflops else None,
                "kernel_tflops": round(flops / kernel_s / 1e12, 4) if kernel_s else None,
                "ratio": round(tflops / torch_tflops, 4) if torch_tflops else None,
                "kernel_ratio": round(flops / kernel_s / 1e12 / torch_tflops, 4)
                if kernel_s and torch_tflops else None,
                "device": backend.device.name, "torch_device": torch_device,
                "max_rel_err": err}), flush=True)


if __name__ == "__main__":
    main()
