"""What the browser runtime (wasm/cinders.js) calls inside Pyodide.

    info = await init("auto")                  # WebGPU, else WebAssembly, else Python; says which and why
    predictor = await load_model(bytes, name)  # a record -> the model class it names
    logits = await predictor.predict(pixels)   # a JS Float32Array (the page makes the answer)
    result = await predictor.run(values)       # any model: {"shape", "values"}

Everything here is plain cinders code: the same model classes and record loader as the desktop.
"""
import itertools
import json
import os
from array import array

import cinders as cn

_state = {"backend": None, "kind": None, "note": ""}
_replay_owners = itertools.count(1)   # Predictor.replay_owner


def cpu_backend():
    """NumPy where it imports (Pyodide users online can load it), else the pure-Python backend."""
    try:
        import numpy  # noqa: F401
        from cinders.backends.numpy_backend import NumPy
        return NumPy()
    except ImportError:
        from cinders.backends.python_backend import Python
        return Python()


PREFERENCES = ("auto", "webgpu", "wasm", "python", "cpu")


async def _webgpu_backend(fusion):
    from cinders.wgpu import browser
    await browser.init_device()
    # Autotuning times kernels with blocking waits, which the browser cannot do.
    backend = cn.Wgpu(autotune=False)
    return cn.Fusion(backend) if fusion else backend


async def _wasm_backend(kernels):
    from cinders import wasm
    await wasm.load(kernels)
    return wasm.Wasm()


async def init(prefer="auto", fusion=False, kernels=None):
    """Choose the backend once per page. prefer: "auto" (WebGPU, else WebAssembly SIMD, else
    the CPU in Python) | "webgpu" | "wasm" | "python" (alias "cpu"): a named one is used or
    fails loudly. fusion: wrap WebGPU in cn.Fusion (elementwise chains become one kernel: fewer
    dispatches, which is most of the cost on software adapters). kernels: cn.Wasm()'s module, as
    its URL (default: the demo server's /wasm-kernels/) or a JS promise of the compiled module.
    Returns {"backend":
    "webgpu"|"wasm"|"cpu", "name": backend repr, "note": why, when it fell back}."""
    if prefer not in PREFERENCES:
        raise ValueError("cinders: backend must be one of %s, got %r" % (", ".join(PREFERENCES), prefer))
    notes, backend, kind = [], None, None
    for candidate in ("webgpu", "wasm"):
        if prefer not in ("auto", candidate):
            continue
        try:
            backend = await (_webgpu_backend(fusion) if candidate == "webgpu" else _wasm_backend(kernels))
            kind = candidate
            break
        except Exception as e:  # no navigator.gpu, null adapter, module missing: say so, go on
            if prefer == candidate:
                raise
            notes.append("%s unavailable (%s)" % ("WebGPU" if candidate == "webgpu" else "WebAssembly", e))
    if backend is None:
        backend, kind = cpu_backend(), "cpu"
        notes.append("running on the CPU" if notes else "CPU backend requested")
    elif notes:
        notes.append("running on %s" % kind)
    note = "; ".join(notes)
    _state.update(backend=backend, kind=kind, note=note)
    # Models built on this page (record loading included) start on the chosen backend, instead
    # of initialising their weights on the CPU and copying them over.
    cn.set_default_backend(backend)
    return {"backend": _state["kind"], "name": repr(backend), "note": note}


def current_backend():
    if _state["backend"] is None:
        raise RuntimeError("cinders.web.bridge: call `await init()` before loading a model")
    return _state["backend"]


async def read_async(t):
    """A tensor's values as a flat list, awaiting the device instead of blocking the page."""
    reader = getattr(t.backend, "to_flat_async", None)
    return await reader(t.handle) if reader is not None else t.backend.to_flat(t.handle)


def _nested(flat, shape):
    """A flat list as nested lists of `shape` (what tolist() gives)."""
    for d in reversed(shape[1:]):
        flat = [flat[i:i + d] for i in range(0, len(flat), d)]
    return flat


def float32_to_js(values):
    """Flat float32 values (a sequence of floats, or array('f')) as a JS Float32Array: results
    cross to the page as one typed array (the page makes the answer: wasm/cinders.js answerOf),
    not as a dict converted value by value."""
    import js
    data = values if values.__class__ is array and values.typecode == "f" else array("f", values)
    out = js.Float32Array.new(len(data))
    out.assign(data)
    return out


def _as_floats(pixels):
    """A JS Float32Array (JsProxy), a buffer or a sequence -> array('f') (a flat sequence of
    Python floats that every backend's from_flat takes without a per-value Python loop)."""
    to_bytes = getattr(pixels, "to_bytes", None)
    if to_bytes is not None:
        return array("f", to_bytes())
    if isinstance(pixels, (bytes, bytearray, memoryview)):
        return array("f", bytes(pixels))
    return array("f", [float(v) for v in pixels])


class Predictor:
    """A loaded model bound to the page's backend."""

    def __init__(self, model, meta, backend, name):
        self.model = model
        # The forward pass replays its recorded kernels from the third call on: one call into
        # JS per prediction instead of Python per kernel (cn.capture; on CPU backends a no-op).
        self.forward = cn.capture(model)
        self.meta = meta
        self.backend = backend
        self.name = name
        # Records may name their input shape (JSON); the MNIST models take (N, 1, 28, 28).
        self.input_shape = tuple(json.loads(meta.get("input_shape", "[1, 28, 28]")))
        # cn.Wasm(): the page replays the last prediction's program itself while it holds
        # (wasm/cinders.js Replay, reading the plan predict_now hands out): no Python per
        # prediction. The owner number tells this model's plan from another's.
        self.replay_owner = next(_replay_owners) if _state["kind"] == "wasm" else 0

    def info(self):
        return {"class": type(self.model).__name__, "name": self.name,
                "input_shape": list(self.input_shape), "backend": _state["kind"]}

    def _input(self, pixels, n, sample_shape=None):
        values = _as_floats(pixels)
        sample_shape = sample_shape or self.input_shape
        per = 1
        for d in sample_shape:
            per *= d
        if len(values) != n * per:
            raise ValueError("predict: expected %d values (%d x %s), got %d"
                             % (n * per, n, "x".join(map(str, sample_shape)), len(values)))
        shape = (n,) + tuple(sample_shape)
        # from_flat directly: cn.tensor would walk the 784 floats in Python to infer a shape
        # and dtype this code already knows (a third of a warm inference on cn.Wasm())
        return cn.Tensor(self.backend, self.backend.from_flat(values, shape, cn.float32), shape, cn.float32)

    def _forward(self, pixels, n, sample_shape=None):
        return self.forward(self._input(pixels, n, sample_shape))

    async def predict_batch(self, pixels, n):
        """n images' logits, one after the other, as one JS Float32Array."""
        return float32_to_js(await read_async(self._forward(pixels, n)))

    async def predict(self, pixels):
        """One image's logits (a JS Float32Array)."""
        return await self.predict_batch(pixels, 1)

    async def run(self, values, sample_shape=None):
        """Any model: `values` hold one or more samples of sample_shape (default: the record's
        input_shape), flat -> {"shape": the output's, "values": nested like it}."""
        shape = tuple(sample_shape.to_py() if hasattr(sample_shape, "to_py") else sample_shape or self.input_shape)
        values = _as_floats(values)
        per = 1
        for d in shape:
            per *= d
        if len(values) % per or not values:
            raise ValueError("the input holds %d numbers, not a multiple of %d (shape %s)"
                             % (len(values), per, shape))
        output = self._forward(values, len(values) // per, shape)
        return {"shape": list(output.shape), "values": _nested(await read_async(output), output.shape)}

    def predict_now(self, pixels):
        """predict() without the event loop, for backends whose reads never wait (the CPU,
        cn.Wasm()): a JS caller gets the result in the same task instead of after a
        scheduler round trip (which costs more than a whole MNIST inference on cn.Wasm()).
        On cn.Wasm() a call that replayed hands its program to the page (replay_slot)."""
        x = self._input(pixels, 1)
        logits = self.forward(x)
        out = float32_to_js(logits.backend.to_flat(logits.handle))
        if self.replay_owner:
            program = self.forward.replayable()
            views = program and program.output_views()
            if views and all(view[4] is cn.float32 for view in views):
                self.backend.capture_recorder().standalone(program, [x.handle], self.replay_owner)
        return out

    def replay_slot(self):
        """Where the page finds the plan predict_now hands out (wasm/cinders.js Replay), once
        per model: {exports: the module's, memory: its memory (the threaded build imports a shared
        one, so it is not among the exports), block: the plan block's address (uint32 words:
        owner, commands, count, input, input bytes, output, output bytes), owner: this model's
        number, in the owner word while its plan holds}; None on other backends."""
        if not self.replay_owner:
            return None
        import js
        from pyodide.ffi import to_js
        block = self.backend.capture_recorder().plan_address()
        engine = self.backend.engine
        return to_js({"exports": engine.exports, "memory": engine.memory, "block": block,
                      "owner": self.replay_owner}, dict_converter=js.Object.fromEntries)


def _basename(url, default):
    return os.path.basename(url.split("?", 1)[0]) or default


def _user_module(folder, source, source_name):
    """The user's model source as the module its file names, executed afresh (a second load with
    new source gets the new classes), never put on sys.path; a name that an installed module
    already has is refused instead of silently meaning that module."""
    import importlib.util
    import sys
    name = os.path.splitext(_basename(source_name or "", "model_source.py"))[0]
    if not name.isidentifier():
        raise ValueError("the model source %s: its file name must be a Python module name" % source_name)
    path = os.path.join(folder, name + ".py")
    loaded = sys.modules.get(name)
    if loaded is not None and getattr(loaded, "__file__", None) != path:
        raise ValueError("the model source %s: %r is already the name of an installed module; rename "
                         "the file" % (source_name, name))
    with open(path, "w") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module   # the record names its classes by this module
    spec.loader.exec_module(module)
    return module


async def load_model(data, name="model.safetensors", source=None, source_name=None):
    """A record's bytes (JS Uint8Array or Python bytes) -> Predictor on the page's backend.

    The bytes go through cinders' own record loader (cinders.record.load_model: validated, class
    and config from the metadata, only cinders classes), via a file in Pyodide's memory FS.
    source: the text of a user's model module (source_name: its URL, whose file name is the
    module's): imported, and its classes are the only others the record may name.
    """
    from cinders import record
    raw = data.to_bytes() if hasattr(data, "to_bytes") else bytes(data)
    backend = current_backend()
    folder = "/tmp/cinders-models"
    os.makedirs(folder, exist_ok=True)
    allow = ()
    if source is not None:
        allow = (_user_module(folder, source, source_name),)
    path = os.path.join(folder, _basename(name, "model.safetensors"))
    with open(path, "wb") as f:
        f.write(raw)
    model = record.load_model(path, backend=backend, allow=allow)
    model.eval()  # inference: dropout off, batch norm on its running statistics
    # Everything alive now (interpreter, cinders, the model) lives as long as the page: moved out
    # of the collector's generations, each later collection scans only an inference's
    # temporaries (halves a warm MNIST inference on cn.Wasm() in Pyodide).
    import gc
    gc.collect()
    gc.freeze()
    meta = record.read_metadata(path)
    return Predictor(model, meta, backend, name)
