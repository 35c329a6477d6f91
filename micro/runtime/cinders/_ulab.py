"""The ulab engine: `from ulab import numpy` on firmware built with it, batch of one.

Stock ulab firmware has at most 2 dimensions (ULAB_MAX_DIMS 2), so every tensor is a 2-D
ndarray here: an image (1, C, H, W) is (C, H*W), a vector (1, n) is (1, n). Convolution unfolds
one input channel at a time (im2col: (kh*kw, OH*OW)) and multiplies with np.dot; pooling takes
strided 2-D slices of each plane. Only ulab's documented API is used (array, zeros, frombuffer,
reshape, dot, maximum, exp, tanh, max, sum, 2-D slicing); weights come from `Param.chunks` like
the array engine's, a few rows at a time.
"""

import math

from ulab import numpy as np

from cinders._window import window_count
from cinders._tensor import Tensor

try:
    from ulab import scipy as _scipy
    _erf = _scipy.special.erf
except (ImportError, AttributeError):
    _erf = None

_DTYPES = {"f": np.float, "b": np.int8}
_CHUNK_BYTES = 8192


def _layout(shape):
    """2-D storage: (N*C, H*W) for images, (all leading dims, last dim) otherwise (batches and
    1-D signals included); a batch of one keeps the layout described above."""
    if len(shape) == 4:
        return (shape[0] * shape[1], shape[2] * shape[3])
    n = 1
    for d in shape[:-1]:
        n *= d
    return (n, shape[-1] if shape else 1)


def from_flat(values, shape):
    return np.array(values, dtype=np.float).reshape(_layout(shape))


def to_list(data):
    return [float(v) for v in data.flatten()]


def reshape(x, shape):
    return Tensor(x.data.reshape(_layout(shape)), shape)


def _column(values):
    n = len(values)
    return np.array(values, dtype=np.float).reshape((n, 1))


def _weight_rows(weight):
    """Yield (first row, float matrix of some rows): int8 rows are scaled as they arrive."""
    L = weight.row_len
    k = max(1, _CHUNK_BYTES // (4 * L))
    dt = _DTYPES[weight.typecode]
    for j, n, rows in weight.chunks(k):
        w = np.array(np.frombuffer(rows, dtype=dt), dtype=np.float).reshape((n, L))
        if weight.scale is not None:
            w = w * _column(weight.scale[j:j + n])
        yield j, n, w


def linear(x, weight, bias, n_out):
    n_in = x.shape[-1]
    xcol = x.data.reshape((n_in, 1))
    out = np.zeros((n_out, 1), dtype=np.float)
    for j, n, w in _weight_rows(weight):
        out[j:j + n, :] = np.dot(w, xcol)
    if bias is not None:
        out = out + _column(bias.data)
    return Tensor(out.reshape((1, n_out)), (1, n_out))


def _padded(plane, H, W, ph, pw, fill):
    if ph == 0 and pw == 0:
        return plane
    p = np.zeros((H + 2 * ph, W + 2 * pw), dtype=np.float)
    if fill != 0.0:
        p = p + fill
    p[ph:ph + H, pw:pw + W] = plane
    return p


def conv2d(x, weight, bias, out_channels, kernel, stride, padding, dilation, act=None,
           pool=None):
    _, C, H, W = x.shape
    kh, kw = kernel
    sh, sw = stride
    ph, pw = padding
    dh, dw = dilation
    OH = window_count(H, kh, sh, ph, dh)
    OW = window_count(W, kw, sw, pw, dw)
    K = kh * kw
    wmat = np.zeros((out_channels, C * K), dtype=np.float)
    for j, n, w in _weight_rows(weight):
        wmat[j:j + n, :] = w
    out = np.zeros((out_channels, OH * OW), dtype=np.float)
    cols = np.zeros((K, OH * OW), dtype=np.float)
    for c in range(C):
        plane = _padded(x.data[c, :].reshape((H, W)), H, W, ph, pw, 0.0)
        t = 0
        for ky in range(kh):
            for kx in range(kw):
                y0 = ky * dh
                x0 = kx * dw
                cols[t, :] = plane[y0:y0 + (OH - 1) * sh + 1:sh,
                                   x0:x0 + (OW - 1) * sw + 1:sw].flatten()
                t += 1
        out = out + np.dot(wmat[:, c * K:(c + 1) * K], cols)
    if bias is not None:
        out = out + _column(bias.data)
    y = Tensor(out, (1, out_channels, OH, OW))
    if act is not None:
        y = unary(act, y)
    if pool is not None:
        y = pool2d(y, *pool)
    return y


def pool2d(x, kernel, stride, padding, mode):
    _, C, H, W = x.shape
    kh, kw = kernel
    sh, sw = stride
    ph, pw = padding
    OH = window_count(H, kh, sh, ph, 1)
    OW = window_count(W, kw, sw, pw, 1)
    is_max = mode == "max"
    count = None
    if mode == "avg_valid":  # how many real pixels each window covers
        count = _window_sum(_padded(np.ones((H, W), dtype=np.float), H, W, ph, pw, 0.0),
                            kh, kw, sh, sw, OH, OW, False)
    out = np.zeros((C, OH * OW), dtype=np.float)
    for c in range(C):
        plane = _padded(x.data[c, :].reshape((H, W)), H, W, ph, pw, -math.inf if is_max else 0.0)
        acc = _window_sum(plane, kh, kw, sh, sw, OH, OW, is_max)
        if count is not None:
            acc = acc / count
        elif not is_max:
            acc = acc * (1.0 / (kh * kw))
        out[c, :] = acc.flatten()
    return Tensor(out, (1, C, OH, OW))


def _window_sum(plane, kh, kw, sh, sw, OH, OW, is_max):
    acc = None
    for ky in range(kh):
        for kx in range(kw):
            v = plane[ky:ky + (OH - 1) * sh + 1:sh, kx:kx + (OW - 1) * sw + 1:sw]
            if acc is None:
                acc = np.array(v, dtype=np.float)
            elif is_max:
                acc = np.maximum(acc, v)
            else:
                acc = acc + v
    return acc


def _gelu(d, approximate):
    if approximate:
        inner = (d + d * d * d * 0.044715) * 0.7978845608028654
        return d * 0.5 * (np.tanh(inner) + 1.0)
    if _erf is not None:
        return d * 0.5 * (_erf(d * 0.7071067811865476) + 1.0)
    erf = getattr(math, "erf", None)
    if erf is None:
        return _gelu(d, True)
    flat = d.flatten()
    e = np.array([erf(float(v) * 0.7071067811865476) for v in flat], dtype=np.float)
    return d * 0.5 * (e.reshape(d.shape) + 1.0)


def unary(op, x):
    d = x.data
    if op == "relu":
        d = np.maximum(d, 0.0)
    elif op == "sigmoid":
        d = np.ones(d.shape, dtype=np.float) / (np.exp(d * -1.0) + 1.0)
    elif op == "tanh":
        d = np.tanh(d)
    else:
        d = _gelu(d, op == "gelu_tanh")
    return Tensor(d, x.shape)


def softmax_last(x):
    if len(x.shape) != 2:
        raise NotImplementedError("Softmax on the ulab engine takes (1, n), got %s" % (x.shape,))
    e = np.exp(x.data - np.max(x.data))
    return Tensor(e / np.sum(e), x.shape)


def channel_affine(x, scale, shift):
    return Tensor(x.data * _column(scale) + _column(shift), x.shape)
