"""Composite ops, each composed once from Tensor methods (which call backend primitives only).

Because nothing here touches a handle, a decorator backend (Autodiff, Fusion) sees only
primitives and differentiates / fuses every composite for free (cn.Fusion turns softmax or
gelu into one kernel).
"""

import math

from .dtypes import float32, int32, bool_
from .errors import ArgumentError, ArgumentTypeError, DTypeError, IndexingError, ShapeError
from .creation import arange, full
from .backend import unfold2d_output_size
from .tensor import Tensor, _axis, _axes, _numel, cat, pad, unfold2d, where, window_args

_INV_SQRT2 = 1.0 / math.sqrt(2.0)


def _float(op, x):
    if not isinstance(x, Tensor):
        raise ArgumentTypeError("%s: expected a Tensor, got %s" % (op, type(x).__name__))
    return x if x.dtype is float32 else x.cast(float32)


# -- activations ---------------------------------------------------------------------------------

def sigmoid(x):
    x = _float("sigmoid", x)
    return 1.0 / (1.0 + (-x).exp())


def relu(x):
    if x.dtype is bool_:
        raise DTypeError("relu: not defined for bool tensors")
    # where(), not maximum(x, 0): its gradient is one select and 0 at x == 0 (like torch);
    # `x <= 0` is False for NaN, so NaN propagates.
    return where(x <= 0, 0.0 if x.dtype is float32 else 0, x)


def silu(x):
    """x * sigmoid(x) (swish, EfficientNet's activation)."""
    x = _float("silu", x)
    return x * sigmoid(x)


def relu6(x):
    return x.clamp(0.0, 6.0)


def hardsigmoid(x):
    """relu6(x + 3) / 6, torch's piecewise-linear sigmoid (MobileNetV3)."""
    return (x + 3.0).clamp(0.0, 6.0) / 6.0


def hardswish(x):
    """x * hardsigmoid(x)."""
    return x * hardsigmoid(x)


def gelu(x):
    """The exact GELU, x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2))."""
    x = _float("gelu", x)
    return x * 0.5 * (1.0 + (x * _INV_SQRT2).erf())


def softmax(x, axis=-1):
    """exp(x) / sum(exp(x)) along axis, stable: the row max is subtracted first."""
    x = _float("softmax", x)
    axis = _axis("softmax", axis, x.ndim, x.shape)
    if x.backend.normalization_kernels and x.shape[axis]:
        return Tensor(x.backend, x.backend.softmax(x.handle, axis), x.shape, float32)
    e = (x - _shift(x, axis)).exp()
    return e / e.sum(axis, keepdim=True)


def log_softmax(x, axis=-1):
    """x - logsumexp(x) along axis, stable: the row max is subtracted first."""
    x = _float("log_softmax", x)
    axis = _axis("log_softmax", axis, x.ndim, x.shape)
    z = x - _shift(x, axis)
    return z - z.exp().sum(axis, keepdim=True).log()


def _shift(x, axis):
    """The row max that softmax subtracts for stability. The result does not depend on it, so
    its exact gradient is 0: on an Autodiff backend it is detached instead of differentiated."""
    if x.backend.differentiable:
        x = x.detach()  # before the max, so that the max records no tape entry at all
    return x.max(axis, keepdim=True)


# -- reductions and clamping -------------------------------------------------------------------

def mean(x, axis=None, keepdim=False):
    x = _float("mean", x)
    if axis is None or x.ndim == 0:
        count = _numel(x.shape)
    else:
        count = _numel(x.shape[a] for a in _axes("mean", axis, x.shape))
    total = x.sum(axis, keepdim)
    return total / float(count)


def clamp(x, min=None, max=None):  # noqa: A002  (torch's names)
    """Elementwise min(max(x, min), max); NaN stays NaN."""
    if min is None and max is None:
        raise ArgumentError("clamp: give min, max or both")
    if min is not None:
        x = x.maximum(min)
    if max is not None:
        x = x.minimum(max)
    return x


# -- building tensors --------------------------------------------------------------------------

def stack(tensors, axis=0):
    """Join same-shape tensors along a new axis."""
    tensors = list(tensors) if isinstance(tensors, (list, tuple)) else tensors
    if not isinstance(tensors, list) or not all(isinstance(t, Tensor) for t in tensors):
        raise ArgumentTypeError("stack: needs a list of Tensors, got %r" % (tensors,))
    if not tensors:
        raise ArgumentError("stack: needs at least one tensor")
    first = tensors[0]
    for t in tensors[1:]:
        if t.shape != first.shape:
            raise ShapeError("stack: shapes %s and %s differ" % (first.shape, t.shape))
    a = _axis("stack", axis, first.ndim + 1, first.shape)
    return cat([t.unsqueeze(a) for t in tensors], a)


def one_hot(indices, num_classes, dtype=int32):
    """(...,) int32 class indices -> (..., num_classes). An index outside [0, num_classes)
    (negative ones included) is an IndexingError: checking it reads one bool from the
    device."""
    if not isinstance(indices, Tensor) or indices.dtype is not int32:
        raise DTypeError("one_hot: indices must be an int32 Tensor, got %r" % (getattr(indices, "dtype", indices),))
    if type(num_classes) is not int or num_classes < 1:
        raise ArgumentError("one_hot: num_classes must be a positive int, got %r" % (num_classes,))
    if indices.numel() and ((indices < 0) | (indices >= num_classes)).any().item():
        bad = [i for i in indices.reshape(-1).tolist() if not 0 <= i < num_classes]
        raise IndexingError("one_hot: index %d is outside [0, %d) (num_classes=%d)"
                                   % (bad[0], num_classes, num_classes))
    classes = arange(num_classes, backend=indices.backend)
    return (indices.unsqueeze(-1) == classes).cast(dtype)


# -- images (NCHW) ---------------------------------------------------------------------------------

def _relu_then_6(x):
    # (where, not clamp: cn.Autodiff's conv2d gradient is 0 at 0 and at 6, as this one's)
    out = relu(x)
    return where(out >= 6.0, 6.0, out)


# conv2d's `activation`: the composition each names, which a backend's conv2d kernel applies at
# its store where it lists the name in `conv2d_activations` (core/backend.py)
CONV_ACTIVATIONS = {None: None, "relu": relu, "relu6": _relu_then_6, "silu": silu,
                    "hardswish": hardswish, "hardsigmoid": hardsigmoid}


def conv_activation(out, activation):
    """out after conv2d's `activation` (a key of CONV_ACTIVATIONS)."""
    return out if activation is None else CONV_ACTIVATIONS[activation](out)


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, activation=None):
    """2-D cross-correlation like torch.nn.functional.conv2d: x (N, C, H, W), weight
    (O, C/groups, kh, kw), bias (O,); then `activation` (a key of CONV_ACTIVATIONS). padding:
    an int, (ph, pw), or ((top, bottom), (left, right)). A backend that declares `conv2d_kernel`
    runs it as one kernel (bias and, where it lists it in `conv2d_activations`, the activation
    at its store, no unfolded matrix; another activation follows as its composition); elsewhere
    it is composed as unfold2d + one batched matmul over groups (the protocol's reference)."""
    x._same_device("conv2d", weight)
    if x.dtype is not float32 or weight.dtype is not float32:
        raise DTypeError("conv2d: needs float32 input and weight, got %r and %r" % (x.dtype, weight.dtype))
    if weight.ndim != 4 or x.ndim != 4:
        raise ShapeError("conv2d: needs input (N, C, H, W) and weight (O, C/groups, kh, kw), got shapes "
                         "%s and %s" % (x.shape, weight.shape))
    n, c = x.shape[0], x.shape[1]
    o, cg, kh, kw = weight.shape
    if not isinstance(groups, int) or groups < 1 or c % groups or o % groups or c // groups != cg:
        raise ShapeError("conv2d: input shape %s and weight shape %s do not fit groups=%r "
                         "(need C == weight.shape[1] * groups and O divisible by groups)"
                         % (x.shape, weight.shape, groups))
    if not (activation is None or isinstance(activation, str)) or activation not in CONV_ACTIVATIONS:
        raise ArgumentError("conv2d: activation must be one of %s, got %r" % (tuple(CONV_ACTIVATIONS), activation))
    pads = _conv_padding(padding)
    (pt, pb), (pl, pr) = pads
    padded = (n, c, x.shape[2] + pt + pb, x.shape[3] + pl + pr)
    _, stride, _, dilation, (oh, ow) = window_args("conv2d", padded, (kh, kw), stride, 0, dilation)
    if bias is not None:
        x._same_device("conv2d", bias)
        if bias.shape != (o,):
            raise ShapeError("conv2d: bias shape %s does not fit weight shape %s (need (%d,))"
                             % (bias.shape, weight.shape, o))
        if bias.dtype is not float32:
            raise DTypeError("conv2d: needs a float32 bias, got %r" % (bias.dtype,))
    if x.backend.conv2d_kernel and x.numel() and weight.numel():
        applied = activation if activation in x.backend.conv2d_activations else None
        h = x.backend.conv2d(x.handle, weight.handle, None if bias is None else bias.handle,
                             stride, pads, dilation, groups, applied)
        out = Tensor(x.backend, h, (n, o, oh, ow), float32)
        return out if applied == activation else conv_activation(out, activation)
    return conv2d_reference(x, weight, bias, stride, pads, dilation, groups, activation)


def conv2d_reference(x, weight, bias, stride, padding, dilation, groups, activation):
    """The conv2d primitive's reference (core/backend.py), on arguments conv2d has validated
    (stride, dilation as pairs, padding as ((top, bottom), (left, right))): unfold2d + one
    batched matmul over groups, + bias, then the activation."""
    (n, _, h, wd), (o, cg, kh, kw) = x.shape, weight.shape
    (pt, pb), (pl, pr) = padding
    oh, ow = unfold2d_output_size(h + pt + pb, wd + pl + pr, (kh, kw), stride, (0, 0), dilation)
    if pt == pb and pl == pr:
        cols = unfold2d(x, (kh, kw), stride, (pt, pl), dilation)     # (N, C*kh*kw, L)
    else:
        cols = unfold2d(pad(x, (pl, pr, pt, pb)), (kh, kw), stride, 0, dilation)
    cols = cols.reshape(n, groups, cg * kh * kw, oh * ow)
    w = weight.reshape(1, groups, o // groups, cg * kh * kw)
    out = (w @ cols).reshape(n, o, oh, ow)
    if bias is not None:
        out = out + bias.reshape(1, o, 1, 1)
    return conv_activation(out, activation)


def lstm_cell(gates, c):
    """One LSTM step after its matmuls (the lstm_cell primitive of core/backend.py): gates
    (B, 4H) in ONNX's order i, o, f, g with the biases added, c (B, H) -> (h', c')."""
    gates._same_device("lstm_cell", c)
    b, hidden = _cell_shapes("lstm_cell", gates, 4, c)
    if gates.backend.recurrent_kernels and b * hidden:
        out = Tensor(gates.backend, gates.backend.lstm_cell(gates.handle, c.handle), (2, b, hidden),
                     float32)
        return out[0], out[1]
    i, o, f = (sigmoid(gates[:, k * hidden:(k + 1) * hidden]) for k in range(3))
    new_c = f * c + i * gates[:, 3 * hidden:].tanh()
    return o * new_c.tanh(), new_c


def gru_cell(gx, gh, h):
    """One GRU step (linear_before_reset, the gru_cell primitive of core/backend.py): gx, gh
    (B, 3H) the input and recurrent projections in ONNX's order z, r, n, biases added; h (B, H)
    -> h'."""
    gx._same_device("gru_cell", gh)
    gx._same_device("gru_cell", h)
    b, hidden = _cell_shapes("gru_cell", gx, 3, h)
    if gh.shape != gx.shape or gh.dtype is not float32:
        raise ShapeError("gru_cell: gh must be float32 of gx's shape %s, got %s" % (gx.shape, gh.shape))
    if gx.backend.recurrent_kernels and b * hidden:
        return Tensor(gx.backend, gx.backend.gru_cell(gx.handle, gh.handle, h.handle), (b, hidden), float32)
    z, r = (sigmoid(gx[:, k * hidden:(k + 1) * hidden] + gh[:, k * hidden:(k + 1) * hidden])
            for k in range(2))
    n = (gx[:, 2 * hidden:] + r * gh[:, 2 * hidden:]).tanh()
    return (1.0 - z) * n + z * h


def _cell_shapes(name, gates, count, state):
    if gates.dtype is not float32 or state.dtype is not float32:
        raise DTypeError("%s: needs float32 tensors, got %r and %r" % (name, gates.dtype, state.dtype))
    if state.ndim != 2 or gates.shape != (state.shape[0], count * state.shape[1]):
        raise ShapeError("%s: needs gates (B, %d*H) and a state (B, H), got shapes %s and %s"
                         % (name, count, gates.shape, state.shape))
    return state.shape


def _conv_padding(padding):
    """((top, bottom), (left, right)) from an int, a pair, or that form itself."""
    if isinstance(padding, (tuple, list)) and len(padding) == 2 and \
            all(isinstance(p, (tuple, list)) for p in padding):
        pairs = tuple(tuple(p) for p in padding)
    elif type(padding) is int:
        pairs = ((padding, padding),) * 2
    elif isinstance(padding, (tuple, list)) and len(padding) == 2:
        pairs = tuple((p, p) for p in padding)
    else:
        pairs = None
    if pairs is None or any(len(p) != 2 or any(type(v) is not int or v < 0 for v in p) for p in pairs):
        raise ShapeError("conv2d: padding must be an int, (ph, pw) or ((top, bottom), (left, right)) "
                         "of non-negative ints, got %r" % (padding,))
    return pairs


def _pool_args(op, x, kernel_size, stride, padding, dilation=1):
    if x.dtype is not float32:
        raise DTypeError("%s: needs a float32 input, got %r" % (op, x.dtype))
    kernel, stride, padding, dilation, out_hw = window_args(
        op, x.shape, kernel_size, kernel_size if stride is None else stride, padding, dilation)
    if padding[0] * 2 > kernel[0] or padding[1] * 2 > kernel[1]:
        raise ShapeError("%s: padding %s must be at most half the kernel %s" % (op, padding, kernel))
    return kernel, stride, padding, dilation, out_hw


def max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1):
    """Max over each window (stride defaults to the kernel size; padding counts as -inf)."""
    kernel, stride, padding, dilation, (oh, ow) = _pool_args("max_pool2d", x, kernel_size, stride,
                                                            padding, dilation)
    n, c = x.shape[0], x.shape[1]
    if x.backend.pool2d_kernel and x.numel():
        return _pool2d_kernel(x, "max", kernel, stride, padding, dilation, (oh, ow))
    cols = unfold2d(x, kernel, stride, padding, dilation, pad_value=-math.inf)
    return cols.reshape(n, c, kernel[0] * kernel[1], oh * ow).max(2).reshape(n, c, oh, ow)


def avg_pool2d(x, kernel_size, stride=None, padding=0, count_include_pad=True):
    """Mean over each window (stride defaults to the kernel size). With count_include_pad=False
    border windows divide by the number of real pixels they cover."""
    kernel, stride, padding, _, (oh, ow) = _pool_args("avg_pool2d", x, kernel_size, stride, padding)
    n, c = x.shape[0], x.shape[1]
    if x.backend.pool2d_kernel and x.numel():
        op = "avg" if count_include_pad or padding == (0, 0) else "avg_real"
        return _pool2d_kernel(x, op, kernel, stride, padding, (1, 1), (oh, ow))
    cols = unfold2d(x, kernel, stride, padding).reshape(n, c, kernel[0] * kernel[1], oh * ow)
    if count_include_pad or padding == (0, 0):
        return cols.mean(2).reshape(n, c, oh, ow)
    ones = full((1, 1) + x.shape[2:], 1.0, backend=x.backend, dtype=float32)
    counts = unfold2d(ones, kernel, stride, padding).sum(1)          # (1, L) real pixels per window
    return (cols.sum(2) / counts).reshape(n, c, oh, ow)


def _pool2d_kernel(x, op, kernel, stride, padding, dilation, out_hw):
    """The backend's pool2d primitive (core/backend.py): one kernel, no unfolded matrix."""
    h = x.backend.pool2d(x.handle, op, kernel, stride, padding, dilation)
    return Tensor(x.backend, h, x.shape[:2] + tuple(out_hw), float32)


__all__ = ["sigmoid", "relu", "gelu", "softmax", "log_softmax", "mean", "clamp", "stack", "one_hot",
           "conv2d", "max_pool2d", "avg_pool2d"]
