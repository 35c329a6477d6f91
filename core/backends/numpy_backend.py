"""cn.NumPy(): the fast desktop CPU backend. Handles are C-contiguous-or-view numpy arrays."""

import math
import warnings

import numpy as np

from .. import dtypes
from ..backend import Backend, _hash32, unfold2d_output_size
from ..errors import IndexingError
from ..ops import result_dtype

# IEEE results (inf, nan, overflow) are the answer the protocol asks for, not a problem to
# report. Silencing NumPy's floating-point warnings for this module costs nothing per call
# (filters are consulted only when a warning fires), unlike an np.errstate block per op.
warnings.filterwarnings("ignore", category=RuntimeWarning, module=__name__)

_NP = {dtypes.float32: np.float32, dtypes.int32: np.int32, dtypes.bool_: np.bool_,
       dtypes.int8: np.int8, dtypes.uint8: np.uint8, dtypes.float16: np.float16}
_FROM_NP = {np.dtype(v): k for k, v in _NP.items()}


QUANT_PANEL = 1 << 18   # values of B that matmul_quantized dequantizes at once (1 MB as float32)


def _stored(flat, index, bits):
    """Elements `index` of a flat storage array: values, or nibbles (low first) when bits == 4."""
    if bits == 4:
        return (flat[index >> 1] >> ((index & 1) * 4).astype(np.uint8)) & np.uint8(15)
    return flat[index]


def _nibble_panel(flat, layout, k, ns):
    """The (K, width) nibbles of a 4-bit B's columns ns, unpacked from a strided view of whole
    bytes where B's contiguous axis starts every row (or column) on a byte; None elsewhere (odd
    offsets or strides: index arrays)."""
    off, sk, sn = layout.q
    n0, width = int(ns[0, 0]), ns.shape[1]
    if sn == 1 and off % 2 == 0 and sk % 2 == 0 and n0 % 2 == 0:     # (K, N): along n
        lines, length, step, first, along_k = k, width, sk // 2, (off + n0) // 2, False
    elif sk == 1 and off % 2 == 0 and sn % 2 == 0:                   # (N, K): along k
        lines, length, step, first, along_k = width, k, sn // 2, (off + n0 * sn) // 2, True
    else:
        return None
    size = -(-length // 2)
    if first + (lines - 1) * step + size > flat.size:
        return None
    packed = np.lib.stride_tricks.as_strided(flat[first:], (lines, size), (step * flat.itemsize, flat.itemsize),
                                             writeable=False)
    out = np.empty((lines, 2 * size), np.uint8)
    np.bitwise_and(packed, 15, out=out[:, 0::2])
    np.right_shift(packed, 4, out=out[:, 1::2])
    return out[:, :length].T if along_k else out[:, :length]


def _dequantized(q, scale, zero_point, layout, ks, ns):
    """B[ks, ns] of matmul_quantized's layout (core/backend.py QuantizedLayout) in float32:
    (q - zero point) * scale, or a float16 B widened. Scales and zero points are gathered once
    per block of K and repeated down its rows."""
    flat = q.reshape(-1)
    if layout.bits == 4:
        values = _nibble_panel(flat, layout, ks.shape[0], ns)
        if values is None:
            values = _stored(flat, layout.q[0] + ks * layout.q[1] + ns * layout.q[2], 4)
    else:   # a strided view of the panel's values (no index arrays), widened below
        first, (_, sk, sn) = layout.q[0] + int(ns[0, 0]) * layout.q[2], layout.q
        values = np.lib.stride_tricks.as_strided(flat[first:], (ks.shape[0], ns.shape[1]),
                                                 (sk * flat.itemsize, sn * flat.itemsize), writeable=False)
    if q.dtype == np.float16:
        return values.astype(np.float32)
    k = ks.shape[0]
    block = layout.block or max(1, k)
    blocks = np.arange(-(-k // block))[:, None]

    def down_k(per_block):   # (blocks, width) -> (K, width)
        return per_block if per_block.shape[0] == 1 else np.repeat(per_block, block, axis=0)[:k]
    # (in rows of K, whatever B's contiguous axis: the per-block parameters are repeated down K)
    values = values.astype(np.int32, order="C")
    if zero_point is None:
        values -= np.int32(layout.zp_default)
    else:
        values -= down_k(_stored(zero_point.reshape(-1), layout.zp[0] + blocks * layout.zp[1] + ns * layout.zp[2],
                                 layout.zp_bits).astype(np.int32))
    scales = scale.reshape(-1)[layout.scale[0] + blocks * layout.scale[1] + ns * layout.scale[2]]
    return values.astype(np.float32) * down_k(scales)


# erf in float64, rounded once to float32: within 1 float32 ulp of the correctly rounded erf
# (~0.5% of results are 1 ulp off; math.erf per element costs ~100x more):
#   |x| < 2:       erf(x) = x * S(x^2)         (every element, by Horner, in place)
#   2 <= |x| < 4:  erf(x) = L(|x| - 3)         (those elements only: few, in most data)
#   |x| >= 4:      erf(x) = +-1                (1 - erf(4) = 1.5e-8 is below half an ulp of 1)
# S and L are the Chebyshev interpolants of erf(x)/x on x^2 in [0, 4] (degree 10) and of erf on
# [2, 4] (degree 11), in the power basis (numpy.polynomial.chebyshev.chebinterpolate of
# math.erf): relative and absolute error below 1e-9, against half a float32 ulp of >= 3e-8.
_ERF_SMALL = (1.128379166603666, -0.37612635923286747, 0.1128376165802993, -0.02686498434011635,
              0.005221554761522678, -0.0008519172136280787, 0.00011833479120651973,
              -1.3817015540529021e-05, 1.2764469534889207e-06, -8.12456644688259e-08,
              2.5875637491265284e-09)
_ERF_LARGE = (0.99997790868946, 0.0001392527908787302, -0.0004177003607232283, 0.0007891193661070013,
              -0.0010450971170379512, 0.0010163322020352674, -0.00073494032001357,
              0.0003914576360154836, -0.00014119153195342926, 1.2318377505001385e-05,
              2.214484271926646e-05, -9.620902801543707e-06)
# Blocks of 2^17 floats: the float64 temporaries (1 MB each, allocated once per call: fresh
# ones per block cost more in page faults than the arithmetic) stay in the cache.
_ERF_BLOCK = 1 << 17


def _horner(coefficients, t, out=None):
    out = np.multiply(t, coefficients[-1], out=out)
    for c in coefficients[-2:0:-1]:
        out += c
        out *= t
    out += coefficients[0]
    return out


def _erf(x):
    flat = x.reshape(-1)
    result = np.empty(flat.shape, x.dtype)
    a, t, value = (np.empty(min(flat.size, _ERF_BLOCK)) for _ in range(3))
    for start in range(0, flat.size, _ERF_BLOCK):
        block = flat[start:start + _ERF_BLOCK]
        k = block.size
        np.abs(block, out=a[:k])
        np.multiply(a[:k], a[:k], out=t[:k])
        _horner(_ERF_SMALL, t[:k], value[:k])  # meaningless for |x| >= 2: replaced below
        value[:k] *= a[:k]
        large = np.flatnonzero(a[:k] >= 2.0)  # NaN is not: it stays NaN from S
        if large.size:
            b = a[large]
            value[large] = np.where(b < 4.0, _horner(_ERF_LARGE, np.minimum(b, 4.0) - 3.0), 1.0)
        np.copysign(value[:k], block, out=result[start:start + k], casting="same_kind")
    return result.reshape(x.shape)


def _pad(x, pads, value):
    """np.pad(x, pads, constant_values=value) as a filled array and one copy into it: the same
    array, without np.pad's argument handling and per-side fills (~40 us a call, per conv)."""
    out = np.full(tuple(n + a + b for n, (a, b) in zip(x.shape, pads)), value, x.dtype)
    out[tuple(slice(a, a + n) for n, (a, _) in zip(x.shape, pads))] = x
    return out


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
    "cos": np.cos, "tanh": np.tanh, "erf": _erf,
    "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan, "abs": np.abs, "floor": np.floor,
    "ceil": np.ceil, "round": np.round, "logical_not": np.logical_not,
}
_BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "pow": np.power,
    "maximum": np.maximum, "minimum": np.minimum, "floordiv": _floordiv, "mod": _mod,
    "logical_and": np.logical_and, "logical_or": np.logical_or,
    "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
    "gt": np.greater, "ge": np.greater_equal,
}
_BOOL_RESULT = frozenset(op for op in _BINARY if result_dtype(op, dtypes.float32) is dtypes.bool_)
_REDUCE = {"sum": np.add.reduce, "prod": np.multiply.reduce, "max": np.maximum.reduce,
           "min": np.minimum.reduce}


def _hash32_np(x):
    x = x ^ (x >> np.uint32(16))
    x = x * np.uint32(0x7FEB352D)
    x = x ^ (x >> np.uint32(15))
    x = x * np.uint32(0x846CA68B)
    return x ^ (x >> np.uint32(16))


def _out_of_bounds(op, index, axis, size):
    """The IndexingError (an IndexError) every CPU backend raises for an index outside [-size, size)."""
    bad = int(index[(index < -size) | (index >= size)].flat[0])
    return IndexingError("%s: index %d is out of bounds for axis %d with size %d" % (op, bad, axis, size))


def _strided_index(layout, rows, n):
    """(rows, n) indices off + r * s_r + c * s_c of a QuantizedLayout triple (off, s_r, s_c)."""
    off, sr, sc = layout
    return off + np.arange(rows)[:, None] * sr + np.arange(n)[None, :] * sc


def _from_column(layout, n0):
    """A QuantizedLayout triple (off, s_r, s_c) moved to start at column n0."""
    off, sr, sc = layout
    return off + n0 * sc, sr, sc


def _strided_values(h, layout, rows, n, bits):
    """int32 (rows, n) values of 8-bit (or int32) storage h at a QuantizedLayout triple, or of
    its nibbles (bits 4, low first): a strided view of the bytes, gathered only for nibbles."""
    flat = h.reshape(-1)
    off, sr, sc = layout
    if bits != 4 and sr >= 0 and sc >= 0:
        size = flat.itemsize
        return np.lib.stride_tricks.as_strided(flat[off:], (rows, n), (sr * size, sc * size)).astype(np.int32)
    index = _strided_index(layout, rows, n)
    if bits == 4:
        return ((flat[index >> 1].astype(np.int32) >> ((index & 1) * 4).astype(np.int32)) & 15).astype(np.int32)
    return flat[index].astype(np.int32)


def _largest(x):
    return float(np.abs(x).max(initial=0))


def _exact_product(a, b, largest=None):
    """The exact int32 (wrapping) product of integer-valued a (..., M, K) and b (..., K, N):
    float32 GEMMs over chunks of K whose sums stay below 2**24 (8-bit differences: 258 terms),
    added in int32; float64 where the values are too large for that, int64 beyond 2**53.
    largest: a bound of |a_mk * b_kn| where the caller knows one (else measured)."""
    if largest is None:
        largest = _largest(a) * _largest(b)
    k = b.shape[-2]
    if largest * k >= 2 ** 53:
        return np.matmul(a.astype(np.int64), b.astype(np.int64)).astype(np.int32)
    step = int((2 ** 24 - 1) // largest) if largest else k
    if step < 64:
        return np.matmul(a.astype(np.float64), b.astype(np.float64)).astype(np.int64).astype(np.int32)
    a, b = a.astype(np.float32, copy=False), b.astype(np.float32, copy=False)
    total = None
    for i in range(0, k, step):
        part = np.matmul(a[..., i:i + step], b[..., i:i + step, :]).astype(np.int32)
        total = part if total is None else np.add(total, part, out=total)
    return total


class NumPy(Backend):
    """Desktop CPU backend on NumPy (float32 compute, like every other backend)."""

    name = "numpy"
    storage_dtypes = dtypes.STORAGE_DTYPES  # int8/uint8/float16 arrays
    recurrent_kernels = True  # lstm_cell, gru_cell (core/backend.py)
    normalization_kernels = True  # softmax, layer_norm (core/backend.py)
    # int8/uint8 (and a half model's float16) weights stay small in memory: matmul_quantized
    # reads B's values per call, and a QDQ activation's integers multiply them exactly
    quantized_matmul = True
    quantize_dequantize = True  # QuantizeLinear -> DequantizeLinear in whole-array steps
    quantized_conv2d = True  # conv2d_quantized: the unfolded image's integers times W's, exactly

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
        # (Builtin dtypes are singletons, so `is not` is the cheap test.)
        if out.dtype is not a.dtype and op not in _BOOL_RESULT:
            out = out.astype(a.dtype)
        return out

    def where(self, cond, a, b):
        if a.dtype.itemsize != 4 or max(cond.size, a.size, b.size) < 4096:
            return np.where(cond, a, b)
        # np.where branches per element and mispredicts on masks like relu's (~4 ns each); a
        # bitwise select, b ^ ((a ^ b) & mask) on the 32-bit patterns, is exact and ~5x faster.
        mask = cond.astype(np.int32)
        np.negative(mask, out=mask)  # True -> all bits set
        bits_b = b.view(np.int32)
        out = np.bitwise_xor(a.view(np.int32), bits_b)
        out = np.bitwise_and(out, mask, out=out if out.shape == np.broadcast_shapes(out.shape, mask.shape) else None)
        out ^= bits_b
        return out.view(a.dtype)

    def cast(self, x, dtype):
        if dtype.kind in "iu" and x.dtype.kind == "f":
            # through int32, so that 8-bit casts wrap around exactly as cn.Python's do
            x = np.trunc(x.astype(np.float32)).astype(np.int32)
        return x.astype(_NP[dtype])

    def reduce(self, op, x, axis, keepdim):
        if op == "argmax" or op == "argmin":
            fn = np.argmax if op == "argmax" else np.argmin
            out = fn(x, axis=axis).astype(np.int32)
            return np.expand_dims(out, axis) if keepdim else out
        out = _REDUCE[op](x, axis=axis, keepdims=keepdim)
        # int32 sums/products come back as int64, and reductions to 0-d as NumPy scalars.
        return out if type(out) is np.ndarray and out.dtype is x.dtype else np.asarray(out, dtype=x.dtype)

    def matmul(self, a, b):
        if a.ndim > 2 and b.shape[:-2] == (1,) * (b.ndim - 2) and a.flags.c_contiguous:
            # activations (B, S, K) by a weight (1, K, N): one (B*S, K) GEMM, not B small ones
            # (np.matmul loops over the broadcast batch)
            return np.matmul(a.reshape(-1, a.shape[-1]), b.reshape(b.shape[-2:])).reshape(a.shape[:-1] + b.shape[-1:])
        return np.matmul(a, b)

    def matmul_quantized(self, a, q, scale, zero_point, layout, a_scale=None):
        """C = a @ dequantize(B) (core/backend.py "quantized_matmul"), QUANT_PANEL values of B (a
        few columns of all of K) at a time, so no copy of the whole of B is made. Integer products
        (no scale: MatMulInteger; or a QDQ activation's a_scale) read each panel's values q - zp
        (BLAS multiplies floats) and sum them exactly (_exact_product); float products
        dequantize each panel (a float16 B, a half model's weight, is only widened)."""
        k, n = layout.k, layout.n
        block = layout.block or k
        blocks = -(-k // block)
        width = max(1, QUANT_PANEL // max(k, 1))
        integer = scale is None and q.dtype.kind != "f"
        if integer or (a_scale is not None and blocks == 1):
            a_values = a if integer else np.rint(a / a_scale)
            largest_a = _largest(a_values)
            sums = np.empty((a.shape[0], n), np.int32)
            for n0 in range(0, n, width):
                cols = min(width, n - n0)
                b = _strided_values(q, _from_column(layout.q, n0), k, cols, layout.bits)
                if zero_point is None:
                    b -= np.int32(layout.zp_default)
                else:   # (one row of zero points per block of K, repeated down its rows)
                    zp = _strided_values(zero_point, _from_column(layout.zp, n0), blocks, cols, layout.zp_bits)
                    b -= zp if blocks == 1 else np.repeat(zp, block, axis=0)[:k]
                sums[:, n0:n0 + cols] = _exact_product(a_values, b, largest_a * _largest(b))
            if integer:
                return sums
            s = scale.reshape(-1)[_strided_index(layout.scale, blocks, n)]
            return sums.astype(np.float32) * (a_scale * s)
        out = np.empty((a.shape[0], n), np.float32)
        ks = np.arange(k)[:, None]
        for n0 in range(0, n, width):
            ns = np.arange(n0, min(n, n0 + width))[None, :]
            out[:, n0:n0 + ns.shape[1]] = np.matmul(a, _dequantized(q, scale, zero_point, layout, ks, ns))
        return out

    def conv2d_quantized(self, x, x_param, q, scale, zero_point, bias, stride, padding, dilation, groups):
        """A convolution whose products are integers (core/backend.py "quantized_conv2d"): the
        image's integers (x - x_param, or rint(x / x_param) of a float32 QDQ activation) unfolded
        and multiplied by the weight's (q - zero_point), all groups in one batched product
        summed exactly (_exact_product); scaled once (* x_scale * scale[o] + bias[o]) where
        scale is given."""
        (pt, pb), (pl, pr) = padding
        if x.dtype == np.float32:
            image = np.rint(x / x_param)
        else:
            image = (x if x_param is None else x - x_param).astype(np.float32)
        if pt or pb or pl or pr:
            image = _pad(image, ((0, 0), (0, 0), (pt, pb), (pl, pr)), 0.0)
        o, cg, kh, kw = q.shape
        k = cg * kh * kw
        w = q.reshape(groups, o // groups, k).astype(np.int32)
        if zero_point is not None:
            w -= zero_point.astype(np.int32).reshape((groups, o // groups, 1) if zero_point.size > 1 else ())
        cols = self.unfold2d(image, (kh, kw), stride, (0, 0), dilation, 0.0)
        n, _, length = cols.shape
        oh, ow = unfold2d_output_size(image.shape[2], image.shape[3], (kh, kw), stride, (0, 0), dilation)
        # (the image's largest value bounds its unfolded copy's, without a pass over that)
        sums = _exact_product(w, cols.reshape(n, groups, k, length), _largest(w) * _largest(image)).reshape(
            n, o, oh, ow)
        if scale is None:
            return sums
        out = sums.astype(np.float32) * (x_param * scale.reshape(-1)).reshape(-1, 1, 1)
        return out if bias is None else np.add(out, bias.reshape(-1, 1, 1), out=out)

    def quantize_dequantize(self, x, y_scale, y_zero_point, x_scale, x_zero_point, lo, hi):
        """QuantizeLinear then DequantizeLinear (core/backend.py "quantize_dequantize"), the
        composition's float32 steps in place on one array."""
        y = np.asarray(np.rint(x / y_scale), np.float32)
        if y_zero_point is not None:
            y += y_zero_point.astype(np.float32)
        np.clip(y, np.float32(lo), np.float32(hi), out=y)
        if x_zero_point is not None:
            y -= x_zero_point.astype(np.float32)
        y *= x_scale
        return y

    # The optional recurrent primitives (core/backend.py): a step in a few whole-array calls.
    def lstm_cell(self, gates, c):
        hidden = c.shape[1]
        iof = np.float32(1.0) / (np.float32(1.0) + np.exp(-gates[:, :3 * hidden]))
        i, o, f = iof[:, :hidden], iof[:, hidden:2 * hidden], iof[:, 2 * hidden:]
        out = np.empty((2,) + c.shape, np.float32)
        new_c = out[1]
        np.multiply(f, c, out=new_c)
        new_c += i * np.tanh(gates[:, 3 * hidden:])
        np.multiply(o, np.tanh(new_c), out=out[0])
        return out

    def gru_cell(self, gx, gh, h):
        hidden = h.shape[1]
        zr = np.float32(1.0) / (np.float32(1.0) + np.exp(-(gx[:, :2 * hidden] + gh[:, :2 * hidden])))
        z = zr[:, :hidden]
        n = np.tanh(gx[:, 2 * hidden:] + zr[:, hidden:] * gh[:, 2 * hidden:])
        return (np.float32(1.0) - z) * n + z * h

    # The optional normalisation primitives (core/backend.py): the composition's float32 steps in
    # its order, on one buffer of their own written in place (the composition makes 3 and 5
    # fresh arrays: at transformer sizes, memory traffic and allocations cost more than the math).
    def softmax(self, x, axis):
        out = np.subtract(x, np.maximum.reduce(x, axis=axis, keepdims=True))
        np.exp(out, out=out)
        out /= np.add.reduce(out, axis=axis, keepdims=True)
        return out

    def layer_norm(self, x, weight, bias, eps):
        count = np.float32(x.shape[-1])
        out = np.subtract(x, np.add.reduce(x, axis=-1, keepdims=True) / count)
        variance = np.add.reduce(np.square(out), axis=-1, keepdims=True) / count
        variance += np.float32(eps)
        out /= np.sqrt(variance, out=variance)
        if weight is not None:
            out *= weight
        if bias is not None:
            out += bias
        return out

    # ndarray methods, not the np.* wrappers: these run per op, and the wrappers cost ~1 us each.
    def reshape(self, x, shape):
        return x.reshape(shape)

    def permute(self, x, dims):
        return x.transpose(dims)

    def expand(self, x, shape):
        if not x.flags.c_contiguous:
            return np.broadcast_to(x, shape)
        # np.broadcast_to's argument handling costs ~5 us; a strided view of the same memory
        # (stride 0 along the grown dims) is the same array, read-only like its result.
        out = np.ndarray(shape, x.dtype, x, 0, tuple(0 if n != m else s for n, m, s in zip(x.shape, shape, x.strides)))
        out.flags.writeable = False
        return out

    def slice(self, x, starts, stops, steps):
        return x[tuple(slice(a, b, s) for a, b, s in zip(starts, stops, steps))]

    def cat(self, xs, axis):
        return np.concatenate(xs, axis=axis)

    def pad(self, x, pads, value):
        return _pad(x, pads, value)

    def gather(self, x, axis, index):
        if index.shape[:axis] + index.shape[axis + 1:] != x.shape[:axis] + x.shape[axis + 1:]:
            x = x[tuple(slice(0, n) if d != axis else slice(None) for d, n in enumerate(index.shape))]
        try:  # NumPy checks the range already (negatives count from the end)
            if x.ndim == 2:  # cross-entropy, embeddings: plain fancy indexing, 3x cheaper
                other = np.arange(x.shape[1 - axis])
                return x[index, other] if axis == 0 else x[other[:, None], index]
            return np.take_along_axis(x, index.astype(np.intp), axis=axis)
        except IndexError:
            raise _out_of_bounds("gather", index, axis, x.shape[axis]) from None

    def scatter_add(self, x, axis, index, src):
        out = np.array(x, copy=True)
        if x.ndim == 2 and index.shape[axis] == 1:  # gather's backward for cross-entropy
            # one index per row/column: the positions are distinct, so a fancy-indexed += adds
            # each value once (np.add.at, for repeated positions, costs ~10 us more)
            src = src[:index.shape[0], :index.shape[1]]
            other = np.arange(index.shape[1 - axis])
            try:
                if axis == 1:
                    out[other[:, None], index] += src
                else:
                    out[index, other] += src
            except IndexError:
                raise _out_of_bounds("scatter_add", index, axis, x.shape[axis]) from None
            return out
        grid = list(np.indices(index.shape, sparse=True))
        grid[axis] = index.astype(np.intp)
        try:
            np.add.at(out, tuple(grid), src[tuple(slice(0, n) for n in index.shape)])
        except IndexError:
            raise _out_of_bounds("scatter_add", index, axis, x.shape[axis]) from None
        return out

    def fused_adam(self, p, g, m, v, beta1, beta2, step_size, eps):
        """cn.optim.Adam's update (see core/backend.py): the same float32 roundings in the same
        order, the moments updated in place and p' the only allocation (it serves as the
        scratch buffer first): fresh temporaries cost more than the arithmetic here."""
        # (Python floats meet float32 arrays as float32 values: NumPy 2's promotion rules.)
        out = np.subtract(g, m)
        out *= 1.0 - beta1
        m += out
        np.multiply(g, g, out=out)
        out *= 1.0 - beta2
        v *= beta2
        v += out
        np.sqrt(v, out=out)
        out += eps
        np.divide(m, out, out=out)
        out *= step_size
        return np.subtract(p, out, out=out)

    def unfold2d(self, x, kernel, stride, padding, dilation, pad_value):
        n, c, h, w = x.shape
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel, stride, padding, dilation
        xp = _pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), pad_value) if ph or pw else x
        oh, ow = unfold2d_output_size(h, w, kernel, stride, padding, dilation)
        s = xp.strides
        windows = np.lib.stride_tricks.as_strided(
            xp, (n, c, kh, kw, oh, ow), (s[0], s[1], s[2] * dh, s[3] * dw, s[2] * sh, s[3] * sw))
        return windows.reshape(n, c * kh * kw, oh * ow)

    def fold2d(self, cols, size, kernel, stride, padding, dilation):
        (h, w), (kh, kw), (sh, sw), (ph, pw), (dh, dw) = size, kernel, stride, padding, dilation
        n = cols.shape[0]
        c = cols.shape[1] // (kh * kw)
        oh, ow = unfold2d_output_size(h, w, kernel, stride, padding, dilation)
        cols = cols.reshape(n, c, kh, kw, oh, ow)
        # Windows that tile the padded image exactly (pooling: stride == kernel) write every
        # pixel once: no zero fill, and stores instead of read-add-stores.
        tiles = (sh, sw) == (kh, kw) and (dh, dw) == (1, 1) and (oh * sh, ow * sw) == (h + 2 * ph, w + 2 * pw)
        out = (np.empty if tiles else np.zeros)((n, c, h + 2 * ph, w + 2 * pw), dtype=cols.dtype)
        # One strided add per kernel tap: kh*kw vectorised adds instead of a loop over pixels.
        for i in range(kh):
            for j in range(kw):
                view = out[:, :, i * dh:i * dh + sh * (oh - 1) + 1:sh, j * dw:j * dw + sw * (ow - 1) + 1:sw]
                if tiles:
                    view[...] = cols[:, :, i, j]
                else:
                    view += cols[:, :, i, j]
        return out[:, :, ph:ph + h, pw:pw + w] if ph or pw else out
