"""ONNX import: an ONNX file becomes a cinders.nn.Module, through readable generated Python.

    model = cinders.onnx.load("resnet18.onnx", backend=cn.NumPy())
    y = model(x)                                   # inputs in the graph's order

    cinders import-onnx resnet18.onnx --out models --name resnet18
    # models/resnet18.py (class Model) + models/resnet18.safetensors

One mechanism for both: the graph is read by our own protobuf reader (`proto`), turned into
Python source (`codegen`) whose statements call Tensor methods and the op functions of `ops`,
and `load` executes that source. No `onnx` package needed, so it runs in Pyodide too.
"""

import functools
import inspect
import json
import os
import types

from ..files import check_writable_target, inside, open_regular, read_regular
from .proto import OnnxError, read_model
from . import codegen

from .generate import generate

__all__ = ["OnnxError", "load", "to_source", "import_onnx", "generate"]


MAX_FILE_BYTES = 2 << 30  # protobuf's own limit: larger models keep their weights as external data


def _read(source):
    """(bytes, folder for external data or None, display name)."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source), None, "<bytes>"
    path = os.fspath(source)
    data = read_regular(path, OnnxError, "ONNX file", MAX_FILE_BYTES)
    return data, os.path.dirname(os.path.abspath(path)), os.path.basename(path)


def _external_reader(folder):
    """external(location, offset, length) -> bytes of a regular file inside the model's folder
    (symlinks may not lead out of it). Together the regions read may not exceed the bytes of the
    files they come from: 200 initializers naming one 4 MB region would otherwise cost 800 MB."""
    if folder is None:
        return None
    file_sizes, budget = {}, [0]

    def external(location, offset, length):
        what = "external data %s" % ascii(location)
        path = inside(folder, location, OnnxError, "external data location", "the model's folder")
        with open_regular(path, OnnxError, "external data") as f:
            size = os.fstat(f.fileno()).st_size
            if offset + length > size:
                raise OnnxError("%s: %d bytes at offset %d, the file has %d" % (what, length, offset, size))
            if path not in file_sizes:
                file_sizes[path] = size
                budget[0] += size
            if length > budget[0]:
                raise OnnxError("%s: the initializers read %d bytes more than the external files hold "
                                "(%d bytes); regions shared by several tensors are refused"
                                % (what, length - budget[0], sum(file_sizes.values())))
            budget[0] -= length
            f.seek(offset)
            data = f.read(length)
        if len(data) != length:
            raise OnnxError("%s: %d bytes at offset %d, read %d" % (what, length, offset, len(data)))
        return data
    return external


GENERATED_KEYWORDS = ("opset", "outputs", "backend")  # passed by the generated calls, never inputs


@functools.lru_cache(maxsize=None)
def _required_attributes(fn):
    """The keyword-only parameters of an op function without a default: attributes ONNX requires."""
    return tuple(p.name for p in inspect.signature(fn).parameters.values()
                 if p.kind == p.KEYWORD_ONLY and p.default is p.empty)


def check_inputs(graph, where="graph"):
    """OnnxError for a node of a registered op given more inputs than the op takes: the extra
    ones would land on parameters that are attributes (Softmax's axis) and fail with a TypeError
    when the model runs. Subgraphs too."""
    from .ops import REGISTRY
    for i, node in enumerate(graph.node):
        fn = REGISTRY.get(("", node.op_type)) if node.domain in ("", "ai.onnx") else None
        if fn is not None:
            given = {a.name for a in node.attribute}
            missing = [n for n in _required_attributes(fn) if n not in given]
            if missing:
                raise OnnxError("%s node %d (%s %s): attribute %s is required"
                                % (where, i, ascii(node.op_type), ascii(node.name), missing[0]))
            bound = fn.inputs[:len(node.input)]
            taken = set(bound) & ({a.name for a in node.attribute} | set(GENERATED_KEYWORDS))
            if len(node.input) > len(fn.inputs) or taken:
                raise OnnxError("%s node %d (%s %s): %d inputs, more than %s takes"
                                % (where, i, ascii(node.op_type), ascii(node.name), len(node.input), node.op_type))
        for attr in node.attribute:
            for sub in ([attr.g] if attr.g is not None else []) + list(attr.graphs):
                check_inputs(sub, "%s node %d subgraph %s" % (where, i, ascii(attr.name)))


def _model(data):
    model = read_model(data)
    check_inputs(model.graph)
    return model


def _generate(source, class_name="Model", fixed_inputs=None, input_shapes=None):
    data, folder, name = _read(source)
    model = _model(data)
    src, constants, _ = codegen.generate(model, _external_reader(folder), class_name, name, fixed_inputs,
                                         input_shapes)
    return src, constants, name


def to_source(source, class_name="Model", fixed_inputs=None, input_shapes=None):
    """The generated Python source of an ONNX model (a path or bytes); fixed_inputs and
    input_shapes as in load."""
    return _generate(source, class_name, fixed_inputs, input_shapes)[0]


def _tensors(constants, backend):
    from ..dtypes import from_name
    from ..tensor import Tensor
    base = backend.inner if backend.differentiable else backend   # Autodiff holds weights inside
    out = {}
    for attr, c in constants.items():
        dtype = from_name(c.dtype)
        if base.quantized_matmul and c.onnx_type in ("int8", "uint8"):
            # quantized weights stay 8-bit where matmuls dequantize them (ops/quantization.py)
            dtype = from_name(c.onnx_type)
        elif base.quantized_matmul and c.half:
            # a half model's weights stay float16, widened inside the matmul kernel (ops/linalg.py)
            dtype = from_name("float16")
        out[attr] = Tensor(base, base.from_flat(c.storable_values(), c.shape, dtype), c.shape, dtype)
    return out


def load(source, backend=None, fixed_inputs=None, input_shapes=None):
    """The ONNX model at `source` (a path or bytes) as a cinders.nn.Module on `backend` (default:
    cn.default_backend()). fixed_inputs: {input name: value} of inputs that are the same on every
    call (a sample rate, a flag): they become constants and leave the forward's arguments, and
    what depends only on them (an If on them, shape arithmetic) is decided at import.
    input_shapes: {input name: dims} the model will always get (the graph's symbolic dims made
    fixed), so shape arithmetic and the Ifs on it are decided at import too: what a board wants.
    Raises OnnxError for unreadable files and lists every unsupported op."""
    from ..tensor import default_backend
    backend = backend or default_backend()
    src, constants, name = _generate(source, fixed_inputs=fixed_inputs, input_shapes=input_shapes)
    module = types.ModuleType("cinders_onnx_model")
    module.__file__ = "<onnx %s>" % name
    exec(compile(src, module.__file__, "exec"), module.__dict__)  # our generated source, see codegen
    model = module.Model(backend=backend)
    model.load_state_dict(_tensors(constants, backend))
    model.source = src
    return model.eval()


def import_onnx(source, out_dir, name=None, fixed_inputs=None, input_shapes=None):
    """Write OUT_DIR/NAME.py and OUT_DIR/NAME.safetensors; returns the two paths and the nodes
    that read device values at run time (their results depend on data: NonZero, Unique, ...).
    fixed_inputs, input_shapes: as in load."""
    from .. import record
    from ..tensor import default_backend
    data, folder, display = _read(source)
    if name is None:
        base = os.path.splitext(display)[0] if isinstance(source, (str, os.PathLike)) else "model"
        name = codegen.module_name(base)
    elif not name.isidentifier() or not name.isascii():
        raise OnnxError("--name %r is not a Python module name" % (name,))
    src, constants, device_reads = codegen.generate(_model(data), _external_reader(folder), "Model", display,
                                                    fixed_inputs, input_shapes)
    os.makedirs(out_dir, exist_ok=True)
    py_path = os.path.join(out_dir, name + ".py")
    st_path = os.path.join(out_dir, name + ".safetensors")
    backend = default_backend()
    tensors = _tensors(constants, backend)
    meta = {"format": record.FORMAT, "model_class": name + ".Model", "model_config": "{}",
            "dtype": "float32", "source": display[:200]}
    nonfinite = record.nonfinite_names(tensors)
    if nonfinite:  # the model's own -inf/NaN constants, not a broken training run: Model.load takes them
        meta["nonfinite"] = json.dumps(nonfinite)
    check_writable_target(py_path, OnnxError)
    record.save_tensors(st_path, tensors, meta)
    tmp = py_path + ".tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(src)
        os.replace(tmp, py_path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return py_path, st_path, device_reads
