"""ONNX operators composed from the cinders Tensor API (one function per op, named as in ONNX).

Generated models call these (`ops.Conv(x, self.w, pads=[1, 1, 1, 1])`); inputs arrive
positionally in ONNX order (None for an omitted optional input), attributes as keywords with
their ONNX names. Parameters listed in `host=` of @op take Python numbers (shapes, axes, pads):
the importer writes constant ones as literals, and a tensor arriving there at run time is read
with tolist(). Nothing here touches a backend handle, so every op runs on every backend and
under Autodiff and Fusion. Semantics follow the ONNX operator specs (onnx.ai/onnx/operators);
where cinders differs (no float64/int64: those compute in float32/int32) docs/onnx.md says so.
"""

import inspect
import math

import cinders as cn
from ..dtypes import float32, int32, bool_
from ..functional import conv2d, log_softmax, softmax, stack
from ..nn.functional import batch_norm, hardswish, layer_norm
from ..indexing import _take
from ..backend import numel
from ..tensor import Tensor, unfold2d
from .proto import OnnxError

REGISTRY = {}
_DTYPES = {"float32": float32, "int32": int32, "bool": bool_}


def op(host=(), multi=False):
    """Register an ONNX op function. host: parameters read as Python numbers; multi: the op has
    several outputs and takes `outputs=n` (it then returns a tuple of n tensors)."""
    def register(fn):
        fn.inputs, fn.params = op_params(fn)
        sig = inspect.signature(fn).parameters.values()
        fn.defaults = {p.name: p.default for p in sig if p.default is not p.empty}
        fn.required = sum(1 for p in sig if p.kind == p.POSITIONAL_OR_KEYWORD and p.default is p.empty) or \
            (1 if any(p.kind == p.VAR_POSITIONAL for p in sig) else 0)
        fn.host, fn.multi = frozenset(host), multi
        REGISTRY[fn.__name__] = fn
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
    """cn.Python(): where shape arithmetic runs (see codegen.HOST_OPS)."""
    if not _HOST:
        from ..backends.python_backend import Python
        _HOST.append(Python())
    return _HOST[0]


def host_tensor(value, dtype):
    return cn.tensor(value, backend=host_backend(), dtype=_DTYPES[dtype])


def to_device(t, backend):
    """A host-side shape value moved onto the model's backend, where device math needs it."""
    return t if t.backend is backend else t.to(backend)


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


# -- elementwise ---------------------------------------------------------------------------------

@op()
def Div(a, b, broadcast=0, axis=None):
    b = _legacy_broadcast(a, b, broadcast, axis)
    if a.dtype is float32 or b.dtype is float32:
        return a / b
    return (a.cast(float32) / b.cast(float32)).cast(a.dtype)   # C division: truncates toward 0


@op()
def Mod(a, b, fmod=0):
    if not fmod:
        return a % b
    q = (a.cast(float32) / b.cast(float32))
    q = cn.where(q < 0, q.ceil(), q.floor())
    return a - (q * b.cast(float32)).cast(a.dtype) if a.dtype is not float32 else a - q * b


@op()
def Pow(x, y, broadcast=0, axis=None):
    y = _legacy_broadcast(x, y, broadcast, axis)
    if x.dtype is float32:
        return x ** y.cast(float32)
    return (x.cast(float32) ** y.cast(float32)).round().cast(x.dtype)


@op()
def Reciprocal(x):
    return 1.0 / x


@op()
def Floor(x):
    return x.floor()


@op()
def Ceil(x):
    return x.ceil()


@op()
def Round(x):
    return x.round()


@op()
def Sign(x):
    return (x > 0).cast(x.dtype) - (x < 0).cast(x.dtype)


@op()
def Sin(x):
    return x.sin()


@op()
def Cos(x):
    return x.cos()


@op()
def Tan(x):
    return x.sin() / x.cos()


@op()
def Sinh(x):
    return (x.exp() - (-x).exp()) * 0.5


@op()
def Cosh(x):
    return (x.exp() + (-x).exp()) * 0.5


@op()
def Asin(x):
    return x.asin()


@op()
def Acos(x):
    return x.acos()


@op()
def Atan(x):
    return x.atan()


@op()
def Asinh(x):
    return (x + (x * x + 1.0).sqrt()).log()


@op()
def Acosh(x):
    return (x + (x * x - 1.0).sqrt()).log()


@op()
def Atanh(x):
    return ((1.0 + x) / (1.0 - x)).log() * 0.5


@op()
def Sigmoid(x):
    return x.sigmoid()


@op()
def HardSigmoid(x, alpha=0.2, beta=0.5):
    return (x * alpha + beta).maximum(0.0).minimum(1.0)


@op()
def HardSwish(x):
    return hardswish(x)


@op()
def LeakyRelu(x, alpha=0.01):
    return cn.where(x < 0, x * alpha, x)


@op()
def PRelu(x, slope):
    if slope.ndim == 1 and x.ndim > 2 and slope.shape[0] == x.shape[1] != x.shape[-1]:
        slope = _channel(slope, x.ndim)   # opsets before 7: one slope per channel
    return cn.where(x < 0, x * slope, x)


@op()
def Elu(x, alpha=1.0):
    return cn.where(x < 0, (x.exp() - 1.0) * alpha, x)


@op()
def Selu(x, alpha=1.67326319217681884765625, gamma=1.05070102214813232421875):
    return cn.where(x <= 0, (x.exp() - 1.0) * alpha, x) * gamma


@op()
def Celu(x, alpha=1.0):
    return x.maximum(0.0) + ((x / alpha).exp() - 1.0).minimum(0.0) * alpha


@op()
def ThresholdedRelu(x, alpha=1.0):
    return cn.where(x > alpha, x, 0.0)


@op()
def Softplus(x):
    # log(1 + e^x) without overflow: max(x, 0) + log(1 + e^-|x|)
    return x.maximum(0.0) + ((-x.abs()).exp() + 1.0).log()


@op()
def Softsign(x):
    return x / (x.abs() + 1.0)


@op()
def Mish(x):
    return x * Softplus(x).tanh()


@op()
def Swish(x, alpha=1.0):
    return x * (x * alpha).sigmoid()


@op()
def Gelu(x, approximate="none"):
    if approximate == "tanh":
        return x * 0.5 * (1.0 + ((x + x * x * x * 0.044715) * math.sqrt(2.0 / math.pi)).tanh())
    return x.gelu()


@op()
def Shrink(x, bias=0.0, lambd=0.5):
    return cn.where(x < -lambd, x + bias, cn.where(x > lambd, x - bias, 0.0)).cast(x.dtype)


@op()
def IsNaN(x):
    return x != x


@op()
def IsInf(x, detect_negative=1, detect_positive=1):
    pos = (x == math.inf) if detect_positive else (x != x) & (x == x)
    neg = (x == -math.inf) if detect_negative else (x != x) & (x == x)
    return pos | neg


@op()
def Not(x):
    return x.logical_not()


@op()
def And(a, b):
    return a & b


@op()
def Or(a, b):
    return a | b


@op()
def Xor(a, b):
    return a != b


@op()
def Equal(a, b):
    return a == b


@op()
def Less(a, b):
    return a < b


@op()
def LessOrEqual(a, b):
    return a <= b


@op()
def Greater(a, b):
    return a > b


@op()
def GreaterOrEqual(a, b):
    return a >= b


@op()
def BitShift(x, y, direction="LEFT"):
    factor = (2 ** y.cast(float32)).round().cast(int32)
    return x * factor if direction == "LEFT" else x // factor


@op()
def Where(condition, x, y):
    return cn.where(condition, x, y)


def _fold(fn, inputs):
    out = inputs[0]
    for t in inputs[1:]:
        out = fn(out, t)
    return out


@op()
def Max(*data_0):
    return _fold(lambda a, b: a.maximum(b), data_0)


@op()
def Min(*data_0):
    return _fold(lambda a, b: a.minimum(b), data_0)


@op()
def Sum(*data_0):
    return _fold(lambda a, b: a + b, data_0)


@op()
def Mean(*data_0):
    return Sum(*data_0) / float(len(data_0))


@op(host=("min", "max"))
def Clip(input, min=None, max=None):  # noqa: A002  (ONNX names)
    out = input
    if min is not None:
        out = out.maximum(scalar(min))
    if max is not None:
        out = out.minimum(scalar(max))
    return out


@op()
def Cast(input, to, saturate=1, round_mode="up"):
    dtype = dtype_of(to)
    if input.dtype is float32 and dtype is int32:
        # ONNX casts float to int like C (toward zero); the protocol's cast does the same.
        return input.cast(int32)
    return input.cast(dtype)


@op()
def CastLike(input, target_type, saturate=1, round_mode="up"):
    return input.cast(target_type.dtype)


# -- activations over an axis --------------------------------------------------------------------

def _over_axis(fn, x, axis, opset):
    if opset >= 13:
        return fn(x, -1 if axis is None else axis)
    axis = _axis(1 if axis is None else axis, x.ndim)   # before 13: the input as a 2-D matrix
    flat = x.reshape(numel(x.shape[:axis]), numel(x.shape[axis:]))
    return fn(flat, 1).reshape(x.shape)


@op()
def Softmax(input, axis=None, opset=13):
    return _over_axis(softmax, input, axis, opset)


@op()
def LogSoftmax(input, axis=None, opset=13):
    return _over_axis(log_softmax, input, axis, opset)


@op()
def Hardmax(input, axis=None, opset=13):
    def hardmax(x, axis):
        n = x.shape[axis]
        first = x.argmax(axis, keepdim=True)
        positions = cn.arange(n, backend=x.backend).reshape([n if d == _axis(axis, x.ndim) else 1
                                                               for d in range(x.ndim)])
        return (positions == first).cast(x.dtype)
    return _over_axis(hardmax, input, axis, opset)


# -- reductions -----------------------------------------------------------------------------------

def _reduce_axes(data, axes, noop_with_empty_axes):
    axes = ints(axes)
    if not axes:
        return None if not noop_with_empty_axes else ()
    return tuple(_axis(a, data.ndim) for a in axes)


def _reducer(fn):
    def reduce(data, axes=None, keepdims=1, noop_with_empty_axes=0):
        axes = _reduce_axes(data, axes, noop_with_empty_axes)
        if axes == ():
            return fn(data, None, None, identity=True)
        keep = bool(keepdims)
        if axes is None:
            axes = tuple(range(data.ndim))
        if not data.ndim:
            return fn(data, None, keep, identity=True)
        return fn(data, axes, keep, identity=False)
    return reduce


def _define_reduce(name, body):
    fn = _reducer(body)
    fn.__name__ = name
    return op(host=("axes",))(fn)


def _sum(x, axes, keep, identity):
    return x if identity else x.sum(axes, keep)


def _empty_safe(op_name, x, axes, keep):
    if any(x.shape[a] == 0 for a in axes):
        shape = tuple(1 if a in axes else n for a, n in enumerate(x.shape)) if keep else \
            tuple(n for a, n in enumerate(x.shape) if a not in axes)
        value = -math.inf if op_name == "max" else math.inf
        if x.dtype is bool_:
            value = op_name == "min"
        elif x.dtype is not float32:
            value = -2 ** 31 if op_name == "max" else 2 ** 31 - 1
        return cn.full(shape, value, backend=x.backend, dtype=x.dtype)
    return getattr(x, op_name)(axes, keep)


ReduceSum = _define_reduce("ReduceSum", _sum)
ReduceMean = _define_reduce("ReduceMean", lambda x, a, k, identity: x if identity else x.mean(a, k))
ReduceMax = _define_reduce("ReduceMax", lambda x, a, k, identity: x if identity else _empty_safe("max", x, a, k))
ReduceMin = _define_reduce("ReduceMin", lambda x, a, k, identity: x if identity else _empty_safe("min", x, a, k))
ReduceProd = _define_reduce("ReduceProd", lambda x, a, k, identity: x if identity else x.prod(a, k))
ReduceL1 = _define_reduce("ReduceL1", lambda x, a, k, identity: x.abs() if identity else x.abs().sum(a, k))
ReduceL2 = _define_reduce("ReduceL2", lambda x, a, k, identity: (
    x.abs() if identity else (x * x).sum(a, k).cast(float32).sqrt().cast(x.dtype)))
ReduceSumSquare = _define_reduce("ReduceSumSquare", lambda x, a, k, identity: x * x if identity else (x * x).sum(a, k))
ReduceLogSum = _define_reduce("ReduceLogSum", lambda x, a, k, identity: x.log() if identity else x.sum(a, k).log())


def _log_sum_exp(x, a, k, identity):
    if identity:
        return x
    x = x.cast(float32)
    if any(x.shape[i] == 0 for i in a):
        return x.sum(a, k).log()
    m = x.max(a, keepdim=True)
    m = cn.where(m.abs() == math.inf, 0.0, m)
    out = (x - m).exp().sum(a, keepdim=True).log() + m
    return out if k else out.squeeze(a)


ReduceLogSumExp = _define_reduce("ReduceLogSumExp", _log_sum_exp)


def _arg(name):
    def arg(data, axis=0, keepdims=1, select_last_index=0):
        a = _axis(axis, data.ndim)
        if select_last_index:
            n = data.shape[a]
            rev = _reverse(data, a)
            idx = getattr(rev, name)(a, keepdim=bool(keepdims))
            return (n - 1) - idx
        return getattr(data, name)(a, keepdim=bool(keepdims))
    arg.__name__ = "ArgMax" if name == "argmax" else "ArgMin"
    return op()(arg)


ArgMax = _arg("argmax")
ArgMin = _arg("argmin")


# -- shapes and movement --------------------------------------------------------------------------

def _reverse(x, axis):
    n = x.shape[axis]
    idx = cn.arange(n - 1, -1, -1, backend=x.backend) if n else cn.zeros(0, backend=x.backend, dtype=int32)
    return _take(x, axis, idx)


@op(host=("shape",))
def Reshape(data, shape, allowzero=0):
    shape = ints(shape)
    if not allowzero:
        shape = [data.shape[i] if d == 0 and i < data.ndim else d for i, d in enumerate(shape)]
    return data.reshape(tuple(shape))


@op()
def Flatten(input, axis=1):
    a = _axis(axis, input.ndim)
    return input.reshape(numel(input.shape[:a]), numel(input.shape[a:]))


@op()
def Transpose(data, perm=None):
    return data.permute(tuple(perm) if perm is not None else tuple(range(data.ndim - 1, -1, -1)))


@op(host=("axes",))
def Squeeze(data, axes=None):
    axes = ints(axes)
    if axes is None:
        return data.reshape(tuple(d for d in data.shape if d != 1))
    axes = {_axis(a, data.ndim) for a in axes}
    return data.reshape(tuple(d for i, d in enumerate(data.shape) if i not in axes))


@op(host=("axes",))
def Unsqueeze(data, axes):
    axes = ints(axes)
    rank = data.ndim + len(axes)
    axes = sorted(_axis(a, rank) for a in axes)
    shape = list(data.shape)
    for a in axes:
        shape.insert(a, 1)
    return data.reshape(tuple(shape))


@op()
def Concat(*inputs, axis):
    inputs = [t for t in inputs if t.ndim != 1 or t.shape[0] or len(inputs) == 1] or inputs[:1]
    a = _axis(axis, inputs[0].ndim)
    if len(inputs) == 1:
        return inputs[0]
    dtype = inputs[0].dtype
    return cn.cat([t.cast(dtype) for t in inputs], a)


@op(host=("split",), multi=True)
def Split(input, split=None, axis=0, num_outputs=None, outputs=1):
    a = _axis(axis, input.ndim)
    n = input.shape[a]
    sizes = ints(split)
    if not sizes:
        count = num_outputs or outputs
        size = -(-n // count)
        sizes = [min(size, n - i * size) for i in range(count)]
    parts, start = [], 0
    for s in sizes:
        parts.append(_slice_axis(input, a, start, start + s))
        start += s
    return tuple(parts) if len(parts) > 1 or outputs > 1 else parts[0]


def _slice_axis(x, axis, start, stop, step=1):
    key = [slice(None)] * x.ndim
    key[axis] = slice(start, stop, step)
    return x[tuple(key)]


@op(host=("starts", "ends", "axes", "steps"))
def Slice(data, starts=None, ends=None, axes=None, steps=None):
    starts, ends = ints(starts), ints(ends)
    axes = ints(axes) if axes is not None else list(range(len(starts)))
    steps = ints(steps) if steps is not None else [1] * len(starts)
    key = [slice(None)] * data.ndim
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = _axis(a, data.ndim)
        n = data.shape[a]
        # ONNX clamps out-of-range bounds (INT64_MAX / INT64_MIN mean "to the end"); so do slices
        key[a] = slice(max(-n - 1, min(s, n + 1)), max(-n - 1, min(e, n + 1)), st)
    return data[tuple(key)]


@op()
def Gather(data, indices, axis=0):
    return _take(data, _axis(axis, data.ndim), indices.cast(int32))


@op()
def GatherElements(data, indices, axis=0):
    return data.gather(_axis(axis, data.ndim), indices.cast(int32))


def _linear_index(data, indices, batch_dims=0):
    """indices (..., k) into data's first k dims -> flat row numbers (...)."""
    k = indices.shape[-1]
    dims = data.shape[:k]
    strides = [numel(dims[i + 1:]) for i in range(k)]
    idx = indices.cast(int32)
    idx = cn.where(idx < 0, idx + _const(list(dims), idx), idx)
    return (idx * _const(strides, idx)).sum(-1), k


@op()
def GatherND(data, indices, batch_dims=0):
    if batch_dims:
        b = numel(data.shape[:batch_dims])
        d = data.reshape((b,) + data.shape[batch_dims:])
        i = indices.reshape((b,) + indices.shape[batch_dims:])
        parts = [GatherND(d[j], i[j]) for j in range(b)]
        out = stack(parts, 0)
        return out.reshape(data.shape[:batch_dims] + out.shape[1:])
    flat, k = _linear_index(data, indices)
    rows = data.reshape((numel(data.shape[:k]),) + data.shape[k:])
    return _take(rows, 0, flat)


def _scatter_rows(data_rows, axis, index, updates, reduction):
    """data with updates written at index along axis (index shaped like updates)."""
    if reduction == "add":
        return data_rows.scatter_add(axis, index, updates)
    if reduction == "mul":
        raise OnnxError("ScatterElements/ScatterND: reduction 'mul' is not supported")
    zeros = cn.zeros(*data_rows.shape, backend=data_rows.backend, dtype=float32)
    hit = zeros.scatter_add(axis, index, cn.ones(*updates.shape, backend=updates.backend)) > 0
    written = zeros.scatter_add(axis, index, updates.cast(float32))
    if reduction == "none":
        return cn.where(hit, written.cast(data_rows.dtype), data_rows)
    pick = data_rows.maximum if reduction == "max" else data_rows.minimum
    return cn.where(hit, pick(written.cast(data_rows.dtype)), data_rows)


@op()
def ScatterElements(data, indices, updates, axis=0, reduction="none"):
    return _scatter_rows(data, _axis(axis, data.ndim), indices.cast(int32), updates, reduction)


@op()
def Scatter(data, indices, updates, axis=0):
    return ScatterElements(data, indices, updates, axis)


@op()
def ScatterND(data, indices, updates, reduction="none"):
    flat, k = _linear_index(data, indices)
    rest = data.shape[k:]
    rows = data.reshape((numel(data.shape[:k]),) + rest)
    n = numel(flat.shape)
    upd = updates.reshape((n,) + rest)
    index = flat.reshape((n,) + (1,) * len(rest)).expand((n,) + rest)
    return _scatter_rows(rows, 0, index, upd, reduction).reshape(data.shape)


@op(host=("shape",))
def Expand(input, shape):
    shape = ints(shape)
    n = max(len(shape), input.ndim)
    a = [1] * (n - input.ndim) + list(input.shape)
    b = [1] * (n - len(shape)) + list(shape)
    target = tuple(x if y == 1 else y for x, y in zip(a, b))
    return input.reshape(tuple(a)).expand(target)


@op(host=("repeats",))
def Tile(input, repeats):
    repeats = ints(repeats)
    inter, target = [], []
    for r, d in zip(repeats, input.shape):
        inter += [1, d]
        target += [r, d]
    out = input.reshape(tuple(inter)).expand(tuple(target))
    return out.reshape(tuple(r * d for r, d in zip(repeats, input.shape)))


@op()
def Shape(data, start=0, end=None):
    """On the host (cn.Python()): shapes are known without touching the device."""
    dims = list(data.shape)
    n = len(dims)
    s = max(0, min(n, start + n if start < 0 else start))
    e = n if end is None else max(0, min(n, end + n if end < 0 else end))
    return cn.tensor(dims[s:e], backend=host_backend(), dtype=int32) if e > s else \
        cn.zeros(0, backend=host_backend(), dtype=int32)


@op()
def Size(data):
    return cn.tensor(data.numel(), backend=host_backend(), dtype=int32)


@op(host=("input",))
def ConstantOfShape(input, value=None, backend=None):
    shape = tuple(ints(input))
    if value is None:
        return cn.zeros(*shape, backend=backend)
    type_name, _, flat = value
    return cn.full(shape, flat[0], backend=backend, dtype=dtype_of(type_name))


@op(host=("start", "limit", "delta"))
def Range(start, limit, delta, backend=None):
    start, limit, delta = scalar(start), scalar(limit), scalar(delta)
    n = max(0, math.ceil((limit - start) / delta))
    is_int = all(isinstance(v, int) for v in (start, limit, delta))
    dtype = int32 if is_int else float32
    if not n:
        return cn.zeros(0, backend=backend, dtype=dtype)
    return cn.tensor([start + i * delta for i in range(n)], backend=backend, dtype=dtype)


@op()
def EyeLike(input, dtype=None, k=0):
    rows, cols = input.shape
    out = cn.arange(rows, backend=input.backend).reshape(rows, 1) + k == cn.arange(cols, backend=input.backend)
    return out.cast(dtype_of(dtype) if dtype else input.dtype)


@op(host=("k",))
def Trilu(input, k=None, upper=1):
    k = 0 if k is None else int(scalar(k))
    rows, cols = input.shape[-2:]
    r = cn.arange(rows, backend=input.backend).reshape(rows, 1)
    c = cn.arange(cols, backend=input.backend).reshape(1, cols)
    keep = (c - r >= k) if upper else (c - r <= k)
    return cn.where(keep, input, _const(0, input))


@op(host=("depth", "values"))
def OneHot(indices, depth, values, axis=-1):
    depth = int(scalar(depth))
    off, on = host(values)
    idx = indices.cast(int32)
    idx = cn.where(idx < 0, idx + depth, idx)
    a = _axis(axis, indices.ndim + 1)
    classes = cn.arange(depth, backend=idx.backend).reshape([depth if d == a else 1 for d in range(indices.ndim + 1)])
    hot = idx.unsqueeze(a) == classes
    return cn.where(hot, on, off)


@op(host=("axis",))
def CumSum(x, axis, exclusive=0, reverse=0):
    a = _axis(int(scalar(axis)), x.ndim)
    n = x.shape[a]
    rows = cn.arange(n, backend=x.backend).reshape(n, 1)
    cols = cn.arange(n, backend=x.backend).reshape(1, n)
    if reverse:
        tri = (rows > cols) if exclusive else (rows >= cols)
    else:
        tri = (rows < cols) if exclusive else (rows <= cols)
    moved = x.cast(float32).transpose(a, -1)
    out = (moved @ tri.cast(float32)).transpose(a, -1)
    return out if x.dtype is float32 else out.round().cast(x.dtype)


@op(host=("K",), multi=True)
def TopK(X, K, axis=-1, largest=1, sorted=1, outputs=2):  # noqa: A002
    k = int(scalar(K))
    a = _axis(axis, X.ndim)
    x = X.cast(float32)
    x = x if largest else -x
    values, indices = [], []
    n = X.shape[a]
    positions = cn.arange(n, backend=X.backend).reshape([n if d == a else 1 for d in range(X.ndim)])
    for _ in range(k):
        i = x.argmax(a, keepdim=True)
        values.append(X.gather(a, i))
        indices.append(i)
        x = cn.where(positions == i, -math.inf, x)
    v, i = cn.cat(values, a), cn.cat(indices, a)
    return (v, i)[:outputs] if outputs > 1 else v


@op(host=("condition",))
def Compress(input, condition, axis=None):
    keep = [i for i, c in enumerate(ints(condition)) if c]
    x = input if axis is not None else input.reshape(-1)
    a = 0 if axis is None else _axis(axis, input.ndim)
    keep = [i for i in keep if i < x.shape[a]]
    return _take(x, a, cn.tensor(keep, backend=x.backend, dtype=int32))


@op()
def NonZero(X):
    flat = X.reshape(-1).tolist()
    shape = X.shape
    hits = [i for i, v in enumerate(flat) if v]
    coords = []
    for d in range(len(shape)):
        stride = numel(shape[d + 1:])
        coords.append([(i // stride) % shape[d] for i in hits])
    if not hits:
        return cn.zeros(len(shape), 0, backend=X.backend, dtype=int32)
    return cn.tensor(coords, backend=X.backend, dtype=int32)


@op()
def DepthToSpace(input, blocksize, mode="DCR"):
    n, c, h, w = input.shape
    b = blocksize
    if mode == "DCR":
        x = input.reshape(n, b, b, c // (b * b), h, w).permute(0, 3, 4, 1, 5, 2)
    else:
        x = input.reshape(n, c // (b * b), b, b, h, w).permute(0, 1, 4, 2, 5, 3)
    return x.reshape(n, c // (b * b), h * b, w * b)


@op()
def SpaceToDepth(input, blocksize):
    n, c, h, w = input.shape
    b = blocksize
    x = input.reshape(n, c, h // b, b, w // b, b).permute(0, 3, 5, 1, 2, 4)
    return x.reshape(n, c * b * b, h // b, w // b)


@op(host=("pads", "constant_value", "axes"))
def Pad(data, pads=None, constant_value=None, axes=None, mode="constant", value=0.0, paddings=None):
    pads = ints(pads if pads is not None else paddings)
    rank = data.ndim
    axes = [_axis(a, rank) for a in ints(axes)] if axes is not None else list(range(rank))
    k = len(axes)
    before, after = [0] * rank, [0] * rank
    for i, a in enumerate(axes):
        before[a], after[a] = pads[i], pads[i + k]
    fill = value if constant_value is None else scalar(constant_value)
    x = data
    for a in range(rank):  # negative pads crop
        if before[a] < 0 or after[a] < 0:
            n = x.shape[a]
            x = _slice_axis(x, a, max(0, -before[a]), n - max(0, -after[a]))
            before[a], after[a] = max(0, before[a]), max(0, after[a])
    if mode == "constant":
        flat = []
        for a in range(rank - 1, -1, -1):
            flat += [before[a], after[a]]
        if x.dtype is not float32:
            fill = int(fill)
        return cn.pad(x, flat, fill)
    for a in range(rank):
        if not before[a] and not after[a]:
            continue
        n = x.shape[a]
        idx = []
        for i in range(-before[a], n + after[a]):
            if mode == "edge":
                j = min(max(i, 0), n - 1)
            elif mode == "reflect":
                period = 2 * (n - 1) if n > 1 else 1
                j = i % period if period else 0
                j = period - j if j >= n else j
            elif mode == "wrap":
                j = i % n
            else:
                raise OnnxError("Pad: mode %r is not supported" % (mode,))
            idx.append(j)
        x = _take(x, a, cn.tensor(idx, backend=x.backend, dtype=int32))
    return x


@op(multi=True)
def Dropout(data, ratio=None, training_mode=None, seed=None, is_test=None, outputs=1):
    """Inference: the identity (and an all-true mask when asked for)."""
    if outputs > 1:
        return data, cn.full(data.shape, True, backend=data.backend, dtype=bool_)
    return data


# -- linear algebra ----------------------------------------------------------------------------

@op()
def Gemm(A, B, C=None, alpha=1.0, beta=1.0, transA=0, transB=0, broadcast=0):
    a = A.transpose(0, 1) if transA else A
    b = B.transpose(0, 1) if transB else B
    out = a @ b
    if alpha != 1.0:
        out = out * alpha
    if C is not None:
        out = out + (C * beta if beta != 1.0 else C)
    return out


@op()
def MatMul(A, B):
    return A @ B


@op()
def Einsum(*Inputs, equation):
    lhs, _, rhs = equation.replace(" ", "").partition("->")
    terms = lhs.split(",")
    if "." in equation:
        raise OnnxError("Einsum: ellipsis is not supported (%r)" % (equation,))
    if not _:
        counts = {}
        for t in terms:
            for ch in t:
                counts[ch] = counts.get(ch, 0) + 1
        rhs = "".join(sorted(ch for ch, n in counts.items() if n == 1))
    letters = []
    for t in terms:
        for ch in t:
            if ch not in letters:
                letters.append(ch)
    sizes = {}
    product = None
    for term, x in zip(terms, Inputs):
        if len(set(term)) != len(term):
            x, term = _diagonal(x, term)
        for ch, n in zip(term, x.shape):
            sizes[ch] = max(sizes.get(ch, 1), n)
        order = sorted(range(len(term)), key=lambda i: letters.index(term[i]))
        x = x.permute(tuple(order)) if order else x
        placed = [ch for ch in letters if ch in term]
        shape = [x.shape[placed.index(ch)] if ch in term else 1 for ch in letters]
        x = x.reshape(tuple(shape))
        product = x if product is None else product * x
    summed = tuple(i for i, ch in enumerate(letters) if ch not in rhs)
    out = product.sum(summed) if summed else product
    kept = [ch for ch in letters if ch in rhs]
    return out.permute(tuple(kept.index(ch) for ch in rhs)) if rhs else out


def _diagonal(x, term):
    """Collapse repeated letters of one einsum term into one axis (the diagonal)."""
    while len(set(term)) != len(term):
        for i, ch in enumerate(term):
            j = term.find(ch, i + 1)
            if j >= 0:
                break
        n = x.shape[i]
        eye = cn.eye(n, backend=x.backend, dtype=x.dtype).reshape(
            [n if d in (i, j) else 1 for d in range(x.ndim)])
        x = (x * eye).sum(j)
        term = term[:j] + term[j + 1:]
    return x, term


# -- convolution and pooling ---------------------------------------------------------------------

def _spatial_pads(x_shape, kernel, strides, dilations, pads, auto_pad, ceil_mode=0):
    """(begins, ends) padding per spatial dim, following auto_pad and ceil_mode."""
    nd = len(kernel)
    spatial = x_shape[2:]
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begins, ends = [], []
        for n, k, s, d in zip(spatial, kernel, strides, dilations):
            out = -(-n // s)
            total = max(0, (out - 1) * s + (k - 1) * d + 1 - n)
            small, big = total // 2, total - total // 2
            begins.append(small if auto_pad == "SAME_UPPER" else big)
            ends.append(big if auto_pad == "SAME_UPPER" else small)
        return begins, ends
    if auto_pad == "VALID" or not pads:
        begins, ends = [0] * nd, [0] * nd
    else:
        begins, ends = list(pads[:nd]), list(pads[nd:])
    if ceil_mode:
        for i, (n, k, s, d) in enumerate(zip(spatial, kernel, strides, dilations)):
            span = n + begins[i] + ends[i] - ((k - 1) * d + 1)
            out = -(-span // s) + 1
            if (out - 1) * s >= n + begins[i]:
                out -= 1
            ends[i] += max(0, (out - 1) * s + (k - 1) * d + 1 - (n + begins[i] + ends[i]))
    return begins, ends


def _to_2d(x):
    """(N, C, L) -> (N, C, 1, L): 1-D windows run as 2-D ones."""
    return x.unsqueeze(2)


def _pad_spatial(x, begins, ends, value):
    flat = []
    for b, e in zip(reversed(begins), reversed(ends)):
        flat += [b, e]
    return cn.pad(x, flat, value) if any(flat) else x


@op()
def Conv(X, W, B=None, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    nd = X.ndim - 2
    if nd not in (1, 2, 3):
        raise OnnxError("Conv: %d-D convolution is not supported (1-D to 3-D are)" % nd)
    kernel = list(W.shape[2:])
    strides = strides or [1] * nd
    dilations = dilations or [1] * nd
    begins, ends = _spatial_pads(X.shape, kernel, strides, dilations, pads, auto_pad)
    x = _pad_spatial(X, begins, ends, 0.0)
    w = W
    if nd == 3:
        return _conv3d(x, W, B, strides, dilations, group)
    if nd == 1:
        x, w = _to_2d(x), _to_2d(W)
        strides, dilations = [1] + list(strides), [1] + list(dilations)
    out = conv2d(x, w, B, stride=tuple(strides), padding=0, dilation=tuple(dilations), groups=group)
    return out.squeeze(2) if nd == 1 else out


def _conv3d(x, w, bias, strides, dilations, group):
    """3-D convolution of a padded x as a sum over the kd depth taps of 2-D convolutions, each
    over every output depth slice at once (folded into the batch)."""
    n, c, depth = x.shape[:3]
    o, kd = w.shape[0], w.shape[2]
    sd, dd = strides[0], dilations[0]
    od = (depth - (kd - 1) * dd - 1) // sd + 1
    out = None
    for k in range(kd):
        tap = x[:, :, k * dd:k * dd + (od - 1) * sd + 1:sd]                     # (N, C, OD, H, W)
        tap = tap.permute(0, 2, 1, 3, 4).reshape(n * od, c, x.shape[3], x.shape[4])
        y = conv2d(tap, w[:, :, k], None, stride=tuple(strides[1:]), padding=0,
                   dilation=tuple(dilations[1:]), groups=group)
        out = y if out is None else out + y
    out = out.reshape(n, od, o, out.shape[2], out.shape[3]).permute(0, 2, 1, 3, 4)
    return out if bias is None else out + bias.reshape(1, o, 1, 1, 1)


@op()
def ConvTranspose(X, W, B=None, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
                  output_padding=None, output_shape=None, pads=None, strides=None):
    nd = X.ndim - 2
    if nd not in (1, 2):
        raise OnnxError("ConvTranspose: %d-D is not supported (1-D and 2-D are)" % nd)
    x, w = (X, W) if nd == 2 else (_to_2d(X), _to_2d(W))
    strides = ([1] if nd == 1 else []) + list(strides or [1] * nd)
    dilations = ([1] if nd == 1 else []) + list(dilations or [1] * nd)
    output_padding = ([0] if nd == 1 else []) + list(output_padding or [0] * nd)
    kernel = list(w.shape[2:])
    n, c, h, wd = x.shape
    total = []
    for i, size in enumerate((h, wd)):
        total.append(strides[i] * (size - 1) + output_padding[i] + (kernel[i] - 1) * dilations[i] + 1)
    if output_shape is not None:
        wanted = ([1] if nd == 1 else []) + list(output_shape)[-nd:]
        pad_total = [t - o for t, o in zip(total, wanted)]
        if auto_pad == "SAME_UPPER":
            begins = [p // 2 for p in pad_total]
        else:
            begins = [p - p // 2 for p in pad_total]
        ends = [p - b for p, b in zip(pad_total, begins)]
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        wanted = [size * s for size, s in zip((h, wd), strides)]
        pad_total = [t - o for t, o in zip(total, wanted)]
        begins = [p // 2 if auto_pad == "SAME_UPPER" else p - p // 2 for p in pad_total]
        ends = [p - b for p, b in zip(pad_total, begins)]
    elif pads:
        begins = ([0] if nd == 1 else []) + list(pads[:nd])
        ends = ([0] if nd == 1 else []) + list(pads[nd:])
    else:
        begins, ends = [0, 0], [0, 0]
    # dilate the input with stride-1 zeros between pixels, then a plain convolution with the
    # flipped, transposed kernel
    sh, sw = strides
    if sh > 1 or sw > 1:
        x = x.reshape(n, c, h, 1, wd, 1)
        x = cn.pad(x, [0, sw - 1, 0, 0, 0, sh - 1], 0.0).reshape(n, c, h * sh, wd * sw)
        x = x[:, :, :h * sh - sh + 1, :wd * sw - sw + 1]
    o_per_group = w.shape[1]
    cg = c // group
    wt = w.reshape(group, cg, o_per_group, kernel[0], kernel[1]).permute(0, 2, 1, 3, 4)
    wt = _reverse(_reverse(wt, 3), 4).reshape(group * o_per_group, cg, kernel[0], kernel[1])
    full_pad = [(k - 1) * d for k, d in zip(kernel, dilations)]
    pb = [fp - b for fp, b in zip(full_pad, begins)]
    pe = [fp - e + op_ for fp, e, op_ in zip(full_pad, ends, output_padding)]
    crop_b = [max(0, -p) for p in pb]
    crop_e = [max(0, -p) for p in pe]
    x = _pad_spatial(x, [max(0, p) for p in pb], [max(0, p) for p in pe], 0.0)
    out = conv2d(x, wt, B, stride=1, padding=0, dilation=tuple(dilations), groups=group)
    if any(crop_b) or any(crop_e):
        out = out[:, :, crop_b[0]:out.shape[2] - crop_e[0], crop_b[1]:out.shape[3] - crop_e[1]]
    return out.squeeze(2) if nd == 1 else out


def _windows(X, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode):
    """(kernel, strides, dilations, begins, ends) of a pooling window over X's spatial dims."""
    nd = X.ndim - 2
    if nd not in (1, 2, 3):
        raise OnnxError("pooling: %d-D windows are not supported (1-D to 3-D are)" % nd)
    if not kernel_shape or len(kernel_shape) != nd:
        raise OnnxError("pooling: kernel_shape %r does not fit a %d-D input" % (kernel_shape, nd))
    strides = list(strides or [1] * nd)
    dilations = list(dilations or [1] * nd)
    kernel = list(kernel_shape)
    begins, ends = _spatial_pads(X.shape, kernel, strides, dilations, pads, auto_pad, ceil_mode)
    return kernel, strides, dilations, begins, ends


def _window_reduce(x, kernel, strides, dilations, how):
    """Sum ("sum") or max ("max") of every window of an already padded (N, C, *spatial) x.
    2-D windows are one unfold2d; 1-D ones run as 2-D with height 1; 3-D ones reduce each depth
    slice's 2-D windows, then across the kd depth taps."""
    nd = x.ndim - 2
    if nd == 1:
        return _window_reduce(_to_2d(x), [1] + kernel, [1] + strides, [1] + dilations, how).squeeze(2)
    if nd == 3:
        n, c, depth = x.shape[:3]
        plane = _window_reduce(x.reshape(n, c * depth, *x.shape[3:]), kernel[1:], strides[1:], dilations[1:], how)
        plane = plane.reshape(n, c, depth, *plane.shape[2:])
        kd, sd, dd = kernel[0], strides[0], dilations[0]
        od = (depth - (kd - 1) * dd - 1) // sd + 1
        out = None
        for k in range(kd):
            tap = plane[:, :, k * dd:k * dd + (od - 1) * sd + 1:sd]
            out = tap if out is None else (out + tap if how == "sum" else out.maximum(tap))
        return out
    n, c = x.shape[:2]
    oh, ow = _pool_shape(x, kernel, strides, dilations)
    cols = unfold2d(x, tuple(kernel), tuple(strides), 0, tuple(dilations)).reshape(n, c, kernel[0] * kernel[1], oh * ow)
    cols = cols.sum(2) if how == "sum" else cols.max(2)
    return cols.reshape(n, c, oh, ow)


def _pool_shape(x, kernel, strides, dilations):
    return tuple((size - (k - 1) * d - 1) // s + 1 for size, k, s, d in zip(x.shape[2:], kernel, strides, dilations))


@op(multi=True)
def MaxPool(X, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None, pads=None,
            storage_order=0, strides=None, outputs=1):
    if outputs > 1:
        raise OnnxError("MaxPool: the Indices output is not supported")
    kernel, strides, dilations, begins, ends = _windows(X, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    floor = -math.inf if X.dtype is float32 else -2.0 ** 31
    x = _pad_spatial(X.cast(float32), begins, ends, floor)
    out = _window_reduce(x, kernel, strides, dilations, "max")
    return out if X.dtype is float32 else out.cast(X.dtype)


@op()
def AveragePool(X, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None,
                kernel_shape=None, pads=None, strides=None):
    kernel, strides, dilations, begins, ends = _windows(X, kernel_shape, strides, dilations, pads, auto_pad, 0)
    _, _, _, _, ceil_ends = _windows(X, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    extra = [ce - e for ce, e in zip(ceil_ends, ends)]          # what ceil_mode adds: never counted
    total_ends = [e + x_ for e, x_ in zip(ends, extra)]
    sums = _window_reduce(_pad_spatial(X, begins, total_ends, 0.0), kernel, strides, dilations, "sum")
    ones = cn.ones(1, 1, *X.shape[2:], backend=X.backend)
    if count_include_pad:
        mask = _pad_spatial(_pad_spatial(ones, begins, ends, 1.0), [0] * len(begins), extra, 0.0)
    else:
        mask = _pad_spatial(ones, begins, total_ends, 0.0)
    counts = _window_reduce(mask, kernel, strides, dilations, "sum")
    return sums / counts


@op()
def LpPool(X, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None, p=2, pads=None, strides=None):
    kernel, strides, dilations, begins, ends = _windows(X, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    x = _pad_spatial(X.abs() ** float(p), begins, ends, 0.0)
    return _window_reduce(x, kernel, strides, dilations, "sum") ** (1.0 / p)


@op()
def GlobalAveragePool(X):
    return X.mean(tuple(range(2, X.ndim)), keepdim=True)


@op()
def GlobalMaxPool(X):
    return X.max(tuple(range(2, X.ndim)), keepdim=True)


@op()
def GlobalLpPool(X, p=2):
    return (X.abs() ** float(p)).sum(tuple(range(2, X.ndim)), keepdim=True) ** (1.0 / p)


# -- normalisation ------------------------------------------------------------------------------

def _channel(t, ndim):
    return t.reshape((1, t.shape[0]) + (1,) * (ndim - 2))


@op(multi=True)
def BatchNormalization(X, scale, B, input_mean, input_var, epsilon=1e-5, momentum=0.9,
                       training_mode=0, spatial=1, is_test=None, consumed_inputs=None, outputs=1):
    if training_mode or outputs > 1:
        raise OnnxError("BatchNormalization: training mode (running statistics outputs) is not supported")
    return batch_norm(X, input_mean, input_var, scale, B, epsilon)


@op()
def InstanceNormalization(input, scale, B, epsilon=1e-5):
    axes = tuple(range(2, input.ndim))
    centred = input - input.mean(axes, keepdim=True)
    var = (centred * centred).mean(axes, keepdim=True)
    return centred / (var + epsilon).sqrt() * _channel(scale, input.ndim) + _channel(B, input.ndim)


@op(multi=True)
def LayerNormalization(X, Scale, B=None, axis=-1, epsilon=1e-5, stash_type=1, outputs=1):
    a = _axis(axis, X.ndim)
    if outputs == 1:
        return layer_norm(X, X.shape[a:], Scale, B, epsilon)
    axes = tuple(range(a, X.ndim))
    mean = X.mean(axes, keepdim=True)
    centred = X - mean
    inv = 1.0 / ((centred * centred).mean(axes, keepdim=True) + epsilon).sqrt()
    out = centred * inv * Scale
    if B is not None:
        out = out + B
    return (out, mean, inv)[:outputs] if outputs > 1 else out


@op()
def RMSNormalization(X, scale, axis=-1, epsilon=1e-5, stash_type=1):
    a = _axis(axis, X.ndim)
    axes = tuple(range(a, X.ndim))
    return X / ((X * X).mean(axes, keepdim=True) + epsilon).sqrt() * scale


@op()
def GroupNormalization(X, scale, bias, epsilon=1e-5, num_groups=1, stash_type=1):
    n, c = X.shape[:2]
    g = X.reshape((n, num_groups, -1))
    centred = g - g.mean(2, keepdim=True)
    out = (centred / ((centred * centred).mean(2, keepdim=True) + epsilon).sqrt()).reshape(X.shape)
    if scale.shape[0] != c:  # opset 18: one scale and bias per group
        per = c // num_groups
        scale = scale.reshape(num_groups, 1).expand(num_groups, per).reshape(c)
        bias = bias.reshape(num_groups, 1).expand(num_groups, per).reshape(c)
    return out * _channel(scale, X.ndim) + _channel(bias, X.ndim)


@op()
def LpNormalization(input, axis=-1, p=2):
    a = _axis(axis, input.ndim)
    norm = input.abs().sum(a, keepdim=True) if p == 1 else (input * input).sum(a, keepdim=True).sqrt()
    return cn.where(norm == 0, 0.0, input / norm)


@op()
def MeanVarianceNormalization(X, axes=(0, 2, 3)):
    axes = tuple(axes)
    centred = X - X.mean(axes, keepdim=True)
    return centred / ((centred * centred).mean(axes, keepdim=True).sqrt() + 1e-9)


@op()
def LRN(X, size, alpha=1e-4, beta=0.75, bias=1.0):
    c = X.shape[1]
    sq = X * X
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    padded = _pad_spatial(sq.transpose(1, -1), [lo], [hi], 0.0).transpose(1, -1)
    total = padded[:, 0:c]
    for i in range(1, size):
        total = total + padded[:, i:i + c]
    return X / (total * (alpha / size) + bias) ** beta


# -- resizing ------------------------------------------------------------------------------------

def _source_coords(out_size, in_size, scale, mode, roi_start=0.0, roi_end=1.0):
    """Input coordinate (float) of each output index along one axis."""
    coords = []
    for i in range(out_size):
        if mode == "half_pixel":
            x = (i + 0.5) / scale - 0.5
        elif mode == "pytorch_half_pixel":
            x = (i + 0.5) / scale - 0.5 if out_size > 1 else 0.0
        elif mode == "align_corners":  # the resized length is in_size * scale, unrounded
            x = i * (in_size - 1) / (in_size * scale - 1) if in_size * scale > 1 else 0.0
        elif mode == "asymmetric":
            x = i / scale
        elif mode == "tf_crop_and_resize":
            x = (roi_start * (in_size - 1) + i * (roi_end - roi_start) * (in_size - 1) / (out_size - 1)
                 if out_size > 1 else 0.5 * (roi_start + roi_end) * (in_size - 1))
        elif mode == "half_pixel_symmetric":
            adj = out_size / (scale * in_size)
            centre = in_size / 2
            offset = centre * (1 - adj)
            x = offset + (i + 0.5) / scale - 0.5
        else:
            raise OnnxError("Resize: coordinate_transformation_mode %r is not supported" % (mode,))
        coords.append(x)
    return coords


def _nearest(x, mode):
    if mode == "round_prefer_floor":
        return math.ceil(x - 0.5)
    if mode == "floor":
        return math.floor(x)
    if mode == "ceil":
        return math.ceil(x)
    return math.floor(x + 0.5)   # round_prefer_ceil (the default)


def _resize_axis(x, axis, out_size, scale, mode, transform, nearest_mode, cubic_a, exclude_outside,
                 extrapolation, roi):
    n = x.shape[axis]
    coords = _source_coords(out_size, n, scale, transform, *roi)
    outside = [c < 0 or c > n - 1 for c in coords] if transform == "tf_crop_and_resize" else None
    if mode == "nearest":
        idx = [min(max(_nearest(c, nearest_mode), 0), n - 1) for c in coords]
        out = _take(x, axis, cn.tensor(idx, backend=x.backend, dtype=int32))
    else:
        if mode == "linear":
            taps = [(math.floor(c), [1 - (c - math.floor(c)), c - math.floor(c)]) for c in coords]
            offsets = [0, 1]
        else:  # cubic
            a = cubic_a
            offsets = [-1, 0, 1, 2]
            taps = []
            for c in coords:
                f = math.floor(c)
                t = c - f
                ws = [_cubic(t + 1, a), _cubic(t, a), _cubic(1 - t, a), _cubic(2 - t, a)]
                taps.append((f, ws))
        weights = [[0.0] * len(offsets) for _ in coords]
        indices = [[0] * len(offsets) for _ in coords]
        for i, (f, ws) in enumerate(taps):
            total = 0.0
            for j, o in enumerate(offsets):
                src = f + o
                inside = 0 <= src < n
                w = ws[j]
                if exclude_outside and not inside:
                    w = 0.0
                weights[i][j] = w
                indices[i][j] = min(max(src, 0), n - 1)
                total += w
            if exclude_outside and total:
                weights[i] = [w / total for w in weights[i]]
        out = None
        for j in range(len(offsets)):
            picked = _take(x, axis, cn.tensor([row[j] for row in indices], backend=x.backend, dtype=int32))
            w = cn.tensor([row[j] for row in weights], backend=x.backend).reshape(
                [out_size if d == axis else 1 for d in range(x.ndim)])
            term = picked * w
            out = term if out is None else out + term
    if outside is not None and any(outside):
        mask = cn.tensor(outside, backend=x.backend).reshape([out_size if d == axis else 1 for d in range(x.ndim)])
        out = cn.where(mask, extrapolation, out)
    return out


def _cubic(s, a):
    s = abs(s)
    if s <= 1:
        return (a + 2) * s ** 3 - (a + 3) * s ** 2 + 1
    if s < 2:
        return a * s ** 3 - 5 * a * s ** 2 + 8 * a * s - 4 * a
    return 0.0


@op(host=("roi", "scales", "sizes"))
def Resize(X, roi=None, scales=None, sizes=None, antialias=0, axes=None, coordinate_transformation_mode="half_pixel",
           cubic_coeff_a=-0.75, exclude_outside=0, extrapolation_value=0.0, keep_aspect_ratio_policy="stretch",
           mode="nearest", nearest_mode="round_prefer_floor", opset=13):
    if antialias:
        raise OnnxError("Resize: antialias is not supported")
    rank = X.ndim
    axes = [_axis(a, rank) for a in axes] if axes else list(range(rank))
    scales = [float(s) for s in (host(scales) or [])]
    sizes = ints(sizes) or []
    roi = [float(r) for r in (host(roi) or [])]
    if opset < 11:
        coordinate_transformation_mode, nearest_mode = "asymmetric", "floor"
    full_scales = {a: 1.0 for a in range(rank)}
    full_sizes = {a: X.shape[a] for a in range(rank)}
    if sizes:
        if keep_aspect_ratio_policy != "stretch":
            ratios = [sizes[i] / X.shape[a] for i, a in enumerate(axes)]
            r = min(ratios) if keep_aspect_ratio_policy == "not_larger" else max(ratios)
            sizes = [int(r * X.shape[a] + 0.5) for a in axes]
            for i, a in enumerate(axes):
                full_scales[a], full_sizes[a] = r, sizes[i]
        else:
            for i, a in enumerate(axes):
                full_sizes[a] = sizes[i]
                full_scales[a] = sizes[i] / X.shape[a]
    else:
        for i, a in enumerate(axes):
            full_scales[a] = scales[i]
            full_sizes[a] = int(math.floor(X.shape[a] * scales[i]))
    rois = {a: (0.0, 1.0) for a in range(rank)}
    if roi:
        k = len(roi) // 2
        for i, a in enumerate(axes if k == len(axes) else range(rank)):
            rois[a] = (roi[i], roi[i + k])
    x = X.cast(float32)
    for a in range(rank):
        if full_sizes[a] == X.shape[a] and full_scales[a] == 1.0 and coordinate_transformation_mode != "tf_crop_and_resize":
            continue
        x = _resize_axis(x, a, full_sizes[a], full_scales[a], mode, coordinate_transformation_mode,
                         nearest_mode, cubic_coeff_a, exclude_outside, extrapolation_value, rois[a])
    return x if X.dtype is float32 else x.cast(X.dtype)


@op(host=("scales",))
def Upsample(X, scales=None, mode="nearest", height_scale=None, width_scale=None):
    return Resize(X, None, scales, coordinate_transformation_mode="asymmetric", mode=mode,
                  nearest_mode="floor")


# -- quantisation ---------------------------------------------------------------------------------

def _per_axis(t, x, axis):
    if t.ndim == 0 or t.numel() == 1:
        return t.reshape(())
    a = _axis(axis, x.ndim)
    return t.reshape([t.shape[0] if d == a else 1 for d in range(x.ndim)])


@op()
def DequantizeLinear(x, x_scale, x_zero_point=None, axis=1, block_size=0, output_dtype=0):
    zp = 0 if x_zero_point is None else _per_axis(x_zero_point, x, axis).cast(float32)
    return (x.cast(float32) - zp) * _per_axis(x_scale, x, axis)


@op()
def QuantizeLinear(x, y_scale, y_zero_point=None, axis=1, block_size=0, output_dtype=0, saturate=1, precision=0):
    q = (x / _per_axis(y_scale, x, axis)).round()
    lo, hi = 0, 255
    if y_zero_point is not None:
        q = q + _per_axis(y_zero_point, x, axis).cast(float32)
    return q.maximum(float(lo)).minimum(float(hi)).cast(int32)


# -- recurrent layers ----------------------------------------------------------------------------

_ACTIVATIONS = {
    "Sigmoid": lambda x, a, b: x.sigmoid(), "Tanh": lambda x, a, b: x.tanh(), "Relu": lambda x, a, b: x.relu(),
    "HardSigmoid": lambda x, a, b: (x * a + b).maximum(0.0).minimum(1.0),
    "LeakyRelu": lambda x, a, b: cn.where(x < 0, x * a, x), "Affine": lambda x, a, b: x * a + b,
    "ThresholdedRelu": lambda x, a, b: cn.where(x > a, x, 0.0), "ScaledTanh": lambda x, a, b: (x * b).tanh() * a,
    "Elu": lambda x, a, b: cn.where(x < 0, (x.exp() - 1.0) * a, x), "Softsign": lambda x, a, b: x / (x.abs() + 1.0),
    "Softplus": lambda x, a, b: Softplus(x),
}
_DEFAULT_ALPHA = {"HardSigmoid": 0.2, "LeakyRelu": 0.01, "Affine": 1.0, "ThresholdedRelu": 1.0, "Elu": 1.0,
                  "ScaledTanh": 1.0}
_DEFAULT_BETA = {"HardSigmoid": 0.5, "ScaledTanh": 1.0}


def _activations(names, alphas, betas, defaults, directions):
    names = list(names) if names else defaults * directions
    alphas, betas = list(alphas or []), list(betas or [])
    out = []
    for i, name in enumerate(names):
        canonical = {n.lower(): n for n in _ACTIVATIONS}.get(name.lower())
        if canonical is None:
            raise OnnxError("RNN activation %r is not supported" % (name,))
        a = alphas.pop(0) if alphas and canonical in _DEFAULT_ALPHA else _DEFAULT_ALPHA.get(canonical, 0.0)
        b = betas.pop(0) if betas and canonical in _DEFAULT_BETA else _DEFAULT_BETA.get(canonical, 0.0)
        out.append(lambda x, f=_ACTIVATIONS[canonical], a=a, b=b: f(x, a, b))
    return out


def _recurrent(kind, X, W, R, B, sequence_lens, initial_h, initial_c, P, activations, activation_alpha,
               activation_beta, clip, direction, hidden_size, layout, linear_before_reset, input_forget, outputs):
    if layout:
        X = X.transpose(0, 1)
        initial_h = initial_h.transpose(0, 1) if initial_h is not None else None
        initial_c = initial_c.transpose(0, 1) if initial_c is not None else None
    seq, batch = X.shape[0], X.shape[1]
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[kind]
    dirs = 2 if direction == "bidirectional" else 1
    hidden = hidden_size or R.shape[-1]
    defaults = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"], "RNN": ["Tanh"]}[kind]
    acts = _activations(activations, activation_alpha, activation_beta, defaults, dirs)
    per = len(defaults)
    lens = ints(sequence_lens) if sequence_lens is not None else None
    if lens is not None and any(n != seq for n in lens):
        mask_steps = [cn.tensor([[1.0] if t < n else [0.0] for n in lens], backend=X.backend) for t in range(seq)]
    else:
        mask_steps = None
    ys, hs, cs = [], [], []
    for d in range(dirs):
        reverse = direction == "reverse" or d == 1
        f = acts[d * per:(d + 1) * per]
        w, r = W[d].transpose(0, 1), R[d].transpose(0, 1)        # (I, G*H), (H, G*H)
        wb = B[d, :gates * hidden] if B is not None else None
        rb = B[d, gates * hidden:] if B is not None else None
        h = initial_h[d] if initial_h is not None else cn.zeros(batch, hidden, backend=X.backend)
        c = initial_c[d] if initial_c is not None else cn.zeros(batch, hidden, backend=X.backend)
        p = P[d] if P is not None else None
        xw = X @ w
        if wb is not None:
            xw = xw + wb
        steps = [None] * seq
        order = range(seq - 1, -1, -1) if reverse else range(seq)
        for t in order:
            gx = xw[t]
            if kind == "GRU":
                hz = h @ r
                gz, gr, gh = (gx[:, i * hidden:(i + 1) * hidden] for i in range(3))
                rz, rr, rh = (hz[:, i * hidden:(i + 1) * hidden] for i in range(3))
                bz = br = bh = None
                if rb is not None:
                    bz, br, bh = (rb[i * hidden:(i + 1) * hidden] for i in range(3))
                z = f[0](_clip(gz + rz + (bz if bz is not None else 0.0), clip))
                rg = f[0](_clip(gr + rr + (br if br is not None else 0.0), clip))
                if linear_before_reset:
                    cand = gh + rg * (rh + (bh if bh is not None else 0.0))
                else:
                    rw = r[:, 2 * hidden:]
                    cand = gh + (rg * h) @ rw + (bh if bh is not None else 0.0)
                hn = f[1](_clip(cand, clip))
                new_h = (1.0 - z) * hn + z * h
                new_c = c
            else:
                g = gx + h @ r
                if rb is not None:
                    g = g + rb
                if kind == "RNN":
                    new_h = f[0](_clip(g, clip))
                    new_c = c
                else:
                    gi, go, gf, gc = (g[:, k * hidden:(k + 1) * hidden] for k in range(4))
                    if p is not None:
                        gi = gi + c * p[:hidden]
                        gf = gf + c * p[2 * hidden:]
                    i_ = f[0](_clip(gi, clip))
                    f_ = f[0](_clip(gf, clip))
                    if input_forget:
                        f_ = 1.0 - i_
                    new_c = f_ * c + i_ * f[1](_clip(gc, clip))
                    if p is not None:
                        go = go + new_c * p[hidden:2 * hidden]
                    o_ = f[0](_clip(go, clip))
                    new_h = o_ * f[2](new_c)
            if mask_steps is not None:
                m = mask_steps[t]
                new_h = new_h * m + h * (1.0 - m)
                new_c = new_c * m + c * (1.0 - m)
                steps[t] = new_h * m
            else:
                steps[t] = new_h
            h, c = new_h, new_c
        ys.append(stack(steps, 0))             # (seq, batch, hidden)
        hs.append(h)
        cs.append(c)
    Y = stack(ys, 1)                           # (seq, dirs, batch, hidden)
    Y_h, Y_c = stack(hs, 0), stack(cs, 0)
    if layout:
        Y = Y.permute(2, 0, 1, 3)
        Y_h, Y_c = Y_h.transpose(0, 1), Y_c.transpose(0, 1)
    results = (Y, Y_h, Y_c)[:outputs]
    return results if outputs > 1 else results[0]


def _clip(x, clip):
    return x if clip is None else x.maximum(-clip).minimum(clip)


@op(host=("sequence_lens",), multi=True)
def LSTM(X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None, P=None, activation_alpha=None,
         activation_beta=None, activations=None, clip=None, direction="forward", hidden_size=None,
         input_forget=0, layout=0, outputs=1):
    return _recurrent("LSTM", X, W, R, B, sequence_lens, initial_h, initial_c, P, activations, activation_alpha,
                      activation_beta, clip, direction, hidden_size, layout, 0, input_forget, outputs)


@op(host=("sequence_lens",), multi=True)
def GRU(X, W, R, B=None, sequence_lens=None, initial_h=None, activation_alpha=None, activation_beta=None,
        activations=None, clip=None, direction="forward", hidden_size=None, layout=0, linear_before_reset=0,
        outputs=1):
    return _recurrent("GRU", X, W, R, B, sequence_lens, initial_h, None, None, activations, activation_alpha,
                      activation_beta, clip, direction, hidden_size, layout, linear_before_reset, 0, outputs)


@op(host=("sequence_lens",), multi=True)
def RNN(X, W, R, B=None, sequence_lens=None, initial_h=None, activation_alpha=None, activation_beta=None,
        activations=None, clip=None, direction="forward", hidden_size=None, layout=0, outputs=1):
    return _recurrent("RNN", X, W, R, B, sequence_lens, initial_h, None, None, activations, activation_alpha,
                      activation_beta, clip, direction, hidden_size, layout, 0, 0, outputs)


# -- ops the generated code usually writes inline (`a + b`), here for the other cases --------------

def _legacy_broadcast(A, B, broadcast, axis):
    """Opsets before 7: with broadcast=1, B's dims line up with A's starting at `axis`."""
    if broadcast and axis is not None and B.ndim and B.ndim < A.ndim:
        a = _axis(axis, A.ndim)
        return B.reshape(B.shape + (1,) * (A.ndim - a - B.ndim))
    return B


@op()
def Add(A, B, broadcast=0, axis=None):
    return A + _legacy_broadcast(A, B, broadcast, axis)


@op()
def Sub(A, B, broadcast=0, axis=None):
    return A - _legacy_broadcast(A, B, broadcast, axis)


@op()
def Mul(A, B, broadcast=0, axis=None):
    return A * _legacy_broadcast(A, B, broadcast, axis)


@op()
def Relu(X):
    return X.relu()


@op()
def Tanh(input):
    return input.tanh()


@op()
def Exp(input):
    return input.exp()


@op()
def Log(input):
    return input.log()


@op()
def Sqrt(X):
    return X.sqrt()


@op()
def Neg(X):
    return -X


@op()
def Abs(X):
    return X.abs()


@op()
def Erf(input):
    return input.erf()


@op()
def Identity(input):
    return input


# -- losses ---------------------------------------------------------------------------------------

@op()
def NegativeLogLikelihoodLoss(input, target, weight=None, ignore_index=None, reduction="mean"):  # noqa: A002
    target = target.cast(int32)
    c = input.shape[1]
    valid = (target >= 0) & (target < c)
    if ignore_index is not None:
        valid = valid & (target != ignore_index)
    safe = cn.where(valid, target, 0)
    picked = input.gather(1, safe.unsqueeze(1)).squeeze(1)            # (N, d1, ...)
    w = valid.cast(float32)
    if weight is not None:
        w = w * _take(weight, 0, safe)
    loss = -picked * w
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / w.sum()


@op(multi=True)
def SoftmaxCrossEntropyLoss(scores, labels, weights=None, ignore_index=None, reduction="mean", outputs=1):
    log_prob = log_softmax(scores, 1)
    loss = NegativeLogLikelihoodLoss(log_prob, labels, weights, ignore_index=ignore_index, reduction=reduction)
    return (loss, log_prob) if outputs > 1 else loss


# -- attention (opset 23+) -------------------------------------------------------------------------

@op(multi=True)
def Attention(Q, K, V, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None, is_causal=0,
              kv_num_heads=None, q_num_heads=None, qk_matmul_output_mode=0, scale=None, softcap=0.0,
              softmax_precision=None, left_window_size=-1, right_window_size=-1, outputs=1):
    three_d = Q.ndim == 3
    if three_d:  # (B, S, H*D) -> (B, H, S, D)
        b = Q.shape[0]
        Q = Q.reshape(b, Q.shape[1], q_num_heads, -1).transpose(1, 2)
        K = K.reshape(b, K.shape[1], kv_num_heads, -1).transpose(1, 2)
        V = V.reshape(b, V.shape[1], kv_num_heads, -1).transpose(1, 2)
    past = past_key.shape[2] if past_key is not None else 0
    if past_key is not None:
        K = cn.cat([past_key, K], 2)
    if past_value is not None:
        V = cn.cat([past_value, V], 2)
    present_k, present_v = K, V
    hq, hk = Q.shape[1], K.shape[1]
    if hq != hk:  # grouped-query attention: each K/V head serves hq // hk query heads
        rep = hq // hk
        K = K.unsqueeze(2).expand(K.shape[0], hk, rep, K.shape[2], K.shape[3]).reshape(K.shape[0], hq, K.shape[2], K.shape[3])
        V = V.unsqueeze(2).expand(V.shape[0], hk, rep, V.shape[2], V.shape[3]).reshape(V.shape[0], hq, V.shape[2], V.shape[3])
    d = Q.shape[-1]
    s = (1.0 / math.sqrt(d)) if scale is None else scale
    qk = (Q * math.sqrt(s)) @ (K * math.sqrt(s)).transpose(-2, -1)
    if softcap:  # before the mask, so that masked positions stay -inf
        qk = (qk / softcap).tanh() * softcap
    sq, skv = qk.shape[-2], qk.shape[-1]
    bias = None
    if attn_mask is not None:
        m = attn_mask
        if m.shape[-1] < skv:  # a mask shorter than the keys: the rest is masked out
            m = cn.pad(m, [0, skv - m.shape[-1]], False if m.dtype is bool_ else -math.inf)
        bias = cn.where(m, 0.0, -math.inf) if m.dtype is bool_ else m
    rows = cn.arange(sq, backend=Q.backend).reshape(sq, 1)
    cols = cn.arange(skv, backend=Q.backend).reshape(1, skv)
    # query i sits at absolute position i + offset: after the keys that precede this block
    if past_key is None and nonpad_kv_seqlen is not None:
        offset = (nonpad_kv_seqlen.cast(int32) - sq).reshape(-1, 1, 1, 1)
    else:
        offset = past
    if is_causal:
        causal = cn.where(cols <= rows + offset, 0.0, -math.inf)
        bias = causal if bias is None else bias + causal
    if left_window_size >= 0 or right_window_size >= 0:   # sliding window around that position
        diff = rows + offset - cols
        allowed = (diff <= left_window_size) if left_window_size >= 0 else (diff == diff)
        if right_window_size >= 0:
            allowed = allowed & (-diff <= right_window_size)
        window = cn.where(allowed, 0.0, -math.inf)
        bias = window if bias is None else bias + window
    if nonpad_kv_seqlen is not None:
        lens = nonpad_kv_seqlen.cast(int32).reshape(-1, 1, 1, 1)
        pad_bias = cn.where(cols.reshape(1, 1, 1, skv) < lens, 0.0, -math.inf)
        bias = pad_bias if bias is None else bias + pad_bias
    with_bias = qk + bias if bias is not None else qk
    probs = softmax(with_bias, -1)
    probs = cn.where(probs != probs, 0.0, probs)   # rows masked entirely give 0, not NaN
    y = probs @ V
    if three_d:
        y = y.transpose(1, 2).reshape(y.shape[0], y.shape[2], -1)
    qk_out = (qk, qk, with_bias, probs)[qk_matmul_output_mode]   # as the ONNX reference numbers them
    results = (y, present_k, present_v, qk_out)[:outputs]
    return results if outputs > 1 else y


@op(multi=True)
def DynamicQuantizeLinear(x, outputs=1):
    lo = x.min().minimum(0.0)
    hi = x.max().maximum(0.0)
    scale = (hi - lo) / 255.0
    zp = (-lo / scale).round().maximum(0.0).minimum(255.0)
    y = ((x / scale).round() + zp).maximum(0.0).minimum(255.0).cast(int32)
    results = (y, scale, zp.cast(int32))[:outputs]
    return results if outputs > 1 else y


@op(host=("axis",))
def CumProd(x, axis, exclusive=0, reverse=0):
    a = _axis(int(scalar(axis)), x.ndim)
    n = x.shape[a]
    parts, running = [], None
    order = range(n - 1, -1, -1) if reverse else range(n)
    for i in order:
        item = _slice_axis(x, a, i, i + 1)
        if exclusive:
            parts.append(running if running is not None else cn.ones(*item.shape, backend=x.backend, dtype=x.dtype))
            running = item if running is None else running * item
        else:
            running = item if running is None else running * item
            parts.append(running)
    if reverse:
        parts.reverse()
    return cn.cat(parts, a) if parts else x


@op(host=("shape",))
def CenterCropPad(input_data, shape, axes=None):
    shape = ints(shape)
    axes = [_axis(a, input_data.ndim) for a in axes] if axes is not None else list(range(input_data.ndim))
    x = input_data
    for a, want in zip(axes, shape):
        n = x.shape[a]
        if want < n:      # crop: the extra element goes to the end
            start = (n - want) // 2
            x = _slice_axis(x, a, start, start + want)
        elif want > n:    # pad: the extra element goes to the end
            before = (want - n) // 2
            flat = [0, 0] * (x.ndim - 1 - a) + [before, want - n - before]
            x = cn.pad(x, flat, 0 if x.dtype is not float32 else 0.0)
    return x


@op()
def RotaryEmbedding(X, cos_cache, sin_cache, position_ids=None, interleaved=0, num_heads=0, rotary_embedding_dim=0):
    shape = X.shape
    x = X.transpose(1, 2) if X.ndim == 4 else X.reshape(shape[0], shape[1], num_heads, shape[2] // num_heads)
    head = x.shape[3]
    dim = rotary_embedding_dim or head
    if position_ids is not None:   # (batch, seq) rows of the caches
        cos_cache = _take(cos_cache, 0, position_ids.cast(int32))
        sin_cache = _take(sin_cache, 0, position_ids.cast(int32))
    cos, sin = cos_cache.unsqueeze(2), sin_cache.unsqueeze(2)          # (batch, seq, 1, dim/2)
    rotate, keep = x[..., :dim], x[..., dim:]
    if interleaved:
        x1, x2 = rotate[..., 0::2], rotate[..., 1::2]
    else:
        x1, x2 = rotate[..., :dim // 2], rotate[..., dim // 2:]
    real, imag = cos * x1 - sin * x2, sin * x1 + cos * x2
    if interleaved:
        rotated = stack([real, imag], -1).reshape(real.shape[:-1] + (dim,))
    else:
        rotated = cn.cat([real, imag], -1)
    out = cn.cat([rotated, keep], -1) if keep.shape[-1] else rotated
    return out.transpose(1, 2) if X.ndim == 4 else out.reshape(shape)


def _reflect(p, lo, hi):
    """Reflect float coordinates p into [lo, hi] by the nearer border, repeatedly (GridSample)."""
    span = hi - lo
    if span <= 0:
        return p * 0.0 + lo
    below, above = lo - p, p - hi
    out = p
    for dist, start, sign in ((below, lo, 1.0), (above, hi, -1.0)):
        flips = (dist / span).floor()
        rest = dist - flips * span
        even = (flips % 2.0) == 0.0
        reflected = cn.where(even, start + rest * sign, (hi if sign > 0 else lo) - rest * sign)
        out = cn.where(dist > 0, reflected, out)
    return out


@op()
def GridSample(X, grid, align_corners=0, mode="linear", padding_mode="zeros"):
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    n, c = X.shape[:2]
    spatial = X.shape[2:]
    nd = len(spatial)
    out_spatial = grid.shape[1:-1]
    count = numel(out_spatial)
    g = grid.reshape(n, count, nd)
    per_dim = []        # per spatial dim: [(int32 index (n, L), float weight (n, L))]
    for d, size in enumerate(spatial):
        v = g[:, :, nd - 1 - d]                     # the grid's last component is the last dim
        p = (v + 1.0) * 0.5 * (size - 1) if align_corners else ((v + 1.0) * size - 1.0) * 0.5
        lo, hi = (0.0, size - 1.0) if align_corners else (-0.5, size - 0.5)
        if padding_mode == "border":
            p = cn.where((p < lo) | (p > hi), p.maximum(0.0).minimum(size - 1.0), p)
        elif padding_mode == "reflection":
            p = _reflect(p, lo, hi)
        if mode == "nearest":
            taps = [(p.round(), None)]
        elif mode == "linear":
            f = p.floor()
            t = p - f
            taps = [(f, 1.0 - t), (f + 1.0, t)]
        else:
            f = p.floor()
            t = p - f
            a = -0.75
            w = [((a * (t + 1) - 5 * a) * (t + 1) + 8 * a) * (t + 1) - 4 * a,
                 ((a + 2) * t - (a + 3)) * t * t + 1,
                 ((a + 2) * (1 - t) - (a + 3)) * (1 - t) * (1 - t) + 1]
            w.append(1.0 - w[0] - w[1] - w[2])
            taps = [(f + float(k), w[k + 1]) for k in (-1, 0, 1, 2)]
        resolved = []
        for pos, weight in taps:
            if padding_mode == "zeros":
                inside = ((pos >= 0) & (pos <= size - 1)).cast(float32)
                weight = inside if weight is None else weight * inside
            elif padding_mode == "reflection":
                pos = _reflect(pos, lo, hi)
            idx = pos.maximum(0.0).minimum(size - 1.0).cast(int32)
            resolved.append((idx, weight))
        per_dim.append(resolved)
    flat = X.reshape(n, c, numel(spatial))
    strides = [numel(spatial[d + 1:]) for d in range(nd)]
    out = None

    def combine(d, index, weight):
        nonlocal out
        if d == nd:
            picked = flat.gather(2, index.unsqueeze(1).expand(n, c, count))
            term = picked if weight is None else picked * weight.unsqueeze(1)
            out = term if out is None else out + term
            return
        for idx, w in per_dim[d]:
            part = idx * strides[d]
            combine(d + 1, part if index is None else index + part,
                    w if weight is None else (weight if w is None else weight * w))
    combine(0, None, None)
    return out.reshape((n, c) + tuple(out_spatial))


@op(multi=True)
def Unique(X, axis=None, sorted=1, outputs=1):  # noqa: A002
    """Computed on the host: the result's size depends on the values (like NonZero)."""
    if axis is None:
        items = [(v,) for v in X.reshape(-1).tolist()]
        source, a = X.reshape(-1), 0
    else:
        a = _axis(axis, X.ndim)
        moved = X.transpose(0, a) if a else X
        items = [tuple(_flat_list(row)) for row in moved.tolist()]
        source = X
    first, counts, order = {}, {}, []
    for i, key in enumerate(items):
        if key not in first:
            first[key] = i
            order.append(key)
        counts[key] = counts.get(key, 0) + 1
    if sorted:
        order.sort()
    position = {key: j for j, key in enumerate(order)}
    backend = X.backend
    picked = cn.tensor([first[k] for k in order], backend=backend, dtype=int32)
    y = _take(source, a, picked)
    results = (y, picked, cn.tensor([position[k] for k in items], backend=backend, dtype=int32),
               cn.tensor([counts[k] for k in order], backend=backend, dtype=int32))[:outputs]
    return results if outputs > 1 else y


def _flat_list(v):
    return [v] if not isinstance(v, list) else [x for item in v for x in _flat_list(item)]
