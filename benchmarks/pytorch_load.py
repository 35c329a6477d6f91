"""Loading a ~100 MB PyTorch checkpoint: cinders.record.load_pytorch against
torch.load(weights_only=True) on the same file, side by side.

Prints JSON lines:
    {"bench": "pytorch_load", "loader", "file_mb", "tensors", "best_s", "median_s", "peak_rss_mb", "peak_vs_file"}
    {"bench": "pytorch_load_ratio", "time_ratio" (cinders / torch, best of R), "median_time_ratio",
     "cinders_peak_vs_file", ...}
Each loader runs in its own fresh interpreter (imports done before the clock starts), R times
alternating with the other, so both see the same page cache and machine load. Peak memory is the
child's peak resident set (VmHWM) minus its resident set just before loading, i.e. what loading
the file added at its worst; the issue's bound is 2x the file size.

    python benchmarks/pytorch_load.py [--mb 100] [--repeat 5] [--layout zip|legacy]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import json, sys, time
layout_loader, path = sys.argv[1], sys.argv[2]
if layout_loader == "torch":
    import torch
    load = lambda: torch.load(path, weights_only=True)
else:
    import cinders as cn
    from cinders.record import load_pytorch
    backend = cn.NumPy()
    load = lambda: load_pytorch(path, backend=backend)
def status_mb(field):  # VmHWM, not ru_maxrss: ru_maxrss keeps the parent's peak across exec
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith(field + ":")) / 1024
before = status_mb("VmRSS")
start = time.perf_counter()
state = load()
seconds = time.perf_counter() - start
peak = status_mb("VmHWM")
print(json.dumps({"seconds": seconds, "peak_added_mb": peak - before, "tensors": len(state)}))
"""


def make_checkpoint(path, mb, layout):
    """A ResNet-like state dict of ~mb MB: conv/linear weights, BatchNorm buffers (int64
    num_batches_tracked included), seeded."""
    import torch
    torch.manual_seed(0)
    state, total, i = {}, 0, 0
    while total < mb * 1e6:
        channels = 64 * (1 + i % 8)
        state["layer%d.conv.weight" % i] = torch.randn(channels, channels, 3, 3)
        state["layer%d.bn.weight" % i] = torch.randn(channels)
        state["layer%d.bn.running_var" % i] = torch.rand(channels)
        state["layer%d.bn.num_batches_tracked" % i] = torch.tensor(100)
        total += channels * channels * 9 * 4 + channels * 8 + 8
        i += 1
    torch.save(state, path, _use_new_zipfile_serialization=layout == "zip")
    return len(state)


def run_child(loader, path):
    out = subprocess.run([sys.executable, "-c", CHILD, loader, path], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=100)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--layout", choices=["zip", "legacy"], default="zip")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "checkpoint.pt")
        tensors = make_checkpoint(path, args.mb, args.layout)
        file_mb = os.path.getsize(path) / 2 ** 20
        runs = {"torch": [], "cinders": []}
        run_child("torch", path), run_child("cinders", path)  # warm the page cache
        for _ in range(args.repeat):
            for loader in runs:
                runs[loader].append(run_child(loader, path))
    summary = {}
    for loader, results in runs.items():
        seconds = [r["seconds"] for r in results]
        peak = max(r["peak_added_mb"] for r in results)
        summary[loader] = (min(seconds), peak, statistics.median(seconds))
        print(json.dumps({"bench": "pytorch_load", "layout": args.layout,
                          "loader": ("torch.load(weights_only=True)" if loader == "torch"
                                     else "cinders load_pytorch (NumPy)"),
                          "file_mb": round(file_mb, 1), "tensors": tensors, "best_s": round(min(seconds), 4),
                          "median_s": round(statistics.median(seconds), 4), "peak_rss_mb": round(peak, 1),
                          "peak_vs_file": round(peak / file_mb, 2)}), flush=True)
    print(json.dumps({"bench": "pytorch_load_ratio", "layout": args.layout, "file_mb": round(file_mb, 1),
                      "time_ratio": round(summary["cinders"][0] / summary["torch"][0], 2),
                      "median_time_ratio": round(summary["cinders"][2] / summary["torch"][2], 2), "time_bound": 1.5,
                      "cinders_peak_vs_file": round(summary["cinders"][1] / file_mb, 2), "memory_bound": 2.0,
                      "repeat": args.repeat}), flush=True)


if __name__ == "__main__":
    main()
