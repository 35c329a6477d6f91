"""cn.Wasm() on the desktop: its engines side by side in one run: the Node child process and the
in-process Wasmtime engine (the same .wasm module), and the native build of the same kernels
(ctypes); eager calls against cn.capture replays.

Prints one JSON line per bench:
    {"bench", "node_us", "wasmtime_us", "native_us", "ratio", "wasmtime_over_native", "load"}
    ratio = node_us / wasmtime_us; load: the 1-minute load average
Timings are best-of-R per-call means over blocks of calls, the engines' blocks interleaved so
all see the same machine load.

    python benchmarks/wasm_engine.py [--repeat 7]
"""

import argparse
import json
import os
import time

import numpy as np

import cinders as cn
from cinders.models.mnist import MnistCNN
from cinders.wasm.engines import NativeEngine, NodeEngine, WasmtimeEngine


def _per_call_us(fn, n):
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e6


def side_by_side(fns, repeat, block_s=0.05):
    """Best per-call time (µs) of each function, measured in alternating blocks."""
    for fn in fns:
        fn()
        fn()
    counts = [max(1, int(block_s / max(_per_call_us(fn, 1) * 1e-6, 1e-7))) for fn in fns]
    best = [float("inf")] * len(fns)
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            best[i] = min(best[i], _per_call_us(fn, counts[i]))
    return best


def cases(backend):
    """name -> function of one engine's backend."""
    x = cn.tensor(np.ones(16, np.float32), backend=backend)
    cn.manual_seed(0)
    model = MnistCNN().to(backend).eval()
    image = cn.tensor(np.random.default_rng(0).random((1, 1, 28, 28), dtype=np.float32),
                      backend=backend)
    fast = cn.capture(model)
    return {
        # one host call into the module and back (a round trip to Node, a native call in-process)
        "engine_call": lambda: backend.engine.call("memory_pages"),
        # one small op computed and read back: the per-op cost a data-dependent loop pays
        "add_16_and_read": lambda: (x + 1.0).tolist(),
        # 100 queued small ops, one flush: the tensor layer's per-op cost
        "add_16_x100_queued": lambda: _chain(x, 100),
        "mnist_cnn_forward_eager": lambda: model(image).tolist(),
        "mnist_cnn_forward_captured": lambda: fast(image).tolist(),
    }


def _chain(x, n):
    for _ in range(n):
        x = x + 1.0
    x.backend.synchronize()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    engines = {"node": cases(cn.Wasm(engine=NodeEngine())),
               "wasmtime": cases(cn.Wasm(engine=WasmtimeEngine())),
               "native": cases(cn.Wasm(engine=NativeEngine()))}
    for name in engines["node"]:
        node_us, wasmtime_us, native_us = side_by_side([e[name] for e in engines.values()], args.repeat)
        print(json.dumps({"bench": name, "node_us": round(node_us, 2), "wasmtime_us": round(wasmtime_us, 2),
                          "native_us": round(native_us, 2), "ratio": round(node_us / wasmtime_us, 2),
                          "wasmtime_over_native": round(wasmtime_us / native_us, 2),
                          "load": round(os.getloadavg()[0], 2)}), flush=True)


if __name__ == "__main__":
    main()
