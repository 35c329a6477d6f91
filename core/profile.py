"""cn.profile: what the backends did inside a `with` block (any backend, any decorator stack).

    with cn.profile(backend) as p:
        y = model(x)
    p.kernel_launches, p.bytes_read, p.bytes_written, p.gpu_time, p.events, p.cache_hits,
    p.device_reads

Backends report events with `record(backend, event)` (a dict with at least "kind" and "name")
while `ACTIVE` is non-empty; the check is one list truth test, so reporting costs nothing when
nobody profiles. Kinds the counters understand:
    "kernel"     one launch; optional "bytes_read", "bytes_written", and "gpu_time" (seconds),
                 which a GPU backend may fill in later (timestamps resolve after submission)
    "compile"    a kernel/pipeline cache miss (it was compiled)
    "cache_hit"  a kernel/pipeline cache hit (counted, not kept in `events`)
    "submit"     one submission of queued GPU work (counted in `submits`, not kept)
    "replay"     a cn.capture replay: "kernels" launches in one submission
    "read"       the host read a tensor's values ("bytes" of them; tolist, item, numpy, to, ...):
                 on a GPU the CPU waits for the device there, and cn.capture refuses it
    "move"       a tensor copied between devices (cn.Router's fallback); counted in `moves`
A profiler of backend B sees the events of B and of every backend B wraps (`B.inner` chain).
Backends may define `profile_start()` / `profile_stop()` (e.g. to turn GPU timestamps on) and
`synchronize()`, which the profiler calls on exit so that timings are complete.
"""

ACTIVE = []


class Profile:
    def __init__(self, backend=None):
        self.backend = backend
        self.chain = []
        while backend is not None:
            self.chain.append(backend)
            backend = backend.inner
        self.events = []
        self.kernel_launches = 0
        self.bytes_read = 0
        self.bytes_written = 0
        self.cache_hits = 0
        self.cache_misses = 0
        self.submits = 0
        self.device_reads = 0
        self.moves = 0

    @property
    def gpu_time(self):
        """Seconds of GPU time of the kernels launched in the block (None: not measurable)."""
        times = [e["gpu_time"] for e in self.events if e.get("gpu_time") is not None]
        return sum(times) if times else None

    def wants(self, backend):
        return not self.chain or any(backend is b or backend == b for b in self.chain)

    def add(self, event):
        kind = event["kind"]
        if kind == "cache_hit":
            self.cache_hits += 1
            return
        if kind == "submit":
            self.submits += 1
            return
        if kind == "replay":
            self.kernel_launches += event["kernels"]
        if kind == "read":
            self.device_reads += 1
        if kind == "move":
            self.moves += 1
        if kind == "compile":
            self.cache_misses += 1
        elif kind == "kernel":
            self.kernel_launches += 1
            self.bytes_read += event.get("bytes_read", 0)
            self.bytes_written += event.get("bytes_written", 0)
        self.events.append(event)

    def __enter__(self):
        for b in self.chain:
            b.profile_start()
        ACTIVE.append(self)
        return self

    def __exit__(self, *exc):
        try:
            for b in self.chain:
                b.synchronize()
        finally:
            ACTIVE.remove(self)
            for b in self.chain:
                b.profile_stop()
        return False

    def __repr__(self):
        return ("Profile(kernel_launches=%d, submits=%d, bytes_read=%d, bytes_written=%d, "
                "gpu_time=%r, cache_hits=%d, cache_misses=%d, device_reads=%d)" % (
                    self.kernel_launches, self.submits, self.bytes_read, self.bytes_written,
                    self.gpu_time, self.cache_hits, self.cache_misses, self.device_reads))


def profile(backend=None):
    """Profile the ops of `backend` (and what it wraps) inside a `with` block; None: all."""
    return Profile(backend)


def record(backend, event):
    """Report an event to every active profiler that watches `backend`; returns the event."""
    event["backend"] = backend.name
    for p in ACTIVE:
        if p.wants(backend):
            p.add(event)
    return event
