"""What the /onnx/ page (web_demos/onnx/) calls inside Pyodide: import an uploaded ONNX file in
the tab and run it on the page's backend (WebGPU, or the CPU fallback).

    info = import_model(data, "model.onnx")     # {"source", "inputs", "outputs", "import_ms", ...}
    result = await run(batch=1, seed=0)         # {"outputs": [...], "first_ms", "warm_ms", "captured"}

Inputs are drawn with cn.random(shape, distribution="normal", seed=seed + i): the same numbers on
every backend, so a desktop run with the same seed reproduces the page's input exactly.
"""
import time

import cinders as cn
from . import load

_state = {"model": None, "forward": None}


def _backend():
    from ..web import bridge
    return bridge.current_backend() or cn.default_backend()


def import_model(data, name="model.onnx"):
    started = time.perf_counter()
    model = load(bytes(data), backend=_backend())
    ms = (time.perf_counter() - started) * 1e3
    _state["model"] = model
    # The forward replays its recorded kernels from the fourth call of a shape on: one call into JS
    # per run instead of Python per kernel (cn.capture; on CPU backends it simply calls the model).
    _state["forward"] = cn.capture(model)
    inputs = [{"name": n, "shape": list(s), "type": t}
              for n, s, t in zip(model.input_names, model.input_shapes, model.input_types)]
    return {"name": str(name), "source": model.source, "inputs": inputs, "outputs": list(model.output_names),
            "opset": model.opset, "import_ms": ms, "parameters": model.num_params(),
            "backend": repr(_backend())}


def input_shape(shape, batch):
    """A graph input's dims with symbolic ones (names, None) made concrete: the batch size."""
    return tuple(d if isinstance(d, int) and d > 0 else batch for d in shape)


def make_inputs(model, batch, seed, backend):
    tensors = []
    for i, (shape, type_name) in enumerate(zip(model.input_shapes, model.input_types)):
        shape = input_shape(shape, batch)
        if type_name in ("float32", "float64", "float16", "bfloat16"):
            tensors.append(cn.random(shape, backend=backend, distribution="normal", seed=seed + i))
        elif type_name == "bool":
            tensors.append(cn.zeros(*shape, backend=backend, dtype=cn.bool))
        else:
            tensors.append(cn.zeros(*shape, backend=backend, dtype=cn.int32))
    return tensors


async def run(batch=1, seed=0):
    """Run the imported model four times on random inputs and time the first (pipelines compile)
    and the last (warm: a replay of the captured forward, where the backend records kernels)."""
    model, forward = _state["model"], _state["forward"]
    if model is None:
        raise RuntimeError("import a model first")
    backend = _backend()
    inputs = make_inputs(model, batch, seed, backend)
    timings = []
    for _ in range(4):  # call 1 runs, calls 2 and 3 record, call 4 replays (cinders/capture.py)
        started = time.perf_counter()
        try:
            out = forward(*inputs)
        except cn.CaptureError:  # a model whose Python reads values: run it uncaptured from now on
            forward = _state["forward"] = model
            out = model(*inputs)
        outs = out if isinstance(out, tuple) else (out,)
        values = [await t.to_data_async() for t in outs]
        timings.append((time.perf_counter() - started) * 1e3)
    results = [{"name": n, "shape": list(t.shape), "values": _flat(v)}
               for n, t, v in zip(model.output_names, outs, values)]
    return {"outputs": results, "first_ms": timings[0], "warm_ms": timings[-1], "batch": batch, "seed": seed,
            "captured": getattr(forward, "replays", 0) > 0}


def _flat(v):
    if isinstance(v, list):
        out = []
        for x in v:
            out.extend(_flat(x))
        return out
    return [v]
