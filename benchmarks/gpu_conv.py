"""conv2d on cn.Wgpu(): its kernels (implicit GEMM / direct, wgpu_backend/conv.py), the composed
reference (unfold2d + matmul) on the same device, and PyTorch (cuDNN, TF32 off) side by side.

One JSON line per convolution:
    {"bench": "gpu_conv", "name", "x", "w", "stride", "padding", "groups", "kernel",
     "kernel_ms", "kernel_gpu_ms", "im2col_ms", "torch_ms", "kernel_vs_torch", "kernel_vs_im2col",
     "kernel_gflops", "max_abs_diff", "device", "torch_device"}
Times are per convolution: `reps` back-to-back calls then one synchronisation, best of --repeat
blocks (so they include submission, not readback). kernel_gpu_ms is the GPU time of the conv
kernel alone from timestamp queries (cn.profile), null where the adapter has none.
"kernel" names the WGSL kernel that ran; im2col_ms is null when the unfolded matrix exceeds
the device's binding limit (the case the kernels exist for). max_abs_diff: the kernel's output
against torch's.

    python benchmarks/gpu_conv.py             # ResNet-50 / MobileNetV2 / MNIST layers (a real GPU)
    python benchmarks/gpu_conv.py --quick     # tiny shapes: runs on lavapipe in seconds
"""

import argparse
import json
import time

import numpy as np

import cinders as cn
from cinders.functional import conv2d_reference
from cinders.wgpu import DeviceLimitError

# (name, x shape, (O, kh, kw), stride, padding, groups)
LAYERS = [
    ("resnet50_conv1_b32", (32, 3, 224, 224), (64, 7, 7), 2, 3, 1),
    ("resnet50_l1_3x3_b32", (32, 64, 56, 56), (64, 3, 3), 1, 1, 1),
    ("resnet50_l1_1x1_b32", (32, 256, 56, 56), (64, 1, 1), 1, 0, 1),
    ("resnet50_l3_3x3_b32", (32, 256, 14, 14), (256, 3, 3), 1, 1, 1),
    ("resnet50_l4_3x3_s2_b32", (32, 512, 14, 14), (512, 3, 3), 2, 1, 1),
    ("mobilenetv2_dw_b1", (1, 144, 56, 56), (144, 3, 3), 1, 1, 144),
    ("mobilenetv2_dw_s2_b32", (32, 96, 112, 112), (96, 3, 3), 2, 1, 96),
    ("mnist_conv2_b1", (1, 16, 14, 14), (32, 3, 3), 1, 1, 1),
    ("mnist_conv2_b256", (256, 16, 14, 14), (32, 3, 3), 1, 1, 1),
]
QUICK = [
    ("quick_3x3", (2, 8, 16, 16), (16, 3, 3), 1, 1, 1),
    ("quick_3x3_c32", (1, 32, 12, 12), (32, 3, 3), 1, 1, 1),
    ("quick_3x3_s2_g2", (1, 8, 15, 13), (16, 3, 3), 2, 1, 2),
    ("quick_dw", (1, 16, 16, 16), (16, 3, 3), 1, 1, 16),
]


def best_seconds(run, sync, reps, repeat):
    run()
    sync()  # warm up: compile, pool
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(reps):
            run()
        sync()
        best = min(best, (time.perf_counter() - start) / reps)
    return best


def torch_conv(x_np, w_np, b_np, stride, padding, groups, reps, repeat):
    """(seconds, output as NumPy, device) of torch's conv2d + bias, TF32 off (cuDNN too)."""
    import torch
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    x, w, b = (torch.from_numpy(a).to(device) for a in (x_np, w_np, b_np))
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    with torch.no_grad():
        run = lambda: torch.nn.functional.conv2d(x, w, b, stride, padding, 1, groups)  # noqa: E731
        seconds = best_seconds(run, sync, reps, repeat)
        return seconds, run().cpu().numpy(), device


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny shapes (lavapipe)")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    backend = cn.Wgpu()
    rng = np.random.default_rng(0)
    for name, x_shape, (o, kh, kw), stride, padding, groups in (QUICK if args.quick else LAYERS):
        n, c, h, wd = x_shape
        w_shape = (o, c // groups, kh, kw)
        x_np = rng.standard_normal(x_shape).astype(np.float32)
        w_np = (rng.standard_normal(w_shape) / np.sqrt(c // groups * kh * kw)).astype(np.float32)
        b_np = rng.standard_normal(o).astype(np.float32)
        x, w, b = (cn.tensor(a, backend=backend) for a in (x_np, w_np, b_np))
        oh = (h + 2 * padding - kh) // stride + 1
        ow = (wd + 2 * padding - kw) // stride + 1
        flops = 2.0 * n * o * oh * ow * (c // groups) * kh * kw
        reps = 3 if args.quick else max(3, min(50, int(2e11 / flops)))

        kernel_run = lambda: cn.conv2d(x, w, b, stride, padding, 1, groups)  # noqa: E731
        kernel_s = best_seconds(kernel_run, backend.synchronize, reps, args.repeat)
        with cn.profile(backend) as prof:
            out = kernel_run()
            backend.synchronize()
        convs = [e for e in prof.events if e.get("kind") == "kernel" and e["name"].startswith("conv2d")]
        gpu_times = [e["gpu_time"] for e in convs if e.get("gpu_time") is not None]
        pads = ((padding, padding), (padding, padding))
        try:
            im2col_s = best_seconds(
                lambda: conv2d_reference(x, w, b, (stride, stride), pads, (1, 1), groups, None),
                backend.synchronize, reps, args.repeat)
        except DeviceLimitError:
            im2col_s = None
        torch_s, want, torch_device = torch_conv(x_np, w_np, b_np, stride, padding, groups, reps,
                                                 args.repeat)
        print(json.dumps({
            "bench": "gpu_conv", "name": name, "x": list(x_shape), "w": list(w_shape),
            "stride": stride, "padding": padding, "groups": groups,
            "kernel": convs[0]["name"] if convs else None,
            "kernel_ms": round(kernel_s * 1e3, 4),
            "kernel_gpu_ms": round(sum(gpu_times) * 1e3, 4) if gpu_times else None,
            "im2col_ms": None if im2col_s is None else round(im2col_s * 1e3, 4),
            "torch_ms": round(torch_s * 1e3, 4),
            "kernel_vs_torch": round(kernel_s / torch_s, 3),
            "kernel_vs_im2col": None if im2col_s is None else round(kernel_s / im2col_s, 3),
            "kernel_gflops": round(flops / kernel_s / 1e9, 2),
            "max_abs_diff": float(np.max(np.abs(out.numpy() - want))),
            "device": backend.device.name, "torch_device": torch_device}), flush=True)


if __name__ == "__main__":
    main()
