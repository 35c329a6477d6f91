"""cn.capture(fn): record the kernel launches of fn once, replay them with no Python per kernel.

    fast = cn.capture(model)           # or any function of tensors
    y = fast(x)                        # 1st call: runs fn (fills caches, compiles kernels)
    y = fast(x)                        # 2nd call: runs fn, recording every launch
    y = fast(x)                        # 3rd call: runs and records again; both must agree
    y = fast(x2)                       # later calls: one submit of the recorded launches

Per kernel, Python costs tens of microseconds on the desktop and most of a millisecond in
Pyodide; the GPU idles meanwhile. A replay skips all of it: the tensor layer, Autodiff, Fusion's
graph building, the backend's bookkeeping. What a recording holds (wgpu_backend/device.py,
`Launch`): each launch's pipeline, buffers, parameter block and workgroup counts. Buffers play
three roles:
  inputs      the buffers of fn's tensor arguments: a replay binds the new arguments' buffers
              in their place (no copy), so inputs must have the recorded shapes, dtypes and
              layouts (another signature captures again: one program per signature, the
              MAX_SIGNATURES most recently used kept, with their workspaces);
  state       buffers that existed before the call (parameters, optimizer state): read and
              written in place, so a changed parameter value is seen by the next replay;
  workspace   buffers allocated during the call: kept by the program for good (taken out of
              the pool) and reused by every replay; no more than one uncaptured call uses.
Outputs are copied into fresh buffers at the end of the same submit and returned as new tensors
of fn's backend (detached: no gradient history).

Guards, because a replay cannot run fn's Python:
  * fn runs on the first three calls of a signature, the last two recorded; a different second
    recording (other kernels, other constants, a state tensor replaced instead of updated in
    place) raises CaptureError naming the first difference;
  * reading a value inside fn (item(), tolist(), numpy()) raises CaptureError with the line;
  * random ops draw seeds from cn.random's counter as they would uncaptured: a replay patches
    the seeds of its random kernels and advances the counter (same numbers as uncaptured runs).
On backends without kernels to record (Python, NumPy) cn.capture(fn) simply calls fn.
cn.profile sees a "replay" event per replay and a "record" event per recording (each recording
first collects Python's garbage, ~0.4 s in a process holding torch).

The backend's side. A base backend declaring `capturable` (core/backend.py, "Abilities") returns
from `capture_recorder()` one recorder per device (cn.Wgpu: wgpu_backend/capture.py; cn.Wasm:
wasm_backend/capture.py) with
    start() / stop() -> (launches, allocated)   record the calling thread's launches (each with
                            pipeline, buffers, params, groups, name, seed) and the buffers handed
                            out meanwhile ({id(buffer): (buffer, launches before it)})
    owns(backend)           whether that base backend's tensors live on the recorder's device
    buffer(h)               (buffer, byte offset, byte size) of a contiguous handle
    contiguous(h), new_output(shape, dtype), assign(dst, src), host_scalar(value),
    write_scalar(buffer, offset, value)
    keep(owner, buffers)    the buffers are the program's while `owner` lives
    prepare(launches) -> (program, parameter block offsets); replay(program, rebinds, patches,
                            copies)
Everything else here (guards, comparison, rebinding inputs, seeds, host values) is shared.
The state of a capture in progress is per thread: a data loader thread beside it is not recorded.
A backend that declares `records_ops` (cn.Remote) records its own op stream instead, and a
replay is one call to `base.replay` (cn.Remote: one message; the server runs the ops).
"""

import linecache
import sys
import gc
import threading
import weakref


from .errors import CindersError
from .profile import ACTIVE as _PROFILING, record as _profile_event
from .creation import _seed_counter
from .tensor import Tensor

_SEED_MASK = 0xFFFFFFFF


class CaptureError(CindersError, RuntimeError):
    """fn cannot be captured as it is (the message says where and why)."""


class _ThreadState(threading.local):
    def __init__(self):
        self.capturing = []  # the base backends of the cn.capture calls running fn now
        self.host = []       # per recording in progress: {"values": [(buffer, offset, compute)],
        #                      "callbacks": [...], "held": [handles]}


_state = _ThreadState()


def capturing():
    """True while cn.capture runs fn (its first calls) in this thread: state (parameters,
    optimizer moments) must then be updated in place and computed before fn returns, since a
    replay reuses the buffers it recorded and runs no Python (optimizers do this)."""
    return bool(_state.capturing)


def host_value(compute, backend):
    """A float32 scalar tensor holding compute(), recomputed at every call of the captured
    function, replays included (uploaded before its kernels run): how a Python number that
    changes per call (a scheduled learning rate, Adam's bias corrections) reaches a replay.
    Outside a recording it is just cn.tensor(compute())."""
    from . import dtypes
    from .creation import tensor
    chain = _chain(backend)
    base = chain[-1]
    if not _state.host or not base.capturable:
        return tensor(float(compute()), backend=backend)
    # Its own buffer, held until the recording ends: a pooled one could serve another value of
    # the same call too, which the replay's upload (before every kernel) would clobber.
    recorder = base.capture_recorder()
    h = recorder.host_scalar(compute())
    raw, offset, _ = recorder.buffer(h)
    _state.host[-1]["values"].append((raw, offset, compute))
    _state.host[-1]["held"].append(h)
    return _from_base(Tensor(base, h, (), dtypes.float32), chain)


def on_replay(callback):
    """Run callback() at every replay of the call being recorded, after the host values are
    computed: how Python-side state that fn advances (step counters) keeps counting."""
    if _state.host:
        _state.host[-1]["callbacks"].append(callback)


def realize(t):
    """Compute t now (a lazy value would otherwise be computed in some later call)."""
    _to_base(t)


def assign(dst, src):
    """Write src's values into dst's own buffer (same shape and dtype), in place."""
    d, s = _to_base(dst), _to_base(src)
    if d.shape != s.shape or d.dtype is not s.dtype:
        raise CaptureError("cn.capture: cannot update a %s %s tensor in place with a %s %s one"
                           % (d.dtype.name, d.shape, s.dtype.name, s.shape))
    if not d.backend.capturable:
        raise CaptureError("cn.capture: assign needs a backend that cn.capture records (such as "
                           "cn.Wgpu()), got %r" % (d.backend,))
    d.backend.capture_recorder().assign(d.handle, s.handle)


def retire(t):
    """t's owner gives its buffer up (a parameter replaced by a new tensor, `t[key] = v`): the
    programs that read that buffer as state would replay the old values, so they record again
    at their next call instead (Module and indexing call this; a Python variable that fn reads
    and the user rebinds is not seen: pass such values as arguments)."""
    if not _LIVE_PROGRAMS:
        return
    base = _to_base(t)
    if not base.backend.capturable:
        return
    raw = base.backend.capture_recorder().buffer(base.handle)[0]
    for program in list(_LIVE_PROGRAMS):
        if id(raw) in program.state_ids and not program.stale:
            program.stale = True
            for callback in list(program.on_stale):
                callback()


_LIVE_PROGRAMS = weakref.WeakSet()  # the _Programs alive, for retire()


def _user_line():
    """'file:line: source' of the innermost frame outside cinders (the user's code)."""
    frame = sys._getframe(1)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module != "cinders" and not module.startswith("cinders."):
            break
        frame = frame.f_back
    if frame is None:
        return "unknown line"
    filename, lineno = frame.f_code.co_filename, frame.f_lineno
    return "%s:%d: %s" % (filename, lineno, linecache.getline(filename, lineno).strip())


def reading_while_recording():
    """The error for a read inside a function being captured (raised by the device)."""
    return CaptureError(
        "cn.capture: fn reads a tensor's value while being captured, at %s. A replay cannot "
        "run Python that depends on data: read values outside fn (return the tensor and call "
        "item()/tolist() on the result)" % _user_line())


def capture(fn, backend=None):
    """Record fn's kernel launches once, replay them afterwards (see the module docstring).
    backend: where fn computes, when no argument of fn is a tensor (else the first tensor's)."""
    return Captured(fn, backend)


def _leaves(value, out):
    """Tensors and other leaves of nested tuples/lists/dicts, in order."""
    if isinstance(value, (tuple, list)):
        for v in value:
            _leaves(v, out)
    elif isinstance(value, dict):
        for k in value:
            _leaves(value[k], out)
    else:
        out.append(value)
    return out


def _rebuild(value, tensors):
    """value with its tensors replaced, in order, by the next ones from iterator `tensors`."""
    if isinstance(value, (tuple, list)):
        return type(value)(_rebuild(v, tensors) for v in value)
    if isinstance(value, dict):
        return {k: _rebuild(v, tensors) for k, v in value.items()}
    return next(tensors) if isinstance(value, Tensor) else value


def _chain(backend):
    """[backend, its inner, ..., the base backend]."""
    chain = [backend]
    while chain[-1].inner is not None:
        chain.append(chain[-1].inner)
    return chain


def _to_base(t):
    """A Tensor of the base backend holding t's data (computed: Fusion's pending groups run)."""
    while t.backend.inner is not None:
        t = t.backend.inner_tensor(t)
    return t


def _from_base(t, chain):
    for b in reversed(chain[:-1]):
        t = b.outer_tensor(t)
    return t


def _signature_of(value):
    if isinstance(value, Tensor):
        return ("tensor", value.shape, value.dtype.name, value.backend.device_key())
    try:
        hash(value)
        return ("value", type(value).__name__, value)
    except TypeError:
        return ("object", id(value))


MAX_SIGNATURES = 16  # programs a captured function keeps, one per input signature


class Captured:
    """The callable cn.capture returns; `captures` and `replays` count what happened."""

    def __init__(self, fn, backend=None):
        self.fn = fn
        self.backend = backend
        self.captures = 0   # programs recorded and accepted (one per signature)
        self.replays = 0    # calls answered by a replay
        self._entries = {}  # signature -> _Entry
        self._last = None   # _LastCall: the signature of the last replay, checked first
        self.__name__ = getattr(fn, "__name__", "captured")
        self.__doc__ = getattr(fn, "__doc__", None)

    def __repr__(self):
        return "cn.capture(%s: %d captures, %d replays)" % (self.__name__, self.captures,
                                                            self.replays)

    @property
    def fast_path(self):
        """True when the next call with the last replay's signature is checked against it
        argument by argument, before any signature is built (_LastCall)."""
        return self._last is not None

    def replayable(self):
        """The program the last call replayed, when a host may replay it by itself, running no
        Python, until the program's `on_stale` callbacks run (cn.Wasm() in the page:
        wasm_backend/capture.py `standalone`, wasm/cinders.js): the last call was a replay of
        all-tensor arguments, and the program patches no random seeds and computes no host
        values. None otherwise. Such replays are not counted in `replays`."""
        last = self._last
        if last is None:
            return None
        program = last.program
        if program.stale or program.seed_patches or program.host_values or program.callbacks:
            return None
        return program

    def _entry(self, key):
        """The entry of a signature, now the most recently used; a new one may push out the
        least recently used (its program and workspace go: inputs of ever new shapes, such as
        text lines of every width, must not hold memory without bound)."""
        entry = self._entries.pop(key, None)
        if entry is None:
            entry = _Entry()
            if len(self._entries) >= MAX_SIGNATURES:
                del self._entries[next(iter(self._entries))]
        self._entries[key] = entry
        return entry

    def __call__(self, *args, **kwargs):
        last = self._last
        if last is not None and not kwargs and not last.program.stale:
            based = last.match(args)  # (alive until the replay has run)
            if based is not None:
                self.replays += 1
                return last.program.replay([raw for raw, _, _ in based], self.__name__)
        self._last = None  # (an entry may be pushed out below)
        leaves = _leaves((args, kwargs), [])
        tensors = [v for v in leaves if isinstance(v, Tensor)]
        top = tensors[0].backend if tensors else self.backend
        base = _chain(top)[-1] if top is not None else None
        if base is not None and base.records_ops:
            return self._call_op_stream(base, leaves, tensors, args, kwargs)
        if base is None or not base.capturable:
            return self.fn(*args, **kwargs)
        recorder = base.capture_recorder()
        # Inputs as contiguous buffers of the base backend: what a replay binds.
        based = [recorder.contiguous(_to_base(t).handle) for t in tensors]  # alive for the call
        views = [recorder.buffer(h) for h in based]
        key = tuple(_signature_of(v) for v in leaves) + tuple(off for _, off, _ in views)
        entry = self._entry(key)
        if entry.program is not None and entry.program.stale:  # state it read was replaced
            entry = self._entries[key] = _Entry()
        if entry.program is not None:
            self.replays += 1
            if not kwargs and all(isinstance(a, Tensor) for a in args):
                self._last = _LastCall(entry.program, recorder, args, views)
            return entry.program.replay([raw for raw, _, _ in views], self.__name__)
        if not entry.warm:
            # The first call fills caches (constants, compiled kernels, autotuning) that later
            # calls only read: it is run as it is; the next two are recorded and compared.
            entry.warm = True
            _state.capturing.append(base)
            try:
                return self.fn(*args, **kwargs)
            finally:
                _state.capturing.pop()
        recording, out = _record(self.fn, args, kwargs, base, recorder,
                                 [raw for raw, _, _ in views])
        if entry.first is None:
            entry.first = recording
            return out
        try:
            _compare(entry.first, recording)
        except CaptureError as e:
            e.result = out  # the call itself ran: its results, for a caller that falls back
            raise
        entry.first = None
        entry.program = _Program(base, recorder, recording)
        self.captures += 1
        # The outputs live in the program's workspace, which the next replay overwrites.
        return entry.program.hand_out(out, [raw for raw, _, _ in views])

    def _call_op_stream(self, base, leaves, tensors, args, kwargs):
        """The same three calls for a backend that records its own op stream and replays it
        where the ops run (cn.Remote: on the server, one message per call). Its recordings
        compare themselves (`base.compare_recordings` raises CaptureError at the first
        difference); reading a value inside fn raises as on a GPU."""
        based = [_to_base(t) for t in tensors]
        key = tuple(_signature_of(v) for v in leaves)
        entry = self._entry(key)
        if entry.program is not None:
            self.replays += 1
            if _PROFILING:
                _profile_event(base, {"kind": "replay", "name": self.__name__, "kernels": entry.program.ops})
            handles = base.replay(entry.program, [b.handle for b in based])
            return _rebuild(entry.template, iter(_from_base(Tensor(base, h, shape, dtype), chain)
                                              for h, (chain, shape, dtype) in zip(handles, entry.outputs)))
        if not entry.warm:
            entry.warm = True
            return self.fn(*args, **kwargs)
        base.start_recording([b.handle for b in based])
        try:
            out = self.fn(*args, **kwargs)
            outputs = [(_chain(t.backend), _to_base(t)) for t in _leaves(out, []) if isinstance(t, Tensor)]
        finally:
            recording = base.stop_recording()
        if entry.first is None:
            entry.first = recording
            return out
        try:
            base.compare_recordings(entry.first, recording)
            entry.program = base.define_program(recording, [b.handle for b in based],
                                                [b.handle for _, b in outputs])
        except CaptureError as e:
            e.result = out
            raise
        entry.first, entry.template = None, out
        entry.outputs = [(chain, b.shape, b.dtype) for chain, b in outputs]
        self.captures += 1
        return out


class _LastCall:
    """The guard of the last replayed signature when fn's arguments are all tensors: the same
    backend object (so the same chain and device), shape, dtype and byte offset per argument
    imply the generic key, checked without building it. Any difference takes the generic path."""
    __slots__ = ("program", "recorder", "expected")

    def __init__(self, program, recorder, args, views):
        self.program, self.recorder = program, recorder
        self.expected = tuple((t.backend, t.shape, t.dtype, offset)
                              for t, (_, offset, _) in zip(args, views))

    def match(self, args):
        """[(buffer, byte offset, contiguous handle)] per argument, or None when args do not
        have the last call's signature."""
        if len(args) != len(self.expected):
            return None
        recorder, based = self.recorder, []
        for t, (backend, shape, dtype, offset) in zip(args, self.expected):
            if not isinstance(t, Tensor) or t.backend is not backend or t.shape != shape \
                    or t.dtype is not dtype:
                return None
            h = recorder.contiguous(_to_base(t).handle)
            raw, at, _ = recorder.buffer(h)
            if at != offset:
                return None
            based.append((raw, at, h))
        return based


class _Entry:
    __slots__ = ("warm", "first", "program", "outputs", "template")

    def __init__(self):
        self.warm = False
        self.first = None    # the first call's recording, kept until the second confirms it
        self.program = None
        self.outputs = self.template = None  # op-stream programs: output (chain, shape, dtype), fn's result


class _Recording:
    def __init__(self, launches, allocated, inputs, outputs, seeds):
        self.launches = launches    # [device.Launch]
        self.allocated = allocated  # {id(raw): (raw, launches before it)} allocated meanwhile
        self.inputs = inputs        # [raw] per tensor argument
        self.outputs = outputs      # [(chain, base Tensor)] per output tensor
        self.seeds = seeds          # (counter before, counter after)
        roles, first_seen, index = [], {}, {id(r): i for i, r in enumerate(inputs)}
        self.inputs_ids = index
        for launch in launches:
            for raw in launch.buffers:
                if id(raw) in index:
                    roles.append(("input", index[id(raw)]))
                else:
                    roles.append(("buffer", first_seen.setdefault(id(raw), len(first_seen))))
        self.roles = roles

    def relative_seed(self, seed):
        """A seed drawn from cn.random's counter during the call, as its offset from the
        counter at the call's start; None for an explicit seed."""
        start, stop = self.seeds
        rel = (seed - start) & _SEED_MASK
        return rel if rel < stop - start else None


def _record(fn, args, kwargs, base, recorder, inputs):
    # Both recordings of a call must bind the same pattern of buffers, and a buffer returns to
    # the pool when its last tensor dies: cyclic garbage (Autodiff tapes, an earlier model's
    # leftovers) must not die at a different point of each. Collected now, none during the call.
    if _PROFILING:   # (cn.profile's "record" events: what a kept program saves a later call)
        _profile_event(base, {"kind": "record", "name": getattr(fn, "__name__", "captured")})
    gc.collect()
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _record_without_gc(fn, args, kwargs, base, recorder, inputs)
    finally:
        if gc_was_enabled:
            gc.enable()


def _record_without_gc(fn, args, kwargs, base, recorder, inputs):
    start = _seed_counter[0]
    recorder.start()  # (work queued before the call is not part of it)
    _state.capturing.append(base)
    host = {"values": [], "callbacks": [], "held": []}
    _state.host.append(host)
    try:
        out = fn(*args, **kwargs)
        # The outputs are computed inside the recording (Fusion launches pending groups here).
        outputs = []
        for t in _leaves(out, []):
            if isinstance(t, Tensor):
                b = _to_base(t)
                if not recorder.owns(b.backend):
                    raise CaptureError("cn.capture: fn returned a tensor of %r, not of the "
                                       "device it captures (%r)" % (t.backend, base))
                outputs.append((_chain(t.backend),
                                Tensor(b.backend, recorder.contiguous(b.handle), b.shape,
                                       b.dtype)))
    finally:
        _state.host.pop()
        _state.capturing.pop()
        launches, allocated = recorder.stop()
    stop = _seed_counter[0]
    recording = _Recording(launches, allocated, inputs, outputs, (start, stop))
    recording.host = host
    return recording, out


def _compare(first, second):
    """Raise CaptureError at the first difference between two recordings of one signature."""
    def where(i):
        return "kernel #%d (%s)" % (i, second.launches[i].name if i < len(second.launches)
                                    else first.launches[i].name)

    n1, n2 = len(first.launches), len(second.launches)
    for i, (a, b) in enumerate(zip(first.launches, second.launches)):
        if a.pipeline is not b.pipeline or a.groups != b.groups or \
                len(a.buffers) != len(b.buffers):
            raise CaptureError(
                "cn.capture: the second call of fn launched a different kernel sequence than "
                "the first: %s was %s. fn's Python must run the same ops every call (branches "
                "on data or on a changing Python value cannot be replayed)"
                % (where(i), a.name if a.pipeline is not b.pipeline else "the same kernel "
                   "with other sizes"))
        if a.seed is not None or b.seed is not None:
            ra = None if a.seed is None else first.relative_seed(a.seed)
            rb = None if b.seed is None else second.relative_seed(b.seed)
            if (ra, None if ra is not None else a.seed) != (rb, None if rb is not None else b.seed):
                raise CaptureError("cn.capture: %s drew its random seed differently in the two "
                                   "calls" % where(i))
            same = a.params[:1] == b.params[:1] and a.params[2:] == b.params[2:]
        else:
            same = a.params == b.params
        if not same:
            raise CaptureError(
                "cn.capture: %s read other constants in the second call of fn than in the first "
                "(a Python number that changes per call, such as a learning rate or a step "
                "count, is baked into a recording: pass it as a tensor)" % where(i))
    if n1 != n2:
        raise CaptureError("cn.capture: the second call of fn launched %d kernels, the first %d "
                           "(first extra: %s)" % (n2, n1, where(min(n1, n2))))
    if first.roles != second.roles:
        pos = next(j for j, (p, q) in enumerate(zip(first.roles, second.roles)) if p != q)
        raise CaptureError("cn.capture: %s bound its buffers differently in the two calls of fn"
                           % where(_launch_at(second, pos)))
    # State read in place: a buffer that existed before the first call must be the very same
    # buffer in the second. A different one means fn replaced a tensor it reads (e.g. a
    # parameter updated out of place), and a replay would keep reading the old one.
    for k, (a, b) in enumerate(zip(first.launches, second.launches)):
        for r1, r2 in zip(a.buffers, b.buffers):
            made = first.allocated.get(id(r1))
            if r1 is r2 or id(r1) in first.inputs_ids or (made is not None and made[1] <= k):
                continue
            raise CaptureError(
                "cn.capture: %s reads a tensor that fn replaced between calls (state such as "
                "parameters must be updated in place: optimizers do so under cn.capture)"
                % where(k))


def _launch_at(recording, pos):
    """Index of the launch whose buffers hold flat buffer position pos."""
    for i, launch in enumerate(recording.launches):
        pos -= len(launch.buffers)
        if pos < 0:
            return i
    return len(recording.launches) - 1


class _Program:
    """An accepted recording, prepared on the device."""

    def __init__(self, base, recorder, recording):
        self.base, self.recorder = base, recorder
        launches = recording.launches
        self.prepared, offsets = recorder.prepare(launches)
        inputs = {id(r): i for i, r in enumerate(recording.inputs)}
        self.input_count = len(inputs)
        # Launches reading inputs are rebound per replay: (launch index, [(slot, input)]).
        self.rebinds = []
        for i, launch in enumerate(launches):
            slots = [(j, inputs[id(r)]) for j, r in enumerate(launch.buffers) if id(r) in inputs]
            if slots:
                self.rebinds.append((i, slots))
        # Random kernels seeded from the counter: (byte offset of params[1], relative seed).
        self.seed_patches = []
        for i, launch in enumerate(launches):
            if launch.seed is not None:
                rel = recording.relative_seed(launch.seed)
                if rel is not None:
                    self.seed_patches.append((offsets[i] + 4, rel))
        self.draws = recording.seeds[1] - recording.seeds[0]
        self.launches = [launch.buffers for launch in launches]
        # An output may be an input or a view of one (fn returned x.reshape(...), x[0]): no
        # kernel writes it, so a replay copies it out of that call's input (its index here),
        # never out of the recording call's buffer.
        self.outputs = []
        for chain, t in recording.outputs:
            view = recorder.buffer(t.handle)
            self.outputs.append((chain, view, t.shape, t.dtype, inputs.get(id(view[0]))))
        self.template = None
        self.kernels = len(launches)
        self.host_values = recording.host["values"]
        self.callbacks = recording.host["callbacks"]
        # Everything but the inputs is the program's from now on (workspace and state).
        kept = {id(r): r for buffers in self.launches for r in buffers if id(r) not in inputs}
        kept.update((id(raw), raw) for _, (raw, _, _), _, _, source in self.outputs if source is None)
        kept.update((id(raw), raw) for raw, _, _ in self.host_values)
        recorder.keep(self, list(kept.values()))
        # The program's last reference (this object) keeps the buffers alive, so their ids
        # stay unique until the recorder has them back.
        self._kept = list(kept.values())
        self.state_ids = frozenset(kept)
        self.stale = False   # set by retire(): a buffer it reads as state was given up
        self.on_stale = []   # called when it goes stale (a host replaying it by itself stops)
        _LIVE_PROGRAMS.add(self)

    def output_views(self):
        """[(buffer, byte offset, byte size, shape, dtype)] per output: where a replay leaves
        fn's results, before copying them out; None where an output is read out of an input
        (it is in another buffer at every call)."""
        if any(source is not None for *_, source in self.outputs):
            return None
        return [view + (shape, dtype) for _, view, shape, dtype, _ in self.outputs]

    def hand_out(self, out, inputs):
        """The second call's outputs, copied out of the workspace (one submit)."""
        self.template = out
        fresh, copies = self._fresh_outputs(inputs)
        self.recorder.replay(None, {}, [], copies)
        return _rebuild(out, iter(fresh))

    def _fresh_outputs(self, inputs):
        """New tensors for the outputs, and the copies that fill them: from the workspace, or
        from this call's input `inputs[source]` where an output is (a view of) an input."""
        base, recorder, fresh, copies = self.base, self.recorder, [], []
        for chain, (raw, offset, nbytes), shape, dtype, source in self.outputs:
            if source is not None:
                raw = inputs[source]
            h = recorder.new_output(shape, dtype)
            dst, dst_off, _ = recorder.buffer(h)
            copies.append((raw, offset, dst, dst_off, nbytes))
            fresh.append(_from_base(Tensor(base, h, shape, dtype), chain))
        return fresh, copies

    def replay(self, inputs, name):
        rebinds = {}
        for i, slots in self.rebinds:
            buffers = list(self.launches[i])
            for j, k in slots:
                buffers[j] = inputs[k]
            rebinds[i] = buffers
        patches = []
        if self.seed_patches:
            from .backend import _hash32
            counter = _seed_counter[0]
            for offset, rel in self.seed_patches:
                seed = (counter + rel) & _SEED_MASK
                patches.append((offset, _hash32(seed).to_bytes(4, "little")))
            _seed_counter[0] = counter + self.draws
        if self.host_values:
            for raw, offset, compute in self.host_values:
                self.recorder.write_scalar(raw, offset, compute())
            for callback in self.callbacks:
                callback()
        fresh, copies = self._fresh_outputs(inputs)
        if _PROFILING:
            _profile_event(self.base, {"kind": "replay", "name": name, "kernels": self.kernels})
        self.recorder.replay(self.prepared, rebinds, patches, copies)
        return _rebuild(self.template, iter(fresh))
