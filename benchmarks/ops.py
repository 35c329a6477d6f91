"""Framework overhead of the tensor layer: cn.NumPy() against the same NumPy call, side by side.

Prints one JSON line per (bench, size):
    {"bench", "size", "cinders_us", "numpy_us", "overhead_us", "ratio"}
and the cost of erf on cn.NumPy() (its own vectorised kernel: NumPy has no erf) against tanh's,
per million floats, with the per-element math.erf it replaced:
    {"bench": "erf_vs_tanh", "size", "erf_us", "tanh_us", "ratio", "math_erf_us"}
Timings are best-of-R per-call means over blocks of n calls, with the cinders and raw NumPy
blocks interleaved so both see the same machine load.

    python benchmarks/ops.py [--repeat 7] [--quick]
"""

import argparse
import json
import math
import time

import numpy as np

import cinders as cn


def _per_call_us(fn, n):
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e6


def side_by_side(cinders_fn, numpy_fn, repeat, block_s=0.02):
    """Best per-call time (µs) of each, measured in alternating blocks of equal call counts."""
    cinders_fn(), numpy_fn()  # warm up caches and lazy imports
    n = max(1, int(block_s / max(_per_call_us(cinders_fn, 1) * 1e-6, 1e-7)))
    best_c = best_n = float("inf")
    for _ in range(repeat):
        best_c = min(best_c, _per_call_us(cinders_fn, n))
        best_n = min(best_n, _per_call_us(numpy_fn, n))
    return best_c, best_n


def cases(quick):
    rng = np.random.default_rng(0)
    backend = cn.NumPy()

    def pair(shape):
        a = rng.standard_normal(shape).astype(np.float32)
        b = rng.standard_normal(shape).astype(np.float32)
        return a, b, cn.tensor(a, backend=backend), cn.tensor(b, backend=backend)

    elementwise_sizes = (1_000, 10_000) if quick else (1_000, 10_000, 100_000, 1_000_000)
    for size in elementwise_sizes:
        a, b, ta, tb = pair((size,))
        yield "add", size, (lambda: ta + tb), (lambda: np.add(a, b))
        yield "mul", size, (lambda: ta * tb), (lambda: np.multiply(a, b))
        yield "add_scalar", size, (lambda: ta + 1.5), (lambda: a + np.float32(1.5))
        yield "exp", size, (lambda: ta.exp()), (lambda: np.exp(a))
    for size in ((64, 256) if quick else (64, 256, 1024)):
        a, _, ta, _ = pair((size, size))
        yield "sum_axis1", size, (lambda: ta.sum(1)), (lambda: a.sum(axis=1))
        yield "softmax", size, (lambda: ta.softmax(-1)), (
            lambda: (lambda e: e / e.sum(-1, keepdims=True))(np.exp(a - a.max(-1, keepdims=True))))
    for size in ((64, 256) if quick else (64, 256, 512)):
        a, b, ta, tb = pair((size, size))
        yield "matmul", size, (lambda: ta @ tb), (lambda: a @ b)


def erf_vs_tanh(repeat):
    x = cn.tensor(np.random.default_rng(0).standard_normal(1_000_000).astype(np.float32), backend=cn.NumPy())
    erf_us, tanh_us = side_by_side(lambda: x.erf(), lambda: x.tanh(), repeat)
    per_element = np.vectorize(math.erf, otypes=[np.float64])
    values = x.numpy()
    math_erf_us, _ = side_by_side(lambda: per_element(values).astype(np.float32), lambda: None, 1)
    return {"bench": "erf_vs_tanh", "size": x.shape[0], "erf_us": round(erf_us, 1), "tanh_us": round(tanh_us, 1),
            "ratio": round(erf_us / tanh_us, 2), "math_erf_us": round(math_erf_us, 1)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=7, help="blocks per side; the best counts")
    parser.add_argument("--quick", action="store_true", help="small sizes only (a smoke run)")
    args = parser.parse_args()
    for bench, size, cinders_fn, numpy_fn in cases(args.quick):
        c, n = side_by_side(cinders_fn, numpy_fn, args.repeat)
        print(json.dumps({"bench": bench, "size": size, "cinders_us": round(c, 2), "numpy_us": round(n, 2),
                          "overhead_us": round(c - n, 2), "ratio": round(c / n, 3)}), flush=True)
    print(json.dumps(erf_vs_tanh(args.repeat)), flush=True)


if __name__ == "__main__":
    main()
