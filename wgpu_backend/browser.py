"""The browser Device: WebGPU through `navigator.gpu`, from Python in Pyodide.

The second implementation of device.py's interface (desktop.py is the first). Everything that
builds JS objects runs in a small JS shim (`_SHIM` below) so that one Python call crosses into
JS once per buffer, pipeline or *batch* of dispatches, never once per descriptor field.

The browser cannot block:
* Getting a device is asynchronous, so a page runs `await init_device()` once (the runtime in
  wasm/cinders.js does it through cinders.web.bridge); after that `cn.Wgpu()` is synchronous
  and picks this device automatically (backend.py selects it under sys.platform "emscripten").
* Reading data back is `await t.to_data_async()` (or `await backend.to_flat_async(h)`): a
  copy into a MAP_READ staging buffer, `mapAsync`, a copy of the mapped range, then unmap.
  Synchronous reads (`t.tolist()`) work only where Pyodide can block on a promise (JSPI,
  `pyodide.ffi.can_run_sync()`); elsewhere they raise an error that says to use await.

No GPU timestamps here (timestamp queries are not requested): profiler events carry no GPU time.
"""

import re

from cinders.errors import CindersError, DeviceError

from .device import Device

# The limits asked for in full (the WebGPU defaults are small), as on the desktop.
_WANTED_LIMITS = (
    "maxStorageBufferBindingSize", "maxBufferSize", "maxComputeWorkgroupStorageSize",
    "maxComputeInvocationsPerWorkgroup", "maxStorageBuffersPerShaderStage",
    "maxComputeWorkgroupSizeX", "maxComputeWorkgroupSizeY",
)
# Every limit the device reports, copied into Python under snake_case names like desktop.py's.
_ALL_LIMITS = _WANTED_LIMITS + (
    "minUniformBufferOffsetAlignment", "minStorageBufferOffsetAlignment",
    "maxComputeWorkgroupSizeZ", "maxComputeWorkgroupsPerDimension", "maxUniformBufferBindingSize",
    "maxBindGroups", "maxBindingsPerBindGroup", "maxUniformBuffersPerShaderStage",
)

_SHIM = r"""
({
  async init(powerPreference, wanted, names) {
    if (typeof navigator === "undefined" || !navigator.gpu) {
      throw new Error("navigator.gpu is missing: this browser has no WebGPU, or the page is " +
                      "not a secure context (https or http://127.0.0.1)");
    }
    const adapter = await navigator.gpu.requestAdapter({ powerPreference });
    if (!adapter) {
      throw new Error("navigator.gpu.requestAdapter() returned null: WebGPU is disabled or no " +
                      "GPU adapter is usable (Chromium: --enable-unsafe-webgpu)");
    }
    const requiredLimits = {};
    for (const name of wanted) if (name in adapter.limits) requiredLimits[name] = adapter.limits[name];
    // shader-f16 where the adapter has it (not SwiftShader): float16 buffers as array<f16>
    const requiredFeatures = adapter.features.has("shader-f16") ? ["shader-f16"] : [];
    const device = await adapter.requestDevice({ requiredLimits, requiredFeatures });
    const state = { device, errors: [], lost: null, layouts: new WeakMap() };
    device.addEventListener("uncapturederror", (event) => {
      state.errors.push(event.error.message);
      console.error("cinders WebGPU error:", event.error.message);
    });
    device.lost.then((info) => { state.lost = info.message || info.reason || "lost"; });
    const limits = {};
    for (const name of names) if (name in device.limits) limits[name] = device.limits[name];
    const info = adapter.info || {};
    state.name = [info.vendor, info.architecture, info.description].filter((s) => s).join(" ") || "WebGPU adapter";
    // A software adapter (SwiftShader, or a fallback adapter): the backend picks kernels for CPUs.
    state.isCpu = !!(info.isFallbackAdapter || adapter.isFallbackAdapter) ||
                  /swiftshader|llvmpipe|lavapipe|warp/i.test(state.name);
    state.limits = limits;
    state.shaderF16 = device.features.has("shader-f16");
    return state;
  },

  createBuffer(state, size) {
    return state.device.createBuffer({ size,
      usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST });
  },

  // data: a PyProxy of a Python buffer, read in place (writeBuffer copies it at once).
  writeBuffer(state, buffer, offset, data) {
    const view = data.getBuffer("u8");
    try { state.device.queue.writeBuffer(buffer, offset, view.data); } finally { view.release(); }
  },

  compile(state, code) {
    const module = state.device.createShaderModule({ code });
    const pipeline = state.device.createComputePipeline({ layout: "auto", compute: { module, entryPoint: "main" } });
    state.layouts.set(pipeline, pipeline.getBindGroupLayout(0));
    return pipeline;
  },

  // params: PyProxy of the batch's parameter blocks; batch: [[pipeline, [buffers], offset, size, x, y, z], ...]
  submit(state, params, batch) {
    const device = state.device;
    const view = params.getBuffer("u8");
    let uniform;
    try {
      uniform = device.createBuffer({ size: Math.max(16, view.data.byteLength),
                                      usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST });
      device.queue.writeBuffer(uniform, 0, view.data);
    } finally { view.release(); }
    const encoder = device.createCommandEncoder();
    const pass = encoder.beginComputePass();
    for (const [pipeline, buffers, offset, size, x, y, z] of batch) {
      const entries = [{ binding: 0, resource: { buffer: uniform, offset, size } }];
      for (let j = 0; j < buffers.length; j++) entries.push({ binding: j + 1, resource: { buffer: buffers[j] } });
      pass.setPipeline(pipeline);
      pass.setBindGroup(0, device.createBindGroup({ layout: state.layouts.get(pipeline), entries }));
      pass.dispatchWorkgroups(x, y, z);
    }
    pass.end();
    device.queue.submit([encoder.finish()]);
    uniform.destroy();  // after submit: the queued work keeps what it uses
  },

  // A captured program (core/capture.py): its uniform buffer and bind groups, built once.
  prepare(state, params, batch) {
    const device = state.device;
    const view = params.getBuffer("u8");
    let uniform;
    try {
      uniform = device.createBuffer({ size: Math.max(256, view.data.byteLength + 256),
                                      usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST });
      device.queue.writeBuffer(uniform, 0, view.data);
    } finally { view.release(); }
    const program = { uniform, steps: [] };
    for (const [pipeline, buffers, offset, size, x, y, z] of batch) {
      const step = { pipeline, offset, size, x, y, z };
      step.group = this.bindGroup(state, program, step, buffers);
      program.steps.push(step);
    }
    return program;
  },

  bindGroup(state, program, step, buffers) {
    const entries = [{ binding: 0, resource: { buffer: program.uniform, offset: step.offset, size: step.size } }];
    for (let j = 0; j < buffers.length; j++) entries.push({ binding: j + 1, resource: { buffer: buffers[j] } });
    return state.device.createBindGroup({ layout: state.layouts.get(step.pipeline), entries });
  },

  // One call per replay: the seed patches, the dispatches (inputs rebound where they changed),
  // the output copies, one submit. rebinds: [[step index, [buffers]]]; patches: [[offset,
  // u32]]; copies: [[src, srcOffset, dst, dstOffset, nbytes]].
  replay(state, program, rebinds, patches, copies) {
    const device = state.device;
    for (const [offset, value] of patches) {
      device.queue.writeBuffer(program.uniform, offset, new Uint32Array([value]));
    }
    const groups = program ? program.steps.map((s) => s.group) : [];
    for (const [i, buffers] of rebinds) groups[i] = this.bindGroup(state, program, program.steps[i], buffers);
    const encoder = device.createCommandEncoder();
    if (program) {
      const pass = encoder.beginComputePass();
      program.steps.forEach((s, i) => {
        pass.setPipeline(s.pipeline);
        pass.setBindGroup(0, groups[i]);
        pass.dispatchWorkgroups(s.x, s.y, s.z);
      });
      pass.end();
    }
    for (const [src, srcOffset, dst, dstOffset, nbytes] of copies) {
      encoder.copyBufferToBuffer(src, srcOffset, dst, dstOffset, nbytes);
    }
    device.queue.submit([encoder.finish()]);
  },

  async read(state, buffer, offset, nbytes) {
    const device = state.device, size = Math.ceil(nbytes / 4) * 4;
    const staging = device.createBuffer({ size, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
    const encoder = device.createCommandEncoder();
    encoder.copyBufferToBuffer(buffer, offset, staging, 0, size);
    device.queue.submit([encoder.finish()]);
    try {
      await staging.mapAsync(GPUMapMode.READ);
      // Copy before unmap: the mapped ArrayBuffer is detached by unmap().
      return new Uint8Array(staging.getMappedRange(0, size)).slice(0, nbytes);
    } finally {
      if (staging.mapState === "mapped") staging.unmap();
      staging.destroy();
    }
  },

  idle(state) { return state.device.queue.onSubmittedWorkDone(); },
})
"""


class WebGPUUnavailable(CindersError):
    """No usable WebGPU in this browser (no navigator.gpu, null adapter, device request failed)."""


_shared = {"state": None, "shim": None}


def _shim():
    if _shared["shim"] is None:
        from pyodide.code import run_js
        _shared["shim"] = run_js(_SHIM)
    return _shared["shim"]


def _to_js(value):
    from pyodide.ffi import to_js
    return to_js(value)


def can_block():
    """True where Pyodide can wait for a promise synchronously (JSPI)."""
    try:
        from pyodide.ffi import can_run_sync
    except ImportError:
        return False
    return can_run_sync()


def _block_on(awaitable, what):
    hint = ("cn.Wgpu in the browser: %s would block, and this page cannot block on the GPU "
            "(no JSPI here%s). Use the asynchronous form instead: `await t.to_data_async()` (or "
            "`await backend.to_flat_async(handle)`), and `await cinders.wgpu.browser.init_device()` "
            "before the first cn.Wgpu().")
    if not can_block():
        raise DeviceError(hint % (what, ""))
    from pyodide.ffi import run_sync
    try:
        return run_sync(awaitable)
    except RuntimeError as e:
        # A Pyodide started from a memory snapshot (cinders.js's fast start) has no stack
        # switching even where the browser has JSPI.
        if "stack switching" not in str(e):
            raise
        if hasattr(awaitable, "close"):
            awaitable.close()
        raise DeviceError(hint % (what, ": this Pyodide was started from a memory snapshot; "
                                        "Cinders.load({snapshot: false}) keeps JSPI")) from None


async def init_device(power_preference="high-performance"):
    """Request the WebGPU adapter and device once per page; raises WebGPUUnavailable."""
    if _shared["state"] is None:
        from pyodide.ffi import JsException
        try:
            _shared["state"] = await _shim().init(power_preference, _to_js(list(_WANTED_LIMITS)),
                                                  _to_js(list(_ALL_LIMITS)))
        except JsException as e:
            raise WebGPUUnavailable(str(e).replace("Error: ", "", 1)) from None
    return _shared["state"]


def _snake(name):
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


class BrowserDevice(Device):
    """The page's WebGPU device (one per page, requested by `init_device`, with `shader-f16`
    where the adapter has it; shader_f16=False keeps float16 packed in u32 words anyway)."""

    def __init__(self, adapter=None, shader_f16=True):
        super().__init__()
        if adapter is not None:
            raise ValueError("cn.Wgpu(adapter=%r): in the browser the page's one WebGPU adapter is "
                             "used; pass no adapter" % (adapter,))
        if _shared["state"] is None:
            _block_on(init_device(), "requesting the WebGPU device")
        self.state = _shared["state"]
        self.shim = _shim()
        self.name = "%s (WebGPU, browser)" % (self.state.name,)
        self.is_cpu = bool(self.state.isCpu)
        self.shader_f16 = bool(shader_f16) and bool(self.state.shaderF16)
        limits = self.state.limits.to_py()
        self.limits = {_snake(k): int(v) for k, v in limits.items()}

    def _check(self):
        """Raise what WebGPU reported asynchronously (shader or validation errors, device loss)."""
        if self.state.lost:
            raise DeviceError("the WebGPU device was lost: %s" % (self.state.lost,))
        if self.state.errors.length:
            errors = list(self.state.errors.to_py())
            self.state.errors.length = 0
            # The first error is the cause; the rest are usually "invalid due to a previous error".
            raise DeviceError("WebGPU reported %d error(s); the first: %s" % (len(errors), errors[0]))

    # ---- Device primitives --------------------------------------------------------------
    def _create_buffer(self, nbytes):
        return self.shim.createBuffer(self.state, nbytes)

    def _destroy_buffer(self, raw):
        raw.destroy()

    def _write_buffer(self, raw, offset, data):
        self.shim.writeBuffer(self.state, raw, offset, data)

    def _compile(self, wgsl):
        return self.shim.compile(self.state, wgsl)

    def _submit(self, dispatches, params, timed):
        batch = [[d.pipeline, d.buffers, d.params_offset, d.params_size] + list(d.groups)
                 for d in dispatches]
        self.shim.submit(self.state, params, _to_js(batch))
        return len(dispatches)

    def _timings(self, token):
        return [None] * token

    def _prepare(self, dispatches, params):
        batch = [[d.pipeline, d.buffers, d.params_offset, max(16, d.params_size)] + list(d.groups)
                 for d in dispatches]
        return self.shim.prepare(self.state, params, _to_js(batch))

    def _replay(self, program, rebinds, patches, copies):
        # Patches are u32 seeds: sent as numbers (the shim writes them as one Uint32Array each).
        self.shim.replay(self.state, program, _to_js([[i, b] for i, b in rebinds.items()]),
                         _to_js([[o, int.from_bytes(data, "little")] for o, data in patches]),
                         _to_js([list(c) for c in copies]))

    def _read_buffer(self, raw, offset, nbytes):
        return _block_on(self._read_buffer_async(raw, offset, nbytes), "reading a tensor (tolist())")

    async def _read_buffer_async(self, raw, offset, nbytes):
        data = (await self.shim.read(self.state, raw, offset, nbytes)).to_bytes()
        self._check()
        return data

    def wait_idle(self):
        """Submit, and wait for the GPU where the page can block (JSPI). Elsewhere this returns
        once the work is submitted: every read is queue-ordered after it and awaits it anyway."""
        self.flush()
        if can_block():
            try:
                _block_on(self.shim.idle(self.state), "waiting for the GPU")
            except DeviceError:
                pass  # a snapshot-started Pyodide cannot block (see _block_on): nothing to wait for
        self._check()
