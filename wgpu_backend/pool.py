"""GPU memory: a pool of device buffers by size class, returned when their last view dies.

A `Storage` owns one device buffer. Tensor handles (views) point at a Storage; when the last
view is garbage collected, the Storage hands its buffer back to the pool, where the next
allocation of the same size class reuses it instead of asking the driver (allocation is slow,
and a training step allocates the same sizes every iteration).

Captured programs (core/capture.py) own the buffers their kernels use: while a thread records,
its Recording (device.py) notes every buffer handed out to it; `reserve` then takes them out of circulation while
the program lives (a replay writes them again, so nobody else may get them), and
`unreserve_later` hands them back when it dies.

In-place results ("placement"). An elementwise kernel may write its result into the buffer of
an input that nobody can read afterwards: `((x + 1) * 2).exp()` needs one buffer, not three.
Whether an input is still wanted is known for certain only once the caller has dropped it, and
Python drops a temporary operand as soon as the op returns. So the result of the *last* recorded
launch stays unplaced (a Storage without a buffer, its launch's output binding empty) until the
next allocation or launch, the submit of the batch, or a request for its buffer (`Storage.raw`).
Then `Placement.place` looks for a candidate input whose buffer is back in the pool: that input
died meanwhile, and no one took its buffer since (every allocation settles the open placement
first), so nothing reads it after this launch; the result takes it through the kernel's in-place
variant. Otherwise the result gets a buffer as usual. Liveness is the storage's own (every view
of it gone), so no reference counting, Python frame or backend above this one takes part:
Autodiff's backward reuses buffers the same way, and so do Fusion's flat groups with one output
(programs.py: every elementwise result is a flat Program; a dead leaf's buffer).
"""

from collections import deque

from cinders.errors import CindersError

MIN_CLASS = 256


def size_class(nbytes):
    """Powers of two up to 1 MiB, then eighths of a power of two (at most 12.5 % slack)."""
    n = max(nbytes, MIN_CLASS)
    top = 1 << (n - 1).bit_length()
    if n <= 1 << 20:
        return top
    step = top // 8
    return -(-n // step) * step


def _position(free, raw):
    """Where this very buffer sits in a free list, or -1 (a dead donor is usually last in)."""
    for k in range(len(free) - 1, -1, -1):
        if free[k] is raw:
            return k
    return -1


class ResultLostError(CindersError, RuntimeError):
    """The kernel computing this tensor never ran: finding its buffer failed (the error
    raised then says why). Compute the tensor again."""


class Storage:
    """One pooled device buffer; `raw` is the Device's buffer object. An unplaced result's
    buffer is chosen when first asked for (see "In-place results" above)."""

    __slots__ = ("_raw", "nbytes", "_pool")

    def __init__(self, raw, nbytes, pool):
        self._raw = raw
        self.nbytes = nbytes
        self._pool = pool

    @property
    def raw(self):
        if self._raw is None:
            self._pool.device.settle()
            if self._raw is None:
                raise ResultLostError(ResultLostError.__doc__)
        return self._raw

    def __del__(self):
        # The last view is gone. This runs in whatever thread dropped the last reference,
        # wgpu-py's poll thread included, so it must not wait for the pool's lock (the thread
        # holding it may be waiting for that poll thread): deque.append is atomic, and the next
        # allocation drains the deque.
        if self._raw is not None:
            self._pool._released.append((self._raw, self.nbytes))


class Placement:
    """The result of the last recorded elementwise launch, not placed yet.
    donors: [(input index, raw, size class)] inputs whose buffer may take the result (contiguous,
    same shape and dtype, not bound twice); in_place(index): that kernel's in-place pipeline;
    dispatch: the recorded launch (its last buffer, the output, is None until placed)."""

    __slots__ = ("pool", "storage", "donors", "in_place", "dispatch")

    def __init__(self, pool, storage, donors, in_place):
        self.pool, self.storage, self.donors, self.in_place = pool, storage, donors, in_place
        self.dispatch = None

    def place(self):
        """Give the result its buffer, a dead donor's when there is one (the Device calls this
        under its lock); returns the buffer."""
        return self.pool._place(self)


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
        self.inplace = 0            # elementwise results written into a dead input's buffer
        self.inplace_bytes = 0      # ... and the bytes (size classes) those results saved
        self._held = {}             # id -> raw of every buffer a Storage holds
        self._released = deque()    # (raw, size class) handed back by dead storages, not yet pooled
        self._reserved = set()      # ids of buffers owned by captured programs
        self._reserved_idle = {}    # id -> (raw, size class): theirs, held by no tensor
        self._unreserved = deque()  # id lists of programs that died (handed back by finalizers)
        self.reserved_bytes = 0
        self._pinned = set()        # ids of buffers uploaded into while a thread records
        self._pinned_idle = {}      # id -> (raw, size class): pinned ones their tensor let go of

    def allocate(self, nbytes, fresh=False):
        """A Storage of at least nbytes (the caller checked the device limit); fresh: a buffer
        no kernel has used yet (never one from the pool)."""
        cls = self._class(nbytes)
        with self.device.lock:
            if self.device.open_placement is not None:  # it may want a buffer that is pooled now
                self.device.settle()
            if self._released or self._unreserved:
                self._drain_released()
            raw = self._take(cls, fresh)
            recording = self.device.recording_here()
            if recording is not None:  # (the buffer, how many launches preceded it)
                recording.allocated.setdefault(id(raw), (raw, len(recording.launches)))
            self._hand_out(raw, cls)
        return Storage(raw, cls, self)

    def unplaced(self, nbytes):
        """A Storage for the result of the launch about to be recorded with a Placement."""
        return Storage(None, self._class(nbytes), self)

    def _class(self, nbytes):
        return min(size_class(nbytes), max(self.limit, nbytes))

    def _take(self, cls, fresh=False, avoid=()):
        """A buffer of size class cls: a pooled one (none of `avoid`) or a new one."""
        free = None if fresh else self._free.get(cls)
        if free:
            k = len(free) - 1
            while k >= 0 and free[k] in avoid:  # (buffers compare by identity)
                k -= 1
            if k >= 0:
                self.pooled_bytes -= cls
                self.reused += 1
                return free.pop(k)
        self.buffers_created += 1
        return self.device.create_buffer(cls)

    def _hand_out(self, raw, cls):
        # The pool holds every buffer it hands out: a Storage dying as cyclic garbage must never
        # take its buffer with it (the collector finalizes a cycle's objects in any order).
        self._held[id(raw)] = raw
        self.allocated_bytes += cls
        self.peak_bytes = max(self.peak_bytes, self.allocated_bytes)

    def _place(self, placement):
        # Nothing changes until everything that can fail (an in-place compile, a new buffer)
        # has succeeded: a failure leaves the pool as it was (Device.settle drops the launch).
        if self._released or self._unreserved:
            self._drain_released()
        dispatch, storage = placement.dispatch, placement.storage
        for index, raw, cls in placement.donors:
            free = self._free.get(cls)
            position = _position(free, raw) if free else -1
            if position >= 0:
                pipeline = placement.in_place(index)
                del free[position]
                self.pooled_bytes -= cls
                dispatch.pipeline = pipeline
                dispatch.buffers = dispatch.buffers[:-1]  # the output binding goes
                self.inplace += 1
                self.inplace_bytes += cls
                break
        else:
            # The launch is the last one recorded, so every pooled buffer's last reader comes
            # before it, except its own inputs.
            cls = storage.nbytes
            raw = dispatch.buffers[-1] = self._take(cls, avoid=dispatch.buffers)
        self._hand_out(raw, cls)
        storage._raw, storage.nbytes = raw, cls
        placement.storage = placement.dispatch = None
        return raw

    def _drain_released(self):
        while self._unreserved:  # programs that died give their buffers back
            for key in self._unreserved.popleft():
                self._reserved.discard(key)
                found = self._reserved_idle.pop(key, None)
                if found is not None:
                    self.reserved_bytes -= found[1]
                    self._pool_buffer(*found)
        while self._released:
            raw, cls = self._released.popleft()
            del self._held[id(raw)]
            self.allocated_bytes -= cls
            if id(raw) in self._reserved:
                # a captured program's: handed out to no one else while the program lives
                self.reserved_bytes += cls
                self._reserved_idle[id(raw)] = (raw, cls)
                continue
            if id(raw) in self._pinned:
                self._pinned_idle[id(raw)] = (raw, cls)
                continue
            self._pool_buffer(raw, cls)

    def pin(self, raw):
        """Keep `raw` out of the pool until unpin: the host wrote data into it during a recording
        (a tensor made from a list inside a captured function, e.g. gather indices). A replay
        runs only the recorded kernels, so no later kernel of the same recording may reuse it as
        an output after its tensor dies; kept out until the program reserves it (capture.keep)."""
        with self.device.lock:
            self._pinned.add(id(raw))

    def unpin(self, raws):
        with self.device.lock:
            for raw in raws:
                self._pinned.discard(id(raw))
                found = self._pinned_idle.pop(id(raw), None)
                if found is not None:
                    self._pool_buffer(*found)

    def _pool_buffer(self, raw, cls):
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
            self.device.settle()
            self._drain_released()
            for buffers in self._free.values():
                for raw in buffers:
                    self.device.destroy_buffer(raw)
            self._free.clear()
            self.pooled_bytes = 0

    def stats(self):
        with self.device.lock:
            self.device.settle()
            self._drain_released()
        return {"allocated_bytes": self.allocated_bytes, "pooled_bytes": self.pooled_bytes,
                "reserved_bytes": self.allocated_bytes + self.pooled_bytes,
                "peak_bytes": self.peak_bytes, "buffers_created": self.buffers_created,
                "captured_bytes": self.reserved_bytes,
                "reused": self.reused, "inplace": self.inplace, "inplace_bytes": self.inplace_bytes}
