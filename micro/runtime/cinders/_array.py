"""The `array('f')` engine: plain loops over flat float32 arrays.

Memory: a layer writes its output into one of two activation buffers that live as long as the
interpreter (`_buffer`), the one its input is not in, so after the first inference a forward
allocates only small scratch. Weights arrive row by row from `Param.chunks`, resident or read
from the record file, and int8 rows are scaled as they are used (never a float copy of them).
"""

import math
from array import array

from cinders._tensor import GENS, Tensor, empty

BATCHED = True  # linear takes (B, n) at once; the image layers run sample by sample (nn.py)
_slots = [None, None]


def _buffer(x, n):
    """n floats of the activation buffer that does not hold x (grown, never shrunk)."""
    slot = 1 if x.slot == 0 else 0
    a = _slots[slot]
    if a is None or len(a) < n:
        _slots[slot] = a = None  # let the old one go before asking for the new one
        a = _slots[slot] = empty("f", n)
    GENS[slot] += 1  # tensors still pointing at this slot's previous contents are now stale
    return memoryview(a)[:n], slot


_index_buf = [None]


def _indices(n):
    """A reusable int array of at least n entries (positions of the nonzero inputs)."""
    a = _index_buf[0]
    if a is None or len(a) < n:
        _index_buf[0] = a = None
        a = _index_buf[0] = array("H" if n < 65536 else "i", range(n))
    return memoryview(a)


def from_flat(values, shape=None):
    """float32 data of a flat sequence; an array is taken as it is (no second copy)."""
    return values if isinstance(values, array) else array("f", values)


def to_list(data):
    return [v for v in data]


def linear(x, weight, bias, n_out):
    """y[j] = scale[j] * (W[j] . x) + b[j], skipping the zeros of x (pixels, ReLU outputs).
    A batch of several rows goes to _array_batch (code a one-sample model never loads)."""
    xd = x.data
    n_in = x.shape[-1]
    if len(xd) != n_in:
        from cinders._array_batch import linear_rows
        return linear_rows(x, weight, bias, n_out)
    idx = _indices(n_in)
    m = 0
    for i in range(n_in):
        if xd[i] != 0.0:
            idx[m] = i
            m += 1
    nonzero = idx[:m]
    out, slot = _buffer(x, n_out)
    scale = weight.scale
    b = bias.data if bias is not None else None
    for j, _, row in weight.chunks(1):
        s = 0.0
        for i in nonzero:
            s += row[i] * xd[i]
        if scale is not None:
            s *= scale[j]
        if b is not None:
            s += b[j]
        out[j] = s
    return Tensor(out, x.shape[:-1] + (n_out,), slot)


def conv2d(*args):
    from cinders import _array_conv  # loaded on first use: an MLP never pays for its code
    return _array_conv.conv2d(*args)


def pool2d(*args):
    from cinders import _array_conv
    return _array_conv.pool2d(*args)


# ---- elementwise, in place (inference only: a layer owns the tensor it is given)

def _sigmoid(v):
    return 1.0 / (1.0 + math.exp(-v)) if v > -80.0 else 0.0


def _erf(v):
    # Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7) for ports built without math.erf
    t = 1.0 / (1.0 + 0.3275911 * abs(v))
    y = 1.0 - t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (
        -1.453152027 + t * 1.061405429)))) * math.exp(-v * v)
    return y if v >= 0 else -y


_ERF = getattr(math, "erf", _erf)
_SQRT_HALF = 0.7071067811865476
_SQRT_2_OVER_PI = 0.7978845608028654


def _gelu(v):
    return 0.5 * v * (1.0 + _ERF(v * _SQRT_HALF))


def _gelu_tanh(v):
    return 0.5 * v * (1.0 + math.tanh(_SQRT_2_OVER_PI * (v + 0.044715 * v * v * v)))


UNARY_FN = {"sigmoid": _sigmoid, "tanh": math.tanh, "gelu": _gelu, "gelu_tanh": _gelu_tanh}


def _relu(d, n):
    for i in range(n):
        if d[i] < 0.0:
            d[i] = 0.0


def _own(x):
    """x to overwrite: a layer's output (in an activation slot) is taken over in place and the
    old tensor marked stale (reading it raises); any other tensor (the caller's input, a
    method's result) is copied first, so the caller's tensor keeps its values."""
    from cinders._tensor import live
    live(x)
    if x.slot is None:
        return Tensor(array("f", x.data), x.shape)
    y = Tensor(x.data, x.shape, x.slot)
    x.gen = -1
    return y


def unary(op, x):
    """relu, sigmoid, tanh, gelu or gelu_tanh of x (in place when x is a layer's output)."""
    x = _own(x)
    d = x.data
    if op == "relu":
        _relu(d, len(d))
        return x
    f = UNARY_FN[op]
    for i in range(len(d)):
        d[i] = f(d[i])
    return x


def softmax_last(x):
    """Softmax over the last dimension, each row shifted by its max so exp never overflows."""
    x = _own(x)
    d = x.data
    n = x.shape[-1]
    for r in range(0, len(d), n):
        m = d[r]
        for i in range(r, r + n):
            if d[i] > m:
                m = d[i]
        s = 0.0
        for i in range(r, r + n):
            e = math.exp(d[i] - m)
            d[i] = e
            s += e
        for i in range(r, r + n):
            d[i] /= s
    return x


def channel_affine(x, scale, shift):
    """x[c] * scale[c] + shift[c] per channel: a BatchNorm folded at load time."""
    x = _own(x)
    d = x.data
    C = len(scale)
    plane = len(d) // (C * x.shape[0])
    for start in range(0, len(d), plane):  # planes in order: sample 0 channel 0, 1, ...
        c = (start // plane) % C
        a = scale[c]
        b = shift[c]
        for i in range(start, start + plane):
            d[i] = d[i] * a + b
    return x


def reshape(x, shape):
    y = Tensor(x.data, shape, x.slot)
    y.gen = x.gen  # a view: stale when x is
    return y
