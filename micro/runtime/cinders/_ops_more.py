"""The board Tensor's less common methods (see _ops.py): permute/transpose, indexing, matmul,
reductions, softmax, layer norm, cat/stack. A module of their own so that a model using only
elementwise methods and operators never compiles or holds them."""

import math
from array import array

from cinders._ops import _strides, flat, make, numel, reshape, squeeze, unsqueeze
from cinders._tensor import Tensor, empty

# Not math.nan: frozen firmware (mpy-cross) folds it into a C constant that does not compile;
# a call is left alone.
_NAN = float("nan")


def permute(t, *dims):
    if len(dims) == 1 and isinstance(dims[0], (list, tuple)):
        dims = dims[0]
    s = t.shape
    dims = [d % len(s) for d in dims]
    if sorted(dims) != list(range(len(s))):
        raise ValueError("permute%s: not a permutation of the %d dims of %s" % (tuple(dims), len(s), s))
    v = flat(t)
    st = _strides(s)
    shape = tuple(s[d] for d in dims)
    src = [st[d] for d in dims]
    out = empty("f", numel(shape))
    idx = [0] * len(shape)
    for k in range(len(out)):
        off = 0
        for i in range(len(shape)):
            off += idx[i] * src[i]
        out[k] = v[off]
        i = len(shape) - 1
        while i >= 0:
            idx[i] += 1
            if idx[i] < shape[i]:
                break
            idx[i] = 0
            i -= 1
    return make(out, shape)


def transpose(t, d0, d1):
    dims = list(range(len(t.shape)))
    d0 %= len(dims)
    d1 %= len(dims)
    dims[d0], dims[d1] = dims[d1], dims[d0]
    return permute(t, dims)


def getitem(t, key):
    """x[i] and x[i, j, ...]: integer indices on the leading dims (what reading results needs)."""
    if not isinstance(key, tuple):
        key = (key,)
    s = t.shape
    if len(key) > len(s) or not all(isinstance(k, int) for k in key):
        raise TypeError("board tensors take integer indices on their leading dims, got %r" % (key,))
    off = 0
    st = _strides(s)
    for i, k in enumerate(key):
        if not -s[i] <= k < s[i]:
            raise IndexError("index %d is out of range for dim %d of size %d" % (k, i, s[i]))
        off += (k % s[i]) * st[i]
    rest = s[len(key):]
    v = flat(t)
    return make(array("f", v[off:off + numel(rest)]), rest)


# ---- elementwise

def matmul(a, b):
    """a @ b: (..., n, k) @ (k, m) or (..., k, m) with the same leading dims; 1-D operands as in
    PyTorch (a vector is a row on the left, a column on the right)."""
    if not isinstance(b, Tensor):
        raise TypeError("matmul: needs two tensors")
    sa, sb = a.shape, b.shape
    if len(sa) == 1:
        return squeeze(matmul(reshape(a, 1, sa[0]), b), -2)
    if len(sb) == 1:
        return squeeze(matmul(a, reshape(b, sb[0], 1)), -1)
    n, k = sa[-2], sa[-1]
    if sb[-2] != k:
        raise ValueError("matmul: shapes %s and %s do not fit (%d != %d)" % (sa, sb, k, sb[-2]))
    m = sb[-1]
    batch = numel(sa[:-2])
    if len(sb) > 2 and tuple(sb[:-2]) != tuple(sa[:-2]):
        raise ValueError("matmul: batch dims of %s and %s differ" % (sa, sb))
    bstep = k * m if len(sb) > 2 else 0
    av = flat(a)
    bv = flat(b)
    out = empty("f", batch * n * m)
    for p in range(batch):
        ao = p * n * k
        bo = p * bstep
        oo = p * n * m
        for i in range(n):
            for j in range(m):
                s = 0.0
                for t in range(k):
                    s += av[ao + i * k + t] * bv[bo + t * m + j]
                out[oo + i * m + j] = s
    return make(out, tuple(sa[:-2]) + (n, m))


# ---- reductions along one axis (or all)

def _axis_view(shape, axis):
    """(outer, size, inner) of a reduction along axis."""
    axis %= len(shape)
    return numel(shape[:axis]), shape[axis], numel(shape[axis + 1:]), axis


def reduce(name, t, axis=None, keepdim=False):
    v = flat(t)
    if axis is None:
        shape = (1,) * len(t.shape) if keepdim else ()
        outer, size, inner = 1, len(v), 1
    else:
        outer, size, inner, axis = _axis_view(t.shape, axis)
        shape = list(t.shape)
        if keepdim:
            shape[axis] = 1
        else:
            shape.pop(axis)
        shape = tuple(shape)
    out = empty("f", outer * inner)
    for o in range(outer):
        for i in range(inner):
            base = o * size * inner + i
            best = v[base]
            at = 0
            acc = 0.0
            product = 1.0
            for s in range(size):
                x = v[base + s * inner]
                acc += x
                product *= x
                if (name == "max" or name == "argmax") and x > best or \
                        (name == "min" or name == "argmin") and x < best or \
                        x != x and best == best:  # the first NaN wins, like the desktop
                    best = x
                    at = s
            out[o * inner + i] = {"sum": acc, "prod": product, "mean": acc / size if size else _NAN,
                                  "max": best, "min": best, "argmax": at, "argmin": at}[name]
    y = make(out, shape)
    if name[:3] == "arg":
        y.dtype = "int32"  # indices, stored as floats (exact below 2**24)
    return y


def softmax(t, axis=-1, log=False):
    v = flat(t)
    outer, size, inner, _ = _axis_view(t.shape, axis)
    out = empty("f", len(v))
    for o in range(outer):
        for i in range(inner):
            base = o * size * inner + i
            m = v[base]
            for s in range(size):
                if v[base + s * inner] > m:
                    m = v[base + s * inner]
            total = 0.0
            for s in range(size):
                total += math.exp(v[base + s * inner] - m)
            lt = math.log(total)
            for s in range(size):
                x = v[base + s * inner] - m
                out[base + s * inner] = x - lt if log else math.exp(x) / total
    return make(out, t.shape)


def layer_norm(t, n, weight, bias, eps):
    """Normalise each run of the last n values (biased variance), then weight and bias (flat
    sequences of n values, or None)."""
    v = flat(t)
    out = empty("f", len(v))
    for r in range(0, len(v), n):
        mean = 0.0
        for i in range(r, r + n):
            mean += v[i]
        mean /= n
        var = 0.0
        for i in range(r, r + n):
            d = v[i] - mean
            var += d * d
        inv = 1.0 / math.sqrt(var / n + eps)
        for i in range(n):
            y = (v[r + i] - mean) * inv
            if weight is not None:
                y *= weight[i]
            if bias is not None:
                y += bias[i]
            out[r + i] = y
    return make(out, t.shape)


def cat(tensors, axis=0):
    tensors = list(tensors)
    first = tensors[0].shape
    axis %= len(first)
    for t in tensors:
        if len(t.shape) != len(first) or any(t.shape[d] != first[d] for d in range(len(first)) if d != axis):
            raise ValueError("cat: shapes %s do not fit along axis %d" % ([x.shape for x in tensors], axis))
    outer = numel(first[:axis])
    inner = numel(first[axis + 1:])
    total = sum(t.shape[axis] for t in tensors)
    out = empty("f", outer * total * inner)
    k = 0
    views = [(flat(t), t.shape[axis] * inner) for t in tensors]
    for o in range(outer):
        for v, run in views:
            for i in range(run):
                out[k] = v[o * run + i]
                k += 1
    return make(out, first[:axis] + (total,) + first[axis + 1:])


def stack(tensors, axis=0):
    return cat([unsqueeze(t, axis) for t in tensors], axis)


def log_softmax(t, axis=-1):
    return softmax(t, axis, True)
