"""Indexing: `x[key]` for ints, slices, None, Ellipsis and one int tensor/list index.

Basic indexing is one `slice` + one `reshape` of the backend protocol; one tensor/list index
is a `gather` on top. Everything here is composed from Tensor ops, so Autodiff differentiates it.
"""

from .creation import _flatten_nested
from .dtypes import int32
from .tensor import Tensor, where



def getitem(x, key):
    if type(key) is int and x.shape:  # x[i], the common case: one slice and one reshape
        n = x.shape[0]
        i = key + n if key < 0 else key
        if 0 <= i < n:
            rest = x.shape[1:]
            h = x.backend.slice(x.handle, (i,) + (0,) * len(rest), (i + 1,) + rest, (1,) * len(x.shape))
            return Tensor(x.backend, x.backend.reshape(h, rest), rest, x.dtype)
    if not isinstance(key, tuple):
        key = (key,)
    consuming = sum(1 for k in key if k is not None and k is not Ellipsis)
    ellipses = [i for i, k in enumerate(key) if k is Ellipsis]
    if len(ellipses) > 1:
        raise IndexError("index: only one Ellipsis (...) allowed, got %r" % (key,))
    if consuming > x.ndim:
        raise IndexError("index: %d indices for shape %s" % (consuming, x.shape))
    fill = (slice(None),) * (x.ndim - consuming)
    if ellipses:
        key = key[:ellipses[0]] + fill + key[ellipses[0] + 1:]
    else:
        key = key + fill

    starts, stops, steps, out_shape = [], [], [], []
    advanced = None  # (output axis, index, input dim) of the one tensor/list index
    dim = 0
    for k in key:
        if k is None:
            out_shape.append(1)
            continue
        n = x.shape[dim]
        if isinstance(k, slice):
            start, stop, step = k.indices(n)
            if step < 0:
                raise IndexError("index: negative slice steps are not supported (%r on axis %d of shape %s)"
                                 % (k, dim, x.shape))
            count = len(range(start, stop, step))
            starts.append(start if count else 0)
            stops.append(start + (count - 1) * step + 1 if count else 0)
            steps.append(step)
            out_shape.append(count)
        elif isinstance(k, (Tensor, list)):
            if advanced is not None:
                raise IndexError("index: only one tensor/list index per subscript is supported, got %r" % (key,))
            advanced = (len(out_shape), k, dim)
            starts.append(0)
            stops.append(n)
            steps.append(1)
            out_shape.append(n)
        elif isinstance(k, bool) or not hasattr(k, "__index__"):
            raise IndexError("index: unsupported index %r (use ints, slices, None, ..., or one int "
                             "tensor/list)" % (k,))
        else:
            i = k.__index__()
            j = i + n if i < 0 else i
            if not 0 <= j < n:
                raise IndexError("index: index %d out of range for axis %d of shape %s" % (i, dim, x.shape))
            starts.append(j)
            stops.append(j + 1)
            steps.append(1)
        dim += 1

    backend, h = x.backend, x.handle
    sliced = tuple(len(range(a, b, s)) for a, b, s in zip(starts, stops, steps))
    if sliced != x.shape:
        h = backend.slice(h, tuple(starts), tuple(stops), tuple(steps))
    out_shape = tuple(out_shape)
    if out_shape != sliced:
        h = backend.reshape(h, out_shape)
    out = Tensor(backend, h, out_shape, x.dtype)
    if advanced is not None:
        axis, index, dim = advanced
        out = _take(out, axis, _index_tensor(x, index, dim))
    return out


def _index_tensor(x, index, dim):
    n = x.shape[dim]
    if isinstance(index, list):
        flat, shape = _flatten_nested(index)
        for i in flat:
            if isinstance(i, bool) or not isinstance(i, int) or not -n <= i < n:
                raise IndexError("index: %r out of range for axis %d of shape %s" % (i, dim, x.shape))
        return Tensor(x.backend, x.backend.from_flat(flat, shape, int32), shape, int32)
    x._same_device("index", index)
    if index.dtype is not int32:
        raise IndexError("index: tensor indices must be int32, got %r (boolean masks are not supported)"
                         % (index.dtype,))
    return index


def _take(x, axis, index):
    """x with `axis` replaced by index's dims, selecting x's entries along axis (numpy.take)."""
    n = x.shape[axis]
    flat = index.reshape(-1)
    flat = where(flat < 0, flat + n, flat)
    k = flat.shape[0]
    picked = flat.reshape(tuple(k if d == axis else 1 for d in range(x.ndim)))
    picked = picked.expand(x.shape[:axis] + (k,) + x.shape[axis + 1:])
    out = x.gather(axis, picked)
    return out.reshape(x.shape[:axis] + index.shape + x.shape[axis + 1:])
