"""The device interface: the narrow waist between the Wgpu backend and a WebGPU implementation.

Everything above this file (codegen, pool, backend) speaks only to `Device`; nothing above it
imports wgpu. Two implementations exist or are planned:

    desktop.py   wgpu-py (Vulkan / Metal / DX12), synchronous and asynchronous readback
    browser      Pyodide's js.navigator.gpu (asynchronous readback only, unless JSPI)

What an implementation provides (the abstract methods below, all small):

    _create_buffer(nbytes) -> raw       a STORAGE | COPY_SRC | COPY_DST buffer (contents undefined)
    _destroy_buffer(raw)
    _write_buffer(raw, offset, data)    queue-ordered upload (WebGPU queue.writeBuffer)
    _compile(wgsl) -> pipeline          one compute pipeline, entry point `main`, layout "auto"
    _submit(dispatches, params, timed)  encode the recorded dispatches into ONE command encoder
                                        and submit; returns a token for `_timings` (or None)
    _timings(token) -> [seconds]        GPU time of each dispatch of a timed submit (blocking)
    _read_buffer(raw, offset, nbytes) -> bytes-like  blocking readback (a private copy)
    async _read_buffer_async(raw, offset, nbytes) -> bytes
    _prepare(dispatches, params) -> program          a captured sequence made ready to replay
    _replay(program, rebinds, patches, copies)       encode it (and buffer copies) in ONE submit

and these attributes:

    name            a stable description of the adapter (keys the autotune cache, device_key)
    limits          dict with at least max_storage_buffer_binding_size,
                    min_uniform_buffer_offset_alignment (WebGPU limit names in snake_case)
    has_timestamps  whether `_submit(..., timed=True)` can measure GPU time
    is_cpu          a software adapter (lavapipe, SwiftShader): matmul heuristics differ
    shader_f16      the device was opened with `shader-f16` (WGSL f16): float16 buffers are
                    array<f16> (codegen/packing.py)

Shared logic lives here, in pure Python, so both implementations batch identically:
dispatches are *recorded* (pipeline, buffers, a small block of u32 parameters, workgroup counts)
and only encoded at `flush()`: all parameter blocks of a batch go into one uniform buffer, all
dispatches into one command encoder, one `queue.submit`. The CPU never waits except in `read`.
The last recorded launch may leave its output binding open until the next launch or allocation,
the submit, or a request for that buffer (`settle`): pool.py ("In-place results") then decides
whether it writes into an input that died meanwhile.

Captured execution (core/capture.py, through wgpu_backend/capture.py): while a thread records
(`start_recording`), each dispatch it makes is also appended to its `Recording` (pipeline,
buffers, parameter block, workgroups) and each buffer the pool hands it out is noted; other
threads (data loaders) go on unrecorded. `prepare` turns such a sequence into a program whose
parameter blocks and bind groups are built once, and `replay` submits it again with no Python
per kernel beyond the implementation's encoding loop (one call into JS in the browser). Reading
data while recording raises CaptureError (data-dependent Python).

Binding convention of every generated kernel (codegen/ relies on it):
    @group(0) @binding(0)          var<uniform> P  (the dispatch's parameter block)
    @group(0) @binding(1 .. n)     the storage buffers, in the order given to `dispatch`
"""

import struct
import threading

# A batch is submitted once it holds this many dispatches, so the GPU starts working while
# Python keeps recording (and recorded bind groups do not pile up without bound).
MAX_BATCH = 128
# ... or once its kernels declared this many flops (34 GFLOP, ~1 ms of an H200), so a long run of
# big products starts on the GPU while Python records the rest. A submit costs ~100 us of CPU:
# at 8 GFLOP, resnet50's convolutions (5 GFLOP each at batch 32) paid ~3 ms more than they won.
EARLY_SUBMIT_FLOPS = 1 << 35


class Dispatch:
    """One recorded kernel launch, encoded at flush."""

    __slots__ = ("pipeline", "buffers", "params_offset", "params_size", "groups", "on_time")

    def __init__(self, pipeline, buffers, params_offset, params_size, groups, on_time):
        self.pipeline = pipeline
        self.buffers = buffers            # raw buffers, binding 1..n (kept alive until submitted)
        self.params_offset = params_offset
        self.params_size = params_size
        self.groups = groups              # (x, y, z) workgroup counts
        self.on_time = on_time            # callback(seconds) when timing is on, else None


class Recording:
    """What one thread's capture collects: its launches, the buffers handed out meanwhile
    ({id(raw): (raw, how many launches preceded it)}), and the buffers the host wrote data into
    (a replay does not write them again, so they must keep that data: see BufferPool.pin)."""

    __slots__ = ("launches", "allocated", "uploaded")

    def __init__(self):
        self.launches = []
        self.allocated = {}
        self.uploaded = []


class Launch:
    """One kernel launch as a recording (core/capture.py) sees it."""

    __slots__ = ("pipeline", "buffers", "params", "groups", "name", "seed")

    def __init__(self, pipeline, buffers, params, groups, name, seed):
        self.pipeline = pipeline
        self.buffers = buffers    # raw buffers, binding 1..n
        self.params = params      # the u32 parameter block (list)
        self.groups = groups
        self.name = name
        self.seed = seed          # the random seed hashed into params[1] (random kernels), or None


def pack_params(params):
    """A parameter block as bytes: u32s, padded to 16 bytes (a vec4<u32> array)."""
    block = struct.pack("<%dI" % len(params), *params) if params else b"\0" * 16
    return block + b"\0" * (-len(block) % 16)


class Device:
    """Abstract WebGPU compute device with batched submission. See the module docstring."""

    # Filled by implementations from the device's limits (WebGPU names, snake_case).
    limits = None
    name = "device"
    has_timestamps = False
    is_cpu = False  # a software adapter (lavapipe, SwiftShader): kernel heuristics differ
    shader_f16 = False  # opened with the `shader-f16` feature

    def __init__(self):
        # One lock over the open batch and the buffer pool: batches are often built in data
        # loader threads (a queue write racing a flush would land before the submit of kernels
        # recorded earlier that still read the buffer's old contents). Never held while waiting
        # for the GPU. Re-entrant: a flush may run inside another locked section.
        self.lock = threading.RLock()
        self._pipelines = {}          # wgsl source -> compiled pipeline
        self._pending = []            # recorded Dispatch objects of the open batch
        self._pending_buffers = set()  # ids of raw buffers the open batch touches
        self._pending_flops = 0       # what the open batch's kernels declared (dispatch(flops=))
        self.open_placement = None    # the Placement of the last launch, while undecided
        self._params = bytearray()
        self.timing = 0               # > 0 while some profiler wants GPU time
        self.pipeline_cache_hits = 0
        self.pipeline_compiles = 0
        self._capture = threading.local()  # .recording: the Recording of this thread, if any
        self.submits = 0              # queue submissions of kernel work (batches and replays)
        self.on_submit = None         # callback() per submission (cn.profile's "submit" events)

    # ---- buffers ------------------------------------------------------------------------
    def create_buffer(self, nbytes):
        return self._create_buffer(max(nbytes, 16))

    def destroy_buffer(self, raw):
        with self.lock:
            if id(raw) in self._pending_buffers:
                self.flush()
            self._destroy_buffer(raw)

    def write_buffer(self, raw, offset, data):
        # A queue write executes before the command buffers of the *next* submit. If the open
        # batch still reads this buffer (it came back from the pool), submit that batch first.
        with self.lock:
            if id(raw) in self._pending_buffers:
                self.flush()
            self._write_buffer(raw, offset, data)

    def start_recording(self):
        """Record the calling thread's launches and allocations from now on (after submitting
        the work queued before); returns its Recording."""
        if self.recording_here() is not None:
            raise RuntimeError("this thread is already recording on %s" % self.name)
        self.flush()
        recording = self._capture.recording = Recording()
        return recording

    def stop_recording(self):
        """End the calling thread's recording; returns it."""
        recording, self._capture.recording = self.recording_here(), None
        return recording

    def recording_here(self):
        """The Recording of the calling thread, or None."""
        return getattr(self._capture, "recording", None)

    def _check_not_recording(self):
        if self.recording_here() is not None:
            from cinders.capture import reading_while_recording
            raise reading_while_recording()

    def read(self, raw, offset, nbytes):
        """Blocking readback: the one place the CPU waits for the GPU. The lock is not held
        while waiting: wgpu-py resolves the map on its poll thread, where a pooled buffer's
        finalizer may run too."""
        self._check_not_recording()
        self.flush()
        if nbytes == 0:
            return b""
        return self._read_buffer(raw, offset, nbytes)

    async def read_async(self, raw, offset, nbytes):
        self._check_not_recording()
        self.flush()  # (no lock across the await: the browser runs one thread)
        if nbytes == 0:
            return b""
        return await self._read_buffer_async(raw, offset, nbytes)

    # ---- pipelines and dispatch ---------------------------------------------------------
    def pipeline(self, wgsl):
        """Compiled pipeline for a WGSL source (cached: a training loop compiles each once).
        Returns (pipeline, was_cached)."""
        found = self._pipelines.get(wgsl)
        if found is not None:
            self.pipeline_cache_hits += 1
            return found, True
        self.pipeline_compiles += 1
        found = self._pipelines[wgsl] = self._compile(wgsl)
        return found, False

    def dispatch(self, pipeline, buffers, params, groups, on_time=None, name="kernel", seed=None,
                 placement=None, flops=0):
        """Record one launch. params: sequence of u32 (the kernel's uniform block); seed: the
        random seed hashed into params[1] (capture draws a new one per replay); placement: its
        output (the last buffer, None here) is placed later (pool.py, "In-place results");
        flops: the kernel's arithmetic, where it is large (EARLY_SUBMIT_FLOPS)."""
        align = self.limits["min_uniform_buffer_offset_alignment"]
        block = pack_params(params)
        recording = self.recording_here()
        if recording is not None:
            recording.launches.append(Launch(pipeline, tuple(buffers), list(params), groups, name,
                                             seed))
        with self.lock:
            if self.open_placement is not None:
                self.settle()
            offset = len(self._params)
            self._params += block
            self._params += b"\0" * (-len(self._params) % align)
            d = Dispatch(pipeline, buffers, offset, len(block), groups,
                         on_time if self.timing else None)
            self._pending.append(d)
            self._pending_buffers.update(map(id, buffers))
            if placement is not None:
                placement.dispatch = d
                self.open_placement = placement
            self._pending_flops += flops
            if len(self._pending) >= MAX_BATCH or self._pending_flops >= EARLY_SUBMIT_FLOPS:
                self.flush()

    def settle(self):
        """Place the last launch's result if it is still open: before another launch is
        recorded or a buffer allocated, before a submit, and when its buffer is asked for."""
        with self.lock:
            placement = self.open_placement
            if placement is not None:
                self.open_placement = None
                dispatch = placement.dispatch
                try:
                    raw = placement.place()
                except BaseException:
                    # Without an output the launch cannot run; the rest of the batch still does.
                    self._pending = [d for d in self._pending if d is not dispatch]
                    raise
                self._pending_buffers.add(id(raw))

    def flush(self):
        """Encode and submit the open batch (returns immediately; the GPU works on)."""
        with self.lock:
            self.settle()
            if not self._pending:
                return
            dispatches, params = self._pending, bytes(self._params)
            self._pending, self._params, self._pending_buffers = [], bytearray(), set()
            self._pending_flops = 0
            timed = any(d.on_time is not None for d in dispatches)
            token = self._submit(dispatches, params, timed)
            self._submitted()
        if timed:
            for d, seconds in zip(dispatches, self._timings(token)):
                if d.on_time is not None:
                    d.on_time(seconds)

    def _submitted(self):
        self.submits += 1
        if self.on_submit is not None:
            self.on_submit()

    # ---- captured programs ----------------------------------------------------------------
    def prepare(self, launches):
        """Make a recorded sequence of Launch ready to replay: parameter blocks laid out once
        (returns the program and the byte offset of each launch's block), bind groups built
        once."""
        align = self.limits["min_uniform_buffer_offset_alignment"]
        params, dispatches = bytearray(), []
        for launch in launches:
            block = pack_params(launch.params)
            offset = len(params)
            params += block
            params += b"\0" * (-len(params) % align)
            dispatches.append(Dispatch(launch.pipeline, launch.buffers, offset, len(block),
                                       launch.groups, None))
        with self.lock:
            return self._prepare(dispatches, bytes(params)), [d.params_offset for d in dispatches]

    def replay(self, program, rebinds, patches, copies):
        """Submit a prepared program (None: only the copies) once more, after everything
        recorded before it.
        rebinds: {launch index: new buffer list} (inputs read in place); patches: [(byte
        offset, bytes)] into its parameter blocks (fresh random seeds); copies: [(src, src
        offset, dst, dst offset, nbytes)] encoded after the kernels (outputs handed out)."""
        with self.lock:
            self.flush()
            self._replay(program, rebinds, patches, copies)
            self._submitted()

    # ---- what an implementation provides -------------------------------------------------
    def _create_buffer(self, nbytes):
        raise NotImplementedError

    def _destroy_buffer(self, raw):
        raise NotImplementedError

    def _write_buffer(self, raw, offset, data):
        raise NotImplementedError

    def _compile(self, wgsl):
        raise NotImplementedError

    def _submit(self, dispatches, params, timed):
        raise NotImplementedError

    def _timings(self, token):
        raise NotImplementedError

    def _read_buffer(self, raw, offset, nbytes):
        raise NotImplementedError

    async def _read_buffer_async(self, raw, offset, nbytes):
        raise NotImplementedError

    def _prepare(self, dispatches, params):
        raise NotImplementedError

    def _replay(self, program, rebinds, patches, copies):
        raise NotImplementedError

    def wait_idle(self):
        """Block until all submitted work is done (benchmarks use this for wall-clock timing)."""
        self.flush()
