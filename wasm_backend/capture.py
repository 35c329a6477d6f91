"""cn.Wasm's side of cn.capture: the recorder core/capture.py drives (`Wasm.capture_recorder()`).

cn.Wasm() already queues its kernel calls as int32 commands that one call of the module's
run_commands executes (backend.py, Commands). A recording is that command stream, with each
command's buffer operands named (a Launch: kernel, Buffers, ints); a program is the stream laid
out once in a block of linear memory, and a replay is ONE host call, run_commands(program):
no Python per kernel. Inputs are bound in place: a replay rewrites only the addresses of the
commands that read an input (the program's ints are rewritten only when one changed, so a
replay whose inputs sit where the last ones did writes nothing). Outputs are copied out by
copy commands appended to the same call. Workspace and state stay alive because the program
holds their Buffers (core/capture.py `_Program._kept`); the descriptors it reads are pinned in
the backend's constant cache (`Wasm._constant` never releases a pinned block).

A host may also replay the last program by itself, running no Python (the page's JS:
wasm/cinders.js Replay): `standalone` writes where its commands, input and output lie into a
plan block in linear memory, whose first word names the plan's owner while it holds and is
zeroed as soon as it does not (the commands rewritten for other inputs, the program stale,
kernels queued that must run first). The host reads the plan from memory at every call.

gather and scatter_add are called by the host, not queued: they return the first bad index for
the host to raise on. A program keeps them in place, and a replay runs the commands before
each, calls it, raises IndexingError on a bad index, and runs on: one call more per such
kernel (an embedding, cross_entropy), never an unchecked index. Reading a value inside fn
raises CaptureError as on a GPU.
"""
import struct
import threading
import weakref
from array import array

from ..capture import reading_while_recording
from ..errors import IndexingError
from ..backend import numel
from .backend import _SIZE, command_word


class Launch:
    """One queued kernel call, as core/capture.py compares and replays it: `pipeline` the kernel
    (the Commands' own name string, so `is` compares kernels), `buffers` its Buffer operands,
    `params` its int arguments in order then each buffer operand's byte offset in its Buffer
    (random_f32's key is params[1], where core/capture.py patches seeds), `groups` unused."""
    __slots__ = ("pipeline", "buffers", "params", "groups", "name", "seed", "layout", "checked")

    def __init__(self, name, args, checked=False):
        self.pipeline = self.name = name
        self.checked = checked  # called by the host (it returns a bad index), not queued
        self.buffers, ints, offsets, layout = [], [], [], []
        for a in args:
            if a.__class__ is int:
                layout.append(-1)
                ints.append(a)
            else:
                layout.append(len(self.buffers))
                self.buffers.append(a.buf)
                offsets.append(a.ptr - a.buf.ptr)
        self.buffers = tuple(self.buffers)
        self.params = tuple(ints + offsets)
        self.groups = ()
        self.seed = None
        self.layout = layout  # per argument: its buffer slot, or -1 for an int


class _Recording:
    """The hook Commands and Heap call while the recording thread runs fn."""

    def __init__(self, names):
        self.names = names
        self.thread = threading.get_ident()
        self.launches = []
        self.allocated = {}

    def __call__(self, name, args, checked=False):
        if threading.get_ident() == self.thread:
            self.launches.append(Launch(self.names[name], args, checked))

    def allocated_buffer(self, buf):
        if threading.get_ident() == self.thread:
            self.allocated[id(buf)] = (buf, len(self.launches))

    def seeded(self, seed):
        """The last launch drew random numbers from `seed`."""
        if threading.get_ident() == self.thread:
            self.launches[-1].seed = seed


class Program:
    """A recorded command stream prepared in linear memory: run by one run_commands call."""

    def __init__(self, backend, launches):
        ids = backend.commands.ids
        ints, self.slots, offsets = array("i"), [], []
        self.checked = []  # (position of a host-called kernel's id, its name, argument count)
        for launch in launches:
            if launch.checked:
                self.checked.append((len(ints), launch.name, len(launch.layout)))
            ints.append(-1 if launch.checked else ids[launch.name])
            values = iter(launch.params)
            byte_offsets = launch.params[len(launch.params) - len(launch.buffers):]
            addresses, int_positions = [], []
            for slot in launch.layout:
                if slot < 0:
                    int_positions.append(len(ints))
                    ints.append(command_word(next(values)))
                else:
                    addresses.append((len(ints), slot, byte_offsets[slot]))
                    ints.append(command_word(launch.buffers[slot].ptr + byte_offsets[slot]))
            self.slots.append(addresses)  # where a replay rebinds an input
            # core/capture.py patches a seed at offsets[i] + 4, i.e. params[1]'s position
            offsets.append(4 * int_positions[1] - 4 if len(int_positions) > 1 else 0)
        self.ints = ints
        self.offsets = offsets
        self.written = None  # the ints last written to the block
        self.bound = None    # the input addresses, seeds and copies they were written with
        self.block = None
        # The descriptors the commands read stay in the constant cache while this program lives.
        constants = {ptr for ptr, _ in backend.engine.constant_blocks}
        self.pinned = sorted({v for launch in launches for v in launch.params if v in constants})
        pins = backend.engine.pinned_constants
        for ptr in self.pinned:
            pins[ptr] = pins.get(ptr, 0) + 1
        weakref.finalize(self, _unpin, pins, self.pinned)


def _unpin(pins, pinned):
    for ptr in pinned:
        pins[ptr] -= 1
        if not pins[ptr]:
            del pins[ptr]


class CommandRecorder:
    """Recording and replay of the kernel calls of every cn.Wasm() on one engine."""

    def __init__(self, backend):
        self.backend = backend
        self.commands = backend.commands
        self.heap = backend.heap
        self.names = {name: name for name in self.commands.ids}
        self.recording = None
        self.plan = None         # the plan block (standalone), made on first use
        self.handed_out = None   # (program, input handle) of the plan that holds, else None

    # ---- recording --------------------------------------------------------------------------
    def start(self):
        """Record the calling thread's kernel calls and allocations (queued work runs first)."""
        self.commands.flush()
        self.recording = _Recording(self.names)
        self.commands.recording = self.recording
        self.heap.watch = self.recording.allocated_buffer

    def stop(self):
        recording, self.recording = self.recording, None
        self.commands.recording = self.heap.watch = None
        return recording.launches, recording.allocated

    def recording_here(self):
        """True while the calling thread is being recorded (reads must then raise)."""
        return self.recording is not None and self.recording.thread == threading.get_ident()

    def check_read(self):
        if self.recording_here():
            raise reading_while_recording()

    def host_checked(self, kernel, args):
        """Record a kernel the host calls directly because it answers (gather/scatter_add
        return the first bad index): a replay calls it between runs of the queued commands
        and raises on a bad index as an uncaptured call does."""
        if self.recording_here():
            self.recording(self.names.setdefault(kernel, kernel), args, checked=True)

    def owns(self, handle_backend):
        return handle_backend.capturable and handle_backend.capture_recorder() is self

    # ---- buffers ----------------------------------------------------------------------------
    @staticmethod
    def buffer(h):
        """(Buffer, byte offset, byte size) of a contiguous handle."""
        return h.buf, h.ptr - h.buf.ptr, _nbytes(h)

    def host_scalar(self, value):
        from .. import dtypes
        out = self.backend._new((), dtypes.float32)
        self.write_scalar(out.buf, 0, value)
        return out

    def write_scalar(self, buffer, offset, value):
        self.commands.flush()
        self.backend.engine.write(buffer.ptr + offset, struct.pack("<f", float(value)))

    def new_output(self, shape, dtype):
        return self.backend._new(shape, dtype)

    def contiguous(self, h):
        return self.backend._contiguous(h)

    def assign(self, dst, src):
        """Copy src into dst's own buffer, in place (state updates under cn.capture)."""
        self.backend.copy_into(dst, src)

    def keep(self, owner, buffers):
        """Nothing to do: the program's references keep its Buffers out of the heap's free
        lists (a Buffer's block goes back only when the Buffer is collected)."""

    # ---- programs ---------------------------------------------------------------------------
    def prepare(self, launches):
        program = Program(self.backend, launches)
        return program, program.offsets

    def replay(self, program, rebinds, patches, copies):
        """One run_commands call (one more per host-checked kernel): the program with inputs
        rebound and seeds patched, then the output copies. program None: only the copies.
        What varies between replays (input and output addresses, seeds) is compared with what
        the program's block holds: a replay whose inputs and outputs sit where the last ones
        did (a page predicting again and again) writes nothing before its one call."""
        if program is None:
            tail = self._copy_commands(copies)
            self.commands.flush()
            block = _Block(self.heap, 4 * len(tail))
            self.backend.engine.write(block.ptr, tail.tobytes())
            self.backend.engine.call("run_commands", command_word(block.ptr), len(tail))
            return
        slots = program.slots
        bound = [buffers[slot].ptr + offset
                 for i, buffers in rebinds.items() for _, slot, offset in slots[i]]
        bound += [data for _, data in patches]
        # (a copy's descriptor too: the constant cache may have moved it since)
        bound += [(src.ptr + src_off, dst.ptr + dst_off, self._copy_descriptor(nbytes))
                  for src, src_off, dst, dst_off, nbytes in copies]
        if bound != program.bound:
            self.invalidate()
            ints = array("i", program.ints)
            for i, buffers in rebinds.items():
                for position, slot, offset in slots[i]:
                    ints[position] = command_word(buffers[slot].ptr + offset)
            for offset, data in patches:
                ints[offset // 4] = struct.unpack("<i", data)[0]
            ints.extend(self._copy_commands(copies))
            if program.block is None or program.block.size < 4 * len(ints):
                program.block = _Block(self.heap, 4 * len(ints))
            self.backend.engine.write(program.block.ptr, ints.tobytes())
            program.written, program.bound = ints, bound
        self.commands.flush()
        ints, ptr = program.written, program.block.ptr
        call, start = self.backend.engine.call, 0
        for position, name, count in program.checked:
            if position > start:
                call("run_commands", command_word(ptr + 4 * start), position - start)
            bad = call(name, *ints[position + 1:position + 1 + count])
            if bad >= 0:
                raise IndexingError("%s: an index is out of bounds (position %d of its index "
                                    "tensor) in a cn.capture replay" % (name.rsplit("_", 1)[0], bad))
            start = position + 1 + count
        call("run_commands", command_word(ptr + 4 * start), len(ints) - start)

    # ---- a host's own replays ------------------------------------------------------------
    PLAN_WORDS = ("owner", "commands", "count", "input", "input bytes", "output", "output bytes")

    def plan_address(self):
        """Address of the plan block: uint32 words PLAN_WORDS (addresses, byte sizes, the
        command count); `owner` is 0 while no plan holds."""
        if self.plan is None:
            self.plan = _Block(self.heap, 4 * len(self.PLAN_WORDS))
            self.backend.engine.write(self.plan.ptr, bytes(self.plan.size))
        return self.plan.ptr

    def standalone(self, program, inputs, owner):
        """Hand `program` (core/capture.py `Captured.replayable()`, just replayed with the
        handles `inputs` bound) to a host that replays it by itself while the plan block's
        owner word is `owner` (a nonzero int the caller picks): write the input at its
        address, call run_commands(commands, count), read the output at its address. The
        program and the input are kept alive meanwhile. False (no plan) unless the program
        has one input, bound at `inputs[0]` by its last replay, and one output that a kernel
        writes, and needs no host calls between its commands (gather)."""
        prepared = program.prepared
        outputs = program.output_views()
        if (prepared.checked or prepared.written is None or program.input_count != 1
                or len(inputs) != 1 or outputs is None or len(outputs) != 1):
            return False
        (h,), (raw, offset, nbytes, _, _) = inputs, outputs[0]
        # The last replay bound every launch that reads the input (program.rebinds: launch,
        # [(buffer slot, input)]) in this order, all its buffers (replay's `bound`): the input's
        # slots must hold `h`, else the commands read the input somewhere else.
        bound = iter(prepared.bound)
        for i, pairs in program.rebinds:
            inputs_at = {slot for slot, _ in pairs}
            for _, slot, at in prepared.slots[i]:
                if next(bound, None) != h.ptr + at and slot in inputs_at:
                    return False
        self.invalidate()   # one plan at a time
        words = array("I", [owner, prepared.block.ptr, len(prepared.ints), h.ptr, _nbytes(h),
                            raw.ptr + offset, nbytes])
        self.backend.engine.write(self.plan_address(), words.tobytes())
        self.handed_out = (program, h)
        program.on_stale.append(self.invalidate)
        self.commands.on_queue = self.invalidate
        return True

    def invalidate(self):
        """The plan `standalone` handed out no longer holds: zero its owner word."""
        if self.handed_out is None:
            return
        program = self.handed_out[0]
        self.handed_out = None
        self.commands.on_queue = None
        if self.invalidate in program.on_stale:
            program.on_stale.remove(self.invalidate)
        self.backend.engine.write(self.plan.ptr, bytes(4))

    def _copy_commands(self, copies):
        tail, copy_id = array("i"), self.commands.ids["copy_u8"]
        for src, src_off, dst, dst_off, nbytes in copies:
            tail.extend((copy_id, command_word(self._copy_descriptor(nbytes)),
                         command_word(dst.ptr + dst_off), command_word(src.ptr + src_off)))
        return tail

    def _copy_descriptor(self, nbytes):
        """The descriptor of a copy of nbytes bytes, kept with the backend's constants."""
        constants, key = self.backend.engine.constants, ("copy_u8", nbytes)
        desc = constants.get(key)
        if desc is None:
            desc = constants[key] = self.backend._descriptor((nbytes,), [[1], [1]])
        return desc


def _nbytes(h):
    return numel(h.shape) * _SIZE[h.dtype]


class _Block:
    """A block of linear memory for a program's commands, back to the heap when collected."""

    def __init__(self, heap, nbytes):
        self.heap = heap
        self.ptr, self.size = heap.alloc(nbytes)

    def __del__(self):
        self.heap.release(self.ptr, self.size)
