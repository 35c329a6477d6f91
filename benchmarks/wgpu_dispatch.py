"""Host cost of one cn.Wgpu() launch: CPU time of the calling thread per plain op (recording,
bindings, parameters, submit), on tiny tensors so the device's own work does not count.

Prints one JSON line per op:
    {"bench": "wgpu_dispatch", "op", "host_us", "device"}
host_us is the best of R blocks of thread CPU time per call (time.thread_time: lavapipe's own
worker threads are not counted). Run it in two checkouts to compare them on one machine.

    python benchmarks/wgpu_dispatch.py [--repeat 5] [--calls 3000]
"""

import argparse
import json
import time

import numpy as np

import cinders as cn


def host_us(backend, fn, calls, repeat):
    for _ in range(200):
        fn()
    backend.synchronize()
    best = float("inf")
    for _ in range(repeat):
        start = time.thread_time()
        for _ in range(calls):
            fn()
        backend.synchronize()
        best = min(best, (time.thread_time() - start) / calls * 1e6)
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--calls", type=int, default=3000)
    args = parser.parse_args()
    b = cn.Wgpu(autotune=False)
    x = b.from_flat(np.ones(16, np.float32).tolist(), (4, 4), cn.float32)
    row = b.reshape(b.from_flat([1.0] * 4, (4,), cn.float32), (1, 4))
    cases = {
        "unary_exp": lambda: b.unary("exp", x),
        "binary_add_broadcast": lambda: b.binary("add", x, row),
        "reduce_sum": lambda: b.reduce("sum", x, 1, False),
        "argmax": lambda: b.reduce("argmax", x, 1, False),
    }
    for op, fn in cases.items():
        print(json.dumps({"bench": "wgpu_dispatch", "op": op, "device": b.device.name,
                          "host_us": round(host_us(b, fn, args.calls, args.repeat), 1)}))


if __name__ == "__main__":
    main()
