"""ONNX import: an ONNX file becomes a cinders.nn.Module, through readable generated Python.

    model = cinders.onnx.load("resnet18.onnx", backend=cn.NumPy())
    y = model(x)                                   # inputs in the graph's order

    cinders import-onnx resnet18.onnx --out models --name resnet18
    # models/resnet18.py (class Model) + models/resnet18.safetensors

One mechanism for both: the graph is read by our own protobuf reader (`proto`), turned into
Python source (`codegen`) whose statements call Tensor methods and the op functions of `ops`,
and `load` executes that source. No `onnx` package needed, so it runs in Pyodide too.
"""

import os
import types

from .proto import OnnxError, read_model
from . import codegen

from .generate import generate

__all__ = ["OnnxError", "load", "to_source", "import_onnx", "generate"]


def _read(source):
    """(bytes, folder for external data or None, display name)."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source), None, "<bytes>"
    path = os.fspath(source)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise OnnxError("cannot read ONNX file %r: %s" % (path, e.strerror or e)) from None
    return data, os.path.dirname(os.path.abspath(path)), os.path.basename(path)


def _external_reader(folder):
    """external(location, offset, length) -> bytes, confined to the model's folder."""
    if folder is None:
        return None

    def external(location, offset, length):
        if os.path.isabs(location) or ".." in location.replace("\\", "/").split("/"):
            raise OnnxError("external data location %s leaves the model's folder" % ascii(location))
        path = os.path.join(folder, location)
        try:
            size = os.path.getsize(path)
            if offset + length > size:
                raise OnnxError("external data %s: %d bytes at offset %d, the file has %d"
                                % (ascii(location), length, offset, size))
            with open(path, "rb") as f:
                f.seek(offset)
                return f.read(length)
        except OSError as e:
            raise OnnxError("cannot read external data %s: %s" % (ascii(location), e.strerror or e)) from None
    return external


def _generate(source, class_name="Model"):
    data, folder, name = _read(source)
    model = read_model(data)
    src, constants, _ = codegen.generate(model, _external_reader(folder), class_name, name)
    return src, constants, name


def to_source(source, class_name="Model"):
    """The generated Python source of an ONNX model (a path or bytes)."""
    return _generate(source, class_name)[0]


def _tensors(constants, backend):
    from ..dtypes import from_name
    from ..tensor import Tensor
    base = backend.inner if hasattr(backend, "from_inner") else backend
    out = {}
    for attr, c in constants.items():
        dtype = from_name(c.dtype)
        out[attr] = Tensor(base, base.from_flat(c.storable_values(), c.shape, dtype), c.shape, dtype)
    return out


def load(source, backend=None):
    """The ONNX model at `source` (a path or bytes) as a cinders.nn.Module on `backend` (default:
    cn.default_backend()). Raises OnnxError for unreadable files and lists every unsupported op."""
    from ..tensor import default_backend
    backend = backend or default_backend()
    src, constants, name = _generate(source)
    module = types.ModuleType("cinders_onnx_model")
    module.__file__ = "<onnx %s>" % name
    exec(compile(src, module.__file__, "exec"), module.__dict__)  # our generated source, see codegen
    model = module.Model(backend=backend)
    model.load_state_dict(_tensors(constants, backend))
    model.source = src
    return model.eval()


def import_onnx(source, out_dir, name=None):
    """Write OUT_DIR/NAME.py and OUT_DIR/NAME.safetensors; returns the two paths and the nodes
    that read device values at run time (their results depend on data: NonZero, Unique, ...)."""
    from .. import record
    from ..tensor import default_backend
    data, folder, display = _read(source)
    if name is None:
        base = os.path.splitext(display)[0] if isinstance(source, (str, os.PathLike)) else "model"
        name = codegen.module_name(base)
    elif not name.isidentifier() or not name.isascii():
        raise OnnxError("--name %r is not a Python module name" % (name,))
    src, constants, device_reads = codegen.generate(read_model(data), _external_reader(folder), "Model", display)
    os.makedirs(out_dir, exist_ok=True)
    py_path = os.path.join(out_dir, name + ".py")
    st_path = os.path.join(out_dir, name + ".safetensors")
    backend = default_backend()
    tensors = _tensors(constants, backend)
    meta = {"format": record.FORMAT, "model_class": name + ".Model", "model_config": "{}",
            "dtype": "float32", "source": display[:200]}
    record.save_tensors(st_path, tensors, meta)
    tmp = py_path + ".tmp"
    with open(tmp, "w", encoding="ascii") as f:
        f.write(src)
    os.replace(tmp, py_path)
    return py_path, st_path, device_reads
