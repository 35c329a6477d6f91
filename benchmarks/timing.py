"""The timing rules the benchmarks share: warm up, then the median of `repeat` runs, in ms; and
where a GPU spends a forward pass, by kernel; and torch's CUDA context before the GPU is timed."""
import collections
import statistics
import time


def median_ms(run, repeat, warm=2):
    """Median wall time of `run()` in milliseconds after `warm` untimed calls (kernels compiled,
    pools filled, autotune done: the state of a running app)."""
    for _ in range(warm):
        run()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def interleaved_median_ms(runs, repeat, warm=2, self_timed=False):
    """{key: median ms} of several `run()`s timed in turns (one call of each per round), so that
    every one of them sees the same machine load: the side-by-side rule for ratios measured on a
    shared machine. self_timed: each run() returns its own ms (a call into a browser page timed
    by the page's clock, without the driver's round trip), instead of being timed here."""
    for run in runs.values():
        for _ in range(warm):
            run()
    times = {key: [] for key in runs}
    for _ in range(repeat):
        for key, run in runs.items():
            start = time.perf_counter()
            ms = run()
            times[key].append(ms if self_timed else (time.perf_counter() - start) * 1e3)
    return {key: statistics.median(t) for key, t in times.items()}


def kernel_table(profile, top=12):
    """GPU time of a `cn.profile` block by kernel name, most expensive first:
    (total GPU ms, [[name, launches, GPU ms], ...] of the `top` names). Needs a backend with
    GPU timestamps (cn.Wgpu() on an adapter with timestamp-query)."""
    launches, seconds = collections.Counter(), collections.Counter()
    for event in profile.events:
        if event["kind"] == "kernel":
            launches[event["name"]] += 1
            seconds[event["name"]] += event.get("gpu_time") or 0.0
    rows = [[name, launches[name], round(s * 1e3, 4)] for name, s in seconds.most_common(top)]
    return round(sum(seconds.values()) * 1e3, 4), rows


def torch_cuda_context():
    """Give an imported torch its CUDA context before cn.Wgpu is timed. Measured on the lent
    H200 (torch 2.11+cu130, wgpu on NVIDIA's Vulkan driver): after `import torch`, and until
    torch creates a CUDA context, cn.Wgpu's kernels ran 5.7x slower in GPU time (a 512-channel
    3x3 conv: 318 -> 1810 us; loading libcuda and cuInit alone did not do it; a CUDA tensor
    undid it). Benchmarks that import torch only to export models call this; those that run
    torch on CUDA already make the context."""
    import sys
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.zeros(1, device="cuda")
