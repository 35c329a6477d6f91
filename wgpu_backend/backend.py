"""cn.Wgpu(): the backend whose every primitive is a generated WGSL kernel.

Handles are `GpuArray` views (storage, shape, strides, offset, dtype) over pooled device
buffers, so reshape of contiguous data, permute, expand and slice cost no kernel; kernels read
their inputs through strides. Ops only *record* launches on the Device (device.py); the CPU
waits for the GPU in `to_flat` alone.

An elementwise result may be written into the buffer of an input that died before the next
launch (pool.py, "In-place results"): liveness is the storage's own, so this holds however the
backend is reached (the tensor layer, Autodiff's backward, Fusion).
"""

import math
import struct
import sys
from array import array

from cinders import dtypes
from cinders.profile import ACTIVE as _PROFILING, record as _record
from cinders.backend import Backend, _hash32, broadcast_shape, is_row_major, row_major_strides, unfold2d_output_size
from cinders.errors import CindersError
from cinders.fusion.graph import row_shape, squeezed_row_shape
from cinders.ops import result_dtype

from . import conv, conv_grad, quantize
from .codegen import images
from .codegen.packing import HALF, PACKED, directives, fill_word, word_count
from .codegen.matmul import (QUANT_THREADS, matmul_direct_wgsl, matmul_params, matmul_quantized_layout,
                             matmul_quantized_regtile_wgsl, matmul_quantized_wgsl, matmul_regtile_wgsl,
                             matmul_wgsl, quantized_micro, quantized_per_word, quantized_tiling)
from .codegen.prelude import WG, MAX_GROUPS, bits, groups_for
from .matmul import VARIANTS, Tuner, split_count
from .pool import BufferPool, Placement
from .programs import ProgramRunner


class DeviceLimitError(CindersError, MemoryError):
    """A tensor larger than the device can bind to one kernel."""


class GpuArray:
    """A strided view of a pooled device buffer (counts in elements: a compute dtype's element is
    one u32 word, a storage dtype's a field of one, `DType.per_word`, codegen/packing.py)."""

    __slots__ = ("storage", "shape", "strides", "offset", "dtype", "__weakref__")

    def __init__(self, storage, shape, strides, offset, dtype):
        self.storage = storage
        self.shape = shape
        self.strides = strides
        self.offset = offset
        self.dtype = dtype

    @property
    def size(self):
        return math.prod(self.shape)

    def is_contiguous(self):
        return is_row_major(self.shape, self.strides)

    def __repr__(self):
        return "GpuArray(shape=%r, dtype=%r, strides=%r, offset=%d)" % (
            self.shape, self.dtype, self.strides, self.offset)


class _Runtime:
    """What every cn.Wgpu() on one device shares: the device, its pool, kernels, tuning.
    `serial` tells devices apart: two GPUs of one model have the same `device.name`, and a
    buffer of one device must never reach a kernel of the other (they are distinct backends)."""

    def __init__(self, device, serial):
        self.device = device
        self.serial = serial
        # float16 as array<f16> where the device has shader-f16, else packed in u32 words
        self.storage_layout = HALF if device.shader_f16 else PACKED
        self.pool = BufferPool(device)
        self.kernels = {}  # kernel key -> pipeline, without regenerating WGSL
        self.in_place_sources = {}  # in-place variant key -> WGSL, until it is first compiled
        self.recorder = None  # cn.capture's LaunchRecorder for this device (capture.py)
        self.tuner = Tuner(device.name, device.limits.get("max_compute_workgroup_storage_size",
                                                           16384))


_RUNTIMES = {}


def _runtime(adapter, instance, shader_f16):
    key = (adapter, instance, shader_f16)
    if key not in _RUNTIMES:
        if sys.platform == "emscripten":
            from .browser import BrowserDevice  # the browser device adapter (navigator.gpu)
            device = BrowserDevice(adapter, shader_f16)
        else:
            from .desktop import DesktopDevice
            device = DesktopDevice(adapter, shader_f16)
        _RUNTIMES[key] = _Runtime(device, len(_RUNTIMES))
    return _RUNTIMES[key]


class Wgpu(Backend):
    """WGSL kernels on WebGPU: wgpu-py on the desktop, navigator.gpu in the browser.

    adapter: None (default adapter), an index or a description substring (desktop).
    autotune: benchmark matmul variants on first use per shape class, a few seconds at most per
    class, remembered on disk (matmul.py). None (default): on hardware adapters only (a
    software adapter such as lavapipe or SwiftShader uses the heuristic); True: also there;
    False: never.
    instance: 0 (default) shares the adapter's device with every cn.Wgpu(adapter) of this
    process; another number opens a device of its own on that adapter (a second device on
    one GPU: data-parallel training tested on one adapter).
    shader_f16: True (default) requests the adapter's `shader-f16` feature where it has it, and
    then holds float16 tensors as `array<f16>` (plain 2-byte loads and stores); False, or an
    adapter without it (SwiftShader), packs them two to a u32 word. Same bytes, same results
    (float16 computes in float32 either way: codegen/packing.py); False opens a device of its
    own, so both layouts can be compared on one adapter."""

    name = "wgpu"

    # Declared abilities (core/backend.py): cn.Fusion compiles into this backend's kernels
    # (fusion_compiler), cn.capture records and replays its launches (core/capture.py).
    compiles_kernels = True
    capturable = True

    # The optional conv2d primitive (core/backend.py) has kernels of its own here (conv.py).
    conv2d_kernel = True
    conv2d_activations = tuple(a for a in conv.ACTIVATIONS if a)  # (WGSL at the store)
    # ... and its backward: dx, dw and dbias kernels without unfold2d or fold2d (conv_grad.py).
    conv2d_backward_kernels = True
    # ... and so has the optional pool2d primitive (codegen/images.py: a window per thread).
    pool2d_kernel = True
    # int8/uint8 packed four to a u32 word, float16 two or as f16 (codegen/packing.py).
    storage_dtypes = dtypes.STORAGE_DTYPES
    # Quantized weights stay packed: matmul_quantized dequantizes them as the kernel reads them.
    quantized_matmul = True
    # ... and the conv kernels read 8-bit and float16 weights (conv.py conv2d_quantized).
    quantized_conv2d = True
    half_conv2d = True
    # Activations: DynamicQuantizeLinear in three launches, a QDQ round trip in one (quantize.py).
    dynamic_quantize = True
    quantize_dequantize = True

    def __init__(self, adapter=None, autotune=None, instance=0, shader_f16=True):
        self._rt = _runtime(adapter, instance, bool(shader_f16))
        self.device = self._rt.device
        self.autotune = (not self.device.is_cpu) if autotune is None else bool(autotune)
        self._programs = ProgramRunner(self)
        if self.device.on_submit is None:
            # cn.profile counts submissions ("submit" events) of this device.
            self.device.on_submit = lambda: _record(self, {"kind": "submit", "name": "submit"}) \
                if _PROFILING else None

    @property
    def pool(self):
        return self._rt.pool

    @property
    def storage_layout(self):
        """Where storage dtypes sit in buffers: codegen.packing.HALF or PACKED."""
        return self._rt.storage_layout

    def capture_recorder(self):
        """cn.capture's recorder of this device's launches (capture.py, core/capture.py)."""
        if self._rt.recorder is None:
            from .capture import LaunchRecorder
            self._rt.recorder = LaunchRecorder(self)
        return self._rt.recorder

    def contiguous(self, h):
        return h if h.is_contiguous() else self._materialize(h)

    def copy_into(self, dst, src):
        """Copy src into dst's own buffer, in place (cn.capture's state updates)."""
        self._elementwise("copy", [src], dst.dtype, out=dst)

    def device_key(self):
        return ("Wgpu", self.device.name, self._rt.serial)

    def __repr__(self):
        # Two GPUs of one model describe themselves alike: the serial tells them apart.
        serial = ", device #%d" % self._rt.serial if self._rt.serial else ""
        return "cn.Wgpu(%r%s)" % (self.device.name, serial)

    # ---- housekeeping ---------------------------------------------------------------------
    def shape(self, h):
        return h.shape

    def dtype(self, h):
        return h.dtype

    def synchronize(self):
        self.device.wait_idle()

    def memory_stats(self):
        stats = self._rt.pool.stats()
        stats["pipelines"] = len(self._rt.kernels)
        return stats

    def empty_cache(self):
        self._rt.pool.empty_cache()

    def profile_start(self):
        self.device.timing += 1

    def profile_stop(self):
        self.device.flush()
        self.device.timing -= 1

    def _new(self, shape, dtype, unplaced=False, fresh=False):
        """A new contiguous handle. unplaced: its buffer is chosen only when its launch is
        settled, possibly a dead input's (pool.py, "In-place results"); fresh: a buffer no kernel
        has used."""
        shape = tuple(shape)
        nbytes = 4 * word_count(dtype, math.prod(shape))
        pool = self._rt.pool
        if nbytes > pool.limit:
            raise DeviceLimitError(
                "cn.Wgpu: a %s tensor of shape %s needs %d bytes, more than this device's "
                "maxStorageBufferBindingSize of %d bytes (%s); split it into smaller tensors"
                % (dtype.name, shape, nbytes, pool.limit, self.device.name))
        storage = pool.unplaced(nbytes) if unplaced else pool.allocate(nbytes, fresh=fresh)
        return GpuArray(storage, shape, row_major_strides(shape), 0, dtype)

    def _pipeline(self, key, build, name):
        """The compiled kernel for `key` (`build()` returns its WGSL, called once per key)."""
        found = self._rt.kernels.get(key)
        if found is None:
            source = build()
            pipeline, cached = self.device.pipeline(directives(source, self.storage_layout) + source)
            found = self._rt.kernels[key] = pipeline
            if _PROFILING:
                _record(self, {"kind": "cache_hit" if cached else "compile", "name": name})
        elif _PROFILING:
            _record(self, {"kind": "cache_hit", "name": name})
        return found

    def _launch(self, key, build, buffers, params, groups, name, bytes_read, bytes_written,
                seed=None, placement=None, flops=0):
        pipeline = self._rt.kernels.get(key)
        if pipeline is None or _PROFILING:
            pipeline = self._pipeline(key, build, name)
        on_time = None
        if _PROFILING:
            event = _record(self, {"kind": "kernel", "name": name,
                                           "bytes_read": bytes_read, "bytes_written": bytes_written})
            on_time = lambda seconds: event.__setitem__("gpu_time", seconds)  # noqa: E731
        self.device.dispatch(pipeline, buffers, params, groups, on_time, name, seed, placement,
                             flops)

    # ---- compile and launch: the interface of generated and user kernels ------------------
    def empty(self, shape, dtype):
        """A new contiguous handle with undefined contents, for a kernel to write."""
        return self._new(shape, dtype)

    def launch(self, key, build, inputs, outputs, params, groups, name="kernel", bytes_read=0,
               bytes_written=0, seed=None, donors=(), flops=0):
        """Record one launch of a generated kernel; returns its output handles.
        key: hashable, names the kernel (its pipeline is compiled once per key from `build()`,
        its WGSL). Binding 0 is the uniform block holding `params` (u32s); bindings 1.. are the
        buffers of `inputs`, then of `outputs` (handles, or (shape, dtype) for new contiguous
        ones; views: pass offsets and strides in params). seed: the random seed hashed into
        params[1] (cn.capture draws a new one per replay).
        donors: indices of inputs whose buffer the one new output may take, if that input dies
        before the next launch (pool.py, "In-place results"); `build(i)` then gives the kernel
        that writes its output into input i (declared read_write), `build(None)` the usual one.
        flops: the kernel's arithmetic where it is large (a batch holding much is submitted at
        once: device.py EARLY_SUBMIT_FLOPS). Asynchronous, counted by cn.profile, recorded by
        cn.capture."""
        if donors and (len(outputs) != 1 or not isinstance(outputs[0], tuple)
                       or self.device.recording_here() is not None):
            donors = ()  # (a capture binds the buffers it saw)
        outs = [self._new(o[0], o[1], unplaced=bool(donors)) if isinstance(o, tuple) else o
                for o in outputs]
        buffers = [h.storage.raw for h in inputs]
        placement = None
        if donors:
            # The in-place kernels' sources are written now, once per key: a closure over
            # `build` would keep the inputs, the very buffers to donate, alive.
            kernels, sources = self._rt.kernels, self._rt.in_place_sources
            for i in donors:
                if key + (i,) not in kernels and key + (i,) not in sources:
                    sources[key + (i,)] = build(i)
            placement = Placement(
                self._rt.pool, outs[0].storage,
                [(i, buffers[i], inputs[i].storage.nbytes) for i in donors],
                lambda i: self._pipeline(key + (i,), lambda: sources.pop(key + (i,)), name))
            buffers.append(None)
        else:
            buffers += [h.storage.raw for h in outs]
        self._launch(key, build, buffers, params, groups, name, bytes_read, bytes_written,
                     seed, placement, flops)
        return outs

    def run_kernel(self, key, build, handles, params, groups, name="custom", bytes_read=0,
                   bytes_written=0, flops=0):
        """Launch a user's WGSL kernel over `handles` (bound 1.. in order; see `launch`)."""
        self.launch(key, build, handles, (), params, groups, name, bytes_read, bytes_written,
                    flops=flops)

    def fusion_compiler(self, max_buffers=None):
        """What cn.Fusion compiles its groups with (core/fusion/backend.py): this backend's
        Program runner, binding at most `max_buffers` storage buffers per kernel."""
        return ProgramRunner(self, max_buffers)

    def custom(self, op, handles, shape):
        """A user kernel (cinders.fusion.custom_op): one generated elementwise kernel around its
        WGSL function, a Program of one node."""
        return self._programs.run_op("custom", op, handles, shape, dtypes.float32)[0]

    # ---- creation and reading -------------------------------------------------------------
    def from_flat(self, values, shape, dtype):
        code = dtype.word_code
        if dtype is dtypes.bool_:
            data = array(code, [1 if v else 0 for v in values])
        elif dtype is dtypes.float16:
            data = array("H", _half_bits(values))
        else:
            try:
                data = array(code, values)
            except TypeError:
                data = array(code, [int(v) if code == "i" else float(v) for v in values])
        # Recording (cn.capture): a replay will not upload these values again, so they get a
        # buffer no kernel has used and that none reuses before the program reserves it
        # (BufferPool.pin); both recordings of a call then bind the same pattern of buffers.
        recording = self.device.recording_here() if len(data) else None
        out = self._new(shape, dtype, fresh=recording is not None)
        if len(data):
            raw = data.tobytes()  # whole words: a packed tail is padded with zero bytes
            self.device.write_buffer(out.storage.raw, 0, raw + bytes(-len(raw) % 4))
        if recording is not None:
            recording.uploaded.append(out.storage.raw)
            self.pool.pin(out.storage.raw)
        return out

    def full(self, shape, value, dtype):
        out = self._new(shape, dtype)
        if dtype is dtypes.float16:
            word = _half_bits([value])[0]
        elif dtype.per_word > 1:
            word = int(value)  # (fill_word keeps its low 8 bits: two's complement)
        else:
            word = bits(value, dtype)
        self._fill(out, fill_word(dtype, word))
        return out

    def _fill(self, out, word):
        """Fill out's words with `word` (a packed dtype: every element of the word at once)."""
        n = word_count(out.dtype, out.size)
        if n:
            ty = "u32" if out.dtype.per_word > 1 else out.dtype.wgsl
            self.launch(("fill", ty), lambda: images.fill_wgsl(ty), (), [out],
                        images.FILL_PARAMS.pack(n=n, bits=word), groups_for(n, WG), "fill", 0, 4 * n)

    def random(self, shape, distribution, seed, dtype):
        if distribution not in ("uniform", "normal"):
            raise ValueError("unknown distribution %r: use 'uniform' or 'normal'" % (distribution,))
        out = self._new(shape, dtypes.float32)
        n = out.size
        if n:
            self.launch(("random", distribution), lambda: images.random_wgsl(distribution), (),
                        [out], images.RANDOM_PARAMS.pack(n=n, key=_hash32(seed)),
                        groups_for(n, WG), "random_" + distribution, 0, 4 * n, seed=seed)
        return out if dtype is dtypes.float32 else self.cast(out, dtype)

    def _readable(self, h):
        return h if h.is_contiguous() else self._materialize(h)

    @staticmethod
    def _span(h):
        """(first byte, byte count) of contiguous h's words, and where its bytes start in them
        (copies move whole words; a packed view may start inside one)."""
        size = 4 // h.dtype.per_word
        start, stop = size * h.offset, size * (h.offset + h.size)
        first = start - start % 4
        return first, -(-stop // 4) * 4 - first, start - first, stop - start

    def _decode(self, h, data, skip, nbytes):
        # (struct, not memoryview.cast: the latter has no float16 "e")
        return list(struct.unpack_from("<%d%s" % (h.size, h.dtype.word_code), data, skip))

    def to_flat(self, h):
        h = self._readable(h)
        first, count, skip, nbytes = self._span(h)
        return self._decode(h, self.device.read(h.storage.raw, first, count), skip, nbytes)

    async def to_flat_async(self, h):
        h = self._readable(h)
        first, count, skip, nbytes = self._span(h)
        return self._decode(h, await self.device.read_async(h.storage.raw, first, count), skip,
                            nbytes)

    def to_numpy(self, h):
        import numpy as np  # desktop convenience only; the backend itself never needs NumPy
        h = self._readable(h)
        first, count, skip, nbytes = self._span(h)
        data = self.device.read(h.storage.raw, first, count)[skip:skip + nbytes]
        out = np.frombuffer(data, dtype=h.dtype.word_code).reshape(h.shape)
        if h.dtype is dtypes.bool_:
            return out.astype(np.bool_)
        # The read is a private copy already (a bytearray's view): a second one only where the
        # device handed back read-only bytes.
        return out if out.flags.writeable else out.copy()

    # ---- elementwise and reductions: Programs of one node (programs.py) ---------------------
    def _elementwise(self, op, inputs, out_dtype, out=None):
        """Launch op over broadcast inputs. out: a destination view (copies into cat/pad
        results); without one, the result may later take the buffer of an input that died
        meanwhile (pool.py, "In-place results")."""
        shape = broadcast_shape(*[h.shape for h in inputs])
        return self._programs.run_op(op, None, inputs, shape, out_dtype,
                                     out=None if out is None else [out])[0]

    def _materialize(self, h):
        return self._elementwise("copy", [h], h.dtype)

    def unary(self, op, x):
        return self._elementwise(op, [x], result_dtype(op, x.dtype))

    def binary(self, op, a, b):
        return self._elementwise(op, [a, b], result_dtype(op, a.dtype))

    def where(self, cond, a, b):
        return self._elementwise("where", [cond, a, b], a.dtype)

    def cast(self, x, dtype):
        if x.dtype is dtype:
            return x
        return self._elementwise("cast_" + dtype.kind, [x], dtype)

    def reduce(self, op, x, axis, keepdim):
        frame = (tuple(x.shape), axis)
        shape = row_shape(frame) if keepdim else squeezed_row_shape(frame)
        return self._programs.run_op("reduce_" + op, None, [x], shape, result_dtype(op, x.dtype),
                                     frame)[0]

    # ---- matmul ---------------------------------------------------------------------------
    def matmul(self, a, b):
        *abatch, m, k = a.shape
        *bbatch, _, n = b.shape
        batch = tuple(max(p, q) for p, q in zip(abatch, bbatch))
        nb = math.prod(batch)
        out_shape = batch + (m, n)
        if m * n * nb == 0:
            return self._new(out_shape, dtypes.float32)
        if k == 0:
            return self.full(out_shape, 0.0, dtypes.float32)

        def run(variant):
            return self._matmul_variant(variant, a, b, batch, m, n, k)

        variant = self._rt.tuner.select(m, n, k, nb, self.autotune, run, self.synchronize,
                                        self.device.is_cpu)
        return run(variant)

    def matmul_epilogue(self, a, b, epilogue):
        """C = A @ B with `epilogue` (codegen/matmul.py) applied at C's store, in the matmul
        kernel itself: cn.Fusion's bias + activation after a Linear or conv. Returns False
        (nothing launched) where the chosen variant splits K, or the product is empty."""
        *abatch, m, k = a.shape
        *bbatch, _, n = b.shape
        batch = tuple(max(p, q) for p, q in zip(abatch, bbatch))
        nb = math.prod(batch)
        if m * n * nb * k == 0:
            return False

        def run(variant):
            return self._matmul_variant(variant, a, b, batch, m, n, k)

        variant = self._rt.tuner.select(m, n, k, nb, self.autotune, run, self.synchronize,
                                        self.device.is_cpu)
        return self._matmul_variant(variant, a, b, batch, m, n, k, epilogue) is not None

    def _matmul_variant(self, variant, a, b, batch, m, n, k, epilogue=None):
        tiling = VARIANTS[variant]
        bm, bn, bk, tm, tn, split_k, lanes_x, pad_a = tiling
        if tiling.shared_bytes() > self._rt.tuner.shared_limit:
            raise DeviceLimitError("cn.Wgpu matmul: variant %s needs %d bytes of workgroup memory, "
                                   "more than this device has" % (variant, tiling.shared_bytes()))
        nb = math.prod(batch)
        splits = split_count(m, n, k, nb, bm, bn) if split_k else 1
        kchunk = -(-k // splits)
        kchunk = -(-kchunk // max(bk, 1)) * max(bk, 1)
        splits = -(-k // kchunk)
        groups = (-(-n // bn), -(-m // bm), nb * splits)
        if epilogue is not None and splits > 1:
            return None  # the epilogue needs the whole sum: cn.Fusion runs it separately
        if max(groups) > MAX_GROUPS:
            raise DeviceLimitError("cn.Wgpu matmul: %s @ %s needs %r workgroups, more than the "
                                   "device's 65535 per dimension" % (a.shape, b.shape, groups))
        nbd = len(batch)
        a_bstrides = [a.strides[d] if a.shape[d] > 1 else 0 for d in range(nbd)]
        b_bstrides = [b.strides[d] if b.shape[d] > 1 else 0 for d in range(nbd)]
        a_sm, a_sk, b_sk, b_sn = a.strides[-2], a.strides[-1], b.strides[-2], b.strides[-1]
        params = matmul_params(m, n, k, kchunk, a.offset, b.offset, a_sm, a_sk, b_sk, b_sn,
                                       batch, a_bstrides, b_bstrides)
        if epilogue is None:
            out = self._new((splits,) + batch + (m, n) if splits > 1 else batch + (m, n),
                            dtypes.float32)
            outputs, written, name = [out.storage.raw], 4 * splits * nb * m * n, "matmul_" + variant
        else:
            params += epilogue.params
            outputs, written = [h.storage.raw for h in epilogue.handles], epilogue.bytes_written
            name = "matmul_%s_%s" % (variant, epilogue.name)
        # vec4 loads where the layout allows (4-aligned, unit stride); no bounds checks where the
        # tiles cover the product exactly. Only tiled variants have these specialisations.
        vec_a = bool(bk) and a_sk == 1 and k % 4 == 0 and a.offset % 4 == 0 and \
            (m == 1 or a_sm % 4 == 0) and all(s % 4 == 0 for s in a_bstrides)
        vec_b = bool(bk) and tn % 4 == 0 and b_sn == 1 and n % 4 == 0 and \
            b.offset % 4 == 0 and (k == 1 or b_sk % 4 == 0) and all(s % 4 == 0 for s in b_bstrides)
        exact = bool(bk) and m % bm == 0 and n % bn == 0 and k % kchunk == 0

        def build():
            if lanes_x:
                return matmul_regtile_wgsl(nbd, bm, bn, bk, tm, tn, lanes_x, pad_a, vec_a, vec_b,
                                           exact, epilogue)
            if bk:
                return matmul_wgsl(nbd, bm, bn, bk, tm, tn, vec_a, vec_b, exact, epilogue)
            return matmul_direct_wgsl(nbd, bm, bn, tm, tn, epilogue)
        self._launch(("matmul", nbd, tiling, vec_a, vec_b, exact,
                      None if epilogue is None else epilogue.key), build,
                     [a.storage.raw, b.storage.raw] + outputs, params, groups, name,
                     4 * nb * (m * k + k * n) + (0 if epilogue is None else epilogue.bytes_read),
                     written, flops=2 * nb * m * n * k)
        if epilogue is not None:
            return True
        if splits > 1:
            return self.reduce("sum", out, 0, False)
        return out

    def matmul_quantized(self, a, q, scale, zero_point, layout, a_scale=None):
        """C = a @ dequantize(B), B read from packed q inside the kernel (core/backend.py,
        "quantized_matmul"; codegen/matmul.py, matmul_quantized_wgsl). A QDQ activation
        (a_scale) takes the float32 tiles too: a GPU's f32 fma is as fast as its i32 one, and
        the two extra passes that would make a's integers cost more than they save."""
        m, k = a.shape
        n = layout.n
        integer = scale is None and not q.dtype.is_float   # (a float16 B has no scale)
        out = self._new((m, n), dtypes.int32 if integer else dtypes.float32)
        if m * n == 0:
            return out
        if k == 0:
            self._fill(out, 0)
            return out
        tiling = quantized_tiling(m, n, self.device.is_cpu)
        micro = quantized_micro(m, n)
        tile = QUANT_THREADS * micro
        a = self._readable(a)
        handles = [a, q] + ([] if scale is None else [scale]) + ([] if zero_point is None else [zero_point])
        P = matmul_quantized_layout()
        so, ssb, ssn = (scale.offset + layout.scale[0],) + layout.scale[1:] if scale is not None else (0, 0, 0)
        zo, zsb, zsn = (zero_point.offset * (2 if layout.zp_bits == 4 else 1) + layout.zp[0],) + \
            layout.zp[1:] if zero_point is not None else (0, 0, 0)
        q_off, q_sk, q_sn = q.offset * (2 if layout.bits == 4 else 1) + layout.q[0], *layout.q[1:]
        params = P.pack(M=m, N=n, K=k, block=layout.block or k, a_off=a.offset,
                        q_off=q_off, q_sk=q_sk, q_sn=q_sn, s_off=so, s_sb=ssb, s_sn=ssn,
                        z_off=zo, z_sb=zsb, z_sn=zsn, z_default=layout.zp_default & 0xFFFFFFFF)
        sd = None if scale is None else scale.dtype
        zd = None if zero_point is None else zero_point.dtype
        # whole packed words along B's contiguous axis where its rows start on word boundaries
        pw = quantized_per_word(q.dtype, layout.bits)
        words = ("kv" if q_sk == 1 else None) if q.dtype.is_float else \
            "k" if q_sk == 1 and q_off % pw == 0 and q_sn % pw == 0 else \
            "n" if q_sn == 1 and q_off % pw == 0 and q_sk % pw == 0 else None
        if tiling is None:
            grid, name = (-(-n // tile), -(-m // tile), 1), "matmul_quantized"
            key = ("matmul_quantized", a.dtype, q.dtype, layout.bits, sd, zd, layout.zp_bits, words, micro)
            build = lambda: matmul_quantized_wgsl(a.dtype, q.dtype, layout.bits, sd, zd,  # noqa: E731
                                                  layout.zp_bits, self.storage_layout, words, micro)
        else:   # the register-tiled loop; B stored (N, K) runs transposed (rows: n)
            t = VARIANTS[tiling]
            rows, cols = (n, m) if words in ("k", "kv") else (m, n)
            grid, name = (-(-cols // t.bn), -(-rows // t.bm), 1), "matmul_quantized_" + tiling
            key = ("matmul_quantized", a.dtype, q.dtype, layout.bits, sd, zd, layout.zp_bits, words, tiling)
            build = lambda: matmul_quantized_regtile_wgsl(a.dtype, q.dtype, layout.bits, sd, zd,  # noqa: E731
                                                          layout.zp_bits, self.storage_layout, words, t)
        if max(grid) > MAX_GROUPS:
            raise DeviceLimitError("cn.Wgpu matmul_quantized: (%d, %d) outputs need more than the "
                                   "device's 65535 workgroups per dimension" % (m, n))
        self.launch(key, build, handles, [out], params, grid, name,
                    4 * m * k + k * n * layout.bits // 8, 4 * m * n, flops=2 * m * n * k)
        return out

    def dynamic_quantize(self, x):
        """ONNX DynamicQuantizeLinear (core/backend.py "dynamic_quantize"; quantize.py)."""
        return quantize.dynamic_quantize(self, self._programs, x)

    def quantize_dequantize(self, x, y_scale, y_zero_point, x_scale, x_zero_point, lo, hi):
        """QuantizeLinear then DequantizeLinear in one kernel (core/backend.py; quantize.py)."""
        return quantize.quantize_dequantize(self, self._programs, x, y_scale, y_zero_point, x_scale,
                                            x_zero_point, lo, hi)

    # ---- movement (views where possible) --------------------------------------------------
    def reshape(self, x, shape):
        shape = tuple(shape)
        if not x.is_contiguous():
            x = self._materialize(x)
        return GpuArray(x.storage, shape, row_major_strides(shape), x.offset, x.dtype)

    def permute(self, x, dims):
        return GpuArray(x.storage, tuple(x.shape[d] for d in dims),
                        tuple(x.strides[d] for d in dims), x.offset, x.dtype)

    def expand(self, x, shape):
        shape = tuple(shape)
        strides = tuple(0 if old == 1 and new != 1 else s
                        for old, new, s in zip(x.shape, shape, x.strides))
        return GpuArray(x.storage, shape, strides, x.offset, x.dtype)

    def slice(self, x, starts, stops, steps):
        offset = x.offset + sum(a * s for a, s in zip(starts, x.strides))
        shape = tuple(max(0, -(-(b - a) // st)) for a, b, st in zip(starts, stops, steps))
        strides = tuple(s * st for s, st in zip(x.strides, steps))
        return GpuArray(x.storage, shape, strides, offset, x.dtype)

    def _copy_into(self, src, dst, offset):
        """Copy src into the region of contiguous dst that starts at element `offset`."""
        view = GpuArray(dst.storage, src.shape, dst.strides, dst.offset + offset, dst.dtype)
        self._elementwise("copy", [src], dst.dtype, out=view)

    def cat(self, xs, axis):
        shape = list(xs[0].shape)
        shape[axis] = sum(x.shape[axis] for x in xs)
        out = self._new(shape, xs[0].dtype)
        at = 0
        for x in xs:
            self._copy_into(x, out, at * out.strides[axis])
            at += x.shape[axis]
        return out

    def pad(self, x, pads, value):
        shape = tuple(n + a + b for n, (a, b) in zip(x.shape, pads))
        out = self.full(shape, value, x.dtype)
        self._copy_into(x, out, sum(a * s for (a, _), s in zip(pads, out.strides)))
        return out

    # ---- indexing -------------------------------------------------------------------------
    def gather(self, x, axis, index):
        out = self._new(index.shape, x.dtype)
        n = out.size
        if n == 0:
            return out
        ndim, dt = len(x.shape), x.dtype
        params = images.gather_layout(ndim).pack(
            n=n, x_axis_len=x.shape[axis], shape=index.shape, idx_off=index.offset,
            idx_strides=index.strides, x_off=x.offset, x_strides=x.strides)
        self.launch(("gather", dt.name, ndim, axis),
                    lambda: images.gather_wgsl(dt, self.storage_layout, ndim, axis),
                    [x, index], [out], params, groups_for(n, WG), "gather", 8 * n, 4 * n)
        return out

    def scatter_add(self, x, axis, index, src):
        out = self._new(x.shape, x.dtype)
        n = out.size
        if n == 0:
            return out
        ndim, ty = len(x.shape), x.dtype.wgsl
        params = images.scatter_add_layout(ndim).pack(
            n=n, x_shape=x.shape, idx_shape=index.shape, x_off=x.offset, x_strides=x.strides,
            idx_off=index.offset, idx_strides=index.strides, src_off=src.offset,
            src_strides=src.strides)
        self.launch(("scatter_add", ty, ndim, axis),
                    lambda: images.scatter_add_wgsl(ty, ndim, axis), [x, index, src], [out],
                    params, groups_for(n, WG), "scatter_add",
                    4 * n + 8 * index.size * (n // max(1, x.shape[axis])), 4 * n)
        return out

    # ---- images ---------------------------------------------------------------------------
    def unfold2d(self, x, kernel, stride, padding, dilation, pad_value):
        n, c, h, w = x.shape
        oh, ow = unfold2d_output_size(h, w, kernel, stride, padding, dilation)
        out = self._new((n, c * kernel[0] * kernel[1], oh * ow), x.dtype)
        total = out.size
        if total == 0:
            return out
        ty = x.dtype.wgsl
        params = images.UNFOLD2D_PARAMS.pack(
            x_off=x.offset, x_strides=x.strides, pad_bits=bits(pad_value, x.dtype),
            **images.geometry_values(total, x.shape, kernel, stride, padding, dilation, (oh, ow)))
        self.launch(("unfold2d", ty), lambda: images.unfold2d_wgsl(ty), [x], [out], params,
                    groups_for(total, WG), "unfold2d", 4 * total, 4 * total)
        return out

    def conv2d(self, x, w, bias, stride, padding, dilation, groups, activation):
        return conv.conv2d(self, x, w, bias, stride, padding, dilation, groups, activation)

    def conv2d_quantized(self, x, x_param, q, scale, zero_point, bias, stride, padding, dilation, groups):
        return conv.conv2d_quantized(self, x, x_param, q, scale, zero_point, bias, stride, padding,
                                     dilation, groups)

    def conv2d_grad_input(self, g, w, size, stride, padding, dilation, groups):
        return conv_grad.grad_input(self, g, w, size, stride, padding, dilation, groups)

    def conv2d_grad_weight(self, x, g, kernel, stride, padding, dilation, groups):
        return conv_grad.grad_weight(self, x, g, kernel, stride, padding, dilation, groups)

    def conv2d_grad_bias(self, g):
        return conv_grad.grad_bias(self, g)

    def pool2d(self, x, op, kernel, stride, padding, dilation):
        n, c, h, w = x.shape
        oh, ow = unfold2d_output_size(h, w, kernel, stride, padding, dilation)
        out = self._new((n, c, oh, ow), x.dtype)
        total = out.size
        if total == 0:
            return out
        params = images.POOL2D_PARAMS.pack(
            x_off=x.offset, x_strides=x.strides,
            **images.geometry_values(total, x.shape, kernel, stride, padding, dilation, (oh, ow)))
        self.launch(("pool2d", op), lambda: images.pool2d_wgsl(op), [x], [out], params,
                    groups_for(total, WG), "pool2d_" + op, 4 * total * kernel[0] * kernel[1], 4 * total)
        return out

    def fold2d(self, cols, size, kernel, stride, padding, dilation):
        n = cols.shape[0]
        c = cols.shape[1] // (kernel[0] * kernel[1])
        h, w = size
        oh, ow = unfold2d_output_size(h, w, kernel, stride, padding, dilation)
        out = self._new((n, c, h, w), cols.dtype)
        total = out.size
        if total == 0:
            return out
        if cols.size == 0:
            self._fill(out, 0)
            return out
        cols = self._readable(cols)
        if cols.offset:
            cols = self._materialize(cols)
        ty = cols.dtype.wgsl
        params = images.FOLD2D_PARAMS.pack(**images.geometry_values(
            total, (n, c, h, w), kernel, stride, padding, dilation, (oh, ow)))
        self.launch(("fold2d", ty), lambda: images.fold2d_wgsl(ty), [cols], [out], params,
                    groups_for(total, WG), "fold2d", 4 * cols.size, 4 * total)
        return out


def _half_bits(values):
    """float16 bit patterns of Python floats, rounded to nearest even; beyond float16's range
    infinity (struct refuses those)."""
    values = [float(v) for v in values]
    try:
        packed = struct.pack("<%de" % len(values), *values)
    except OverflowError:
        packed = struct.pack("<%de" % len(values), *[
            v if abs(v) < 65520.0 else math.copysign(math.inf, v) for v in values])
    return struct.unpack("<%dH" % len(values), packed)
