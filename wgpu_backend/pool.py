"""GPU memory: a pool of device buffers by size class, returned when their last view dies.

A `Storage` owns one device buffer. Tensor handles (views) point at a Storage; when the last
view is garbage collected, `weakref.finalize` hands the buffer back to the pool, where the next
allocation of the same size class reuses it instead of asking the driver (allocation is slow,
and a training step allocates the same sizes every iteration).

Captured programs (core/capture.py) own the buffers their kernels use: while a capture records,
`recording` collects every buffer handed out; `reserve` then takes them out of circulation while
the program lives (a replay writes them again, so nobody else may get them), and
`unreserve_later` hands them back when it dies.
"""

import weakref
from collections import deque

MIN_CLASS = 256


def size_class(nbytes):
    """Powers of two up to 1 MiB, then eighths of a power of two (at most 12.5 % slack)."""
    n = max(nbytes, MIN_CLASS)
    top = 1 << (n - 1).bit_length()
    if n <= 1 << 20:
        return top
    step = top // 8
    return -(-n // step) * step


class Storage:
    """One pooled device buffer; `raw` is the Device's buffer object."""

    __slots__ = ("raw", "nbytes", "__weakref__")

    def __init__(self, raw, nbytes):
        self.raw = raw
        self.nbytes = nbytes


class BufferPool:
    def __init__(self, device):
        self.device = device
        self.limit = device.limits["max_storage_buffer_binding_size"]
        self._free = {}             # size class -> [raw buffers]
        self.allocated_bytes = 0    # held by live storages (size-class bytes)
        self.pooled_bytes = 0       # free in the pool, ready for reuse
        self.peak_bytes = 0         # peak of allocated_bytes
        self.buffers_created = 0
        self.reused = 0             # allocations served from the pool
        self.inplace = 0            # elementwise results written into a dying input's buffer
        self._released = deque()    # (raw, size class) handed back by finalizers, not yet pooled
        self.recording = None       # while a capture records: {id(raw): (raw, launches before)}
        self._reserved = set()      # ids of buffers owned by captured programs
        self._reserved_idle = {}    # id -> (raw, size class): theirs, held by no tensor
        self._unreserved = deque()  # id lists of programs that died (handed back by finalizers)
        self.reserved_bytes = 0

    def allocate(self, nbytes, fresh=False):
        """A Storage of at least nbytes (the caller checked the device limit); fresh: a buffer
        no kernel has used yet (never one from the pool)."""
        cls = min(size_class(nbytes), max(self.limit, nbytes))
        with self.device.lock:
            self._drain_released()
            free = None if fresh else self._free.get(cls)
            if free:
                raw = free.pop()
                self.pooled_bytes -= cls
                self.reused += 1
            else:
                raw = self.device.create_buffer(cls)
                self.buffers_created += 1
            if self.recording is not None and self.device.recording_here() is not None:
                # (the buffer, how many launches preceded it)
                self.recording.setdefault(id(raw), (raw, len(self.device.recording)))
            self.allocated_bytes += cls
            self.peak_bytes = max(self.peak_bytes, self.allocated_bytes)
        storage = Storage(raw, cls)
        weakref.finalize(storage, self._release, raw, cls)
        return storage

    def _release(self, raw, cls):
        # A finalizer: it runs in whatever thread dropped the last reference, wgpu-py's poll
        # thread included, so it must not wait for the lock (the thread holding it may be
        # waiting for that poll thread). deque.append is atomic; the next allocation drains.
        self._released.append((raw, cls))

    def _drain_released(self):
        while self._unreserved:  # programs that died give their buffers back
            for key in self._unreserved.popleft():
                self._reserved.discard(key)
                found = self._reserved_idle.pop(key, None)
                if found is not None:
                    self.reserved_bytes -= found[1]
                    self.pooled_bytes += found[1]
                    self._free.setdefault(found[1], []).append(found[0])
        while self._released:
            raw, cls = self._released.popleft()
            self.allocated_bytes -= cls
            if id(raw) in self._reserved:
                # a captured program's: handed out to no one else while the program lives
                self.reserved_bytes += cls
                self._reserved_idle[id(raw)] = (raw, cls)
                continue
            self.pooled_bytes += cls
            self._free.setdefault(cls, []).append(raw)

    def unreserve_later(self, ids):
        """A captured program died: its buffers return to the pool (at the next allocation;
        safe from a finalizer in any thread)."""
        self._unreserved.append(list(ids))

    def reserve(self, raws):
        """Take these buffers (a captured program's) out of circulation: the free ones now,
        the ones still held by tensors when those let go."""
        with self.device.lock:
            self._drain_released()
            ids = {id(r) for r in raws}
            self._reserved |= ids
            for cls, free in self._free.items():
                kept = [r for r in free if id(r) not in ids]
                taken = len(free) - len(kept)
                if taken:
                    for r in free:
                        if id(r) in ids:
                            self._reserved_idle[id(r)] = (r, cls)
                    free[:] = kept
                    self.pooled_bytes -= cls * taken
                    self.reserved_bytes += cls * taken

    def empty_cache(self):
        """Destroy every pooled (unused) buffer, e.g. before a phase with different shapes."""
        with self.device.lock:
            self._drain_released()
            for buffers in self._free.values():
                for raw in buffers:
                    self.device.destroy_buffer(raw)
            self._free.clear()
            self.pooled_bytes = 0

    def stats(self):
        with self.device.lock:
            self._drain_released()
        return {"allocated_bytes": self.allocated_bytes, "pooled_bytes": self.pooled_bytes,
                "reserved_bytes": self.allocated_bytes + self.pooled_bytes,
                "peak_bytes": self.peak_bytes, "buffers_created": self.buffers_created,
                "captured_bytes": self.reserved_bytes,
                "reused": self.reused, "inplace": self.inplace}
