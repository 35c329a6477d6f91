"""GPU memory of a training step and of an elementwise chain on cn.Wgpu(), one JSON line per case.

    {"bench": "mnist_cnn_train_step", "stack", "batch", "peak_bytes", "inplace_per_step",
     "buffers_created"}
    {"bench": "elementwise_chain", "elements", "peak_bytes", "inplace", "buffers"}

peak_bytes is the pool's high-water mark (bytes held by live tensors, by size class) over the
measured steps, after warm-up steps that fill the pool; inplace counts the results written into
the buffer of an input that died (wgpu_backend/pool.py, "In-place results"). The chain row shows
what that saves: `((x + 1) * 2).exp() - 1` needs one buffer beside x, where writing every result
into a fresh buffer needs two. The counts are the pool's own, the same on any adapter, so the
lavapipe run is as good as a GPU's.

    python benchmarks/gpu_memory.py [--batch 64] [--warm 3] [--steps 3]
"""

import argparse
import gc
import json

import numpy as np

import cinders as cn
import cinders.nn.functional as F
from cinders.models.mnist import MnistCNN
from cinders.wgpu import Wgpu


def train_step_row(stack, batch, warm, steps):
    gc.collect()  # the cycles of an earlier row's tape would count as live here
    gpu = Wgpu(autotune=False)
    backend = cn.Autodiff(gpu if stack == "autodiff-wgpu" else cn.Fusion(gpu))
    cn.manual_seed(0)
    model = MnistCNN().to(backend)
    opt = cn.optim.SGD(lr=0.01, momentum=0.9)
    rng = np.random.default_rng(0)
    x = cn.tensor(rng.random((batch, 1, 28, 28), dtype=np.float32), backend=backend)
    y = cn.tensor(rng.integers(0, 10, batch).astype(np.int32), backend=backend)

    def step():
        loss = F.cross_entropy(model(x), y)
        opt.step(model, loss.backward())
        return loss.item()

    for _ in range(warm):
        step()
    pool = gpu.pool
    pool.peak_bytes = pool.allocated_bytes
    before = gpu.memory_stats()
    for _ in range(steps):
        step()
    after = gpu.memory_stats()
    return {"bench": "mnist_cnn_train_step", "stack": stack, "batch": batch,
            "peak_bytes": after["peak_bytes"],
            "inplace_per_step": (after["inplace"] - before["inplace"]) / steps,
            "buffers_created": after["buffers_created"] - before["buffers_created"]}


def chain_row(elements):
    gc.collect()
    gpu = Wgpu(autotune=False)
    x = cn.tensor(np.ones(elements, np.float32), backend=gpu)
    gpu.synchronize()
    pool = gpu.pool
    pool.peak_bytes = base = pool.allocated_bytes
    before = gpu.memory_stats()
    y = ((x + 1) * 2).exp() - 1
    y.numpy()
    after = gpu.memory_stats()
    return {"bench": "elementwise_chain", "elements": elements,
            "peak_bytes": after["peak_bytes"] - base,
            "inplace": after["inplace"] - before["inplace"],
            "buffers": (after["peak_bytes"] - base) / (4 * elements)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--warm", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    for stack in ("autodiff-wgpu", "autodiff-fusion-wgpu"):
        print(json.dumps(train_step_row(stack, args.batch, args.warm, args.steps)), flush=True)
    print(json.dumps(chain_row(1 << 20)), flush=True)


if __name__ == "__main__":
    main()
