"""The ONNX operators that `cinders import-onnx` writes as `ops.X(...)`, on the board: the same
names, arguments and semantics as the desktop's cinders.onnx.ops (core/onnx/ops/*.py), for the
float32 graphs of image and signal models (convolutions, pooling, Gemm, Concat, reductions,
shape ops). Built on the board's own primitives: the engine's conv2d/pool2d (_array_conv.py,
_ulab.py) and the tensor ops of _ops.py/_ops_more.py; nothing here is a kernel of its own.

`cinders export-micro` rewrites a generated model's `from cinders.onnx import ops` to this module
and its base class `cn.nn.Module` to `ops.Module` (its tensors are parameters), and refuses,
before writing anything, a model that calls an operator not defined here. An attribute value the
board cannot reproduce (grouped convolution, asymmetric padding, ceil_mode) raises
NotImplementedError naming it, never a different number.
"""
import math

from cinders import _ops, _ops_more, engine
from cinders._tensor import Tensor, empty
from cinders._nn_image import per_sample
from cinders._window import window_count
from cinders.nn import Module as _Module
from cinders.record import Param

flat, numel, reshape, binary, unary = _ops.flat, _ops.numel, _ops.reshape, _ops.binary, _ops.unary
_sigmoid = _ops.UNARY["sigmoid"]


class Module(_Module):
    """A generated model: its tensor attributes are its parameters (named like the record's
    tensors). Those up to record.RESIDENT_BYTES are read into RAM when the record is bound; larger
    ones stay in the file (Streamed), so a model may hold more weights than the heap."""

    @property
    def _params(self):
        return tuple(k for k in self.__dict__ if isinstance(self.__dict__[k], Tensor))

    _streamed = _params

    def param_shapes(self):
        # kept for loaded(): a record's Param does not carry its shape (heap, record.py)
        self._shapes = {k: tuple(getattr(self, k).shape) for k in self._params}
        self._ints = [k for k in self._params if getattr(self, k).dtype == "int32"]
        return self._shapes

    def loaded(self):
        for k in list(self.__dict__):  # MicroPython's __dict__ is read-only: setattr
            p = self.__dict__[k]
            if isinstance(p, Param):
                shape = self._shapes[k]
                if k in self._ints:  # an index constant (Gather's), stored as exact floats
                    setattr(self, k, [int(v) for v in p.data] if shape else int(p.data[0]))
                elif p.data is None:
                    setattr(self, k, Streamed(p, shape))
                else:
                    setattr(self, k, Weight(p.data, shape))


def param(shape, dtype="float32"):
    """A parameter of a generated model before the record is bound (`cinders export-micro` writes
    it for the `cn.zeros(...)` of its __init__): the shape only, no RAM for the values."""
    t = Tensor(None, tuple(shape))
    t.dtype = dtype
    return t


class Weight(Tensor):
    """A parameter: a tensor of the engine that keeps the record's flat float32 values too, which
    conv and Gemm read as weight rows (on ulab, flattening the engine's array again would box
    every value)."""

    def __init__(self, values, shape):
        Tensor.__init__(self, engine.from_flat(values, shape), shape)
        self.values = values


class Streamed(Tensor):
    """A parameter left in the record file: Conv, Gemm and LSTM read its rows while they run
    (record.Param.chunks); any other op reads it whole, for that op only."""

    def __init__(self, param, shape):  # no Tensor.__init__: nothing in RAM
        self.param = param
        self.shape = shape
        self.slot = None
        self.gen = 0

    @property
    def values(self):
        for _, _, view in self.param.chunks(self.param.rows):  # one chunk: every row
            return view

    @property
    def data(self):
        return engine.from_flat(self.values, self.shape)


class _Rows:
    """A weight tensor seen as the engines read record weights (record.Param's interface): rows
    of the first dim (or `rows` rows), float32, no int8 scale."""
    scale = None
    typecode = "f"

    def __init__(self, t, rows=None):
        self.data = t.values if isinstance(t, Weight) else flat(t)
        self.rows = rows or t.shape[0]
        self.row_len = len(self.data) // self.rows

    def chunks(self, k):
        mv = memoryview(self.data)
        L = self.row_len
        for j in range(0, self.rows, k):
            n = min(k, self.rows - j)
            yield j, n, mv[j * L:(j + n) * L]


def rows_of(t, rows=None):
    """The weight t as rows for the engines' linear and conv2d: read from the file as they run
    when t is Streamed, else from RAM."""
    if isinstance(t, Streamed):
        p = t.param
        if rows and rows != p.rows:
            # an ONNX LSTM's (1, 4 * hidden, n) weight read as 4 * hidden rows (its only use: the
            # regrouping stays; record.py has no method for it, every name there costs the 64 KB MLP)
            p.row_len, p._row_bytes = p.row_len * p.rows // rows, p._row_bytes * p.rows // rows
            p.rows = rows
        return p
    return _Rows(t, rows)


def _own(t):
    """t in memory of its own: the array engine writes conv/pool outputs into shared activation
    buffers, which a graph (unlike a layer chain) may still need after the next layer ran."""
    return _ops.clone(t) if t.slot is not None else t


def ints(v):
    """A list of ints from a list, a number or a (shape) tensor; None stays None."""
    if v is None or isinstance(v, list):
        return v
    if isinstance(v, Tensor):
        v = _ops.tolist(v)
    return [int(x) for x in v] if isinstance(v, (list, tuple)) else [int(v)]


def expect_shape(x, dims, name):
    if len(x.shape) != len(dims) or any(type(d) is int and d != n for d, n in zip(dims, x.shape)):
        raise ValueError("input %s has shape %s; the model declares %s" % (name, list(x.shape), dims))


def _pads(X, kernel, strides, dilations, pads, auto_pad):
    """ONNX `pads` ([begins..., ends...] of the spatial dims) after auto_pad."""
    nd = len(X.shape) - 2
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        total = [max(0, (-(-n // s) - 1) * s + (k - 1) * d + 1 - n)
                 for n, k, s, d in zip(X.shape[2:], kernel, strides, dilations)]
        small = [t // 2 for t in total]
        big = [t - t // 2 for t in total]
        return small + big if auto_pad == "SAME_UPPER" else big + small
    if auto_pad == "VALID" or not pads:
        return [0] * (2 * nd)
    return list(pads)


def _windows(op, X, kernel, strides, dilations, pads, auto_pad):
    """(kernel, strides, padding, dilations) of a 1-D or 2-D window op as 2-D pairs, refusing
    what the engines cannot do (padding that differs between the two ends: Conv pads
    explicitly first, see there)."""
    nd = len(X.shape) - 2
    if nd not in (1, 2):
        raise NotImplementedError("%s: %d-D windows are not supported on the board (1-D, 2-D are)"
                                  % (op, nd))
    strides = list(strides or [1] * nd)
    dilations = list(dilations or [1] * nd)
    pads = _pads(X, kernel, strides, dilations, pads, auto_pad)
    if pads[:nd] != pads[nd:]:
        raise NotImplementedError("%s: pads=%s differ between the two ends, which the board does "
                                  "not do" % (op, pads))
    pad = pads[:nd]
    if nd == 1:
        return [1] + list(kernel), [1] + strides, [0] + pad, [1] + dilations
    return list(kernel), strides, pad, dilations


def _as_2d(X):
    return reshape(X, X.shape[:2] + (1,) + X.shape[2:]) if len(X.shape) == 3 else X


def _from_2d(y, nd):
    return reshape(y, y.shape[:2] + y.shape[3:]) if nd == 1 else y


def Conv(X, W, B=None, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None,
         strides=None, activation=None):
    # activation: not ONNX's; the importer folds a Relu, Clip(0, 6), HardSwish, HardSigmoid or
    # x * Sigmoid(x) after a Conv into it (_CONV_ACTIVATIONS)
    if activation is not None and activation not in _CONV_ACTIVATIONS:
        raise NotImplementedError("Conv: activation %r is not supported on the board" % (activation,))
    if group != 1:
        raise NotImplementedError("Conv: group=%d is not supported on the board" % group)
    if X.shape[1] != W.shape[1]:
        raise ValueError("Conv: input of shape %s has %d channels, the weight %s wants %d"
                         % (X.shape, X.shape[1], W.shape, W.shape[1]))
    nd = len(X.shape) - 2
    kernel = list(W.shape[2:])
    pads = _pads(X, kernel, strides or [1] * nd, dilations or [1] * nd, pads, auto_pad)
    if pads[:nd] != pads[nd:]:  # the engines pad both ends alike: zeros first, then none
        X = Pad(X, [0, 0] + pads[:nd] + [0, 0] + pads[nd:])
        pads = [0] * (2 * nd)
    kernel, strides, pad, dilations = _windows("Conv", X, kernel, strides, dilations, pads, "NOTSET")
    rows, bias = rows_of(W), (_Rows(B) if B is not None else None)
    X2 = _as_2d(X)
    out = [window_count(X2.shape[2 + i], kernel[i], strides[i], pad[i], dilations[i]) for i in (0, 1)]
    positions = out[0] * out[1]
    if positions <= FEW_POSITIONS or positions < kernel[0] * kernel[1]:
        conv = lambda xb: _conv_by_position(xb, rows, bias, W.shape[0], kernel, strides, pad, dilations, out)
    else:
        conv = lambda xb: _own(engine.conv2d(xb, rows, bias, W.shape[0], kernel, strides, pad, dilations))
    y = per_sample(conv, X2)
    if activation is not None:
        y = _CONV_ACTIVATIONS[activation](y)
    return _from_2d(y, nd)


def _hardsigmoid(y):
    return _ops.binary("div", _ops.clamp(_ops.binary("add", y, 3.0), 0.0, 6.0), 6.0)


# Conv's folded activations: the desktop's functional.CONV_ACTIVATIONS on the board's ops
_CONV_ACTIVATIONS = {
    "relu": lambda y: _ops.clamp(y, 0.0, None),
    "relu6": lambda y: _ops.clamp(y, 0.0, 6.0),
    "silu": lambda y: _ops.binary("mul", y, _ops.unary("sigmoid", y)),
    "hardsigmoid": _hardsigmoid,
    "hardswish": lambda y: _ops.binary("mul", y, _hardsigmoid(y)),
}


FEW_POSITIONS = 8  # a streaming model's chunk (silero's convs: 4 and fewer)


def _conv_by_position(x, rows, bias, M, kernel, strides, pad, dilations, out):
    """A conv with few output positions (an STFT's 256-tap kernel at 4 positions, silero's
    encoder at 4 and 1): the input patch under the kernel at each position (zeros where it reads
    padding) times every weight row on the engine's linear, where the engines' conv2d would loop
    over the taps for every chunk of weight rows. An engine with batched linear (array) reads
    the weights once for all positions; ulab once per position."""
    C, H, Wd = x.shape[1], x.shape[2], x.shape[3]
    kh, kw = kernel
    OH, OW = out
    P, L = OH * OW, C * kh * kw
    v = flat(x)
    patches = empty("f", P * L)
    i = 0
    for oy in range(OH):
        for ox in range(OW):
            for c in range(C):
                for ky in range(kh):
                    iy = oy * strides[0] - pad[0] + ky * dilations[0]
                    for kx in range(kw):
                        ix = ox * strides[1] - pad[1] + kx * dilations[1]
                        patches[i] = v[(c * H + iy) * Wd + ix] if 0 <= iy < H and 0 <= ix < Wd else 0.0
                        i += 1
    y = empty("f", M * P)
    groups = [(0, P)] if getattr(engine, "BATCHED", False) else [(p, 1) for p in range(P)]
    mv = memoryview(patches)
    for first, n in groups:
        cols = flat(engine.linear(_ops.make(mv[first * L:(first + n) * L], (n, L)), rows, bias, M))
        for p in range(n):
            for m in range(M):
                y[m * P + first + p] = cols[p * M + m]
    return _ops.make(y, (1, M, OH, OW))


def _pool(op, mode, X, kernel_shape, strides, pads, auto_pad, ceil_mode, dilations):
    if ceil_mode or any(d != 1 for d in dilations or ()):
        raise NotImplementedError("%s: ceil_mode and dilations are not supported on the board" % op)
    nd = len(X.shape) - 2
    kernel, strides, pad, _ = _windows(op, X, kernel_shape, strides, None, pads, auto_pad)
    y = per_sample(lambda xb: _own(engine.pool2d(xb, kernel, strides, pad, mode)), _as_2d(X))
    return _from_2d(y, nd)


def MaxPool(X, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None, pads=None,
            storage_order=0, strides=None, outputs=1):
    if outputs > 1:
        raise NotImplementedError("MaxPool: the Indices output is not supported")
    return _pool("MaxPool", "max", X, kernel_shape, strides, pads, auto_pad, ceil_mode, dilations)


def AveragePool(X, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None,
                kernel_shape=None, pads=None, strides=None):
    return _pool("AveragePool", "avg" if count_include_pad else "avg_valid", X, kernel_shape,
                 strides, pads, auto_pad, ceil_mode, dilations)


def _reduce(name, data, axes, keepdims, noop_with_empty_axes=0):
    """Reduce over several axes: moved last and merged, then one reduction (exact, unlike
    reducing axis by axis)."""
    axes = ints(axes)
    if not axes:
        if noop_with_empty_axes:
            return data
        axes = list(range(len(data.shape)))
    rank = len(data.shape)
    axes = sorted(a % rank for a in axes)
    kept = [d for d in range(rank) if d not in axes]
    x = _ops_more.permute(data, *(kept + axes)) if kept + axes != list(range(rank)) else data
    x = reshape(x, tuple(data.shape[d] for d in kept) + (numel([data.shape[d] for d in axes]),))
    y = _ops_more.reduce(name, x, -1)
    if keepdims:
        y = reshape(y, tuple(1 if d in axes else data.shape[d] for d in range(rank)))
    return y


def _reducer(name):
    return lambda data, axes=None, keepdims=1, noop_with_empty_axes=0: _reduce(
        name, data, axes, keepdims, noop_with_empty_axes)


ReduceMean = _reducer("mean")
ReduceSum = _reducer("sum")
ReduceMax = _reducer("max")
ReduceMin = _reducer("min")


def GlobalAveragePool(X):
    return _reduce("mean", X, list(range(2, len(X.shape))), 1)


def GlobalMaxPool(X):
    return _reduce("max", X, list(range(2, len(X.shape))), 1)


def Gemm(A, B, C=None, alpha=1.0, beta=1.0, transA=0, transB=0, broadcast=0):
    n = B.shape[0]
    if transB and not transA and alpha == 1.0 and beta == 1.0 and (C is None or C.shape == (n,)):
        # a Linear layer (what exporters write): the engine's linear reads B's rows in place,
        # where a transposed copy would need B's size again
        rows, bias = rows_of(B), (_Rows(C) if C is not None else None)
        return per_sample(lambda a: _own(engine.linear(a, rows, bias, n)), A)
    a = _ops_more.transpose(A, 0, 1) if transA else A
    b = _ops_more.transpose(B, 0, 1) if transB else B
    out = _ops_more.matmul(a, b)
    if alpha != 1.0:
        out = binary("mul", out, alpha)
    if C is not None:
        out = binary("add", out, C if beta == 1.0 else binary("mul", C, beta))
    return out


def MatMul(A, B):
    return _ops_more.matmul(A, B)


def Flatten(input, axis=1):  # noqa: A002  (ONNX names)
    a = axis % len(input.shape) if input.shape else 0
    return reshape(input, numel(input.shape[:a]), numel(input.shape[a:]))


def Reshape(data, shape, allowzero=0):
    shape = ints(shape)
    if not allowzero:
        shape = [data.shape[i] if d == 0 and i < len(data.shape) else d for i, d in enumerate(shape)]
    return reshape(data, shape)


def Transpose(data, perm=None):
    return _ops_more.permute(data, *(perm if perm is not None else range(len(data.shape) - 1, -1, -1)))


def Squeeze(data, axes=None):
    axes = ints(axes)
    if axes is None:
        return reshape(data, [d for d in data.shape if d != 1])
    axes = [a % len(data.shape) for a in axes]
    return reshape(data, [d for i, d in enumerate(data.shape) if i not in axes])


def Unsqueeze(data, axes):
    rank = len(data.shape) + len(ints(axes))
    axes = sorted(a % rank for a in ints(axes))
    shape = list(data.shape)
    for a in axes:
        shape.insert(a, 1)
    return reshape(data, shape)


def _gather(data, tables, fill=0.0):
    """A new tensor whose index i along axis a reads data's index tables[a][i] there (-1: fill)."""
    v = flat(data)
    shape = tuple(len(t) for t in tables)
    strides = [1] * len(shape)
    for a in range(len(shape) - 2, -1, -1):
        strides[a] = strides[a + 1] * data.shape[a + 1]
    out = empty("f", numel(shape))
    idx = [0] * len(shape)
    for k in range(len(out)):
        off = 0
        for a in range(len(shape)):
            j = tables[a][idx[a]]
            if j < 0:
                off = -1
                break
            off += j * strides[a]
        out[k] = fill if off < 0 else v[off]
        a = len(shape) - 1
        while a >= 0:
            idx[a] += 1
            if idx[a] < shape[a]:
                break
            idx[a] = 0
            a -= 1
    return _ops.make(out, shape)


def _source(i, n, mode):
    """The input index that output index i (counted from the first original element) reads."""
    if 0 <= i < n:
        return i
    if mode == "constant":
        return -1
    if mode == "edge":
        return min(max(i, 0), n - 1)
    if mode == "reflect":
        period = 2 * (n - 1) if n > 1 else 1
        j = i % period
        return period - j if j >= n else j
    if mode == "wrap":
        return i % n
    raise NotImplementedError("Pad: mode %r is not supported on the board" % (mode,))


def Pad(data, pads=None, constant_value=None, axes=None, mode="constant", value=0.0, paddings=None):
    pads = ints(pads if pads is not None else paddings)
    rank = len(data.shape)
    axes = [a % rank for a in ints(axes)] if axes is not None else list(range(rank))
    k = len(axes)
    if len(pads) != 2 * k:
        raise ValueError("Pad: %d pads for %d axes (needs %d)" % (len(pads), k, 2 * k))
    before, after = [0] * rank, [0] * rank
    for i, a in enumerate(axes):
        before[a], after[a] = pads[i], pads[i + k]
    fill = value if constant_value is None else (
        _ops.item(constant_value) if isinstance(constant_value, Tensor) else constant_value)
    # negative pads crop: the range simply starts or ends inside the input
    tables = [[_source(i, n, mode) for i in range(-before[a], n + after[a])]
              for a, n in enumerate(data.shape)]
    return _gather(data, tables, fill)


def Slice(data, starts=None, ends=None, axes=None, steps=None):
    starts, ends = ints(starts), ints(ends)
    rank = len(data.shape)
    axes = [a % rank for a in ints(axes)] if axes is not None else list(range(len(starts)))
    steps = ints(steps) if steps is not None else [1] * len(starts)
    tables = [list(range(n)) for n in data.shape]
    for s, e, a, st in zip(starts, ends, axes, steps):
        n = data.shape[a]
        # ONNX clamps out-of-range bounds (INT64_MAX / INT64_MIN mean "to the end"), as slices do
        tables[a] = list(range(n))[max(-n - 1, min(s, n + 1)):max(-n - 1, min(e, n + 1)):st]
    return _gather(data, tables)


def Concat(*inputs, axis):
    return _ops_more.cat(inputs, axis) if len(inputs) > 1 else inputs[0]


def Softmax(input, axis=None, opset=13):  # noqa: A002
    if opset >= 13:
        return _ops_more.softmax(input, -1 if axis is None else axis)
    a = (1 if axis is None else axis) % len(input.shape)  # before 13: the input as a 2-D matrix
    y = _ops_more.softmax(reshape(input, numel(input.shape[:a]), numel(input.shape[a:])), 1)
    return reshape(y, input.shape)


def BatchNormalization(X, scale, B, input_mean, input_var, epsilon=1e-5, momentum=0.9,
                       training_mode=0, spatial=1, outputs=1):
    if training_mode or outputs > 1:
        raise NotImplementedError("BatchNormalization: training mode is not supported")
    per = (X.shape[1],) + (1,) * (len(X.shape) - 2)
    inv = unary("sqrt", binary("add", reshape(input_var, per), epsilon))
    y = binary("div", binary("sub", X, reshape(input_mean, per)), inv)
    return binary("add", binary("mul", y, reshape(scale, per)), reshape(B, per))


def Clip(input, min=None, max=None):  # noqa: A002  (ONNX names)
    return _ops.clamp(input, _ops.item(min) if isinstance(min, Tensor) else min,
                      _ops.item(max) if isinstance(max, Tensor) else max)


def _binary(name):
    return lambda A, B: binary(name, A, B)


Add, Sub, Mul, Div, Pow = (_binary(n) for n in ("add", "sub", "mul", "div", "pow"))


def Max(*inputs):
    out = inputs[0]
    for t in inputs[1:]:
        out = binary("maximum", out, t)
    return out


def Min(*inputs):
    out = inputs[0]
    for t in inputs[1:]:
        out = binary("minimum", out, t)
    return out


def LeakyRelu(X, alpha=0.01):
    return binary("maximum", X, binary("mul", X, alpha)) if alpha <= 1.0 else \
        binary("minimum", X, binary("mul", X, alpha))


def Identity(input):  # noqa: A002
    return input


def Cast(input, to, saturate=1, round_mode="up"):  # noqa: A002
    if to != "float32":
        raise NotImplementedError("Cast: to=%s; the board computes float32" % to)
    return input


def power_by_constant(x, n):
    """Pow(x, n) for the constant exponents 2 and 3, as products (like the desktop's)."""
    y = binary("mul", x, x)
    return binary("mul", y, x) if n == 3 else y


def Gather(data, indices, axis=0):
    """data's slices at the (constant) indices along axis; an int index drops that axis."""
    a = axis % len(data.shape)
    n = data.shape[a]
    picks = [i % n if -n <= i < n else n for i in ints(indices)]
    if n in picks:
        raise IndexError("Gather: an index of %s is out of range for a dim of %d" % (indices, n))
    tables = [list(range(d)) for d in data.shape]
    tables[a] = picks
    y = _gather(data, tables)
    if isinstance(indices, int):
        y = reshape(y, data.shape[:a] + data.shape[a + 1:])
    return y


def LSTM(X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None, P=None,
         activation_alpha=None, activation_beta=None, activations=None, clip=None,
         direction="forward", hidden_size=None, input_forget=0, layout=0, outputs=1):
    """ONNX LSTM, forward, with the default activations (what exporters of nn.LSTM write): per
    step the gates are W x + R h + biases (the engine's linear, rows streamed from the record
    when W and R are), in ONNX's order i, o, f, c."""
    if direction != "forward" or layout or P is not None or clip is not None or input_forget \
            or activations is not None or sequence_lens is not None:
        raise NotImplementedError("LSTM: only direction=forward, layout=0 and the default "
                                  "activations, without peepholes, clip or sequence_lens")
    H = hidden_size
    T, N = X.shape[0], X.shape[1]
    Wr, Rr = rows_of(W, 4 * H), rows_of(R, 4 * H)
    bias = None
    if B is not None:
        b = flat(B)
        bias = _Rows(_ops.make([b[j] + b[4 * H + j] for j in range(4 * H)], (4 * H,)))
    h = [list(flat(initial_h))[k * H:(k + 1) * H] if initial_h is not None else [0.0] * H
         for k in range(N)]
    c = [list(flat(initial_c))[k * H:(k + 1) * H] if initial_c is not None else [0.0] * H
         for k in range(N)]
    xs = flat(X)
    I = X.shape[2]
    Y = []
    for t in range(T):
        for k in range(N):
            x = _ops.make(xs[(t * N + k) * I:(t * N + k + 1) * I], (1, I))
            g = list(flat(engine.linear(x, Wr, bias, 4 * H)))   # a copy: the next linear reuses its buffer
            r = flat(engine.linear(_ops.make(h[k], (1, H)), Rr, None, 4 * H))
            hk, ck = h[k], c[k]
            for j in range(H):
                i_ = _sigmoid(g[j] + r[j])
                o_ = _sigmoid(g[H + j] + r[H + j])
                f_ = _sigmoid(g[2 * H + j] + r[2 * H + j])
                cj = f_ * ck[j] + i_ * math.tanh(g[3 * H + j] + r[3 * H + j])
                ck[j] = cj
                hk[j] = o_ * math.tanh(cj)
            Y.extend(hk)
    Y_h = _ops.make([v for hk in h for v in hk], (1, N, H))
    Y_c = _ops.make([v for ck in c for v in ck], (1, N, H))
    res = (_ops.make(Y, (T, 1, N, H)), Y_h, Y_c)
    return res[:outputs] if outputs > 1 else res[0]
