"""The desktop Device: wgpu-py (Vulkan, Metal or DX12; Mesa lavapipe on machines without a GPU).

The only file of cinders.wgpu that imports wgpu.
"""

import os
import re
import tempfile


def _runtime_dir_for_the_vulkan_loader():
    """Mesa's Vulkan window-system code prints "error: XDG_RUNTIME_DIR is invalid or not set"
    twice on stderr when the variable is missing (servers, CI, containers), though compute needs
    no window. Give it a private directory (0700, as the XDG spec asks) before wgpu loads."""
    current = os.environ.get("XDG_RUNTIME_DIR")
    if current and os.path.isdir(current):
        return
    path = os.path.join(tempfile.gettempdir(), "cinders-runtime-%d" % getattr(os, "getuid", lambda: 0)())
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError:
        return  # not worth failing for: the messages are noise, not errors
    os.environ["XDG_RUNTIME_DIR"] = path


_runtime_dir_for_the_vulkan_loader()

import wgpu  # noqa: E402

from .device import Device  # noqa: E402

try:  # wgpu-native's C entry points: a replay's encoding loop calls them with no Python wrapper
    from wgpu.backends.wgpu_native._ffi import ffi as _ffi, lib as _lib
except ImportError:  # another wgpu-py layout: the public encoder methods serve
    _ffi = _lib = None

# Limits we ask the adapter for in full (the WebGPU defaults are small, e.g. 128 MiB bindings).
_WANTED_LIMITS = (
    "max-storage-buffer-binding-size", "max-buffer-size", "max-compute-workgroup-storage-size",
    "max-compute-invocations-per-workgroup", "max-storage-buffers-per-shader-stage",
    "max-compute-workgroup-size-x", "max-compute-workgroup-size-y",
)
_BUFFER_USAGE = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
_STORAGE_BINDING = re.compile(r"@binding\((\d+)\)\s*var<storage,\s*(read_write|read)>")
# Every dispatch binds a window of this many bytes of the parameter arena (at a dynamic offset),
# so one bind group serves every batch in which the same buffers meet the same kernel layout.
_PARAMS_WINDOW = 256
_MAX_CACHED_GROUPS = 4096
# Reads up to this size go through reused staging buffers (one per power-of-two size class):
# creating a mappable buffer per read cost more than the copy, and reading a batch's
# activations back (2-4 MB for a transformer at batch 16) is what an app does every call.
_STAGING_MAX = 1 << 26


def _adapters():
    return wgpu.gpu.enumerate_adapters_sync()


class DesktopDevice(Device):
    """A wgpu-py device. `adapter`: None (the default high-performance adapter), an index
    into `wgpu.gpu.enumerate_adapters_sync()`, or a substring of the adapter's description.
    shader_f16: request the `shader-f16` feature where the adapter has it."""

    def __init__(self, adapter=None, shader_f16=True):
        super().__init__()
        if adapter is None:
            chosen = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
        else:
            found = _adapters()
            if isinstance(adapter, int):
                chosen = found[adapter]
            else:
                matches = [a for a in found if str(adapter).lower() in _describe(a).lower()]
                if not matches:
                    raise ValueError("cn.Wgpu(adapter=%r): no such adapter; found: %s"
                                     % (adapter, "; ".join(_describe(a) for a in found)))
                chosen = matches[0]
        if chosen is None:
            raise RuntimeError("cn.Wgpu(): wgpu found no GPU adapter (install a Vulkan driver, "
                               "e.g. `apt-get install mesa-vulkan-drivers` for lavapipe)")
        features = []
        self.has_timestamps = "timestamp-query" in chosen.features
        if self.has_timestamps:
            features.append("timestamp-query")
        self.shader_f16 = bool(shader_f16) and "shader-f16" in chosen.features
        if self.shader_f16:
            features.append("shader-f16")
        limits = {k: chosen.limits[k] for k in _WANTED_LIMITS if k in chosen.limits}
        self.adapter = chosen
        self.device = chosen.request_device_sync(required_features=features, required_limits=limits)
        self.queue = self.device.queue
        self.limits = {k.replace("-", "_"): v for k, v in self.device.limits.items()}
        self.name = _describe(chosen)
        self.is_cpu = chosen.info.get("adapter_type", "").lower() == "cpu"
        self._layouts = {}        # pipeline id -> (signature, bind group layout)
        self._group_layouts = {}  # signature (storage access modes) -> bind group layout
        self._groups = {}         # (signature, window, buffer ids) -> (bind group, buffers)
        self._arena = None        # the uniform buffer holding a batch's parameter blocks
        self._staging = {}        # size class -> [free MAP_READ buffers] for small reads
        self._sentinel = None

    # ---- Device primitives --------------------------------------------------------------
    def _create_buffer(self, nbytes):
        return self.device.create_buffer(size=nbytes, usage=_BUFFER_USAGE)

    def _destroy_buffer(self, raw):
        self._groups.clear()  # cached bind groups may name this buffer
        raw.destroy()

    def _write_buffer(self, raw, offset, data):
        self.queue.write_buffer(raw, offset, data)

    def _compile(self, wgsl):
        # An explicit layout (binding 0: the parameter uniform at a dynamic offset; then the
        # storage buffers as the shader declares them) lets kernels of one signature share
        # cached bind groups.
        signature = tuple(mode for _, mode in sorted(
            (int(b), m) for b, m in _STORAGE_BINDING.findall(wgsl)))
        layout = self._group_layouts.get(signature)
        if layout is None:
            entries = [{"binding": 0, "visibility": wgpu.ShaderStage.COMPUTE,
                        "buffer": {"type": wgpu.BufferBindingType.uniform,
                                   "has_dynamic_offset": True}}]
            entries += [{"binding": i + 1, "visibility": wgpu.ShaderStage.COMPUTE,
                         "buffer": {"type": wgpu.BufferBindingType.storage if mode == "read_write"
                                    else wgpu.BufferBindingType.read_only_storage}}
                        for i, mode in enumerate(signature)]
            layout = self._group_layouts[signature] = self.device.create_bind_group_layout(
                entries=entries)
        module = self.device.create_shader_module(code=wgsl)
        pipeline = self.device.create_compute_pipeline(
            layout=self.device.create_pipeline_layout(bind_group_layouts=[layout]),
            compute={"module": module, "entry_point": "main"})
        self._layouts[id(pipeline)] = (signature, layout)
        return pipeline

    def _group_for(self, pipeline, arena, window, buffers):
        _, layout = self._layouts[id(pipeline)]
        entries = [{"binding": 0, "resource": {"buffer": arena, "offset": 0, "size": window}}]
        entries += [{"binding": j + 1, "resource": {"buffer": b, "offset": 0, "size": b.size}}
                    for j, b in enumerate(buffers)]
        return self.device.create_bind_group(layout=layout, entries=entries)

    def _bind_group(self, pipeline, window, buffers):
        signature, layout = self._layouts[id(pipeline)]
        key = (signature, window) + tuple(id(b) for b in buffers)
        found = self._groups.get(key)
        if found is None:
            if len(self._groups) >= _MAX_CACHED_GROUPS:
                self._groups.clear()
            # The value keeps the buffers alive, so their ids in the key stay unique.
            found = self._groups[key] = (
                self._group_for(pipeline, self._arena, window, buffers), buffers)
        return found[0]

    def _submit(self, dispatches, params, timed):
        device = self.device
        windows = [max(_PARAMS_WINDOW, d.params_size) for d in dispatches]
        needed = len(params) + max(windows)
        if self._arena is None or self._arena.size < needed:
            size = max(needed, 2 * self._arena.size if self._arena is not None else 1 << 16)
            self._arena = device.create_buffer(
                size=size, usage=wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST)
            self._groups.clear()
        # Queue-ordered: earlier submissions have read their parameters before this write lands.
        self.queue.write_buffer(self._arena, 0, params)
        encoder = device.create_command_encoder()
        query_set = None
        if timed and self.has_timestamps:
            query_set = device.create_query_set(type="timestamp", count=2 * len(dispatches))
        compute = None if query_set is not None else encoder.begin_compute_pass()
        for i, d in enumerate(dispatches):
            group = self._bind_group(d.pipeline, windows[i], d.buffers)
            if query_set is not None:
                # A pass per dispatch: timestamps are written at pass boundaries.
                compute = encoder.begin_compute_pass(timestamp_writes={
                    "query_set": query_set, "beginning_of_pass_write_index": 2 * i,
                    "end_of_pass_write_index": 2 * i + 1})
            compute.set_pipeline(d.pipeline)
            compute.set_bind_group(0, group, [d.params_offset])
            compute.dispatch_workgroups(*d.groups)
            if query_set is not None:
                compute.end()
        if query_set is None:
            compute.end()
        resolved = None
        if query_set is not None:
            resolved = device.create_buffer(
                size=16 * len(dispatches),
                usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
            encoder.resolve_query_set(query_set, 0, 2 * len(dispatches), resolved, 0)
        self.queue.submit([encoder.finish()])
        return (resolved, len(dispatches))

    def _prepare(self, dispatches, params):
        windows = [max(_PARAMS_WINDOW, d.params_size) for d in dispatches]
        arena = self.device.create_buffer(
            size=max(256, len(params) + max(windows, default=0)),
            usage=wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST)
        if params:   # (a program without kernels, fn returning a view of its input, has none)
            self.queue.write_buffer(arena, 0, params)
        program = _Program(arena, dispatches, windows)
        program.groups = [self._group_for(d.pipeline, arena, w, d.buffers)
                          for d, w in zip(dispatches, windows)]
        if _lib is not None:
            program.raw = [(d.pipeline._internal, g._internal, _ffi.new("uint32_t[]", [d.params_offset]))
                           + tuple(d.groups) for d, g in zip(dispatches, program.groups)]
        return program

    def _replay(self, program, rebinds, patches, copies):
        encoder = self.device.create_command_encoder()
        if program is not None:
            for offset, data in patches:
                self.queue.write_buffer(program.arena, offset, data)
            groups = program.groups
            if rebinds:
                groups = list(groups)
                for i, buffers in rebinds.items():
                    groups[i] = program.rebound(self, i, buffers)
            compute = encoder.begin_compute_pass()
            # The only per-kernel work of a replay: three encoder calls (straight into
            # wgpu-native where it can: its commands were validated when they were recorded).
            if program.raw is not None:
                pass_ptr = compute._internal
                raw = program.raw
                if rebinds:
                    raw = list(raw)
                    for i in rebinds:
                        pipeline, _, offsets, x, y, z = raw[i]
                        raw[i] = (pipeline, groups[i]._internal, offsets, x, y, z)
                set_pipeline = _lib.wgpuComputePassEncoderSetPipeline
                set_group = _lib.wgpuComputePassEncoderSetBindGroup
                dispatch = _lib.wgpuComputePassEncoderDispatchWorkgroups
                for pipeline, group, offsets, x, y, z in raw:
                    set_pipeline(pass_ptr, pipeline)
                    set_group(pass_ptr, 0, group, 1, offsets)
                    dispatch(pass_ptr, x, y, z)
            else:
                for d, group in zip(program.dispatches, groups):
                    compute.set_pipeline(d.pipeline)
                    compute.set_bind_group(0, group, [d.params_offset])
                    compute.dispatch_workgroups(*d.groups)
            compute.end()
        for src, src_offset, dst, dst_offset, nbytes in copies:
            encoder.copy_buffer_to_buffer(src, src_offset, dst, dst_offset, nbytes)
        self.queue.submit([encoder.finish()])

    def _timings(self, token):
        resolved, count = token
        if resolved is None:
            return [None] * count
        ticks = self.queue.read_buffer(resolved).cast("Q").tolist()
        # Timestamps are in nanoseconds (wgpu applies the queue's timestamp period).
        return [max(0, ticks[2 * i + 1] - ticks[2 * i]) * 1e-9 for i in range(count)]

    def _read_buffer(self, raw, offset, nbytes):
        # Small reads (logits, a loss) reuse mappable staging buffers: creating and destroying
        # one per read costs more than the copy.
        size = -(-nbytes // 4) * 4
        if size > _STAGING_MAX:
            return self.queue.read_buffer(raw, offset, nbytes)
        cls = max(256, 1 << (size - 1).bit_length())
        with self.lock:
            free = self._staging.setdefault(cls, [])
            staging = free.pop() if free else self.device.create_buffer(
                size=cls, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
        encoder = self.device.create_command_encoder()
        encoder.copy_buffer_to_buffer(raw, offset, staging, 0, size)
        self.queue.submit([encoder.finish()])
        staging.map_sync(wgpu.MapMode.READ, 0, size)
        try:  # one copy out of the mapping (a writable bytearray's view); slicing copies nothing
            data = staging.read_mapped(0, size)[:nbytes]
        finally:
            staging.unmap()
            with self.lock:
                free.append(staging)
        return data

    async def _read_buffer_async(self, raw, offset, nbytes):
        staging = self.device.create_buffer(
            size=nbytes, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
        encoder = self.device.create_command_encoder()
        encoder.copy_buffer_to_buffer(raw, offset, staging, 0, nbytes)
        self.queue.submit([encoder.finish()])
        await staging.map_async(wgpu.MapMode.READ)
        data = bytes(staging.read_mapped())
        staging.unmap()
        staging.destroy()
        return data

    def wait_idle(self):
        # A readback completes only after all earlier submissions (on_submitted_work_done_sync
        # is broken in wgpu-py 0.32 against its bundled wgpu-native).
        self.flush()
        if self._sentinel is None:
            self._sentinel = self._create_buffer(16)
        self.queue.read_buffer(self._sentinel, 0, 4)


class _Program:
    """A captured sequence on this device: its parameter arena and bind groups, built once."""

    def __init__(self, arena, dispatches, windows):
        self.arena = arena
        self.dispatches = dispatches
        self.windows = windows
        self.groups = []
        self.raw = None     # [(pipeline, bind group, offsets, x, y, z)] as C handles, if usable
        self._rebound = {}  # (launch index, buffer ids) -> (bind group, buffers kept alive)

    def rebound(self, device, i, buffers):
        key = (i,) + tuple(id(b) for b in buffers)
        found = self._rebound.get(key)
        if found is None:
            if len(self._rebound) >= 256:
                self._rebound.clear()
            d = self.dispatches[i]
            found = self._rebound[key] = (
                device._group_for(d.pipeline, self.arena, self.windows[i], buffers), buffers)
        return found[0]


def _describe(adapter):
    info = adapter.info
    return "%s (%s, %s)" % (info.get("device", "?"), info.get("backend_type", "?"),
                            info.get("adapter_type", "?"))
