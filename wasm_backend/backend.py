"""cn.Wasm(): the backend protocol on WebAssembly SIMD kernels (kernels.py, runtime.h).

Tensor data lives in the module's linear memory; a handle (WasmArray) is a strided view of a
buffer there: reshape of contiguous data, permute, expand and slice make views and move no
bytes; every kernel that reads elementwise reads strided operands directly (broadcasting is a
stride of 0), and the few that need contiguous input (matmul's left operand, reductions,
unfold2d) get a copy only when the view is not contiguous. This module only decides layouts
and calls kernels; the engine (engine_browser.py, engines.py) is how Python reaches them.
"""
import struct
from array import array

from .. import dtypes
from ..backend import Backend, _hash32, broadcast_shape, is_row_major, numel, row_major_strides, unfold2d_output_size
from ..errors import DTypeError, IndexingError, SizeLimitError
from ..ops import result_dtype
from ..profile import record
from . import kernels

_CODE = {dtypes.float32: "f32", dtypes.int32: "i32", dtypes.bool_: "u8", dtypes.int8: "i8",
         dtypes.uint8: "ui8", dtypes.float16: "f16"}
_ARRAY = {dtypes.float32: "f", dtypes.int32: "i", dtypes.bool_: "B", dtypes.int8: "b",
          dtypes.uint8: "B", dtypes.float16: "H"}   # float16: its bit patterns
_SIZE = {dtypes.float32: 4, dtypes.int32: 4, dtypes.bool_: 1, dtypes.int8: 1, dtypes.uint8: 1,
         dtypes.float16: 2}
HALF_PANEL = 65536   # runtime.h H_PANEL: the float16 B panel's floats, so matmul_quantized's K at most
# matmul_quantized's code of a zero point's dtype (runtime.h)
_ZP_CODE = {None: 0, dtypes.int8: 1, dtypes.uint8: 2, dtypes.int32: 3}
# conv2d_f32's activation codes (runtime.h conv_epilogue)
_ACTIVATION_CODES = {None: 0, "relu": 1, "relu6": 2, "silu": 3, "hardswish": 4, "hardsigmoid": 5}
CONV_PANEL_BYTES = 1 << 20  # conv2d's column panel: fits a core's L2 cache
_PAGE = 65536


_STRIDES = {}  # shape -> its row-major strides (a model meets the same few shapes every run)


def _contiguous_strides(shape):
    strides = _STRIDES.get(shape)
    if strides is None:
        strides = row_major_strides(shape)
        if len(_STRIDES) < 4096:
            _STRIDES[shape] = strides
    return strides


def _f32_bits(value):
    return struct.unpack("<i", struct.pack("<f", value))[0]


class Heap:
    """The linear memory above the module's stack and data, handed out in size classes
    (quarter steps between powers of two, 16-byte aligned for SIMD loads) and reused through
    free lists; grows the memory when full. Buffers give their block back when collected."""

    def __init__(self, engine):
        self.engine = engine
        self.top = (engine.call("heap_base") + 15) & ~15
        self.end = engine.call("memory_pages") * _PAGE
        self.free = {}
        self.in_use = 0
        self.classes = {}  # nbytes -> size class (a model allocates the same sizes every run)
        self.watch = None  # capture.py's hook while cn.capture records (else None)
        self.recorder = None  # capture.py's CommandRecorder, one per engine

    @staticmethod
    def size_class(nbytes):
        n = max(16, nbytes)
        top = 1 << (n - 1).bit_length()  # power of two >= n
        step = max(16, top >> 3)
        return (n + step - 1) // step * step

    def alloc(self, nbytes):
        size = self.classes.get(nbytes)
        if size is None:
            size = self.classes[nbytes] = self.size_class(nbytes)
        blocks = self.free.get(size)
        self.in_use += size
        if blocks:
            return blocks.pop(), size
        ptr = self.top
        self.top += size
        if self.top > self.end:
            pages = (self.top - self.end + _PAGE - 1) // _PAGE
            pages = max(pages, self.end // _PAGE // 4)  # grow geometrically: fewer, larger steps
            if self.engine.call("memory_grow", pages) < 0:
                self.top -= size
                self.in_use -= size
                raise MemoryError("cn.Wasm(): cannot grow the WebAssembly memory by %d pages for "
                                  "%d bytes (in use: %d bytes)" % (pages, nbytes, self.in_use))
            self.end += pages * _PAGE
            self.engine.memory_grown()
        return ptr, size

    def release(self, ptr, size):
        self.in_use -= size
        self.free.setdefault(size, []).append(ptr)


class Commands:
    """Kernel calls queued in program order and run by one call of the module's run_commands:
    a forward pass costs the host one call instead of one per kernel (a JS call from Pyodide,
    a round trip to Node). Anything the host does directly (write, read, a kernel whose result
    it needs) runs the queue first, so it sees every earlier kernel's effect; a block freed
    while queued kernels still use it can only be reused by later queued kernels or after a
    flush, so queue order keeps it safe."""

    CAPACITY = 16384  # int32s per batch
    PAD = 1024        # flushed lengths are multiples of this: the browser engine reuses views
    ZEROS = bytes(4 * PAD)

    def __init__(self, engine, heap):
        self.engine = engine
        self.ids = {name: i for i, (name, _) in enumerate(kernels.queued_kernels())}
        self.ptr = heap.alloc(4 * self.CAPACITY)[0]
        self.ints = array("i")
        self.launches = 0
        self.recording = None  # capture.py's hook while cn.capture records (else None)
        self.on_queue = None   # capture.py's hook while a host replays a program by itself

    def add(self, name, *args):
        """Queue kernel `name`; args are ints and WasmArrays (passed as their addresses, and
        named as buffers to a capture recording in progress: capture.py)."""
        ints = self.ints
        if not ints and self.on_queue is not None:
            self.on_queue()  # queued work must run before any later replay: the host's stops
        ints.append(self.ids[name])
        ints.extend([command_word(a if a.__class__ is int else a.ptr) for a in args])
        self.launches += 1
        if self.recording is not None:
            self.recording(name, args)
        if len(ints) > self.CAPACITY - 64:
            self.flush()

    def flush(self):
        ints = self.ints
        if ints:
            n = len(ints)
            self.ints = array("i")
            ints.frombytes(self.ZEROS[:4 * (-n % self.PAD)])
            self.engine.write(self.ptr, ints.tobytes())
            self.engine.call("run_commands", command_word(self.ptr), n)


def command_word(address):
    """An address of the module's memory as a command-list word (int32): wasm32 addresses run to
    4 GiB, so those past 2 GiB are stored as negative numbers (C reads them back unsigned)."""
    return address - (1 << 32) if address >= 1 << 31 else address


class Buffer:
    __slots__ = ("ptr", "size", "heap", "__weakref__")

    def __init__(self, heap, nbytes):
        self.heap = heap
        self.ptr, self.size = heap.alloc(nbytes)
        if heap.watch is not None:  # capture.py: buffers allocated while recording
            heap.watch(self)

    def __del__(self):
        heap = self.heap
        if heap is not None:
            heap.release(self.ptr, self.size)


class WasmArray:
    """A strided view of a Buffer: element offset, shape, element strides, dtype."""
    __slots__ = ("buf", "offset", "shape", "strides", "dtype")

    def __init__(self, buf, offset, shape, strides, dtype):
        self.buf, self.offset, self.shape, self.strides, self.dtype = buf, offset, shape, strides, dtype

    @property
    def ptr(self):
        return self.buf.ptr + self.offset * _SIZE[self.dtype]

    def is_contiguous(self):
        if _STRIDES.get(self.shape) is self.strides:  # the shared row-major tuple: a fresh array
            return True
        return is_row_major(self.shape, self.strides)

    def __repr__(self):
        return "WasmArray(shape=%s, dtype=%r, strides=%s)" % (self.shape, self.dtype, self.strides)


def _merge_dims(shape, operand_strides):
    """Drop size-1 dims and merge neighbours that every operand walks contiguously, so the
    kernels' rows (the last dim) are as long as possible. At least one dim remains."""
    dims = [(n, [s[i] for s in operand_strides]) for i, n in enumerate(shape) if n != 1]
    if not dims:
        return [1], [[0] for _ in operand_strides]
    merged = [dims[0]]
    for n, strides in dims[1:]:
        pn, pstrides = merged[-1]
        if all(ps == s * n for ps, s in zip(pstrides, strides)):
            merged[-1] = (pn * n, strides)
        else:
            merged.append((n, strides))
    return [n for n, _ in merged], [[s[k] for _, s in merged] for k in range(len(operand_strides))]


def _conv_panel(cg, groups, taps, pixels):
    """Output pixels per column panel of conv2d_f32 and its gradients (runtime.h): 0, the
    direct loops, for one input channel per group; else a panel whose columns fill at most
    CONV_PANEL_BYTES, 8 pixels at least."""
    return 0 if cg == 1 and groups > 1 else min(pixels, max(8, CONV_PANEL_BYTES // (4 * taps)))


def _broadcast_strides(h, shape):
    """h's strides seen from the (same-ndim) shape it broadcasts to: 0 where h has size 1."""
    return [0 if n == 1 and m != 1 else s for n, m, s in zip(h.shape, shape, h.strides)]


class Wasm(Backend):
    """The backend protocol on WebAssembly SIMD128 kernels.

    In Pyodide the kernels are the module the page loaded (`await cinders.wasm.load()` or
    wasm/cinders.js does it); on the desktop the same kernel source runs natively compiled for
    this CPU where clang is installed (engine="native"), else the very same module runs in this
    process in Wasmtime ("wasmtime"; a Node child process, "node", where the `wasmtime` package
    is missing): engines.py. `engine=` takes one of those names or any object with the engine
    interface (call, write, read, memory_grown)."""

    name = "wasm"

    # The optional conv2d primitive (core/backend.py) is one kernel here (runtime.h conv2d_f32).
    conv2d_kernel = True
    # ... and so is each of its gradients (runtime.h conv2d_grad_input_f32, _weight_f32,
    # _bias_f32): cn.Autodiff runs them instead of unfold2d/fold2d and matmuls.
    conv2d_backward_kernels = True
    # ... and the forward applies these activations at its store (runtime.h conv_epilogue)
    conv2d_activations = ("relu", "relu6", "silu", "hardswish", "hardsigmoid")
    # ... and so are lstm_cell and gru_cell (runtime.h lstm_cell_f32, gru_cell_f32).
    recurrent_kernels = True
    # cn.capture records the queued kernel calls and replays them as one call (capture.py).
    capturable = True
    # int8/uint8 at one byte each in linear memory, float16 at two (its bit patterns, widened
    # to float32 by a cast kernel before any op); quantized weights stay 8-bit or packed
    # 4-bit: matmul_quantized dequantizes them as it reads them (runtime.h).
    storage_dtypes = (dtypes.int8, dtypes.uint8, dtypes.float16)
    quantized_matmul = True
    # ... and the activations' DynamicQuantizeLinear is one kernel (runtime.h dynamic_quantize_f32)
    dynamic_quantize = True
    # ... and so is a QDQ activation's QuantizeLinear -> DequantizeLinear (runtime.h quantize_dequantize_f32)
    quantize_dequantize = True
    # ... and quantized 2-D convolutions read the 8-bit weight in place and multiply on the
    # integer kernel of matmul_quantized (runtime.h conv2d_quantized)
    quantized_conv2d = True

    def __init__(self, engine=None):
        if engine is None or isinstance(engine, str):
            from . import engines
            engine = engines.default_engine() if engine is None else engines.engine(engine)
        self.engine = engine
        heap = getattr(engine, "heap", None)
        if heap is None:
            heap = engine.heap = Heap(engine)
            engine.constants = {}  # descriptor (or its operands' layout) -> its address
            engine.constant_blocks = []
            engine.pinned_constants = {}  # block address -> captured programs reading it
            engine.commands = Commands(engine, heap)
        self.heap = heap
        self.commands = engine.commands
        if heap.recorder is None:
            from .capture import CommandRecorder  # (imports cinders.capture: not at load time)
            heap.recorder = CommandRecorder(self)
        self._recorder = heap.recorder
        self._run = self.commands.add
        self._profiles = 0  # cn.profile blocks open on this backend (profile_start)

    @property
    def threads(self):
        """How many threads the kernels run on: 1, or the threaded build's pool where the page
        could start one (engine_browser.py; engines.NodeEngine(threads=n) on the desktop)."""
        return self.engine.threads

    @property
    def shares_constants(self):
        """Not while cn.capture records this thread: a scalar the tensor layer caches would be
        filled in one recording and found in the next, and a changed Python number would be
        baked in unseen; uncached, every scalar is a fill whose value the recordings compare."""
        return not self._recorder.recording_here()

    def capture_recorder(self):
        return self._recorder

    def copy_into(self, dst, src):
        """Copy src's values into dst's own buffer (same shape and dtype), in place."""
        self._map("copy_%s" % _CODE[dst.dtype], dst, [src])

    def synchronize(self):
        self.commands.flush()

    def memory_stats(self):
        """Bytes of the module's linear memory (the keys cn.Wgpu's memory_stats has where they
        mean the same): held by live tensors (their size classes), free in the heap's lists
        for reuse, handed out by the heap in all, and the whole memory."""
        heap = self.heap
        pooled = sum(size * len(blocks) for size, blocks in heap.free.items())
        return {"allocated_bytes": heap.in_use, "pooled_bytes": pooled,
                "reserved_bytes": heap.in_use + pooled, "memory_bytes": heap.end}

    def profile_start(self):
        """Inside cn.profile each queued kernel is reported as a "kernel" event (its name); the
        queue is wrapped only then, so unprofiled calls cost nothing more."""
        self._profiles += 1
        queue = self.commands.add

        def run(name, *args):
            record(self, {"kind": "kernel", "name": name})
            queue(name, *args)
        self._run = run

    def profile_stop(self):
        self._profiles -= 1
        if not self._profiles:
            self._run = self.commands.add

    def _write(self, ptr, data):
        self.commands.flush()
        self.engine.write(ptr, data)

    def _call_now(self, name, *args):
        self.commands.flush()
        return self.engine.call(name, *args)

    def device_key(self):
        return ("Wasm", id(self.engine))

    # -- plumbing ---------------------------------------------------------------------------
    def _new(self, shape, dtype):
        shape = tuple(shape)
        return WasmArray(Buffer(self.heap, numel(shape) * _SIZE[dtype]), 0, shape,
                         _contiguous_strides(shape), dtype)

    def _constant(self, ints):
        """Address of these int32s in linear memory. A model runs the same shapes again and
        again, so descriptors are written once and reused: a warm inference writes no
        descriptor (each write is a JS call in the browser). Bounded: at 1024 entries the
        blocks go back to the heap and the cache starts over."""
        constants = self.engine.constants
        ptr = constants.get(ints)
        if ptr is None:
            blocks = self.engine.constant_blocks
            if len(blocks) >= 1024:
                # (a captured program's descriptors stay: capture.py pins them)
                pinned = self.engine.pinned_constants
                for block in blocks:
                    if block[0] not in pinned:
                        self.heap.release(*block)
                blocks[:] = [block for block in blocks if block[0] in pinned]
                kept = {key: ptr for key, ptr in constants.items() if ptr in pinned}
                constants.clear()
                constants.update(kept)
            block = self.heap.alloc(4 * len(ints))
            blocks.append(block)
            self._write(block[0], array("i", ints).tobytes())
            ptr = constants[ints] = block[0]
        return ptr

    def _descriptor(self, shape, operand_strides):
        shape, strides = _merge_dims(shape, operand_strides)
        desc = [len(shape)] + shape
        for s in strides:
            desc += s
        return self._constant(tuple(desc))

    def _map(self, kernel, out, operands):
        """One strided elementwise kernel over out's shape (operands broadcast to it)."""
        layout = (out.shape, out.strides) + tuple((h.shape, h.strides) for h in operands)
        desc = self.engine.constants.get(layout)
        if desc is None:
            if numel(out.shape) == 0:
                return out
            strides = [list(out.strides)] + [_broadcast_strides(h, out.shape) for h in operands]
            desc = self._descriptor(out.shape, strides)
            self.engine.constants[layout] = desc
        self._run(kernel, desc, out, *operands)
        return out

    def _contiguous(self, h):
        if h.is_contiguous():
            return h
        return self._map("copy_%s" % _CODE[h.dtype], self._new(h.shape, h.dtype), [h])

    # -- creation and reading ----------------------------------------------------------------
    def shape(self, h):
        return h.shape

    def dtype(self, h):
        return h.dtype

    def from_flat(self, values, shape, dtype):
        out = self._new(shape, dtype)
        if dtype is dtypes.bool_:
            values = [1 if v else 0 for v in values]
        if dtype is dtypes.float16:  # rounded on the host from the Python floats, as NumPy does
            data = dtypes.float16_bytes([float(v) for v in values])
        elif values.__class__ is array and values.typecode == _ARRAY[dtype]:
            data = values.tobytes()  # (the page's pixels: no element-wise copy first)
        else:
            data = array(_ARRAY[dtype], values).tobytes()
        if data:
            self._write(out.ptr, data)
        return out

    def full(self, shape, value, dtype):
        out = self._new(shape, dtype)
        n = numel(out.shape)
        if n:
            if dtype is dtypes.bool_:
                self._run("fill_8", out, n, 1 if value else 0)
            elif _SIZE[dtype] == 1:
                self._run("fill_8", out, n, int(value) & 0xFF)
            elif dtype is dtypes.float16:  # two per word (a block is a multiple of 16 bytes)
                bits = struct.unpack("<H", dtypes.float16_bytes([float(value)]))[0]
                self._run("fill_32", out, (n + 1) // 2, struct.unpack("<i", struct.pack("<HH", bits, bits))[0])
            else:
                bits = _f32_bits(value) if dtype is dtypes.float32 else int(value)
                self._run("fill_32", out, n, bits)
        return out

    def random(self, shape, distribution, seed, dtype):
        if distribution not in ("uniform", "normal"):
            raise ValueError("unknown distribution %r: use 'uniform' or 'normal'" % (distribution,))
        out = self._new(shape, dtypes.float32)
        n = numel(out.shape)
        if n:
            key = _hash32(seed)
            self._run("random_f32", out, n, key - (1 << 32) if key >= 1 << 31 else key,
                      int(distribution == "normal"))
            if self.commands.recording is not None:
                self.commands.recording.seeded(seed)
        return out if dtype is dtypes.float32 else self.cast(out, dtype)

    def to_flat(self, h):
        h = self._contiguous(h)
        n = numel(h.shape)
        values = array(_ARRAY[h.dtype])
        if n:
            self._recorder.check_read()
            self.commands.flush()
            values.frombytes(self.engine.read(h.ptr, n * _SIZE[h.dtype]))
        if h.dtype is dtypes.bool_:
            return [v != 0 for v in values]
        if h.dtype is dtypes.float16:
            return dtypes.float16_values(values.tobytes())
        return values.tolist()

    async def to_flat_async(self, h):
        """The same as to_flat (kernels run synchronously); for code written for async devices."""
        return self.to_flat(h)

    # -- elementwise ---------------------------------------------------------------------------
    def unary(self, op, x):
        kernel = "unary_%s_%s" % (op, _CODE[x.dtype])
        dtype = result_dtype(op, x.dtype)
        if kernel not in self.engine.kernels:
            if dtype is dtypes.bool_ or x.dtype is dtypes.float32:
                raise DTypeError("cn.Wasm(): no %s kernel for %r" % (op, x.dtype))
            # float-only math on an int/bool tensor: in float32, cast back (as cn.Python())
            return self.cast(self.unary(op, self.cast(x, dtypes.float32)), x.dtype)
        return self._map(kernel, self._new(x.shape, dtype), [x])

    def binary(self, op, a, b):
        kernel = "binary_%s_%s" % (op, _CODE[a.dtype])
        shape = broadcast_shape(a.shape, b.shape)
        dtype = result_dtype(op, a.dtype)
        if kernel not in self.engine.kernels:
            if a.dtype is dtypes.float32 or dtype is dtypes.bool_:
                raise DTypeError("cn.Wasm(): no %s kernel for %r" % (op, a.dtype))
            f32 = self.binary(op, self.cast(a, dtypes.float32), self.cast(b, dtypes.float32))
            return self.cast(f32, a.dtype)
        return self._map(kernel, self._new(shape, dtype), [a, b])

    def where(self, cond, a, b):
        shape = broadcast_shape(cond.shape, a.shape, b.shape)
        return self._map("where_%s" % _CODE[a.dtype], self._new(shape, a.dtype), [cond, a, b])

    def cast(self, x, dtype):
        if dtype is x.dtype:
            return x
        kernel = "cast_%s_%s" % (_CODE[x.dtype], _CODE[dtype])
        if kernel not in self.engine.kernels:
            # float16 converts through float32 only; between bool and 8-bit dtypes: through int32
            via = dtypes.float32 if dtypes.float16 in (x.dtype, dtype) else dtypes.int32
            return self.cast(self.cast(x, via), dtype)
        return self._map(kernel, self._new(x.shape, dtype), [x])

    # -- reductions ------------------------------------------------------------------------------
    def reduce(self, op, x, axis, keepdim):
        x = self._contiguous(x)
        outer, n, inner = numel(x.shape[:axis]), x.shape[axis], numel(x.shape[axis + 1:])
        shape = x.shape[:axis] + ((1,) if keepdim else ()) + x.shape[axis + 1:]
        dtype = result_dtype(op, x.dtype)
        kernel = "reduce_%s_%s" % (op, _CODE[x.dtype])
        if kernel not in self.engine.kernels:  # sum/prod of bool: in int32
            return self.reduce(op, self.cast(x, dtypes.int32), axis, keepdim)
        out = self._new(shape, dtype)
        if outer * inner:
            self._run(kernel, out, x, outer, n, inner)
        return out

    # -- matmul ------------------------------------------------------------------------------------
    def _batched(self, h, batch_shape, matrix_size):
        """(pointer, batch stride) of a contiguous-per-matrix operand: stride 0 when every batch
        dim broadcasts, a copy expanded to the batch shape when only some do."""
        own = h.shape[:-2]
        if numel(own) == 1:
            return h, 0
        if own != batch_shape:
            h = self._contiguous(self.expand(h, batch_shape + h.shape[-2:]))
        return h, matrix_size

    def matmul(self, a, b):
        batch_shape = tuple(max(m, n) if m and n else 0 for m, n in zip(a.shape[:-2], b.shape[:-2]))
        (m, k), n = a.shape[-2:], b.shape[-1]
        out = self._new(batch_shape + (m, n), dtypes.float32)
        batch = numel(batch_shape)
        if batch * m * n == 0:
            return out
        a = self._contiguous(a)
        # b's transpose contiguous (x @ W.T in Linear): dot products along contiguous K
        nd = len(b.shape)
        bt = self.permute(b, tuple(range(nd - 2)) + (nd - 1, nd - 2))
        transposed = not b.is_contiguous() and bt.is_contiguous()
        b = bt if transposed else self._contiguous(b)
        a, a_stride = self._batched(a, batch_shape, m * k)
        b, b_stride = self._batched(b, batch_shape, k * n)
        self._run("matmul_f32", out, a, b, batch, m, k, n, a_stride, b_stride,
                         int(transposed))
        return out

    def matmul_quantized(self, a, q, scale, zero_point, layout, a_scale=None):
        """C = a @ dequantize(B), B read from q's bytes inside the kernel (core/backend.py,
        "quantized_matmul"); a_scaled float32 a sums its integers exactly in int32 (runtime.h)."""
        m, k = a.shape
        n = layout.n
        integer = scale is None and not q.dtype.is_float   # (a float16 B has no scale)
        out = self._new((m, n), dtypes.int32 if integer else dtypes.float32)
        if m * n == 0:
            return out
        if k == 0:
            self._run("fill_32", out, m * n, 0)
            return out
        if layout.bits == 16 and k > HALF_PANEL:
            raise SizeLimitError("cn.Wasm matmul_quantized: a float16 B of K = %d rows (at most %d: "
                                 "runtime.h h_panel holds one column of it)" % (k, HALF_PANEL))
        a = self._contiguous(a)
        nibbles = 2 if layout.bits == 4 else 1
        params = (m, n, k, layout.block or k, q.offset * nibbles + layout.q[0], layout.q[1],
                  layout.q[2], layout.scale[1], layout.scale[2],
                  0 if zero_point is None else zero_point.offset * (2 if layout.zp_bits == 4 else 1)
                  + layout.zp[0], layout.zp[1], layout.zp[2], layout.zp_default, layout.bits,
                  layout.zp_bits, int(q.dtype is dtypes.int8),
                  _ZP_CODE[None if zero_point is None else zero_point.dtype], int(integer),
                  int(a_scale is not None))
        # the integer product's A as int16 pairs (runtime.h pack_pairs): (m, k rounded up to even)
        pairs = integer or a_scale is not None
        scratch = self._new((m * (k + (k & 1)) // 2,), dtypes.int32) if pairs else 0
        # (q and zero_point are read from their buffers' starts: the offsets are in params)
        self._run("matmul_quantized", out, a, q.buf.ptr,
                  0 if scale is None else scale.ptr + 4 * layout.scale[0],
                  0 if zero_point is None else zero_point.buf.ptr, self._constant(params), scratch,
                  0 if a_scale is None else self._contiguous(a_scale))
        return out

    def dynamic_quantize(self, x):
        """ONNX DynamicQuantizeLinear in one kernel (core/backend.py "dynamic_quantize")."""
        x = self._contiguous(x)
        y = self._new(x.shape, dtypes.int32)
        scale, zero_point = self._new((), dtypes.float32), self._new((), dtypes.int32)
        self._run("dynamic_quantize_f32", y, x, scale, zero_point, numel(x.shape))
        return y, scale, zero_point

    def quantize_dequantize(self, x, y_scale, y_zero_point, x_scale, x_zero_point, lo, hi):
        """QuantizeLinear then DequantizeLinear in one kernel (core/backend.py "quantize_dequantize")."""
        x = self._contiguous(x)
        y = self._new(x.shape, dtypes.float32)
        zero_points = [None if z is None else self._contiguous(z) for z in (y_zero_point, x_zero_point)]
        params = (numel(x.shape), lo, hi) + tuple(_ZP_CODE[None if z is None else z.dtype] for z in zero_points)
        self._run("quantize_dequantize_f32", y, x, self._contiguous(y_scale), zero_points[0] or 0,
                  self._contiguous(x_scale), zero_points[1] or 0, self._constant(params))
        return y

    # -- movement: views ------------------------------------------------------------------------------
    def reshape(self, x, shape):
        shape = tuple(shape)
        x = self._contiguous(x)
        return WasmArray(x.buf, x.offset, shape, _contiguous_strides(shape), x.dtype)

    def permute(self, x, dims):
        return WasmArray(x.buf, x.offset, tuple(x.shape[d] for d in dims),
                         tuple(x.strides[d] for d in dims), x.dtype)

    def expand(self, x, shape):
        shape = tuple(shape)
        return WasmArray(x.buf, x.offset, shape, tuple(_broadcast_strides(x, shape)), x.dtype)

    def slice(self, x, starts, stops, steps):
        offset = x.offset + sum(a * s for a, s in zip(starts, x.strides))
        shape = tuple(max(0, (b - a + s - 1) // s) for a, b, s in zip(starts, stops, steps))
        strides = tuple(st * s for st, s in zip(x.strides, steps))
        return WasmArray(x.buf, offset, shape, strides, x.dtype)

    def _copy_into(self, out, starts, x):
        """Copy x into the region of out that starts at `starts` (x's shape)."""
        region = self.slice(out, starts, [a + n for a, n in zip(starts, x.shape)], [1] * len(x.shape))
        self._map("copy_%s" % _CODE[x.dtype], region, [x])

    def cat(self, xs, axis):
        shape = list(xs[0].shape)
        shape[axis] = sum(x.shape[axis] for x in xs)
        out = self._new(shape, xs[0].dtype)
        starts = [0] * len(shape)
        for x in xs:
            self._copy_into(out, starts, x)
            starts[axis] += x.shape[axis]
        return out

    def pad(self, x, pads, value):
        shape = [n + before + after for n, (before, after) in zip(x.shape, pads)]
        out = self.full(shape, value, x.dtype)
        self._copy_into(out, [before for before, _ in pads], x)
        return out

    # -- indexing -----------------------------------------------------------------------------------------
    def _index_error(self, op, index, position, axis, size):
        bad = self.to_flat(index)[position]
        return IndexingError("%s: index %d is out of bounds for axis %d with size %d" % (op, bad, axis, size))

    def _indexed(self, kernel, op, out, data, index, axis, size, axis_stride, target):
        """gather/scatter_add over index's shape: operands (out, data, index); the operand
        `target` (0 or 1) is addressed by the index along axis, so its stride there is 0."""
        if numel(index.shape) == 0:
            return out
        strides = [list(out.strides), list(data.strides), list(index.strides)]
        strides[target][axis] = 0
        desc = self._descriptor(index.shape, strides)
        self._recorder.host_checked(kernel, (desc, out, data, index, size, axis_stride))
        bad = self._call_now(kernel, command_word(desc), command_word(out.ptr), command_word(data.ptr),
                             command_word(index.ptr), size, axis_stride)
        if bad >= 0:
            raise self._index_error(op, self._contiguous(index), bad, axis, size)
        return out

    def gather(self, x, axis, index):
        out = self._new(index.shape, x.dtype)
        return self._indexed("gather_%s" % _CODE[x.dtype], "gather", out, x, index, axis,
                             x.shape[axis], x.strides[axis], 1)

    def scatter_add(self, x, axis, index, src):
        if x.dtype is dtypes.bool_:
            raise DTypeError("cn.Wasm(): scatter_add needs float32 or int32, got %r" % (x.dtype,))
        out = self._map("copy_%s" % _CODE[x.dtype], self._new(x.shape, x.dtype), [x])
        return self._indexed("scatter_add_%s" % _CODE[x.dtype], "scatter_add", out, src, index, axis,
                             x.shape[axis], out.strides[axis], 0)

    # -- images ----------------------------------------------------------------------------------------------
    def _geometry(self, n, c, h, w, kernel, stride, padding, dilation):
        oh, ow = unfold2d_output_size(h, w, kernel, stride, padding, dilation)
        return self._constant((n, c, h, w, *kernel, *stride, *padding, *dilation, oh, ow)), oh, ow

    def unfold2d(self, x, kernel, stride, padding, dilation, pad_value):
        x = self._contiguous(x)
        n, c, h, w = x.shape
        g, oh, ow = self._geometry(n, c, h, w, kernel, stride, padding, dilation)
        out = self._new((n, c * kernel[0] * kernel[1], oh * ow), dtypes.float32)
        if numel(out.shape):
            self._run("unfold2d_f32", out, x, g, _f32_bits(pad_value))
        return out

    def conv2d(self, x, w, bias, stride, padding, dilation, groups, activation):
        x, w = self._contiguous(x), self._contiguous(w)
        (n, c, h, wd), (o, cg, kh, kw) = x.shape, w.shape
        (pt, pb), (pl, pr) = padding
        oh, ow = unfold2d_output_size(h + pt + pb, wd + pl + pr, (kh, kw), stride, (0, 0), dilation)
        out = self._new((n, o, oh, ow), dtypes.float32)
        if numel(out.shape):
            # Panel 0 (one input channel per group): direct taps over a zero-padded plane
            # (runtime.h conv_depthwise); else the columns of a panel of pixels.
            taps = cg * kh * kw
            panel = _conv_panel(cg, groups, taps, oh * ow)
            padded = ((oh - 1) * stride[0] + (kh - 1) * dilation[0] + 1) * \
                ((ow - 1) * stride[1] + (kw - 1) * dilation[1] + 1)
            scratch = self._new((padded if panel == 0 else taps * panel,), dtypes.float32)
            g = self._constant((n, c, h, wd, o, kh, kw, *stride, pt, pl, *dilation, oh, ow, groups,
                                int(bias is not None), _ACTIVATION_CODES[activation], panel))
            b = x if bias is None else self._contiguous(bias)  # (any valid address when unused)
            self._run("conv2d_f32", out, x, w, b, scratch, g)
        return out

    # -- conv2d's backward (core/backend.py conv2d_backward_kernels; runtime.h) ----------------
    def _conv_backward_geometry(self, x_shape, w_shape, g_shape, stride, padding, dilation, groups):
        """(conv2d_f32's geometry constant, the panel, C/groups * kh * kw) for a backward kernel."""
        (n, c, h, wd), (o, cg, kh, kw), (oh, ow) = x_shape, w_shape, g_shape[2:]
        (pt, _), (pl, _) = padding
        taps = cg * kh * kw
        panel = _conv_panel(cg, groups, taps, oh * ow)
        params = (n, c, h, wd, o, kh, kw, *stride, pt, pl, *dilation, oh, ow, groups, 0, 0, panel)
        return self._constant(params), panel, taps

    def conv2d_grad_input(self, g, w, size, stride, padding, dilation, groups):
        g, w = self._contiguous(g), self._contiguous(w)
        x_shape = g.shape[:1] + (w.shape[1] * groups,) + tuple(size)
        if not numel(x_shape) or not numel(g.shape):  # nothing to compute, or nothing reaches dx
            return self.full(x_shape, 0.0, dtypes.float32)
        params, panel, taps = self._conv_backward_geometry(x_shape, w.shape, g.shape, stride,
                                                           padding, dilation, groups)
        o = g.shape[1]
        # the transposed weight, a column panel, the gradient's panel (runtime.h)
        scratch = self._new((o * taps + (taps + o // groups) * panel if panel else 1,), dtypes.float32)
        out = self._new(x_shape, dtypes.float32)
        self._run("conv2d_grad_input_f32", out, g, w, scratch, params)
        return out

    def conv2d_grad_weight(self, x, g, kernel, stride, padding, dilation, groups):
        x, g = self._contiguous(x), self._contiguous(g)
        og = g.shape[1] // groups
        w_shape = (g.shape[1], x.shape[1] // groups) + tuple(kernel)
        if not numel(w_shape) or not numel(g.shape):
            return self.full(w_shape, 0.0, dtypes.float32)
        params, panel, taps = self._conv_backward_geometry(x.shape, w_shape, g.shape, stride,
                                                           padding, dilation, groups)
        # a column panel, the gradient's panel, one partial product (runtime.h)
        scratch = self._new(((taps + og) * panel + og * taps if panel else 1,), dtypes.float32)
        out = self._new(w_shape, dtypes.float32)
        self._run("conv2d_grad_weight_f32", out, x, g, scratch, params)
        return out

    def conv2d_grad_bias(self, g):
        g = self._contiguous(g)
        n, o, oh, ow = g.shape
        out = self._new((o,), dtypes.float32)
        if o:
            self._run("conv2d_grad_bias_f32", out, g, n, o, oh * ow)
        return out

    def conv2d_quantized(self, x, x_param, q, scale, zero_point, bias, stride, padding, dilation, groups):
        """A convolution whose products are integers, on runtime.h conv2d_quantized (core/backend.py,
        "quantized_conv2d")."""
        x, q = self._contiguous(x), self._contiguous(q)
        (n, c, h, wd), (o, cg, kh, kw) = x.shape, q.shape
        (pt, pb), (pl, pr) = padding
        oh, ow = unfold2d_output_size(h + pt + pb, wd + pl + pr, (kh, kw), stride, (0, 0), dilation)
        out = self._new((n, o, oh, ow), dtypes.int32 if scale is None else dtypes.float32)
        if not numel(out.shape):
            return out
        pairs = (cg * kh * kw + 1) // 2
        # output pixels per panel: a multiple of 8 whose int16 columns fill at most CONV_PANEL_BYTES
        panel = min((oh * ow + 7) & ~7, max(8, CONV_PANEL_BYTES // (4 * pairs) & ~7))
        image = c * h * wd + (c * h * wd & 1)
        shorts = image + o * 2 * pairs + 2 * pairs * panel + 2 * (o // groups) * panel
        scratch = self._new(((shorts + 1) // 2,), dtypes.int32)
        zero_point = None if zero_point is None else self._contiguous(zero_point)
        g = self._constant((n, c, h, wd, o, kh, kw, *stride, pt, pl, *dilation, oh, ow, groups, panel,
                            int(q.dtype is dtypes.int8), _ZP_CODE[None if zero_point is None else zero_point.dtype],
                            int(zero_point is not None and numel(zero_point.shape) > 1),
                            int(scale is not None and numel(scale.shape) > 1), int(x.dtype is dtypes.float32),
                            int(bias is not None), int(x_param is not None and x.dtype is dtypes.int32),
                            int(scale is not None)))
        self._run("conv2d_quantized", out, x, 0 if x_param is None else self._contiguous(x_param), q,
                  0 if scale is None else self._contiguous(scale), 0 if zero_point is None else zero_point,
                  0 if bias is None else self._contiguous(bias), scratch, g)
        return out

    # -- the optional recurrent primitives (core/backend.py) ------------------------------------
    def lstm_cell(self, gates, c):
        gates, c = self._contiguous(gates), self._contiguous(c)
        batch, hidden = c.shape
        out = self._new((2, batch, hidden), dtypes.float32)
        self._run("lstm_cell_f32", out, gates, c, batch, hidden)
        return out

    def gru_cell(self, gx, gh, h):
        gx, gh, h = self._contiguous(gx), self._contiguous(gh), self._contiguous(h)
        batch, hidden = h.shape
        out = self._new((batch, hidden), dtypes.float32)
        self._run("gru_cell_f32", out, gx, gh, h, batch, hidden)
        return out

    def fold2d(self, cols, size, kernel, stride, padding, dilation):
        cols = self._contiguous(cols)
        n, c = cols.shape[0], cols.shape[1] // (kernel[0] * kernel[1])
        g, _, _ = self._geometry(n, c, size[0], size[1], kernel, stride, padding, dilation)
        out = self._new((n, c) + tuple(size), dtypes.float32)
        if numel(out.shape):
            self._run("fold2d_f32", out, cols, g)
        return out
