"""cn.Remote against the same backend in this process: per-op latency and an MLP forward, over
a `cinders serve-backend` server on 127.0.0.1 (a child process, as users run it). JSON lines.

    .venv/bin/python benchmarks/remote.py [--backend numpy|python|wgpu] [--repeat 200] [--out F]

Rows (one per measure and side, then a ratio row remote / local):
  op_pipelined_us   a chain of --repeat elementwise ops on 1,024 floats, then one read,
                    per op: what pipelining costs per op (no round trip per op)
  op_roundtrip_us   one op and a read of its 4-byte result, every time: one round trip
  matmul_us         a 256x256 matmul and a read of one value from it
  read_1mb_ms       reading 1 MiB of float32 (to_flat)
  mlp_forward_ms    MnistMLP forward on 64 images, logits read back
  captured_forward_ms  the same forward through cn.capture (after its three recording calls):
                    local NumPy runs it uncaptured (nothing to record), local Wgpu replays its
                    launches; a Remote replays it on the server, one message per call
The server is `python -m cinders serve-backend` run by this interpreter (sys.executable) with
this process's environment and working directory: a cinders installed on PYTHONPATH (a wheel
unpacked into /tmp/site, say) is the one the server imports too.
"""

import argparse
import json
import os
import re
import secrets
import statistics
import subprocess
import sys
import time

import cinders as cn
from cinders.models.mnist import MnistMLP


def emit(row, out):
    line = json.dumps(row, sort_keys=True)
    print(line, flush=True)
    if out:
        with open(out, "a") as f:
            f.write(line + "\n")


def timed(fn, repeat):
    fn()  # warm: constants cached, kernels compiled
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measures(backend, repeat):
    x = cn.random((1024,), backend=backend, seed=1)
    one = cn.tensor([1.0], backend=backend)
    a = cn.random((256, 256), backend=backend, seed=2)
    big = cn.random((1 << 18,), backend=backend, seed=3)
    cn.manual_seed(0)
    model = MnistMLP().to(backend).eval()
    images = cn.random((64, 1, 28, 28), backend=backend, seed=4)

    def chain():
        y = x
        for _ in range(repeat):
            y = y * 1.0001
        y[:1].tolist()

    rows = {
        "op_pipelined_us": timed(chain, 5) / repeat * 1e6,
        "op_roundtrip_us": timed(lambda: (one + 1.0).tolist(), repeat) * 1e6,
        "matmul_us": timed(lambda: (a @ a)[0, :1].tolist(), max(repeat // 10, 5)) * 1e6,
        "read_1mb_ms": timed(lambda: big.tolist(), 10) * 1e3,
        "mlp_forward_ms": timed(lambda: model(images).tolist(), max(repeat // 10, 5)) * 1e3,
    }
    fast = cn.capture(model)
    for _ in range(3):
        fast(images).tolist()
    rows["captured_forward_ms"] = timed(lambda: fast(images).tolist(), max(repeat // 10, 5)) * 1e3
    return rows


def serve(backend_name, token, options=()):
    """`cinders serve-backend` in a child process of this interpreter, with this process's
    environment (PYTHONPATH included: cinders may be installed as a wheel on a path of it) and
    working directory, so the child imports the cinders this process imported. Returns the
    child and its URL. (benchmarks/data_parallel.py --remote starts its servers here too.)"""
    env = dict(os.environ, CINDERS_REMOTE_TOKEN=token)
    child = subprocess.Popen([sys.executable, "-m", "cinders", "serve-backend", "--backend", backend_name,
                              "--port", "0", *options], env=env, stdout=subprocess.PIPE, text=True)
    line = child.stdout.readline()
    found = re.search(r"ws://127\.0\.0\.1:\d+", line)
    if found is None:
        child.kill()
        raise SystemExit("benchmarks/remote.py: the serve-backend child (%s -m cinders) printed %r and exited "
                         "with %s; its errors are above" % (sys.executable, line, child.wait(10)))
    return child, found.group(0)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="numpy", choices=["numpy", "python", "wgpu"])
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--out")
    args = parser.parse_args()
    local = {"numpy": cn.NumPy, "python": cn.Python, "wgpu": lambda: cn.Wgpu()}[args.backend]()
    token = secrets.token_hex(16)
    child, url = serve(args.backend, token)
    try:
        sides = {"local": measures(local, args.repeat),
                 "remote": measures(cn.Remote(url, token=token), args.repeat)}
    finally:
        child.terminate()
        child.wait(10)
    for name in sides["local"]:
        for side, rows in sides.items():
            emit({"bench": "remote", "backend": args.backend, "device": repr(local), "side": side, "measure": name,
                  "value": round(rows[name], 3)}, args.out)
        emit({"bench": "remote", "backend": args.backend, "measure": name, "ratio_remote_over_local":
              round(sides["remote"][name] / sides["local"][name], 2)}, args.out)


if __name__ == "__main__":
    main()
