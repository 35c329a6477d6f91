"""The ulab engine: `from ulab import numpy` on firmware built with it, batch of one.

What the build offers is detected at import, because boards differ:
    FLOAT_BYTES   4 on float32 firmware (most boards), 8 on double (the unix port's default):
                  float32 record bytes are viewed as they are on the first, converted on the second
    DIMS          ULAB_MAX_DIMS (stock firmware: 2); with 3 or more, convolution gathers a kernel
                  tap of every input channel in one slice instead of one slice per channel

Tensors are 2-D ndarrays: an image (1, C, H, W) is (C, H*W), a vector (1, n) is (1, n).
Convolution runs a band of output rows at a time (im2col of the band, np.dot with the weight
matrix, bias, activation, and a non-overlapping pool folded in), so its scratch is a few KB
whatever the image size: a full 16x28x28 output plus its im2col matrix would need ~150 KB.
Only ulab's documented API is used (array, zeros, ones, frombuffer, reshape, dot, maximum, exp,
tanh, max, sum, slicing, slice assignment, `scipy.special.erf` when present); weights come from
`Param.chunks` like the array engine's, a few rows at a time.
"""

import gc
import math
from array import array

from ulab import numpy as np

from cinders._window import window_count
from cinders._tensor import Tensor

# float("-inf"), not -math.inf: the compiler folds math.inf into a constant, which mpy-tool
# writes into frozen C code as `-inf` (no such C name), so frozen firmware would not build
_NEG_INF = float("-inf")

try:
    from ulab import scipy as _scipy
    _erf = _scipy.special.erf
except (ImportError, AttributeError):
    _erf = None

FLOAT_BYTES = np.zeros(1, dtype=np.float).itemsize


def _max_dims():
    for n in (4, 3):
        try:
            np.zeros((1,) * n)
            return n
        except (TypeError, ValueError):
            pass
    return 2


DIMS = _max_dims()
# Small heaps (a 64 KB board) get small scratch, pieces that fit between the heap's objects, and
# the convolution chain (conv_chain): the frozen int8 CNN then runs in 61 KB, at ~2.5x the time.
# Larger heaps get 4 KB weight chunks and 2 KB bands and run each conv block whole.
_SMALL_HEAP = gc.mem_free() < 96 * 1024
_CHUNK_BYTES = 2048 if _SMALL_HEAP else 4096  # weight rows (as the build's floats) per step
_BAND_ITEMS = (512 if _SMALL_HEAP else 2048) // FLOAT_BYTES  # conv outputs per band (and chunk)


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
    """The build's floats of a flat sequence. An array('f') on a float32 build is viewed in
    place, like the array engine takes it as it is: a second copy of the input (3 KB for a digit)
    is what a 64 KB heap cannot spare."""
    if FLOAT_BYTES == 4 and isinstance(values, array):
        return np.frombuffer(values, dtype=np.float).reshape(_layout(shape))
    return np.array(values, dtype=np.float).reshape(_layout(shape))


def to_list(data):
    return [float(v) for v in data.flatten()]


def to_array(data):
    """The values as a flat array('f'): what the tensor ops read (_ops.flat). Filled straight
    from the ndarray, never through a list (a list boxes every float: ~24 bytes a value)."""
    return array("f", data.flatten())


def reshape(x, shape):
    return Tensor(x.data.reshape(_layout(shape)), shape)


def _column(values):
    n = len(values)
    return np.array(values, dtype=np.float).reshape((n, 1))


def _weight_rows(weight, most=1 << 30):
    """Yield (first row, number of rows, matrix of those rows, their int8 scales as a column or
    None), valid until the next step. float32 rows are viewed in place on float32 builds and
    widened on double ones; int8 rows stay int8 (np.dot takes them): the caller scales the rows
    of its result, which is n values instead of n * row_len."""
    L = weight.row_len
    int8 = weight.typecode == "b"
    k = max(1, min(most, _CHUNK_BYTES // ((1 if int8 else FLOAT_BYTES) * L)))
    for j, n, rows in weight.chunks(k):
        if int8:
            w = np.frombuffer(rows, dtype=np.int8)
        elif FLOAT_BYTES == 4:
            w = np.frombuffer(rows, dtype=np.float)  # a view: no copy
        else:
            w = np.array(rows, dtype=np.float)  # float32 values widened to the build's double
        scale = _column(weight.scale[j:j + n]) if weight.scale is not None else None
        yield j, n, w.reshape((n, L)), scale


def linear(x, weight, bias, n_out):
    n_in = x.shape[-1]
    xcol = x.data.reshape((n_in, 1))
    out = np.zeros((n_out, 1), dtype=np.float)
    for j, n, w, scale in _weight_rows(weight):
        d = np.dot(w, xcol)
        out[j:j + n, :] = d if scale is None else d * scale
    if bias is not None:
        out = out + _column(bias.data)
    return Tensor(out.reshape((1, n_out)), (1, n_out))


def _padded(x, C, H, W, ph, pw, fill):
    """The (C, H*W) image as C stacked (H + 2ph, W + 2pw) planes: (C * Hp, Wp)."""
    Hp, Wp = H + 2 * ph, W + 2 * pw
    if ph == 0 and pw == 0:
        return x.reshape((C * H, W))
    p = np.zeros((C * Hp, Wp), dtype=np.float)
    if fill != 0.0:
        p = p + fill
    for c in range(C):
        p[c * Hp + ph:c * Hp + ph + H, pw:pw + W] = x[c, :].reshape((H, W))
    return p


def _in_band_pool(pool):
    """A pool whose windows tile the output (kernel == stride, no padding) is applied band by
    band; others run on the whole convolution output."""
    return pool is not None and tuple(pool[0]) == tuple(pool[1]) and tuple(pool[2]) == (0, 0)


def _valid(o0, n, k, s, p, size):
    """Of the outputs o0..o0+n along one axis, the first and end (o_lo, o_hi) whose input
    o * s + k - p lies inside 0..size (the others read padding), and that first input."""
    lo = max(o0, -((k - p) // s))
    hi = min(o0 + n, (size - 1 - k + p) // s + 1)
    return lo, max(lo, hi), lo * s + k - p


def _tap(x, C, H, W, ky, kx, sh, sw, ph, pw, r0, nb, OW, top):
    """Kernel tap (ky, kx) (dilation applied) under output rows r0..r0+nb: the input values it
    multiplies, zero where it reads padding. (C, nb * OW); without padding a plain slice.
    x holds rows top.. of the (C, H, W) image: all of them, or the window a chain computed."""
    ya, yb, iy = _valid(r0, nb, ky, sh, ph, H)
    xa, xb, ix = _valid(0, OW, kx, sw, pw, W)
    held = x.shape[1] // W
    iy -= top
    ye = iy + (yb - ya - 1) * sh + 1  # MicroPython cannot build slice objects: bounds only
    xe = ix + (xb - xa - 1) * sw + 1
    if DIMS >= 3:
        x3 = x.reshape((C, held, W))
        if yb - ya == nb and xb - xa == OW:
            return np.array(x3[:, iy:ye:sh, ix:xe:sw]).reshape((C, nb * OW))
        t = np.zeros((C, nb, OW), dtype=np.float)
        if yb > ya and xb > xa:
            t[:, ya - r0:yb - r0, xa:xb] = x3[:, iy:ye:sh, ix:xe:sw]
        return t.reshape((C, nb * OW))
    t = np.zeros((C * nb, OW), dtype=np.float)  # channel c's rows are c * nb .. (c + 1) * nb
    if yb > ya and xb > xa:
        for c in range(C):
            t[c * nb + ya - r0:c * nb + yb - r0, xa:xb] = x[c, :].reshape((held, W))[iy:ye:sh, ix:xe:sw]
    return t.reshape((C, nb * OW))


class _Block:
    """Conv2d [activation] [pool] on a (C, H, W) input: its geometry, worked out once.
    An in-band pool (see _in_band_pool) makes `step` output rows one pooled row; the block's
    result has `PH` rows of `PW`."""

    def __init__(self, C, H, W, weight, bias, out_channels, kernel, stride, padding, dilation,
                 act, pool):
        self.C, self.H, self.W = C, H, W
        self.weight, self.bias, self.out_channels = weight, bias, out_channels
        self.kernel, self.stride, self.padding, self.dilation = kernel, stride, padding, dilation
        self.act, self.pool = act, pool
        self.OH = window_count(H, kernel[0], stride[0], padding[0], dilation[0])
        self.OW = window_count(W, kernel[1], stride[1], padding[1], dilation[1])
        self.banded = _in_band_pool(pool)
        self.step = pool[0][0] if self.banded else 1  # bands hold whole pooling windows
        self.PH = (self.OH - self.OH % self.step) // self.step
        self.PW = self.OW // pool[0][1] if self.banded else self.OW

    def inputs_of(self, lo, hi):
        """The input rows (first, end) that the result's rows lo..hi read."""
        sh, ph, reach = self.stride[0], self.padding[0], (self.kernel[0] - 1) * self.dilation[0]
        return max(0, lo * self.step * sh - ph), min(self.H, ((hi * self.step) - 1) * sh - ph + reach + 1)

    def rows(self, xd, top, lo, hi):
        """The result's rows lo..hi as (out_channels, (hi - lo) * PW), from xd holding input rows
        top.. . Output channels a chunk of weight rows at a time (as they stream from the record),
        and within a chunk a band of output rows at a time: per kernel tap, np.dot of the
        chunk's weights for that tap (n, C) with the tap's inputs (C, band). No padded copy of
        the input, no full weight matrix, no full-size output when a pool follows."""
        C, H, W, OW, step, PW = self.C, self.H, self.W, self.OW, self.step, self.PW
        kh, kw = self.kernel
        sh, sw = self.stride
        ph, pw = self.padding
        dh, dw = self.dilation
        K = kh * kw
        pool, act, bias = self.pool, self.act, self.bias
        gc.collect()  # the previous layer's scratch: the output wants one contiguous block
        out = np.zeros((self.out_channels, (hi - lo) * PW), dtype=np.float)
        for j, n, w, scale in _weight_rows(self.weight, max(1, _BAND_ITEMS // (step * OW))):
            band = max(step, _BAND_ITEMS // (max(n, C) * OW) // step * step)
            bcol = _column(bias.data[j:j + n]) if bias is not None else None
            gc.collect()  # free the previous chunk's scratch in one piece: bands need ~3x 8 KB
            for r0 in range(lo * step, hi * step, band):
                nb = min(band, hi * step - r0)
                acc = None
                for t in range(K):
                    ky, kx = t // kw, t % kw
                    d = np.dot(w[:, t::K], _tap(xd, C, H, W, ky * dh, kx * dw, sh, sw, ph, pw,
                                                r0, nb, OW, top))
                    if acc is None:
                        acc = d
                    else:
                        acc += d
                if scale is not None:
                    acc *= scale
                if bcol is not None:
                    acc += bcol
                if act is not None:
                    acc = _unary(act, acc)
                if self.banded:
                    pk = pool[0]
                    acc = _pool_windows(acc.reshape((n * nb, OW)), pk[0], pk[1], pk[0], pk[1],
                                        n * nb // pk[0], PW, pool[3] == "max")
                    if pool[3] != "max":
                        acc = acc * (1.0 / (pk[0] * pk[1]))
                m = (nb // step) * PW
                o = (r0 // step - lo) * PW
                out[j:j + n, o:o + m] = acc.reshape((n, m))
        return out


def conv2d(x, weight, bias, out_channels, kernel, stride, padding, dilation, act=None,
           pool=None):
    """Conv2d, then an optional activation and pool, computed a band of rows at a time (_Block)."""
    _, C, H, W = x.shape
    blk = _Block(C, H, W, weight, bias, out_channels, kernel, stride, padding, dilation, act, pool)
    out = blk.rows(x.data, 0, 0, blk.PH if blk.banded else blk.OH)
    if blk.banded:
        return Tensor(out, (1, out_channels, blk.PH, blk.PW))
    y = Tensor(out, (1, out_channels, blk.OH, blk.OW))
    if pool is not None:
        y = pool2d(y, *pool)
    return y


CONV_CHAIN = _SMALL_HEAP  # nn's Sequential hands two conv blocks in a row to conv_chain


def conv_chain(x, first, second):
    """Two conv blocks in a row (each the arguments of conv2d after x), the second computed a
    pooled row at a time from only the rows of the first's result that it reads: the first's
    result never exists whole (for the MNIST CNN its 12.5 KB, the largest block of a 64 KB
    heap). The first's rows at band edges are computed twice (a halo): cheap, as a first
    convolution has few input channels. Pools that do not tile their input run unchained."""
    if not (_chainable(first[-1]) and _chainable(second[-1])):
        return conv2d(conv2d(x, *first), *second)
    _, C, H, W = x.shape
    a = _Block(C, H, W, *first)
    b = _Block(a.out_channels, a.PH if a.banded else a.OH, a.PW, *second)
    end = b.PH if b.banded else b.OH
    gc.collect()
    out = np.zeros((b.out_channels, end * b.PW), dtype=np.float)
    for r in range(end):
        lo, hi = b.inputs_of(r, r + 1)
        rows = b.rows(a.rows(x.data, 0, lo, hi), lo, r, r + 1)
        out[:, r * b.PW:(r + 1) * b.PW] = rows
        rows = None
    return Tensor(out, (1, b.out_channels, end, b.PW))


def _chainable(pool):
    return pool is None or _in_band_pool(pool)

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
        count = _pool_windows(_padded(np.ones((1, H * W), dtype=np.float), 1, H, W, ph, pw, 0.0),
                              kh, kw, sh, sw, OH, OW, False)
    out = np.zeros((C, OH * OW), dtype=np.float)
    planes = _padded(x.data, C, H, W, ph, pw, _NEG_INF if is_max else 0.0)
    Hp = H + 2 * ph
    for c in range(C):
        acc = _pool_windows(planes[c * Hp:(c + 1) * Hp, :], kh, kw, sh, sw, OH, OW, is_max)
        if count is not None:
            acc = acc / count
        elif not is_max:
            acc = acc * (1.0 / (kh * kw))
        out[c, :] = acc.flatten()
    return Tensor(out, (1, C, OH, OW))


def _pool_windows(plane, kh, kw, sh, sw, OH, OW, is_max):
    """Max or sum over the (kh, kw) windows of a 2-D plane, stride (sh, sw): (OH, OW)."""
    acc = None
    for ky in range(kh):
        for kx in range(kw):
            v = plane[ky:ky + (OH - 1) * sh + 1:sh, kx:kx + (OW - 1) * sw + 1:sw]
            if acc is None:
                acc = np.array(v, dtype=np.float)
            elif is_max:
                acc = np.maximum(acc, v)
            else:
                acc += v
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


def _unary(op, d):
    if op == "relu":
        return np.maximum(d, 0.0)
    if op == "sigmoid":
        return np.ones(d.shape, dtype=np.float) / (np.exp(d * -1.0) + 1.0)
    if op == "tanh":
        return np.tanh(d)
    return _gelu(d, op == "gelu_tanh")


def unary(op, x):
    return Tensor(_unary(op, x.data), x.shape)


def softmax_last(x):
    if len(x.shape) != 2:
        raise NotImplementedError("Softmax on the ulab engine takes (1, n), got %s" % (x.shape,))
    e = np.exp(x.data - np.max(x.data))
    return Tensor(e / np.sum(e), x.shape)


def channel_affine(x, scale, shift):
    return Tensor(x.data * _column(scale) + _column(shift), x.shape)
