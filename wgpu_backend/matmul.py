"""Matmul kernel selection: the variants of codegen.matmul_wgsl, a heuristic, and autotuning.

Autotune: on the first matmul of a (device, shape class) every applicable variant runs a few
times and the fastest is remembered, in memory and on disk ($CINDERS_CACHE or ~/.cache/cinders,
file autotune.json: {device name: {shape class: variant}}), so later processes skip the search.
Small products are never tuned (launch overhead dominates; the heuristic is as good).
"""

import json
import os
import time

# name: (bm, bn, bk, tm, tn, split_k); bk == 0: no shared memory (codegen.matmul_direct_wgsl)
VARIANTS = {
    "direct": (16, 16, 0, 1, 1, False),      # no barriers: fastest on CPU adapters
    "direct2x2": (32, 32, 0, 2, 2, False),
    "splitk_direct": (16, 16, 0, 1, 1, True),
    "rows_direct": (1, 64, 0, 1, 1, False),     # one row per workgroup: matrix-vector products
    "splitk_rows_direct": (1, 64, 0, 1, 1, True),
    "tile16": (16, 16, 16, 1, 1, False),     # shared-memory tiles, one output per thread
    "block64": (64, 64, 8, 4, 4, False),     # 4x4 register blocks, vec4 over columns
    "block128": (128, 128, 8, 8, 8, False),  # 8x8 register blocks (two vec4 per row)
    "block128k16": (128, 128, 16, 8, 8, False),  # the same, half as many barriers per K
    "splitk64": (64, 64, 8, 4, 4, True),     # block64 over K chunks + a sum: tall-skinny
}
TUNE_MIN_FLOPS = 1 << 21


def heuristic(m, n, k, batch, cpu=False):
    """The variant to use without tuning (measured on lavapipe for cpu; tile sizes for GPUs)."""
    if m <= 4:  # matrix-vector products (batch-1 linear layers)
        return "splitk_rows_direct" if k >= 1024 and not cpu and n * batch <= 4096 else "rows_direct"
    if cpu:  # lavapipe, SwiftShader: big register tiles win, barriers cost little per FMA
        return "block128" if m * n * batch >= 128 * 128 else "direct2x2"
    if m * n * batch <= 64 * 64 * 4 and k >= 1024:
        return "splitk64"
    if m >= 512 and n >= 512:
        return "block128"
    if m >= 64 and n >= 64:
        return "block64"
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

    def __init__(self, device_name):
        self.device_name = device_name
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
            return heuristic(m, n, k, batch, cpu)
        if self.chosen is None:
            self._load()
        key = shape_class(m, n, k, batch)
        found = self.chosen.get(key)
        if found is not None:
            return found
        timings = {}
        for name in VARIANTS:
            bm, split_k = VARIANTS[name][0], VARIANTS[name][5]
            if (split_k and k < 512) or (bm == 1 and m > 16):
                continue  # cannot win: nothing to split, or one-row tiles on a tall matrix
            try:
                run(name)  # compile and warm up
            except MemoryError:  # DeviceLimitError: this tiling needs too many workgroups
                continue
            wait()
            start = time.perf_counter()
            for _ in range(3):
                run(name)
            wait()
            timings[name] = time.perf_counter() - start
        best = min(timings, key=timings.get)
        self.chosen[key] = best
        self._save()
        return best
