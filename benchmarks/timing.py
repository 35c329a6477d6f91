"""The one timing rule the benchmarks share: warm up, then the median of `repeat` runs, in ms."""
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


def interleaved_median_ms(runs, repeat, warm=2):
    """{key: median ms} of several `run()`s timed in turns (one call of each per round), so that
    every one of them sees the same machine load: the side-by-side rule for ratios measured on a
    shared machine."""
    for run in runs.values():
        for _ in range(warm):
            run()
    times = {key: [] for key in runs}
    for _ in range(repeat):
        for key, run in runs.items():
            start = time.perf_counter()
            run()
            times[key].append((time.perf_counter() - start) * 1e3)
    return {key: statistics.median(t) for key, t in times.items()}
