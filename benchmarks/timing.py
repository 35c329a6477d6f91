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
