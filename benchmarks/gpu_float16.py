"""cn.Wgpu()'s two float16 layouts side by side (wgpu_backend/codegen/packing.py): array<f16>
with plain 2-byte loads and stores (devices with shader-f16) against two halves packed in a u32
word, written with two atomics on the word (shader_f16=False, SwiftShader's layout). One JSON
line per case, the layouts timed in turns in one run:

    {"bench": "float16_layout", "case", "elements", "adapter", "f16_ms", "packed_ms",
     "packed_over_f16"}

Cases: "cast" (float32 -> float16: stores only), "scale" (float16 -> float16 through float32:
a load and a store), "widen" (float16 -> float32: loads only), and "fused" (the scale chain
under cn.Fusion). Each time is the median wall time of `--repeat` calls, each call waiting for
the GPU (so `--elements` should make a kernel outweigh a submit).

    python benchmarks/gpu_float16.py [--elements 4194304] [--repeat 15]
"""

import argparse
import json

import numpy as np

import cinders as cn
from timing import interleaved_median_ms

CASES = {
    "cast": lambda x32, x16: x32.cast(cn.float16),
    "scale": lambda x32, x16: (x16 * 0.5).cast(cn.float16),
    "widen": lambda x32, x16: x16.cast(cn.float32),
}


def rows(elements, repeat):
    data = np.random.default_rng(0).standard_normal(elements).astype(np.float32)
    gpus = {name: cn.Wgpu(autotune=False, shader_f16=flag)
            for name, flag in (("f16", True), ("packed", False))}
    if gpus["f16"].storage_layout == gpus["packed"].storage_layout:
        raise SystemExit("this adapter has no shader-f16: both layouts are the packed one")
    cases = dict(CASES, fused=CASES["scale"])
    for case, fn in cases.items():
        runs = {}
        for name, gpu in gpus.items():
            backend = cn.Fusion(gpu) if case == "fused" else gpu
            x32 = cn.tensor(data, backend=backend)
            x16 = x32.cast(cn.float16)

            def run(fn=fn, x32=x32, x16=x16, gpu=gpu, backend=backend):
                out = fn(x32, x16)
                if backend is not gpu:
                    backend.realize(out)
                gpu.synchronize()
            runs[name] = run
        ms = interleaved_median_ms(runs, repeat)
        yield {"bench": "float16_layout", "case": case, "elements": elements,
               "adapter": gpus["f16"].device.name, "f16_ms": round(ms["f16"], 3),
               "packed_ms": round(ms["packed"], 3),
               "packed_over_f16": round(ms["packed"] / ms["f16"], 2)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--elements", type=int, default=1 << 22)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    for row in rows(args.elements, args.repeat):
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
