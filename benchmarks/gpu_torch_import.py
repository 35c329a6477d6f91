"""cn.Wgpu's GPU time for one convolution before and after `import torch`, and after torch's
first CUDA tensor (docs/gpu-kernels.md, "torch in the same process"): one JSON line per stage.

    python benchmarks/gpu_torch_import.py
"""
import json

import numpy as np

import cinders as cn


def conv_us(backend, x, w, repeat=5):
    """Median GPU time (µs) of a 3x3 convolution, from cn.profile's kernel timestamps."""
    def call():
        return backend.conv2d(x.handle, w.handle, None, (1, 1), ((1, 1), (1, 1)), (1, 1), 1, None)
    call()
    backend.synchronize()
    with cn.profile(backend) as p:
        for _ in range(repeat):
            call()
    times = sorted(e["gpu_time"] for e in p.events if e["kind"] == "kernel" and e.get("gpu_time"))
    return round(times[len(times) // 2] * 1e6, 1) if times else None


def main():
    backend = cn.Wgpu()
    rng = np.random.default_rng(0)
    x = cn.tensor(rng.standard_normal((1, 512, 7, 7)).astype(np.float32), backend=backend)
    w = cn.tensor(rng.standard_normal((512, 512, 3, 3)).astype(np.float32), backend=backend)

    def emit(stage):
        print(json.dumps({"bench": "gpu_torch_import", "stage": stage, "conv_us": conv_us(backend, x, w),
                          "device": backend.device.name}), flush=True)
    emit("start")
    import torch
    emit("after import torch")
    if torch.cuda.is_available():
        torch.zeros(1, device="cuda")
        emit("after a CUDA tensor")


if __name__ == "__main__":
    main()
