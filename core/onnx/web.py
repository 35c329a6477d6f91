"""What the ONNX pages (web_demos/onnx/, and web_demos/model/ that `cinders export-web` ships) call
inside Pyodide: import an uploaded ONNX file in the tab, run it on the page's backend (WebGPU,
cn.Wasm() or Python) on inputs the visitor can edit, and generate text with a KV-cache decoder.

    info = import_files({"m.onnx": data, "m.onnx.data": weights})   # {"source", "inputs", ...}
    info = import_model(data, "model.onnx")                         # one file
    result = await run([{"shape": [1, 8], "values": "[5, 7, ...]"}, ...])   # the page's fields
    done = await generate([5, 7, 9], 12, on_token)                  # greedy, token by token
    done = await generate([5, 7, 9], 12, on_token, temperature=0.8, top_k=40, seed=1)   # sampled

Example inputs (what the pages prefill their input fields with) come from `example`:
floats are cn.random(shape, distribution="normal", seed=i) for the i-th input - the same numbers
on every backend, so a desktop run reproduces the page's input exactly - and integers
are small (floor(10 * uniform)), never silently zeros; bools start False.
"""
import asyncio
import json
import os
import shutil
import tempfile
import time

import cinders as cn
from . import load
from .generate import generate_steps, is_decoder
from .proto import OnnxError, read_model

_state = {"model": None, "forward": None, "folder": None}
FLOAT_TYPES = ("float32", "float64", "float16", "bfloat16")
INT_RANGE = 10   # example integers are 0..9: valid token ids and indices for most models


def _backend():
    from ..web import bridge
    return bridge.current_backend() or cn.default_backend()


def import_files(files):
    """Import the one .onnx among `files` ({name: bytes}, e.g. a model and its external data,
    as torch.onnx.export writes them): they are written to a fresh folder of the tab's file
    system, so the model's external data is read beside it, as on the desktop."""
    files = {os.path.basename(str(name)): data for name, data in dict(files).items()}
    odd = sorted(n for n in files if n in ("", ".", "..") or "\x00" in n)
    if odd:
        raise OnnxError("%s is not a file name" % ascii(odd[0]))
    models = sorted(n for n in files if n.lower().endswith(".onnx"))
    if len(models) != 1:
        raise OnnxError("pick one .onnx file (and its external data files): got %s"
                        % (", ".join(map(ascii, models)) if models else "no .onnx among %s" % sorted(files)))
    if _state["folder"]:
        shutil.rmtree(_state["folder"], ignore_errors=True)
    folder = _state["folder"] = tempfile.mkdtemp(prefix="onnx-upload-")
    for name, data in files.items():
        with open(os.path.join(folder, name), "wb") as f:
            f.write(bytes(data))
    path = os.path.join(folder, models[0])
    started = time.perf_counter()
    try:
        model = load(path, backend=_backend())
    except OnnxError:
        _missing_external_data(path, files)
        raise
    ms = (time.perf_counter() - started) * 1e3
    _state["model"] = model
    # The forward replays its recorded kernels from the fourth call of a shape on: one call into JS
    # per run instead of Python per kernel (cn.capture; on CPU backends it simply calls the model).
    _state["forward"] = cn.capture(model)
    inputs = []
    for i, (name, dims, type_name) in enumerate(zip(model.input_names, model.input_shapes, model.input_types)):
        shape = input_shape(dims, 1)
        inputs.append({"name": name, "shape": list(dims), "type": type_name, "example_shape": list(shape),
                       "values": json.dumps(example(shape, type_name, i))})
    return {"name": models[0], "source": model.source, "inputs": inputs, "outputs": list(model.output_names),
            "opset": model.opset, "import_ms": ms, "parameters": model.num_params(), "backend": repr(_backend()),
            "generates": is_decoder(model)}


def import_model(data, name="model.onnx"):
    return import_files({name: data})


def _missing_external_data(path, files):
    """OnnxError naming the external data files the model needs and the upload lacks (only
    looked for once the import failed: a second parse of a large model costs seconds)."""
    with open(path, "rb") as f:
        graph = read_model(f.read()).graph
    needed = {e.value for t in graph.initializer for e in t.external_data if e.key == "location"}
    missing = sorted(n for n in needed if os.path.basename(n) not in files)
    if missing:
        raise OnnxError("%s keeps its weights in %s: pick %s together with the .onnx file"
                        % (os.path.basename(path), ", ".join(map(ascii, missing)),
                           "it" if len(missing) == 1 else "them")) from None


def input_shape(shape, size):
    """A graph input's dims with symbolic ones (names, None) made concrete: `size`."""
    return tuple(d if isinstance(d, int) and d > 0 else size for d in shape)


def example(shape, type_name, seed):
    """Flat example values of an input: normal floats, small integers, False for bools."""
    if type_name == "bool":
        return [False] * _numel(shape)
    draws = cn.random(shape, backend=cn.Python(), distribution="normal" if type_name in FLOAT_TYPES else "uniform",
                      seed=seed).reshape(-1).tolist()
    return draws if type_name in FLOAT_TYPES else [int(v * INT_RANGE) for v in draws]


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def _tensor(values, shape, type_name, backend):
    dtype = cn.float32 if type_name in FLOAT_TYPES else cn.bool if type_name == "bool" else cn.int32
    return cn.tensor(values, backend=backend, dtype=dtype).reshape(*shape)


def parse_input(name, dims, type_name, shape, text):
    """(shape, flat values) of one edited input field: a JSON list (flat or nested) of as many
    numbers as `shape` holds; the shape keeps the graph's fixed dims; integer inputs take integers."""
    shape = [int(d) for d in shape]
    if len(shape) != len(dims) or any(d < 0 for d in shape) or any(
            isinstance(g, int) and g > 0 and g != d for g, d in zip(dims, shape)):
        raise OnnxError("input %s: shape %s does not fit the graph's %s" % (ascii(name), shape, list(dims)))
    try:
        values = _flat(json.loads(text))
    except ValueError as e:
        raise OnnxError("input %s: not a JSON list of numbers (%s)" % (ascii(name), e)) from None
    if len(values) != _numel(shape):
        raise OnnxError("input %s: %d values for shape %s, which holds %d"
                        % (ascii(name), len(values), shape, _numel(shape)))
    kinds = (bool,) if type_name == "bool" else (int, float) if type_name in FLOAT_TYPES else (int,)
    wrong = next((v for v in values if type(v) not in kinds or (type_name != "bool" and isinstance(v, bool))), None)
    if wrong is not None:
        raise OnnxError("input %s (%s): %s is not %s" % (ascii(name), type_name, json.dumps(wrong),
                                                         "true/false" if type_name == "bool" else
                                                         "a number" if type_name in FLOAT_TYPES else "an integer"))
    return shape, values


async def run(inputs):
    """Run the imported model four times and time the first (pipelines compile) and the last
    (warm: a replay of the captured forward, where the backend records kernels); device_reads
    counts the values the forward calls read from the device (0 for a captured model). inputs: one
    {"shape", "values" (JSON text)} per graph input, as the page's fields hold them."""
    model, forward = _state["model"], _state["forward"]
    if model is None:
        raise RuntimeError("import a model first")
    backend = _backend()
    fields = [dict(f) for f in inputs]
    if len(fields) != len(model.input_names):
        raise OnnxError("%d inputs given, the model takes %d" % (len(fields), len(model.input_names)))
    tensors = []
    for name, dims, type_name, field in zip(model.input_names, model.input_shapes, model.input_types, fields):
        shape, values = parse_input(name, dims, type_name, list(field["shape"]), str(field["values"]))
        tensors.append(_tensor(values, shape, type_name, backend))
    timings, device_reads = [], 0
    for _ in range(4):  # call 1 runs, calls 2 and 3 record, call 4 replays (cinders/capture.py)
        started = time.perf_counter()
        with cn.profile(backend) as p:   # the forward's own reads (not the outputs' below)
            try:
                out = forward(*tensors)
            except cn.CaptureError:  # a model whose Python reads values: run it uncaptured from now on
                forward = _state["forward"] = model
                out = model(*tensors)
        device_reads += p.device_reads
        outs = out if isinstance(out, tuple) else (out,)
        values = [await t.to_data_async() for t in outs]
        timings.append((time.perf_counter() - started) * 1e3)
    results = [{"name": n, "shape": list(t.shape), "values": _flat(v)}
               for n, t, v in zip(model.output_names, outs, values)]
    return {"outputs": results, "first_ms": timings[0], "warm_ms": timings[-1],
            "captured": getattr(forward, "replays", 0) > 0, "device_reads": device_reads}


async def generate(token_ids, max_new_tokens, on_token=None, temperature=0.0, top_k=None, seed=None):
    """Generation from one prompt with the imported KV-cache decoder (cinders.onnx's
    generate_steps: captured decode steps where the model has attention_mask/position_ids; the
    tokens picked on the device, greedy or sampled, so WebGPU never needs a blocking read).
    Each token is awaited as it comes and handed to on_token(token, seconds since the start),
    so the page shows them one by one. Returns {"tokens", "tokens_per_s", "ms", "replays" (captured
    programs replayed: decode steps and picks)}; the same seed
    gives the tokens of cinders.onnx.generate on the desktop, on any backend."""
    model = _state["model"]
    if model is None:
        raise RuntimeError("import a model first")
    prompt = [int(t) for t in token_ids]
    started, tokens = time.perf_counter(), []
    steps = generate_steps(model, [prompt], int(max_new_tokens), float(temperature),
                           None if top_k is None else int(top_k), None if seed is None else int(seed))
    with cn.profile(_backend()) as p:   # how many steps and picks replayed a captured program
        for picked in steps:
            token = int((await picked.to_data_async())[0][0])
            tokens.append(token)
            if on_token is not None:
                on_token(token, time.perf_counter() - started)
                await asyncio.sleep(0)   # the page repaints: the tokens appear one by one
    seconds = time.perf_counter() - started
    return {"tokens": tokens, "ms": seconds * 1e3, "tokens_per_s": len(tokens) / seconds if seconds else 0.0,
            "replays": sum(1 for e in p.events if e["kind"] == "replay")}


def _flat(v):
    if isinstance(v, list):
        out = []
        for x in v:
            out.extend(_flat(x))
        return out
    return [v]
