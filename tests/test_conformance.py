"""Conformance, run on every backend of tests/backends.py.

The op table's ops (core/ops.py) get generated rows (tests/op_cases.py): every dtype they accept,
samples from their domain, edge values (every pair, for binary ops), broadcasting, both axes of
a reduction; PyTorch in float64 is the oracle, and the entry's exactness class is the bound:
    EXACT        equal to the oracle rounded to float32, on every backend
    ULP          within 2 float32 ulps, or a backend's TRANSCENDENTAL_TOLERANCES (GPUs)
    ACCUMULATED  rtol 1e-5 (float32 sums in the backend's order)

The hand-written rows below test what the table does not say: composites, scalars and dtype
promotion, broadcasting shapes, movement, indexing, images, the protocol's x // 0. Each row: a
name, the op written with cinders (`fn(*tensors)`), the same op written with NumPy (`ref(*arrays)`,
float inputs promoted to float64 and ints to int64), and the input arrays. The expected dtype
follows the reference's kind (float -> cn.float32, int -> cn.int32, bool -> cn.bool) unless the
row says otherwise; the reference is rounded to that dtype before comparing. (The browser suites
replay these rows: e2e/primitive_trace.py.)
"""

import math

import numpy as np
import pytest

import cinders as cn
from cinders import ops
from cinders.backend import reference_random

import backends as backend_registry
import op_cases

_rng = np.random.default_rng(1234)


def F(*shape, lo=-3.0, hi=3.0):
    return _rng.uniform(lo, hi, shape).astype(np.float32)


def I(*shape, lo=-6, hi=7):  # noqa: E743
    return _rng.integers(lo, hi, shape).astype(np.int32)


def B(*shape):
    return _rng.integers(0, 2, shape).astype(np.bool_)


# every float special: infinities, signed zeros, NaN, halves (for round-half-even)
SPECIAL = np.array([-np.inf, -2.5, -1.5, -1.0, -0.5, -0.0, 0.0, 0.5, 1.5, 2.5, 7.25, np.inf, np.nan],
                   np.float32)
INT_A = np.array([7, -7, 7, -7, 0, 5, -1, 6], np.int32)
INT_B = np.array([2, 2, -2, -2, 3, 0, 4, -4], np.int32)


class Case:
    def __init__(self, name, fn, ref, *inputs, dtype=None, tol=None):
        self.name, self.fn, self.ref, self.inputs, self.dtype, self.tol = name, fn, ref, inputs, dtype, tol

    def __repr__(self):
        return self.name


def _np_floordiv(a, b):
    if a.dtype.kind == "i":
        return np.where(b == 0, 0, np.floor_divide(a, np.where(b == 0, 1, b)))
    return np.floor_divide(a, b)


def _np_mod(a, b):
    if a.dtype.kind == "i":
        return np.where(b == 0, 0, np.mod(a, np.where(b == 0, 1, b)))
    return np.mod(a, b)


_erf = np.vectorize(math.erf, otypes=[np.float64])


def _np_softmax(x, axis):
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def _np_log_softmax(x, axis):
    z = x - x.max(axis, keepdims=True)
    return z - np.log(np.exp(z).sum(axis, keepdims=True))


def _np_gelu(x):
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def _np_conv2d(x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    sh, sw = (stride, stride) if isinstance(stride, int) else stride
    ph, pw = (padding, padding) if isinstance(padding, int) else padding
    dh, dw = (dilation, dilation) if isinstance(dilation, int) else dilation
    x = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    oh, ow = (h - dh * (kh - 1) - 1) // sh + 1, (wd - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n, o, oh, ow))
    for oc in range(o):
        g = oc // (o // groups)
        for i in range(kh):
            for j in range(kw):
                patch = x[:, g * cg:(g + 1) * cg, i * dh:i * dh + sh * (oh - 1) + 1:sh,
                          j * dw:j * dw + sw * (ow - 1) + 1:sw]
                out[:, oc] += np.einsum("nchw,c->nhw", patch, w[oc, :, i, j])
    return out if b is None else out + b.reshape(1, o, 1, 1)


# conv2d's activations (functional.CONV_ACTIVATIONS) in float64
_NP_CONV_ACTIVATIONS = {
    "silu": lambda y: y / (1.0 + np.exp(-y)),
    "hardswish": lambda y: y * np.clip(y + 3.0, 0.0, 6.0) / 6.0,
    "hardsigmoid": lambda y: np.clip(y + 3.0, 0.0, 6.0) / 6.0,
}


def _conv_activation_case(activation, x, w, stride, padding, groups):
    """A conv2d row with a bias and `activation` (depthwise where groups == C: 3x3 to 7x7 taps
    whose rows and columns fall inside the image and at its padded borders)."""
    return Case("conv2d %s %dx%d stride %d groups %d" % (activation, w.shape[2], w.shape[3], stride, groups),
                lambda x, w, b: cn.conv2d(x, w, b, stride, padding, 1, groups, activation),
                lambda x, w, b: _NP_CONV_ACTIVATIONS[activation](_np_conv2d(x, w, b, stride, padding, 1, groups)),
                x, w, F(w.shape[0]))


def _np_windows(x, k, stride, padding, pad_value):
    x = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)), constant_values=pad_value)
    win = np.lib.stride_tricks.sliding_window_view(x, (k, k), axis=(2, 3))
    return win[:, :, ::stride, ::stride]  # (N, C, OH, OW, k, k)


def _np_max_pool(x, k, stride, padding):
    return _np_windows(x, k, stride, padding, -np.inf).max(axis=(4, 5))


def _np_avg_pool(x, k, stride, padding, count_include_pad):
    total = _np_windows(x, k, stride, padding, 0.0).sum(axis=(4, 5))
    if count_include_pad:
        return total / (k * k)
    counts = _np_windows(np.ones((1, 1) + x.shape[2:]), k, stride, padding, 0.0).sum(axis=(4, 5))
    return total / counts


def _binary_cases():
    ops = {
        "add": (lambda a, b: a + b), "sub": (lambda a, b: a - b),
        "mul": (lambda a, b: a * b), "div": (lambda a, b: a / b),
    }
    shapes = [((2, 3), (2, 3)), ((2, 3), (3,)), ((2, 1), (1, 3)), ((4, 1, 3), (2, 1)),
              ((0, 3), (3,)), ((), (2, 2))]
    out = []
    for name, f in ops.items():
        for sa, sb in shapes:
            out.append(Case("%s%s%s" % (name, sa, sb), f, f, F(*sa), F(*sb, lo=0.5, hi=3.0)))
    return out


CASES = _binary_cases() + [
    # scalars on either side, dtype promotion with Python numbers and between tensors
    Case("add scalar", lambda a: a + 2.5, lambda a: a + 2.5, F(2, 3)),
    Case("rsub scalar", lambda a: 1 - a, lambda a: 1 - a, F(2, 3)),
    Case("rdiv scalar", lambda a: 2.0 / a, lambda a: 2.0 / a, F(3, lo=0.5)),
    Case("rpow scalar", lambda a: 2 ** a, lambda a: 2.0 ** a, F(4)),
    Case("int + int scalar", lambda a: a + 3, lambda a: a + 3, I(2, 3)),
    Case("int * float scalar", lambda a: a * 0.5, lambda a: a * 0.5, I(2, 3)),
    Case("int + float tensor", lambda a, b: a + b, lambda a, b: a + b, I(2, 3), F(3)),
    Case("bool + int", lambda a, b: a + b, lambda a, b: a.astype(np.int64) + b, B(4), I(4)),
    Case("bool * bool -> int", lambda a, b: a * b, lambda a, b: a.astype(np.int64) * b, B(5), B(5)),
    Case("int / int -> float", lambda a, b: a / b, lambda a, b: a / b, INT_A[:5], INT_B[:5]),
    Case("div by zero", lambda a, b: a / b, lambda a, b: a / b,
         np.array([1, -1, 0], np.float32), np.zeros(3, np.float32)),
    Case("int // (negatives, /0)", lambda a, b: a // b, _np_floordiv, INT_A, INT_B),
    Case("int % (negatives, /0)", lambda a, b: a % b, _np_mod, INT_A, INT_B),
    Case("float //", lambda a, b: a // b, _np_floordiv,
         np.array([7.5, -7.5, 7.5, -7.5, 1.0], np.float32), np.array([2, 2, -2, -2, 0], np.float32)),
    Case("float %", lambda a, b: a % b, _np_mod,
         np.array([7.5, -7.5, 7.5, -7.5, 0.0], np.float32), np.array([2, 2, -2, -2, 3], np.float32)),
    Case("int // scalar", lambda a: a // 3, lambda a: a // 3, INT_A),
    Case("int % scalar", lambda a: a % -3, lambda a: a % -3, INT_A),
    Case("pow square of negatives", lambda a: a ** 2, lambda a: a ** 2, F(6)),
    # comparisons with scalars and across dtypes -> bool
    Case("lt bcast", lambda a, b: a < b, np.less, F(2, 3), F(3)),
    Case("gt scalar", lambda a: a > 0.5, lambda a: a > 0.5, SPECIAL),
    Case("ge int vs float", lambda a, b: a >= b, np.greater_equal, I(4), F(4)),
    # composites
    Case("sigmoid", lambda a: a.sigmoid(), lambda a: 1 / (1 + np.exp(-a)),
         np.concatenate([F(6), [-100.0, 100.0, -np.inf, np.inf, np.nan]]).astype(np.float32)),
    Case("relu", lambda a: a.relu(), lambda a: np.maximum(a, 0), SPECIAL),
    Case("relu int", lambda a: cn.relu(a), lambda a: np.maximum(a, 0), INT_A),
    Case("gelu", lambda a: a.gelu(), _np_gelu, np.concatenate([F(8, lo=-6, hi=6), SPECIAL[:-1]]).astype(np.float32)),
    Case("softmax -1", lambda a: a.softmax(-1), lambda a: _np_softmax(a, -1), F(3, 5)),
    Case("softmax 0", lambda a: cn.softmax(a, 0), lambda a: _np_softmax(a, 0), F(3, 5)),
    Case("softmax large", lambda a: a.softmax(), lambda a: _np_softmax(a, -1),
         np.array([[1000.0, 999.0, -1000.0], [-np.inf, 0.0, 1.0]], np.float32)),
    Case("log_softmax", lambda a: a.log_softmax(1), lambda a: _np_log_softmax(a, 1), F(2, 3, 4)),
    Case("log_softmax large", lambda a: cn.log_softmax(a), lambda a: _np_log_softmax(a, -1),
         np.array([[1000.0, 999.0, -1000.0], [-np.inf, 0.0, 1.0]], np.float32)),
    Case("clamp", lambda a: a.clamp(-1.0, 1.5), lambda a: np.clip(a, -1.0, 1.5), SPECIAL),
    Case("clamp min", lambda a: a.clamp(min=0.5), lambda a: np.maximum(a, 0.5), SPECIAL),
    Case("clamp max int", lambda a: a.clamp(max=2), lambda a: np.minimum(a, 2), INT_A),
    # reductions
    Case("sum all", lambda a: a.sum(), lambda a: a.sum(), F(3, 4)),
    Case("sum 0", lambda a: a.sum(0), lambda a: a.sum(0), F(3, 4)),
    Case("sum -1 keepdim", lambda a: a.sum(-1, keepdim=True), lambda a: a.sum(-1, keepdims=True), F(2, 3, 4)),
    Case("sum tuple", lambda a: a.sum((0, 2)), lambda a: a.sum((0, 2)), F(2, 3, 4)),
    Case("sum tuple keepdim", lambda a: a.sum((-1, 0), keepdim=True),
         lambda a: a.sum((0, 2), keepdims=True), F(2, 3, 4)),
    Case("sum all keepdim", lambda a: a.sum(keepdim=True), lambda a: a.sum(keepdims=True), F(2, 3)),
    Case("sum int", lambda a: a.sum(1), lambda a: a.sum(1), I(3, 4)),
    Case("sum bool -> int", lambda a: a.sum(), lambda a: a.sum(dtype=np.int64), B(3, 4)),
    Case("sum empty axis", lambda a: a.sum(1), lambda a: a.sum(1), F(3, 0)),
    Case("sum of empty", lambda a: a.sum(), lambda a: a.sum(), F(0, 4)),
    Case("prod", lambda a: a.prod(1), lambda a: a.prod(1), F(3, 4, lo=0.5, hi=1.5)),
    Case("prod empty axis", lambda a: a.prod(0), lambda a: a.prod(0), F(0, 2)),
    Case("prod int", lambda a: a.prod(), lambda a: a.prod(), I(5, lo=1, hi=4)),
    Case("max", lambda a: a.max(0), lambda a: a.max(0), F(3, 4)),
    Case("max all", lambda a: a.max(), lambda a: a.max(), F(3, 4)),
    Case("max NaN", lambda a: a.max(1), lambda a: a.max(1), SPECIAL[:12].reshape(3, 4)),
    Case("min -inf/NaN", lambda a: a.min(-1, keepdim=True), lambda a: a.min(-1, keepdims=True),
         SPECIAL[:12].reshape(4, 3)),
    Case("max int", lambda a: a.max(1), lambda a: a.max(1), I(2, 5)),
    Case("min tuple", lambda a: a.min((1, 2)), lambda a: a.min((1, 2)), F(2, 3, 4)),
    Case("argmax", lambda a: a.argmax(1), lambda a: a.argmax(1), F(3, 5)),
    Case("argmax ties first", lambda a: a.argmax(-1), lambda a: a.argmax(-1),
         np.array([[1, 3, 3, 2], [5, 5, 5, 5]], np.float32)),
    Case("argmin ties first", lambda a: a.argmin(0, keepdim=True), lambda a: a.argmin(0, keepdims=True),
         np.array([[1, 3], [0, 3], [0, 2]], np.int32)),
    Case("argmax all (flat)", lambda a: a.argmax(), lambda a: a.argmax(), F(3, 4)),
    Case("mean", lambda a: a.mean(), lambda a: a.mean(), F(3, 4)),
    Case("mean axis keepdim", lambda a: a.mean(-1, keepdim=True), lambda a: a.mean(-1, keepdims=True), F(2, 5)),
    Case("mean tuple", lambda a: a.mean((0, 2)), lambda a: a.mean((0, 2)), F(2, 3, 4)),
    Case("mean int -> float", lambda a: a.mean(0), lambda a: a.mean(0), I(3, 2)),
    Case("any", lambda a: a.any(1), lambda a: a.any(1), B(3, 4)),
    Case("all", lambda a: a.all(0), lambda a: a.all(0), B(3, 4)),
    # matmul
    Case("matmul 2d", lambda a, b: a @ b, np.matmul, F(3, 4), F(4, 5)),
    Case("matmul batched", lambda a, b: a @ b, np.matmul, F(2, 3, 4), F(2, 4, 2)),
    Case("matmul batch bcast", lambda a, b: cn.matmul(a, b), np.matmul, F(2, 1, 3, 4), F(3, 4, 2)),
    Case("matmul 1d @ 2d", lambda a, b: a @ b, np.matmul, F(4), F(4, 3)),
    Case("matmul 2d @ 1d", lambda a, b: a @ b, np.matmul, F(3, 4), F(4)),
    Case("matmul 1d @ 1d", lambda a, b: a @ b, np.matmul, F(4), F(4)),
    Case("matmul 1d @ 3d", lambda a, b: a @ b, np.matmul, F(4), F(2, 4, 3)),
    Case("matmul K=0", lambda a, b: a @ b, np.matmul, F(2, 0), F(0, 3)),
    # movement
    Case("reshape -1", lambda a: a.reshape(-1, 2), lambda a: a.reshape(-1, 2), F(2, 3, 2)),
    Case("reshape to 0-d", lambda a: a.reshape(()), lambda a: a.reshape(()), F(1, 1)),
    Case("permute", lambda a: a.permute(2, 0, 1), lambda a: a.transpose(2, 0, 1), F(2, 3, 4)),
    Case("transpose", lambda a: a.transpose(0, -1), lambda a: a.swapaxes(0, -1), F(2, 3, 4)),
    Case("T", lambda a: a.T, lambda a: a.T, F(2, 3)),
    Case("unsqueeze -1", lambda a: a.unsqueeze(-1), lambda a: a[..., None], F(2, 3)),
    Case("squeeze", lambda a: a.squeeze(), lambda a: a.squeeze(), F(1, 3, 1)),
    Case("squeeze dim", lambda a: a.squeeze(-1), lambda a: a.squeeze(-1), F(1, 3, 1)),
    Case("flatten", lambda a: a.flatten(1), lambda a: a.reshape(2, -1), F(2, 3, 4)),
    Case("expand", lambda a: a.expand(2, 3, -1), lambda a: np.broadcast_to(a, (2, 3, 4)), F(3, 1)[:, :1] * 0 + F(1, 4)),
    Case("expand then op", lambda a: a.expand(3, 4) * 2, lambda a: np.broadcast_to(a, (3, 4)) * 2, F(3, 1)),
    Case("permute then op", lambda a: a.permute(1, 0) + 1, lambda a: a.T + 1, F(2, 3)),
    # indexing
    Case("index int", lambda a: a[1], lambda a: a[1], F(3, 4)),
    Case("index negative", lambda a: a[-1, -2], lambda a: a[-1, -2], F(3, 4)),
    Case("index slices", lambda a: a[1:, ::2], lambda a: a[1:, ::2], F(3, 5)),
    Case("index step 3 clip", lambda a: a[:, 1:100:3], lambda a: a[:, 1:100:3], F(2, 8)),
    Case("index empty slice", lambda a: a[2:1], lambda a: a[2:1], F(3, 2)),
    Case("index None", lambda a: a[None, :, None], lambda a: a[None, :, None], F(3, 2)),
    Case("index Ellipsis", lambda a: a[..., 0], lambda a: a[..., 0], F(2, 3, 4)),
    Case("index mixed", lambda a: a[0, ..., 1:3, None], lambda a: a[0, ..., 1:3, None], F(2, 3, 4)),
    Case("index list", lambda a: a[:, [2, 0, -1]], lambda a: a[:, [2, 0, -1]], F(2, 4)),
    Case("index tensor", lambda a, i: a[i], lambda a, i: a[i], F(4, 3), np.array([3, -1, 0, 0], np.int32)),
    Case("index 2-d tensor", lambda a, i: a[1:, i], lambda a, i: a[1:, i], F(3, 4),
         np.array([[0, 1], [3, 2]], np.int32)),
    Case("index then op", lambda a: a[:, 1:] - a[:, :-1], lambda a: a[:, 1:] - a[:, :-1], F(2, 4)),
    Case("index negative steps", lambda a: a[::-1, 5:1:-2], lambda a: a[::-1, 5:1:-2], F(3, 7)),
    Case("index negative step empty", lambda a: a[1:3:-1], lambda a: a[1:3:-1], F(4, 2)),
    Case("index bool mask", lambda a: a[a > 0], lambda a: a[a > 0], F(3, 4)),
    Case("index bool mask rows", lambda a, m: a[m], lambda a, m: a[m], F(4, 3), np.array([True, False, True, True])),
    Case("index bool mask of ints", lambda a: a[:, [False, True, True]], lambda a: a[:, [False, True, True]], I(2, 3)),
    Case("setitem int slice", lambda a: _assign(a, (0, slice(None, 2)), 1.0), lambda a: _np_assign(a, (0, slice(None, 2)), 1.0), F(3, 4)),
    Case("setitem mask", lambda a: _assign(a, a > 0, 0.0), lambda a: _np_assign(a, a > 0, 0.0), F(3, 4)),
    Case("setitem list tensor value", lambda a, v: _assign(a, [2, 0], v), lambda a, v: _np_assign(a, [2, 0], v), F(3, 4), F(4)),
    Case("setitem negative step", lambda a, v: _assign(a, (slice(None), slice(None, None, -2)), v),
         lambda a, v: _np_assign(a, (slice(None), slice(None, None, -2)), v), F(2, 5), F(2, 3)),
    Case("setitem ints", lambda a: _assign(a, (1, [0, 2]), 9), lambda a: _np_assign(a, (1, [0, 2]), 9), I(2, 3)),
    Case("setitem bools", lambda a: _assign(a, 0, True), lambda a: _np_assign(a, 0, True), B(2, 3)),
    Case("gather", lambda a, i: a.gather(1, i), lambda a, i: np.take_along_axis(a, i.astype(np.intp), 1),
         F(3, 4), np.array([[0, 3], [1, 1], [2, 0]], np.int32)),
    Case("gather axis 0 smaller", lambda a, i: a.gather(0, i),
         lambda a, i: np.take_along_axis(a[:, :2], i.astype(np.intp), 0), F(3, 4),
         np.array([[2, 0], [1, 1]], np.int32)),
    Case("scatter_add", lambda a, i, s: a.scatter_add(1, i, s),
         lambda a, i, s: _np_scatter_add(a, 1, i, s), F(2, 3), np.array([[0, 0], [2, 1]], np.int32), F(2, 2)),
    # joining, selecting, padding, casting
    Case("cat", lambda a, b: cn.cat([a, b], 0), lambda a, b: np.concatenate([a, b], 0), F(2, 3), F(1, 3)),
    Case("cat -1 with empty", lambda a, b: cn.cat([a, b], -1), lambda a, b: np.concatenate([a, b], -1),
         F(2, 0), F(2, 3)),
    Case("cat promotes", lambda a, b: cn.cat([a, b]), lambda a, b: np.concatenate([a, b]), I(2), F(3)),
    Case("stack", lambda a, b: cn.stack([a, b], 1), lambda a, b: np.stack([a, b], 1), F(2, 3), F(2, 3)),
    Case("stack -1", lambda a, b: cn.stack([a, b], -1), lambda a, b: np.stack([a, b], -1), I(2, 3), I(2, 3)),
    Case("where", lambda c, a, b: cn.where(c, a, b), np.where, B(2, 3), F(2, 3), F(3)),
    Case("where scalars", lambda c: cn.where(c, 1.0, 0), lambda c: np.where(c, 1.0, 0.0), B(4)),
    Case("where int", lambda c, a: cn.where(c, a, -1), lambda c, a: np.where(c, a, -1), B(2, 1), I(1, 3)),
    Case("one_hot", lambda i: cn.one_hot(i, 4), lambda i: np.eye(4, dtype=np.int64)[i], np.array([0, 3, 1], np.int32)),
    Case("one_hot float 2-d", lambda i: cn.one_hot(i, 3, dtype=cn.float32),
         lambda i: np.eye(3)[i], np.array([[0, 2], [1, 1]], np.int32)),
    Case("pad", lambda a: cn.pad(a, (1, 2)), lambda a: np.pad(a, ((0, 0), (1, 2))), F(2, 3)),
    Case("pad value 2 dims", lambda a: cn.pad(a, (0, 1, 2, 0), value=-1.5),
         lambda a: np.pad(a, ((2, 0), (0, 1)), constant_values=-1.5), F(2, 3)),
    Case("pad int", lambda a: cn.pad(a, (1, 1), value=7), lambda a: np.pad(a, (1, 1), constant_values=7), I(3)),
    Case("cast float->int truncates", lambda a: a.cast(cn.int32), lambda a: np.trunc(a).astype(np.int64),
         np.array([-2.7, -0.5, 0.0, 0.5, 2.7, 3.0], np.float32)),
    Case("cast ->bool", lambda a: a.cast(cn.bool), lambda a: a != 0, np.array([-1.5, 0.0, 2.0, -0.0], np.float32)),
    Case("cast bool->float", lambda a: a.float(), lambda a: a.astype(np.float64), B(5)),
    Case("cast int->float", lambda a: a.cast(cn.float32), lambda a: a.astype(np.float64), INT_A),
    # images
    Case("conv2d", lambda x, w: cn.conv2d(x, w), _np_conv2d, F(2, 3, 5, 5), F(4, 3, 3, 3)),
    Case("conv2d stride pad bias", lambda x, w, b: cn.conv2d(x, w, b, stride=2, padding=1),
         lambda x, w, b: _np_conv2d(x, w, b, 2, 1), F(1, 2, 6, 5), F(3, 2, 3, 3), F(3)),
    Case("conv2d dilation rect", lambda x, w: cn.conv2d(x, w, padding=(1, 0), dilation=(2, 1)),
         lambda x, w: _np_conv2d(x, w, None, 1, (1, 0), (2, 1)), F(1, 2, 6, 6), F(2, 2, 2, 3)),
    Case("conv2d groups", lambda x, w: cn.conv2d(x, w, groups=2, padding=1),
         lambda x, w: _np_conv2d(x, w, None, 1, 1, 1, 2), F(2, 4, 4, 4), F(6, 2, 3, 3)),
    Case("conv2d depthwise", lambda x, w: cn.conv2d(x, w, groups=3),
         lambda x, w: _np_conv2d(x, w, None, 1, 0, 1, 3), F(1, 3, 4, 4), F(3, 1, 2, 2)),
    _conv_activation_case("silu", F(1, 3, 6, 7), F(4, 3, 3, 3), 1, 1, 1),
    _conv_activation_case("hardswish", F(1, 4, 9, 10), F(4, 1, 3, 3), 1, 1, 4),
    _conv_activation_case("silu", F(2, 3, 8, 9), F(3, 1, 3, 3), 2, 1, 3),
    _conv_activation_case("hardsigmoid", F(1, 3, 11, 12), F(3, 1, 5, 5), 2, 2, 3),
    _conv_activation_case("silu", F(1, 2, 13, 15), F(4, 1, 7, 7), 2, 3, 2),
    _conv_activation_case("hardswish", F(1, 2, 12, 11), F(2, 1, 5, 5), 1, 2, 2),
    Case("max_pool2d", lambda x: cn.max_pool2d(x, 2), lambda x: _np_max_pool(x, 2, 2, 0), F(2, 2, 4, 6)),
    Case("max_pool2d pad stride", lambda x: cn.max_pool2d(x, 3, stride=2, padding=1),
         lambda x: _np_max_pool(x, 3, 2, 1), F(1, 2, 5, 5, lo=-5, hi=-1)),
    Case("avg_pool2d", lambda x: cn.avg_pool2d(x, 2), lambda x: _np_avg_pool(x, 2, 2, 0, True), F(1, 2, 4, 4)),
    Case("avg_pool2d pad", lambda x: cn.avg_pool2d(x, 3, 2, 1),
         lambda x: _np_avg_pool(x, 3, 2, 1, True), F(1, 1, 5, 5)),
    # more edge cases: 0-d tensors, empty dims, size-1 axes, negative axes
    Case("0-d + 0-d", lambda a, b: a + b, lambda a, b: a + b, F(), F()),
    Case("0-d exp", lambda a: a.exp(), np.exp, F()),
    Case("0-d sum", lambda a: a.sum(), lambda a: a.sum(), F()),
    Case("0-d expand", lambda a: a.expand(2, 3), lambda a: np.broadcast_to(a, (2, 3)), F()),
    Case("0-d flatten", lambda a: a.flatten(), lambda a: a.reshape(1), F()),
    Case("empty bcast", lambda a, b: a * b, lambda a, b: a * b, F(0, 1), F(1, 3)),
    Case("empty matmul M=0", lambda a, b: a @ b, np.matmul, F(0, 4), F(4, 3)),
    Case("mean of empty is NaN", lambda a: a.mean(0), lambda a: np.full(a.shape[1:], np.nan), F(0, 2)),
    Case("pad empty dim", lambda a: cn.pad(a, (0, 0, 1, 1)), lambda a: np.pad(a, ((1, 1), (0, 0))), F(0, 3)),
    Case("max size-1 axis", lambda a: a.max(1), lambda a: a.max(1), F(3, 1)),
    Case("argmax size-1 axis", lambda a: a.argmax(-1), lambda a: a.argmax(-1), F(3, 1)),
    Case("max keepdim middle", lambda a: a.max(1, keepdim=True), lambda a: a.max(1, keepdims=True), F(2, 3, 4)),
    Case("prod negatives zeros", lambda a: a.prod(-1), lambda a: a.prod(-1),
         np.array([[-1.5, 2.0, -3.0], [4.0, 0.0, -1.0]], np.float32)),
    Case("sum int negatives", lambda a: a.sum(), lambda a: a.sum(), INT_A),
    Case("where NaN", lambda c, a, b: cn.where(c, a, b), np.where, np.array([True, False, True]),
         np.array([np.nan, 1.0, np.inf], np.float32), np.array([0.0, np.nan, 2.0], np.float32)),
    Case("int < float scalar", lambda a: a < 0.5, lambda a: a < 0.5, INT_A),
    Case("unsqueeze -3", lambda a: a.unsqueeze(-3), lambda a: a[None], F(2, 3)),
    Case("unsqueeze -2", lambda a: a.unsqueeze(-2), lambda a: a[:, None], F(2, 3)),
    Case("cat -2", lambda a, b: cn.cat([a, b], -2), lambda a, b: np.concatenate([a, b], -2), F(2, 2, 3), F(2, 1, 3)),
    Case("gather -1", lambda a, i: a.gather(-1, i), lambda a, i: np.take_along_axis(a, i.astype(np.intp), -1),
         F(2, 3), np.array([[2], [0]], np.int32)),
    Case("log_softmax 1-d", lambda a: a.log_softmax(0), lambda a: _np_log_softmax(a, 0), F(5)),
    Case("softmax -2 of 3-d", lambda a: a.softmax(-2), lambda a: _np_softmax(a, -2), F(2, 3, 4)),
    Case("cast negative ->bool", lambda a: a.bool(), lambda a: a != 0, INT_A),
    Case("conv2d 1x1 stride 2", lambda x, w: cn.conv2d(x, w, stride=2), lambda x, w: _np_conv2d(x, w, None, 2),
         F(2, 3, 5, 4), F(2, 3, 1, 1)),
    Case("max_pool2d dilation", lambda x: cn.max_pool2d(x, 2, stride=1, dilation=2),
         lambda x: np.maximum.reduce([x[:, :, i:i + 3, j:j + 3] for i in (0, 2) for j in (0, 2)]), F(1, 2, 5, 5)),
    Case("avg_pool2d pad exclude", lambda x: cn.avg_pool2d(x, 3, 2, 1, count_include_pad=False),
         lambda x: _np_avg_pool(x, 3, 2, 1, False), F(1, 2, 5, 5)),
]


def _assign(a, key, value):
    out = a * 1 if a.dtype is not cn.bool else a.logical_not().logical_not()  # a copy to write into
    out[key] = value
    return out


def _np_assign(a, key, value):
    out = a.copy()
    out[key] = value
    return out


def _np_scatter_add(a, axis, index, src):
    out = a.copy()
    grid = list(np.indices(index.shape, sparse=True))
    grid[axis] = index.astype(np.intp)
    np.add.at(out, tuple(grid), src[tuple(slice(0, n) for n in index.shape)])
    return out


_EXPECTED_DTYPE = {"f": cn.float32, "i": cn.int32, "u": cn.int32, "b": cn.bool}
_NP_OF = {cn.float32: np.float32, cn.int32: np.int32, cn.bool: np.bool_}


def _ref_input(x):
    if x.dtype.kind == "f":
        return x.astype(np.float64)
    if x.dtype.kind == "i":
        return x.astype(np.int64)
    return x


def check(backend_name, out, expected, dtype=None, tol=None, ulps=None):
    """out (a cinders Tensor) equals expected (a NumPy value) in shape, dtype and values: floats
    within (rtol, atol) = tol, or within `ulps` float32 steps when given; either way within the
    backend's TOLERANCES (tests/backends.py)."""
    expected = np.asarray(expected)
    dtype = dtype or _EXPECTED_DTYPE[expected.dtype.kind]
    assert isinstance(out, cn.Tensor), "expected a Tensor, got %r" % (out,)
    assert out.shape == expected.shape, "shape %s, expected %s" % (out.shape, expected.shape)
    assert out.dtype is dtype, "dtype %r, expected %r" % (out.dtype, dtype)
    with np.errstate(all="ignore"):
        want = expected.astype(_NP_OF[dtype])
    got = np.array(out.tolist(), dtype=_NP_OF[dtype]).reshape(out.shape)
    if dtype is cn.float32:
        rtol, atol = tol or (2e-6, 1e-6)
        loose = backend_registry.TOLERANCES.get(backend_name)
        if loose:
            rtol, atol = max(rtol, loose[0]), max(atol, loose[1])
        if ulps is None:
            np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True)
        else:
            with np.errstate(invalid="ignore"):
                close = (_ulps(got, want) <= ulps) | (np.abs(got - want) <= atol + rtol * np.abs(want))
            assert close.all(), "%s, expected %s (more than %d ulps apart)" % (got[~close], want[~close], ulps)
        # infinities and NaN in the same places, with the same signs
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_array_equal(np.where(np.isinf(got), got, 0), np.where(np.isinf(want), want, 0))
    else:
        np.testing.assert_array_equal(got, want)


# matmul/conv sum many float32 products: compare with a tolerance that scales with the length
_SUMS = ("matmul", "conv2d", "sum", "mean", "prod", "softmax", "log_softmax", "avg_pool2d", "gelu")


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_op(backend_name, backend, case):
    tensors = [cn.tensor(x, backend=backend) for x in case.inputs]
    out = case.fn(*tensors)
    with np.errstate(all="ignore"):
        expected = case.ref(*[_ref_input(x) for x in case.inputs])
    tol = case.tol or ((1e-5, 1e-5) if case.name.split(" ")[0].split("(")[0] in _SUMS else None)
    check(backend_name, out, expected, case.dtype, tol)


# Generated rows that fail on a backend for a bug outside the tests' reach (its kernels belong to
# another part of the tree): backend name prefix -> {row label: the bug}.
KNOWN_BUGS = {
    ("wgpu", "autodiff-wgpu", "fusion-wgpu", "autodiff-fusion-wgpu"): {
        "pow float32 edges": "WGSL pow(0, y < 0) gives 0, not inf (and pow(-0, -inf) too)",
        "pow int32 edges": "WGSL pow(0, y < 0) gives 0, not inf",
        "floordiv float32 edges": "WGSL floor(x / inf) gives -0 for x < 0, not -1 (NumPy, PyTorch, Python)",
        "mod float32 edges": "WGSL x % inf gives NaN, not x (or inf - |x| by the sign rule)",
    },
}


def _known_bug(backend_name, label):
    for names, bugs in KNOWN_BUGS.items():
        if backend_name in names and label in bugs:
            return bugs[label]
    return None


def _ulps(got, want):
    """Distance in float32 steps (0 where both are NaN, huge where only one is)."""
    def ordered(x):
        bits = x.view(np.int32).astype(np.int64)
        return np.where(bits < 0, -(bits & 0x7FFFFFFF), bits)
    distance = np.abs(ordered(got) - ordered(want))
    return np.where(np.isnan(got) & np.isnan(want), 0, np.where(np.isnan(got) ^ np.isnan(want), 2 ** 32, distance))


@pytest.mark.parametrize("row", op_cases.conformance_rows(), ids=repr)
def test_table_op(request, backend_name, backend, row):
    bug = _known_bug(backend_name, row.label)
    if bug:  # strict: the row fails the suite again once the bug is fixed, to be taken off the list
        request.applymarker(pytest.mark.xfail(reason=bug, strict=True))
    out = op_cases.apply_method(row.name, [cn.tensor(x, backend=backend) for x in row.inputs], row.axis)
    expected, dtype = op_cases.oracle(row.name, row.inputs, row.axis)
    exactness = ops.OPS[row.name].exactness
    if exactness == ops.ULP:
        tol = backend_registry.TRANSCENDENTAL_TOLERANCES.get(backend_name, (0.0, 0.0))
        check(backend_name, out, expected, dtype, tol=tol, ulps=2)
    elif exactness == ops.ACCUMULATED:
        check(backend_name, out, expected, dtype, tol=(1e-5, 1e-5))
    else:
        check(None, out, expected, dtype, tol=(0.0, 0.0))


# -- creation and reading ---------------------------------------------------------------------------

def test_tensor_from_nested_lists(backend):
    t = cn.tensor([[1, 2, 3], [4, 5, 6]], backend=backend)
    assert (t.shape, t.dtype, t.backend) == ((2, 3), cn.int32, backend)
    assert t.tolist() == [[1, 2, 3], [4, 5, 6]]
    assert cn.tensor([True, False], backend=backend).tolist() == [True, False]
    assert cn.tensor([1, 2.5], backend=backend).dtype is cn.float32
    assert cn.tensor([[1, 2]], backend=backend, dtype=cn.float32).tolist() == [[1.0, 2.0]]
    assert cn.tensor([], backend=backend).shape == (0,)
    assert cn.tensor([[], []], backend=backend).tolist() == [[], []]
    assert cn.tensor(np.arange(6, dtype=np.int64).reshape(2, 3), backend=backend).tolist() == [[0, 1, 2], [3, 4, 5]]


def test_scalars_and_item(backend):
    t = cn.tensor(2.5, backend=backend)
    assert t.shape == () and t.item() == 2.5 and t.tolist() == 2.5
    assert float(cn.tensor([[3]], backend=backend)) == 3.0 and int(cn.tensor([7], backend=backend)) == 7
    assert bool(cn.tensor([1.0], backend=backend) > 0) is True
    assert cn.tensor([1, 2, 3], backend=backend).sum().item() == 6
    assert len(cn.zeros(4, 2, backend=backend)) == 4
    assert [r.tolist() for r in cn.tensor([[1, 2], [3, 4]], backend=backend)] == [[1, 2], [3, 4]]


def test_creation(backend):
    check(None, cn.zeros(2, 3, backend=backend), np.zeros((2, 3)))
    check(None, cn.ones((3,), backend=backend, dtype=cn.int32), np.ones(3, np.int64))
    check(None, cn.full((2, 2), 1.5, backend=backend), np.full((2, 2), 1.5))
    check(None, cn.full((2,), True, backend=backend), np.full(2, True))
    check(None, cn.arange(5, backend=backend), np.arange(5))
    check(None, cn.arange(5, -3, -2, backend=backend), np.arange(5, -3, -2))
    check(None, cn.arange(0, 1, 0.25, backend=backend), np.arange(0, 1, 0.25))
    check(None, cn.arange(0, backend=backend), np.arange(0))
    check(None, cn.eye(3, backend=backend), np.eye(3))
    check(None, cn.eye(2, 3, backend=backend, dtype=cn.int32), np.eye(2, 3, dtype=np.int64))
    check(None, cn.zeros(0, 3, backend=backend), np.zeros((0, 3)))
    check(None, cn.zeros_like(cn.ones(2, backend=backend, dtype=cn.int32)), np.zeros(2, np.int64))


@pytest.mark.parametrize("distribution", ["uniform", "normal"])
def test_random_matches_reference_generator(backend, distribution):
    t = cn.random((3, 5), backend=backend, distribution=distribution, seed=42)
    expected = np.array(reference_random(15, distribution, 42)).reshape(3, 5)
    check(None, t, expected, tol=(1e-5, 1e-6))
    other = cn.random((3, 5), backend=backend, distribution=distribution, seed=43)
    assert other.tolist() != t.tolist()


def test_random_without_seed_is_reproducible(backend):
    cn.manual_seed(7)
    a = cn.random(4, backend=backend).tolist()
    b = cn.random(4, backend=backend).tolist()
    cn.manual_seed(7)
    assert cn.random(4, backend=backend).tolist() == a and a != b


def test_to_moves_between_backends(backend):
    here = cn.tensor([[1.0, -2.0]], backend=backend)
    there = here.to(cn.NumPy())
    assert there.tolist() == [[1.0, -2.0]] and there.dtype is cn.float32


def test_numpy_readback(backend):
    t = cn.tensor([[1, 2], [3, 4]], backend=backend)
    arr = t.numpy()
    assert arr.dtype == np.int32 and arr.tolist() == [[1, 2], [3, 4]]


def test_repr_names_values_dtype_backend(backend):
    text = repr(cn.tensor([1.5, 2.0], backend=backend))
    assert "1.5" in text and "float32" in text and repr(backend) in text
