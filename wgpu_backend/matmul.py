"""Matmul kernel selection: the tilings of the matmul templates (codegen/matmul.py), a heuristic,
and autotuning.

Autotune: on the first matmul of a (device, shape class) the applicable variants run a few
times each, the heuristic's choice first, and the fastest is remembered, in memory and on disk
($CINDERS_CACHE or ~/.cache/cinders, file autotune.json: {device name: {shape class: variant}}),
so later processes skip the search. The search of one shape class stops starting new variants
after TUNE_BUDGET seconds, and says what it is doing on stderr once it has taken more than
PROGRESS_AFTER seconds (a model's first run may tune a dozen shape classes). Small products are
never tuned (launch overhead dominates; the heuristic is as good). Whether to tune at all is
the backend's choice (cn.Wgpu(autotune=...): by default not on software adapters, where a
search is slow and the heuristic was measured).
"""

import json
import os
import sys
import time
from collections import namedtuple


class Tiling(namedtuple("Tiling", "bm bn bk tm tn split_k lanes_x pad_a")):
    """One matmul kernel: a bm x bn tile of C per workgroup, tm x tn of it per thread, K in
    bk-deep steps through shared memory (bk == 0: none, codegen/matmul.py matmul_direct_wgsl); split_k:
    K in chunks over the grid's z plus a sum. lanes_x > 0 selects the register-tiled,
    double-buffered kernel (matmul_regtile_wgsl: a warp spans lanes_x thread columns;
    pad_a pads its shared rows of A), else matmul_wgsl."""

    def shared_bytes(self):
        if self.lanes_x:
            return 2 * 16 * self.bk * (self.bm // 4 + self.pad_a + self.bn // 4)
        return 4 * self.bk * (self.bm + self.bn)


def _t(bm, bn, bk, tm, tn, split_k=False, lanes_x=0, pad_a=0):
    return Tiling(bm, bn, bk, tm, tn, split_k, lanes_x, pad_a)


VARIANTS = {
    "direct": _t(16, 16, 0, 1, 1),           # no barriers: fastest on CPU adapters
    "direct2x2": _t(32, 32, 0, 2, 2),
    "splitk_direct": _t(16, 16, 0, 1, 1, True),
    "rows_direct": _t(1, 64, 0, 1, 1),       # one row per workgroup: matrix-vector products
    "splitk_rows_direct": _t(1, 64, 0, 1, 1, True),
    "tile16": _t(16, 16, 16, 1, 1),          # shared-memory tiles, one output per thread
    "block64": _t(64, 64, 8, 4, 4),          # 4x4 register blocks, vec4 over columns
    "block128": _t(128, 128, 8, 8, 8),       # 8x8 register blocks (two vec4 per row)
    "block128k16": _t(128, 128, 16, 8, 8),   # the same, half as many barriers per K
    "splitk64": _t(64, 64, 8, 4, 4, True),   # block64 over K chunks + a sum: tall-skinny
    # vec4 shared reads of A and B, double-buffered: the GPU kernels (H200, fp32 vs PyTorch with
    # TF32 off: reg128x256 ~0.77 at 4096^2, ~0.73 at 2048^2; reg128x64 ~0.6 at 1024^2)
    "reg128x256": _t(128, 256, 8, 8, 16, lanes_x=8, pad_a=1),  # the largest products
    "reg128k16": _t(128, 128, 16, 8, 8, lanes_x=16),           # 32 KiB of shared memory
    "reg128x64": _t(128, 64, 16, 8, 4, lanes_x=8),             # more workgroups: mid sizes
    "reg64": _t(64, 64, 16, 4, 4, lanes_x=8, pad_a=1),
    # Narrow tiles (also the convolution's, wgpu_backend/conv.py): twice the workgroups of
    # reg128x64 on mid sizes, within WebGPU's default 16 KiB of workgroup memory.
    "reg64x128": _t(64, 128, 8, 8, 8, lanes_x=16),
    "reg64x64": _t(64, 64, 16, 4, 8, lanes_x=8),
}
TUNE_MIN_FLOPS = 1 << 21
TUNE_SECONDS = 0.01   # timed per variant while tuning
TUNE_BUDGET = 3.0     # seconds per shape class after which no further variant is started
PROGRESS_AFTER = 1.0  # seconds of tuning after which progress goes to stderr


def heuristic(m, n, k, batch, cpu=False, shared_limit=32768):
    """The variant to use without tuning (measured on lavapipe for cpu; tile sizes for GPUs,
    with the reg* kernels where the device has the workgroup memory they need)."""
    choice = _heuristic(m, n, k, batch, cpu)
    return choice if VARIANTS[choice].shared_bytes() <= shared_limit else "block64"


def _heuristic(m, n, k, batch, cpu):
    if m <= 4:  # matrix-vector products (batch-1 linear layers)
        return "splitk_rows_direct" if k >= 1024 and not cpu and n * batch <= 4096 else "rows_direct"
    if cpu:  # lavapipe, SwiftShader: big register tiles win, barriers cost little per FMA
        return "block128" if m * n * batch >= 128 * 128 else "direct2x2"
    if m * n * batch <= 64 * 64 * 4 and k >= 1024:
        return "splitk64"
    if m >= 128 and n >= 256 and m * n * batch >= 2048 * 2048:  # ~128 tiles: fill an H100/H200
        return "reg128x256"
    if m >= 128 and n >= 64 and m * n * batch >= 512 * 512:
        return "reg128x64"
    if m >= 64 and n >= 64:
        return "reg64"
    return "tile16"


def split_count(m, n, k, batch, bm=64, bn=64):
    """K chunks for split-K: enough workgroups to fill a GPU, chunks of at least 256."""
    tiles = -(-m // bm) * -(-n // bn) * batch
    return max(2, min(32, k // 256, max(1, 256 // tiles)))


def shape_class(m, n, k, batch):
    def bucket(v):
        return 1 << max(0, (v - 1).bit_length())
    return "m%d_n%d_k%d_b%d" % (bucket(m), bucket(n), bucket(k), bucket(batch))


def cache_path():
    root = os.environ.get("CINDERS_CACHE") or os.path.join(os.path.expanduser("~"), ".cache",
                                                          "cinders")
    return os.path.join(root, "autotune.json")


class Tuner:
    """Per-device choice of matmul variant."""

    def __init__(self, device_name, shared_limit=32768):
        self.device_name = device_name
        self.shared_limit = shared_limit  # bytes of workgroup memory (the heuristic's bound)
        self.chosen = None  # shape class -> variant, loaded lazily from disk

    def _load(self):
        try:
            with open(cache_path()) as f:
                data = json.load(f)
            mine = data.get(self.device_name, {})
            self.chosen = {k: v for k, v in mine.items() if v in VARIANTS}
        except (OSError, ValueError, AttributeError):
            self.chosen = {}

    def _save(self):
        path = cache_path()
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            try:
                with open(path) as f:
                    data = json.load(f)
                if not isinstance(data, dict):
                    data = {}
            except (OSError, ValueError):
                data = {}
            data[self.device_name] = self.chosen
            tmp = path + ".%d.tmp" % os.getpid()
            with open(tmp, "w") as f:
                json.dump(data, f, indent=1, sort_keys=True)
            os.replace(tmp, path)
        except OSError:
            pass  # a read-only home (or the browser) only loses the disk cache

    def select(self, m, n, k, batch, autotune, run, wait, cpu=False):
        """The variant for this product. run(variant) launches it once; wait() blocks until
        the device is idle (used only while tuning)."""
        if not autotune or m * n * k * batch < TUNE_MIN_FLOPS:
            return heuristic(m, n, k, batch, cpu, self.shared_limit)
        if self.chosen is None:
            self._load()
        key = shape_class(m, n, k, batch)
        found = self.chosen.get(key)
        if found is not None:
            return found
        first = heuristic(m, n, k, batch, cpu, self.shared_limit)
        candidates = [first] + [name for name in VARIANTS if name != first and
                                self._may_win(name, m, k)]
        timings, start = {}, time.perf_counter()
        for done, name in enumerate(candidates):
            if timings and time.perf_counter() - start > TUNE_BUDGET:
                break
            seconds = self._time(name, run, wait)
            if seconds is not None:
                timings[name] = seconds
            elapsed = time.perf_counter() - start
            if elapsed > PROGRESS_AFTER:
                sys.stderr.write("cinders: autotuning matmul %s on %s: %d/%d variants, %.1f s "
                                 "(cn.Wgpu(autotune=False) skips this)\n"
                                 % (key, self.device_name, done + 1, len(candidates), elapsed))
                sys.stderr.flush()
        if not timings:
            return first  # no variant fits this device: the heuristic's raises the clear error
        best = min(timings, key=timings.get)
        self.chosen[key] = best
        self._save()
        return best

    @staticmethod
    def _may_win(name, m, k):
        bm, split_k = VARIANTS[name][0], VARIANTS[name][5]
        # nothing to split, or one-row tiles on a tall matrix
        return not ((split_k and k < 512) or (bm == 1 and m > 16))

    @staticmethod
    def _time(name, run, wait):
        """Seconds per run of variant `name`, or None where the device cannot run it."""
        try:
            run(name)  # compile and warm up
        except MemoryError:  # DeviceLimitError: too many workgroups or too much shared memory
            return None
        wait()
        start = time.perf_counter()
        run(name)
        wait()
        once = time.perf_counter() - start
        if once >= TUNE_SECONDS:
            return once  # slow enough to measure in one run (and to keep the search short)
        # Enough back-to-back runs for ~TUNE_SECONDS: fast kernels differ by less than one
        # synchronisation costs, so a few runs would pick among them at random.
        reps = max(2, min(20, int(TUNE_SECONDS / max(once, 1e-6))))
        start = time.perf_counter()
        for _ in range(reps):
            run(name)
        wait()
        return (time.perf_counter() - start) / reps
