"""cn.NumPy(): the fast desktop CPU backend. Handles are C-contiguous-or-view numpy arrays."""

import math
import warnings

import numpy as np

from .. import dtypes
from ..backend import Backend, _hash32

# IEEE results (inf, nan, overflow) are the answer the protocol asks for, not a problem to
# report. Silencing NumPy's floating-point warnings for this module costs nothing per call
# (filters are consulted only when a warning fires), unlike an np.errstate block per op.
warnings.filterwarnings("ignore", category=RuntimeWarning, module=__name__)

_NP = {dtypes.float32: np.float32, dtypes.int32: np.int32, dtypes.bool_: np.bool_}
_FROM_NP = {np.dtype(np.float32): dtypes.float32, np.dtype(np.int32): dtypes.int32,
            np.dtype(np.bool_): dtypes.bool_}


def _erf(x):
    # Abramowitz-Stegun 7.1.26 is too coarse (1.5e-7 abs) near 0 for a reference; use the
    # vectorised math.erf instead, computed in float64 and rounded once.
    return _ERF(x.astype(np.float64)).astype(x.dtype)


_ERF = np.vectorize(math.erf, otypes=[np.float64])


def _floordiv(a, b):
    if a.dtype.kind == "i":
        return np.where(b == 0, 0, np.floor_divide(a, np.where(b == 0, 1, b))).astype(a.dtype)
    return np.floor_divide(a, b)


def _mod(a, b):
    if a.dtype.kind == "i":
        return np.where(b == 0, 0, np.mod(a, np.where(b == 0, 1, b))).astype(a.dtype)
    return np.mod(a, b)


_UNARY = {
    "neg": np.negative, "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "sin": np.sin,
    "cos": np.cos, "tanh": np.tanh, "erf": _erf, "abs": np.abs, "floor": np.floor,
    "ceil": np.ceil, "round": np.round, "logical_not": np.logical_not,
}
_BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "pow": np.power,
    "maximum": np.maximum, "minimum": np.minimum, "floordiv": _floordiv, "mod": _mod,
    "logical_and": np.logical_and, "logical_or": np.logical_or,
    "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
    "gt": np.greater, "ge": np.greater_equal,
}
_REDUCE = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}


def _hash32_np(x):
    x = x ^ (x >> np.uint32(16))
    x = x * np.uint32(0x7FEB352D)
    x = x ^ (x >> np.uint32(15))
    x = x * np.uint32(0x846CA68B)
    return x ^ (x >> np.uint32(16))


class NumPy(Backend):
    """Desktop CPU backend on NumPy (float32 compute, like every other backend)."""

    name = "numpy"

    def shape(self, h):
        return tuple(h.shape)

    def dtype(self, h):
        return _FROM_NP[h.dtype]

    def from_flat(self, values, shape, dtype):
        return np.asarray(values, dtype=_NP[dtype]).reshape(shape)

    def full(self, shape, value, dtype):
        return np.full(shape, value, dtype=_NP[dtype])

    def random(self, shape, distribution, seed, dtype):
        n = math.prod(shape)
        key = np.uint32(_hash32(seed))
        count = n if distribution == "uniform" else 2 * n
        bits = _hash32_np(np.arange(count, dtype=np.uint32) ^ key)
        u = (bits >> np.uint32(8)).astype(np.float64) * (1.0 / 16777216.0)
        if distribution == "normal":
            u = np.sqrt(-2.0 * np.log(1.0 - u[0::2])) * np.cos(2.0 * np.pi * u[1::2])
        return u.astype(_NP[dtype]).reshape(shape)

    def to_flat(self, h):
        return np.ascontiguousarray(h).reshape(-1).tolist()

    def to_numpy(self, h):
        return np.array(h, copy=True)

    def unary(self, op, x):
        return _UNARY[op](x)

    def binary(self, op, a, b):
        out = _BINARY[op](a, b)
        # NumPy returns float64 for int32 ** int32 and similar; keep the protocol's dtype.
        if op not in ("eq", "ne", "lt", "le", "gt", "ge") and out.dtype != a.dtype:
            out = out.astype(a.dtype)
        return out

    def where(self, cond, a, b):
        return np.where(cond, a, b)

    def cast(self, x, dtype):
        if dtype is dtypes.int32 and x.dtype.kind == "f":
            return np.trunc(x).astype(np.int32)
        return x.astype(_NP[dtype])

    def reduce(self, op, x, axis, keepdim):
        if op == "argmax" or op == "argmin":
            fn = np.argmax if op == "argmax" else np.argmin
            out = fn(x, axis=axis).astype(np.int32)
            return np.expand_dims(out, axis) if keepdim else out
        out = _REDUCE[op](x, axis=axis, keepdims=keepdim)
        return np.asarray(out, dtype=x.dtype)

    def matmul(self, a, b):
        return np.matmul(a, b)

    def reshape(self, x, shape):
        return np.reshape(x, shape)

    def permute(self, x, dims):
        return np.transpose(x, dims)

    def expand(self, x, shape):
        return np.broadcast_to(x, shape)

    def slice(self, x, starts, stops, steps):
        return x[tuple(slice(a, b, s) for a, b, s in zip(starts, stops, steps))]

    def cat(self, xs, axis):
        return np.concatenate(xs, axis=axis)

    def pad(self, x, pads, value):
        return np.pad(x, pads, mode="constant", constant_values=value)

    def gather(self, x, axis, index):
        if index.shape[:axis] + index.shape[axis + 1:] != x.shape[:axis] + x.shape[axis + 1:]:
            x = x[tuple(slice(0, n) if d != axis else slice(None) for d, n in enumerate(index.shape))]
        return np.take_along_axis(x, index.astype(np.intp), axis=axis)

    def scatter_add(self, x, axis, index, src):
        out = np.array(x, copy=True)
        grid = list(np.indices(index.shape, sparse=True))
        grid[axis] = index.astype(np.intp)
        np.add.at(out, tuple(grid), src[tuple(slice(0, n) for n in index.shape)])
        return out

    def unfold2d(self, x, kernel, stride, padding, dilation, pad_value):
        n, c, h, w = x.shape
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel, stride, padding, dilation
        xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=pad_value)
        oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
        ow = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
        s = xp.strides
        windows = np.lib.stride_tricks.as_strided(
            xp, (n, c, kh, kw, oh, ow), (s[0], s[1], s[2] * dh, s[3] * dw, s[2] * sh, s[3] * sw))
        return windows.reshape(n, c * kh * kw, oh * ow)

    def fold2d(self, cols, size, kernel, stride, padding, dilation):
        (h, w), (kh, kw), (sh, sw), (ph, pw), (dh, dw) = size, kernel, stride, padding, dilation
        n = cols.shape[0]
        c = cols.shape[1] // (kh * kw)
        oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
        ow = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
        cols = cols.reshape(n, c, kh, kw, oh, ow)
        out = np.zeros((n, c, h + 2 * ph, w + 2 * pw), dtype=cols.dtype)
        # One strided add per kernel tap: kh*kw vectorised adds instead of a loop over pixels.
        for i in range(kh):
            for j in range(kw):
                out[:, :, i * dh:i * dh + sh * (oh - 1) + 1:sh,
                    j * dw:j * dw + sw * (ow - 1) + 1:sw] += cols[:, :, i, j]
        return out[:, :, ph:ph + h, pw:pw + w]
