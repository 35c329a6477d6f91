"""Static shape inference at import: what the importer knows about each value before any input.

Per value an `Info`: its shape, each dim an int, a symbolic name from the graph's inputs
('batch', 'seq') or None (unknown), or no shape at all (rank unknown); and, for the small int
vectors that exporters build shapes from, its partially known elements (an element is an int, a
symbolic name or None; flat, in row-major order). `Shape(x)` of a hidden state (None, None, 32) is [None, None, 32], so
`Gather(Shape(x), 2)` is known to be 32 at import, and `ConstantOfShape(Shape(v))` of a vector v
of length 4 is four known elements: codegen folds such values into constants.

Only shapes and shape plumbing (Shape, Gather, Concat, Slice, Unsqueeze, Squeeze, Reshape, Cast,
Identity) are followed here; every other value is computed by the op functions themselves,
either at import (codegen folds nodes whose inputs are all constants) or on the host per call
(codegen.HOST_OPS). A node this module has no rule for gets unknown outputs, which only means
less is decided at import.
"""

from ..backend import numel

_SAME_SHAPE = {
    "Identity", "Cast", "CastLike", "Relu", "Sigmoid", "Tanh", "Exp", "Log", "Sqrt", "Neg", "Abs", "Erf",
    "Not", "Floor", "Ceil", "Round", "Reciprocal", "Sin", "Cos", "Sign", "IsNaN", "IsInf", "Softplus",
    "Softsign", "LeakyRelu", "Elu", "Selu", "Celu", "Gelu", "HardSigmoid", "HardSwish", "Mish", "Clip",
    "Softmax", "LogSoftmax", "Hardmax", "LayerNormalization", "BatchNormalization", "InstanceNormalization",
    "LpNormalization", "Dropout", "ThresholdedRelu", "Shrink", "Trilu", "CumSum", "Tan", "Asin", "Acos",
    "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "RMSNormalization", "SimplifiedLayerNormalization",
}
_BROADCAST = {
    "Add", "Sub", "Mul", "Div", "Pow", "Mod", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual",
    "And", "Or", "Xor", "Where", "Max", "Min", "Sum", "Mean", "PRelu", "BitShift",
}
_INT64_MAX = 2 ** 63 - 1


class Info:
    """What is known of one value at import: shape (tuple or None) and, for small int vectors,
    value (flat list of ints / symbolic names / None, or None when not followed)."""

    __slots__ = ("shape", "value")

    def __init__(self, shape=None, value=None):
        self.shape = None if shape is None else tuple(shape)
        self.value = None if value is None else list(value)

    def numel(self):
        """The element count when every dim is a known int, else None."""
        if self.shape is None or not all(isinstance(d, int) for d in self.shape):
            return None
        return numel(self.shape)

    def known(self):
        """The flat values when every element is a known int, else None."""
        if self.value is None or not all(isinstance(v, int) and not isinstance(v, bool) for v in self.value):
            return None
        return self.value


UNKNOWN = Info()


def _dim(a, b):
    """One broadcast dim of a and b."""
    if a == b or b == 1:
        return a
    if a == 1:
        return b
    if isinstance(a, int) and a is not None and not isinstance(b, int):
        return a
    if isinstance(b, int) and not isinstance(a, int):
        return b
    return None


def broadcast(shapes):
    if any(s is None for s in shapes):
        return None
    rank = max(len(s) for s in shapes)
    out = [1] * rank
    for s in shapes:
        padded = (1,) * (rank - len(s)) + tuple(s)
        out = [_dim(a, b) for a, b in zip(out, padded)]
    return tuple(out)


def _axis(axis, rank):
    return axis + rank if axis < 0 else axis


def _vector(info):
    """The elements of a 1-D shape vector: its (partial) values, else as many unknowns as its
    length says (an Expand or Reshape target whose dims are computed keeps its rank)."""
    if info is None or info.value is not None:
        return None if info is None else info.value
    if info.shape is not None and len(info.shape) == 1 and isinstance(info.shape[0], int):
        return [None] * info.shape[0]
    return None


def _ints_of(info, attrs, name, index, inputs):
    """A parameter given as an attribute (old opsets) or as a constant input (newer ones)."""
    if name in attrs:
        v = attrs[name]
        return [int(x) for x in (v if isinstance(v, list) else [v])]
    if len(inputs) > index and inputs[index] is not None:
        return inputs[index].known()
    return None


def infer(op_type, inputs, attrs, n_outputs):
    """[Info] for the outputs of one node. inputs: Info per input (None for an omitted one);
    attrs: {name: Python value} of its attributes."""
    first = inputs[0] if inputs and inputs[0] is not None else UNKNOWN
    rule = _RULES.get(op_type)
    if rule is not None:
        try:
            out = rule(first, inputs, attrs)
        except (IndexError, KeyError, TypeError, ValueError, ZeroDivisionError):
            out = None   # attributes that do not fit the shapes: unknown here, the op refuses them
        if out is not None:
            return out if isinstance(out, list) else [out] + [UNKNOWN] * (n_outputs - 1)
    if op_type in _SAME_SHAPE:
        value = first.value if op_type in ("Identity", "Cast") else None
        if op_type == "Cast" and value is not None and not (
                attrs.get("to") == "int64" or attrs.get("to") == "int32" and
                all(not isinstance(v, int) or -2 ** 31 <= v < 2 ** 31 for v in value)):
            value = None   # shape arithmetic is int; other casts (and wrapping ones) are folded only
        return [Info(first.shape, value)] + [UNKNOWN] * (n_outputs - 1)
    if op_type in _BROADCAST:
        return [Info(broadcast([i.shape if i is not None else None for i in inputs]))] + \
            [UNKNOWN] * (n_outputs - 1)
    return [UNKNOWN] * n_outputs


def _shape(x, inputs, attrs):
    if x.shape is None:   # rank unknown: still a vector (what Gather, Concat after it rely on)
        return Info((None,))
    n = len(x.shape)
    start, end = attrs.get("start", 0), attrs.get("end")
    s = max(0, min(n, start + n if start < 0 else start))
    e = n if end is None else max(0, min(n, end + n if end < 0 else end))
    dims = list(x.shape[s:e]) if e > s else []
    return Info((len(dims),), dims)


def _size(x, inputs, attrs):
    n = x.numel()
    return Info((), None if n is None else [n])


def _gather(x, inputs, attrs):
    idx = inputs[1]
    if x.shape is None or idx is None or idx.shape is None:
        return None
    a = _axis(attrs.get("axis", 0), len(x.shape))
    shape = x.shape[:a] + idx.shape + x.shape[a + 1:]
    value = None
    picks = idx.known()
    if x.value is not None and len(x.shape) == 1 and picks is not None and isinstance(x.shape[0], int):
        n = x.shape[0]
        if all(-n <= p < n for p in picks):
            value = [x.value[p] for p in picks]
    return Info(shape, value)


def _unsqueeze(x, inputs, attrs):
    axes = _ints_of(x, attrs, "axes", 1, inputs)
    if x.shape is None or axes is None:
        return None
    rank = len(x.shape) + len(axes)
    shape = list(x.shape)
    for a in sorted(_axis(a, rank) for a in axes):
        shape.insert(a, 1)
    return Info(shape, x.value)


def _squeeze(x, inputs, attrs):
    axes = _ints_of(x, attrs, "axes", 1, inputs)
    if x.shape is None:
        return None
    if axes is None:
        if len(inputs) > 1 and inputs[1] is not None or not all(isinstance(d, int) for d in x.shape):
            return None
        return Info([d for d in x.shape if d != 1], x.value)
    drop = {_axis(a, len(x.shape)) for a in axes}
    return Info([d for i, d in enumerate(x.shape) if i not in drop], x.value)


def _concat(x, inputs, attrs):
    if any(i is None or i.shape is None for i in inputs) or not inputs:
        return None
    rank = len(inputs[0].shape)
    if any(len(i.shape) != rank for i in inputs):
        return None
    a = _axis(attrs.get("axis", 0), rank)
    sizes = [i.shape[a] for i in inputs]
    total = sum(sizes) if all(isinstance(s, int) for s in sizes) else None
    shape = list(inputs[0].shape)
    shape[a] = total
    for i in inputs[1:]:
        shape = [d if k == a else _dim(d, e) for k, (d, e) in enumerate(zip(shape, i.shape))]
    value = None
    if rank == 1 and all(i.value is not None for i in inputs):
        value = [v for i in inputs for v in i.value]
    return Info(shape, value)


def _slice_bounds(start, end, step, n):
    """The Python slice ONNX's Slice takes of a known dim n (bounds clamped as ONNX does)."""
    start, end = max(-n - 1, min(start, n + 1)), max(-n - 1, min(end, n + 1))
    return range(n)[slice(start, end, step)]


def _slice(x, inputs, attrs):
    if x.shape is None:
        return None
    starts = _ints_of(x, attrs, "starts", 1, inputs)
    ends = _ints_of(x, attrs, "ends", 2, inputs)
    count = len(starts if starts is not None else ends if ends is not None else [])
    axes = _ints_of(x, attrs, "axes", 3, inputs) if "axes" in attrs or len(inputs) > 3 and inputs[3] else \
        list(range(count)) if count else None
    steps = _ints_of(x, attrs, "steps", 4, inputs) if len(inputs) > 4 and inputs[4] else [1] * len(axes or [])
    if axes is None:   # which dims are sliced is unknown: only the rank is kept
        return Info([None] * len(x.shape))
    if starts is None or ends is None or steps is None:   # the sliced dims are unknown
        cut = {_axis(a, len(x.shape)) for a in axes}
        return Info([None if i in cut else d for i, d in enumerate(x.shape)])
    shape, value = list(x.shape), x.value if len(x.shape) == 1 else None   # (values: flat, row-major)
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = _axis(a, len(shape))
        n = shape[a]
        if isinstance(n, int):
            picked = _slice_bounds(s, e, st, n)
            shape[a] = len(picked)
            if value is not None:
                value = [value[i] for i in picked]
        else:
            whole = s == 0 and e >= _INT64_MAX // 2 and st == 1   # x[0:] keeps a symbolic dim
            shape[a] = n if whole else None
            value = value if whole else None
    return Info(shape, value)


def _reshape(x, inputs, attrs):
    target = _vector(inputs[1]) if len(inputs) > 1 else None
    if target is None and "shape" in attrs:
        target = list(attrs["shape"])
    if target is None:
        return None
    allowzero = attrs.get("allowzero", 0)
    shape = []
    for i, d in enumerate(target):
        if d == 0 and not allowzero:
            d = x.shape[i] if x.shape is not None and i < len(x.shape) else None
        shape.append(d)
    if -1 in shape:
        rest = [d for d in shape if d != -1]
        n = x.numel()
        if n is not None and all(isinstance(d, int) for d in rest) and numel(rest):
            shape[shape.index(-1)] = n // numel(rest)
        elif x.shape is not None and len(shape) == len(x.shape) and \
                all(d == e or d == -1 for d, e in zip(shape, x.shape)):
            shape[shape.index(-1)] = x.shape[shape.index(-1)]   # every other dim kept
        else:
            shape[shape.index(-1)] = None
    value = x.value if len(shape) == 1 else None
    return Info(shape, value)


def _constant_of_shape(x, inputs, attrs):
    if x.value is None:
        return Info(None) if x.shape is None or x.numel() is None else Info([None] * x.numel())
    return Info(x.value)


def _expand(x, inputs, attrs):
    target = _vector(inputs[1]) if len(inputs) > 1 else None
    if target is None or x.shape is None:
        return None
    return Info(broadcast([x.shape, tuple(d if d != -1 else None for d in target)]))


def _gather_elements(x, inputs, attrs):
    idx = inputs[1] if len(inputs) > 1 else None
    return None if idx is None or idx.shape is None else Info(idx.shape)


def _range(x, inputs, attrs):
    vals = [i.known() if i is not None else None for i in inputs[:3]]
    if any(v is None or len(v) != 1 for v in vals):
        return Info([None])
    start, limit, delta = (v[0] for v in vals)
    return Info([max(0, -(-(limit - start) // delta))]) if delta else None


def _transpose(x, inputs, attrs):
    if x.shape is None:
        return None
    perm = attrs.get("perm") or list(range(len(x.shape) - 1, -1, -1))
    return Info([x.shape[p] for p in perm])


def _matmul(x, inputs, attrs):
    y = inputs[1]
    if x.shape is None or y is None or y.shape is None or not x.shape or not y.shape:
        return None
    a = x.shape if len(x.shape) > 1 else (1,) + x.shape
    b = y.shape if len(y.shape) > 1 else y.shape + (1,)
    batch = broadcast([a[:-2], b[:-2]])
    shape = list(batch) + [a[-2], b[-1]]
    if len(x.shape) == 1:
        del shape[-2]
    if len(y.shape) == 1:
        del shape[-1]
    return Info(shape)


def _gemm(x, inputs, attrs):
    y = inputs[1]
    if x.shape is None or y is None or y.shape is None or len(x.shape) != 2 or len(y.shape) != 2:
        return None
    return Info([x.shape[1] if attrs.get("transA") else x.shape[0], y.shape[0] if attrs.get("transB") else y.shape[1]])


def _flatten(x, inputs, attrs):
    if x.shape is None:
        return None
    a = _axis(attrs.get("axis", 1), len(x.shape))
    head, tail = x.shape[:a], x.shape[a:]
    known = lambda dims: numel(dims) if all(isinstance(d, int) for d in dims) else None  # noqa: E731
    return Info([known(head), known(tail)])


def _reduce(x, inputs, attrs):
    if x.shape is None:
        return None
    axes = _ints_of(x, attrs, "axes", 1, inputs)
    if axes is None and len(inputs) > 1 and inputs[1] is not None:
        return None
    rank = len(x.shape)
    if not axes and attrs.get("noop_with_empty_axes"):
        return Info(x.shape)
    drop = set(range(rank)) if not axes else {_axis(a, rank) for a in axes}
    if attrs.get("keepdims", 1):
        return Info([1 if i in drop else d for i, d in enumerate(x.shape)])
    return Info([d for i, d in enumerate(x.shape) if i not in drop])


def _conv(x, inputs, attrs):
    w = inputs[1]
    if x.shape is None or w is None or w.shape is None or len(x.shape) < 3:
        return None
    nd = len(x.shape) - 2
    kernel = list(attrs.get("kernel_shape") or w.shape[2:])
    strides = list(attrs.get("strides") or [1] * nd)
    dilations = list(attrs.get("dilations") or [1] * nd)
    auto_pad = attrs.get("auto_pad", "NOTSET")
    spatial = []
    for i, n in enumerate(x.shape[2:]):
        if not isinstance(n, int):
            spatial.append(None)
        elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            spatial.append(-(-n // strides[i]))
        else:
            pads = list(attrs.get("pads") or [0] * (2 * nd)) if auto_pad != "VALID" else [0] * (2 * nd)
            span = n + pads[i] + pads[i + nd] - dilations[i] * (kernel[i] - 1) - 1
            spatial.append(span // strides[i] + 1 if span >= 0 else None)
    return Info([x.shape[0], w.shape[0]] + spatial)


def _pad(x, inputs, attrs):
    pads = _ints_of(x, attrs, "pads", 1, inputs)
    if x.shape is None or pads is None or len(inputs) > 3 and inputs[3] is not None:
        return None   # `axes` given: left to the op
    rank = len(x.shape)
    return Info([d + pads[i] + pads[i + rank] if isinstance(d, int) else None for i, d in enumerate(x.shape)])


def _lstm(x, inputs, attrs):
    """Y (seq, directions, batch, hidden), Y_h and Y_c (directions, batch, hidden): layout 0."""
    if x.shape is None or len(x.shape) != 3 or attrs.get("layout", 0):
        return None
    directions = 2 if attrs.get("direction") == "bidirectional" else 1
    hidden = attrs["hidden_size"]
    state = Info([directions, x.shape[1], hidden])
    return [Info([x.shape[0], directions, x.shape[1], hidden]), state, state]


def _dequantized(rule):
    """A joined product's rule (ops/quantization.py Dequantized*): a packed 4-bit weight's input
    holds its bytes, the weight's own shape is the packed_shape attribute."""
    def joined(x, inputs, attrs):
        if "packed_shape" in attrs:
            inputs = [inputs[0], Info(attrs["packed_shape"])] + list(inputs[2:])
        return rule(x, inputs, attrs)
    return joined


_RULES = {
    "Conv": _conv, "Pad": _pad, "LSTM": _lstm,
    "Shape": _shape, "Size": _size, "Gather": _gather, "Unsqueeze": _unsqueeze, "Squeeze": _squeeze,
    "Concat": _concat, "Slice": _slice, "Reshape": _reshape, "ConstantOfShape": _constant_of_shape,
    "Expand": _expand, "Range": _range, "Transpose": _transpose, "MatMul": _matmul, "Gemm": _gemm,
    "DequantizedMatMul": _dequantized(_matmul), "DequantizedGemm": _dequantized(_gemm),
    "Flatten": _flatten, "GatherElements": _gather_elements,
    **{name: _reduce for name in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd",
                                  "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")},
}
