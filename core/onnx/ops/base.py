"""The op registry and the helpers every operator family shares: host parameters (shapes, axes,
pads read as Python numbers), the host backend where shape arithmetic runs, dtype names."""

import inspect

import cinders as cn
from ...dtypes import float16, float32, int32, bool_
from ...functional import stack
from ...tensor import Tensor
from ..proto import OnnxError

REGISTRY = {}   # (domain, op_type) -> op function; "" is the ai.onnx domain
# Where generated code finds an op of a domain: ai.onnx ops are attributes of `ops` itself, other
# domains have a namespace of their own (`ops.com_microsoft.Attention`), so that names both define
# (Attention, Gelu, RotaryEmbedding) do not collide.
NAMESPACES = {"": "ops", "com.microsoft": "ops.com_microsoft", "cinders.joined": "ops"}
# The domain of the ops cinders.onnx joins nodes into at import (DequantizedConv: a weight's
# DequantizeLinear and its Conv): no ONNX opset names them, so a file's ai.onnx node of the
# same name stays unsupported, as it is in onnxruntime.
JOINED = "cinders.joined"
_DTYPES = {"float32": float32, "int32": int32, "bool": bool_}


def op(host=(), multi=False, reads=False, domain=""):
    """Register an ONNX op function. host: parameters read as Python numbers; multi: the op has
    several outputs and takes `outputs=n` (it then returns a tuple of n tensors); reads: its
    result's size depends on its input's values, which it reads (NonZero, Unique); domain: the
    operator set it belongs to ("" for ai.onnx, e.g. "com.microsoft" for onnxruntime's)."""
    def register(fn):
        fn.inputs, fn.params = op_params(fn)
        sig = inspect.signature(fn).parameters.values()
        fn.defaults = {p.name: p.default for p in sig if p.default is not p.empty}
        fn.required = sum(1 for p in sig if p.kind == p.POSITIONAL_OR_KEYWORD and p.default is p.empty) or \
            (1 if any(p.kind == p.VAR_POSITIONAL for p in sig) else 0)
        fn.host, fn.multi, fn.reads, fn.domain = frozenset(host), multi, reads, domain
        fn.call = "%s.%s" % (NAMESPACES[domain], fn.__name__)
        REGISTRY[(domain, fn.__name__)] = fn
        return fn
    return register


def cinders_dtype_name(onnx_type_name):
    """float32 | int32 | bool: what an ONNX element type computes as in cinders."""
    if onnx_type_name in ("float32", "float64", "float16", "bfloat16"):
        return "float32"
    if onnx_type_name == "bool":
        return "bool"
    return "int32"


def dtype_of(onnx_type):
    return _DTYPES[cinders_dtype_name(onnx_type)]


def half_input(x):
    """A graph input or Cast result the file types float16: its values rounded to float16 (a
    float16 tensor's already are), computed in float32 as every float16 value is."""
    return _holding_half(x).cast(float32).cast(float16).cast(float32)


def half_output(y):
    """A graph output the file types float16, returned as a cn.float16 tensor."""
    return _holding_half(y).cast(float16)


def _holding_half(x):
    if float16 not in x.backend.storage_dtypes:
        raise OnnxError("float16 values (a Cast to float16, float16 inputs and outputs) round through "
                        "cn.float16 tensors, which %r does not hold: run the model on one that does "
                        "(cn.NumPy(), cn.Wasm(), cn.Wgpu(), cn.Python())" % (x.backend,))
    return x


def op_params(fn):
    """(positional input names, every parameter name) of an op function."""
    sig = inspect.signature(fn)
    inputs, names = [], set()
    for p in sig.parameters.values():
        names.add(p.name)
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            inputs.append(p.name)
        elif p.kind == p.VAR_POSITIONAL:
            inputs.extend(p.name + "_%d" % i for i in range(64))
    return tuple(inputs), names


def host(v):
    """A host parameter as Python numbers (nested lists), whether literal or a tensor."""
    if isinstance(v, Tensor):
        return v.tolist()
    return v


def ints(v):
    """A host parameter as a flat list of ints (None stays None)."""
    v = host(v)
    if v is None:
        return None
    if isinstance(v, (int, float)):
        return [int(v)]
    out = []
    for x in v:
        out.extend(ints(x) if isinstance(x, list) else [int(x)])
    return out


def scalar(v):
    v = host(v)
    while isinstance(v, list):
        if len(v) != 1:
            raise OnnxError("expected one value, got %r" % (v,))
        v = v[0]
    return v


def truth(cond):
    """The Python bool of a one-element condition (If): read back from the device."""
    return bool(scalar(cond))


def trips(count):
    """Loop's iteration numbers (host int32 scalars): count of them, or without end for None."""
    i = 0
    limit = None if count is None else int(scalar(count))
    while limit is None or i < limit:
        yield host_tensor(i, "int32")
        i += 1


def stack_scan(values, axis=0, reverse=0):
    """Loop/Scan outputs: the per-iteration values stacked along a new axis (last first when
    reverse)."""
    values = list(reversed(values)) if reverse else values
    return stack(values, axis if axis >= 0 else axis + values[0].ndim + 1)


def scan_slice(x, axis, step, reverse):
    """Scan's element `step` of x along axis (counted from the end when reverse)."""
    a = _axis(axis, x.ndim)
    i = x.shape[a] - 1 - step if reverse else step
    return _slice_axis(x, a, i, i + 1).squeeze(a)


_HOST = []


def host_backend():
    """A cn.Python() of its own device ("host"): where shape arithmetic runs (see codegen.HOST_OPS).
    Being another device, its values never mix unconverted with a cn.Python() model's, and
    cn.profile of that model does not count their reads as the model's."""
    if not _HOST:
        from ...backends.python_backend import Python

        class Host(Python):
            name = "host"

            def device_key(self):
                return ("Python", "host")
        _HOST.append(Host())
    return _HOST[0]


def host_tensor(value, dtype):
    return cn.tensor(value, backend=host_backend(), dtype=_DTYPES[dtype])


def to_device(t, backend):
    """A host-side shape value moved onto the model's backend, where device math needs it."""
    return t if t.backend is backend else t.to(backend)


def expect_shape(x, dims, name):
    """Refuse an input whose dims differ from the graph's declared ints (None and names: any):
    shapes decided at import assume them."""
    if len(x.shape) != len(dims) or any(isinstance(d, int) and d != n for d, n in zip(dims, x.shape)):
        raise OnnxError("input %s has shape %s; the model declares %s" % (ascii(name), list(x.shape), dims))


def backend_of(*things):
    for t in things:
        if isinstance(t, Tensor):
            return t.backend
        for v in getattr(t, "__dict__", {}).values():
            if isinstance(v, Tensor):
                return v.backend
    return cn.default_backend()


def _const(value, like, dtype=None):
    return cn.tensor(value, backend=like.backend, dtype=dtype or like.dtype)


def _axis(axis, ndim):
    return axis + ndim if axis < 0 else axis

def _slice_axis(x, axis, start, stop, step=1):
    key = [slice(None)] * x.ndim
    key[axis] = slice(start, stop, step)
    return x[tuple(key)]
