"""What the browser runtime (wasm/cinders.js) calls inside Pyodide.

    info = await init("auto")                  # picks WebGPU, else the CPU; says which and why
    predictor = await load_model(bytes, name)  # a record -> the model class it names
    result = await predictor.predict(pixels)   # {"class", "logits", "probabilities"}

Everything here is plain cinders code: the same model classes and record loader as the desktop.
"""
import json
import math
import os
from array import array

import cinders as cn

_state = {"backend": None, "kind": None, "note": ""}


def cpu_backend():
    """NumPy where it imports (Pyodide users online can load it), else the pure-Python backend."""
    try:
        import numpy  # noqa: F401
        from cinders.backends.numpy_backend import NumPy
        return NumPy()
    except ImportError:
        from cinders.backends.python_backend import Python
        return Python()


async def init(prefer="auto", fusion=False):
    """Choose the backend once per page. prefer: "auto" | "webgpu" | "cpu"; fusion: wrap WebGPU in
    cn.Fusion (elementwise chains become one kernel: fewer dispatches, which is most of the cost
    on software adapters). Returns {"backend": "webgpu"|"cpu", "name": backend repr, "note": why,
    when it fell back}."""
    note = ""
    backend = None
    if prefer not in ("auto", "webgpu", "cpu"):
        raise ValueError("cinders: backend must be 'auto', 'webgpu' or 'cpu', got %r" % (prefer,))
    if prefer != "cpu":
        try:
            from cinders.wgpu import browser
            await browser.init_device()
            # Autotuning times kernels with blocking waits, which the browser cannot do.
            backend = cn.Wgpu(autotune=False)
            if fusion:
                backend = cn.Fusion(backend)
        except Exception as e:  # no navigator.gpu, null adapter, device lost: say so, use the CPU
            if prefer == "webgpu":
                raise
            note = "WebGPU unavailable (%s); running on the CPU" % (e,)
    kind = "webgpu"
    if backend is None:
        backend, kind = cpu_backend(), "cpu"
        note = note or "CPU backend requested"
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


def _softmax(logits):
    top = max(logits)
    exps = [math.exp(v - top) for v in logits]
    total = sum(exps)
    return [e / total for e in exps]


def _as_floats(pixels):
    """A JS Float32Array (JsProxy), a buffer or a sequence -> list of Python floats."""
    to_bytes = getattr(pixels, "to_bytes", None)
    if to_bytes is not None:
        return array("f", to_bytes()).tolist()
    if isinstance(pixels, (bytes, bytearray, memoryview)):
        return array("f", bytes(pixels)).tolist()
    return [float(v) for v in pixels]


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

    def info(self):
        return {"class": type(self.model).__name__, "name": self.name,
                "input_shape": list(self.input_shape), "backend": _state["kind"]}

    async def predict_batch(self, pixels, n):
        values = _as_floats(pixels)
        per = 1
        for d in self.input_shape:
            per *= d
        if len(values) != n * per:
            raise ValueError("predict: expected %d values (%d x %s), got %d"
                             % (n * per, n, "x".join(map(str, self.input_shape)), len(values)))
        x = cn.tensor(values, backend=self.backend).reshape(n, *self.input_shape)
        logits = self.forward(x)
        flat = await read_async(logits)
        classes = logits.shape[-1]
        results = []
        for i in range(n):
            row = [float(v) for v in flat[i * classes:(i + 1) * classes]]
            results.append({"class": max(range(classes), key=row.__getitem__), "logits": row,
                            "probabilities": _softmax(row)})
        return results

    async def predict(self, pixels):
        return (await self.predict_batch(pixels, 1))[0]


async def load_model(data, name="model.safetensors"):
    """A record's bytes (JS Uint8Array or Python bytes) -> Predictor on the page's backend.

    The bytes go through cinders' own record loader (cinders.record.load_model: validated, class
    and config from the metadata, only cinders classes), via a file in Pyodide's memory FS.
    """
    from cinders import record
    raw = data.to_bytes() if hasattr(data, "to_bytes") else bytes(data)
    backend = current_backend()
    folder = "/tmp/cinders-models"
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, os.path.basename(name.split("?", 1)[0]) or "model.safetensors")
    with open(path, "wb") as f:
        f.write(raw)
    model = record.load_model(path, backend=backend)
    model.eval()  # inference: dropout off, batch norm on its running statistics
    meta = record.read_metadata(path)
    return Predictor(model, meta, backend, name)
