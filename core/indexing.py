"""Indexing: `x[key]` and `x[key] = value`, with PyTorch's meaning, composed from Tensor ops.

A key holds ints, slices (any step, negative too), None, Ellipsis, and at most one advanced
index: an int32 tensor or list of ints, or a bool mask (tensor or list) over one or more dims.

    basic part       one `slice` (positive steps) + one `reshape` of the backend protocol
    negative steps   the same slice with the step's size, then reversed by a `gather`
    int index        a `gather` (numpy.take along that dim)
    bool mask        its True positions, read from the mask (a device sync on GPU backends:
                     the result's shape depends on the data), then an int index

Assignment writes into the positions that reading the same key would return: the flat
positions of those elements (the key applied to an `arange`) are scattered into and `where`
picks them, so Autodiff gives the gradient of torch's index_put and every backend runs it. The
tensor then holds a new handle: tensors taken from it before (`row = x[0]`) keep their values,
because Cinders tensors are values, not views. Duplicate positions in one assignment are
unspecified, as in torch.
"""

from . import capture
from .creation import _flatten_nested, arange, full, tensor
from .dtypes import bool_, int32
from .errors import IndexingError, ShapeError
from .tensor import Tensor, _numel, where


def getitem(x, key):
    if type(key) is int and x.shape:  # x[i], the common case: one slice and one reshape
        n = x.shape[0]
        i = key + n if key < 0 else key
        if 0 <= i < n:
            rest = x.shape[1:]
            h = x.backend.slice(x.handle, (i,) + (0,) * len(rest), (i + 1,) + rest, (1,) * len(x.shape))
            return Tensor(x.backend, x.backend.reshape(h, rest), rest, x.dtype)
    x, key = _masks_to_positions(x, _full_key(x, key))

    starts, stops, steps, out_shape = [], [], [], []
    reversed_axes = []  # output axes read backwards (negative steps)
    advanced = None     # (output axis, index, input dim) of the one tensor/list index
    dim = 0
    for k in key:
        if k is None:
            out_shape.append(1)
            continue
        n = x.shape[dim]
        if isinstance(k, slice):
            try:
                start, stop, step = k.indices(n)
            except (TypeError, ValueError) as e:  # a step of 0, non-int bounds
                raise IndexingError("index: %r on axis %d of shape %s: %s" % (k, dim, x.shape, e)) from None
            count = len(range(start, stop, step))
            if step < 0:  # read the same elements forwards, then reverse them
                start, step = (start + (count - 1) * step if count else 0), -step
                reversed_axes.append(len(out_shape))
            starts.append(start if count else 0)
            stops.append(start + (count - 1) * step + 1 if count else 0)
            steps.append(step)
            out_shape.append(count)
        elif isinstance(k, (Tensor, list)):
            if advanced is not None:
                raise IndexingError("index: only one tensor/list index per subscript is supported, got %r" % (key,))
            advanced = (len(out_shape), k, dim)
            starts.append(0)
            stops.append(n)
            steps.append(1)
            out_shape.append(n)
        elif isinstance(k, bool) or not hasattr(k, "__index__"):
            kind = "a float" if isinstance(k, float) else "a bool" if isinstance(k, bool) else type(k).__name__
            raise IndexingError("index: %r is %s; use ints, slices, None, ..., one int32 tensor or list "
                             "of ints, or a bool mask" % (k, kind))
        else:
            i = k.__index__()
            j = i + n if i < 0 else i
            if not 0 <= j < n:
                raise IndexingError("index: index %d out of range for axis %d of shape %s" % (i, dim, x.shape))
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
    for axis in reversed_axes:
        n = out_shape[axis]
        out = _take(out, axis, arange(n - 1, -1, -1, backend=backend, dtype=int32)) if n > 1 else out
    if advanced is not None:
        axis, index, dim = advanced
        out = _take(out, axis, _index_tensor(x, index, dim))
    return out


def setitem(x, key, value):
    """x[key] = value: broadcast value to x[key]'s shape, cast to x's dtype, and write it there."""
    positions = getitem(arange(_numel(x.shape), backend=x.backend, dtype=int32).reshape(x.shape), key)
    if isinstance(value, Tensor):
        x._same_device("setitem", value)
        if value.dtype is not x.dtype:
            value = value.cast(x.dtype)
    elif isinstance(value, (bool, int, float)):   # (a storage dtype's value: narrowed at the end)
        value = full((), value, backend=x.backend, dtype=x.dtype.compute)
    else:
        value = tensor(value, backend=x.backend, dtype=x.dtype)
    if value.shape != positions.shape:
        if value.ndim > positions.ndim or any(v not in (1, p) for v, p in zip(value.shape[::-1], positions.shape[::-1])):
            raise ShapeError("setitem: value of shape %s does not broadcast to the indexed shape %s"
                             % (value.shape, positions.shape))
        value = value.reshape((1,) * (positions.ndim - value.ndim) + value.shape).expand(positions.shape)
    # scatter_add adds; bools add as ints. `hit` marks the written positions, `where` keeps the rest.
    work = int32 if x.dtype is bool_ else x.dtype.compute
    flat, where_to = x.reshape(-1), positions.reshape(-1)
    hit = full(flat.shape, 0, backend=x.backend, dtype=int32).scatter_add(
        0, where_to, full(where_to.shape, 1, backend=x.backend, dtype=int32)) > 0
    placed = full(flat.shape, 0, backend=x.backend, dtype=work).scatter_add(0, where_to, value.reshape(-1).cast(work))
    # (where widens a storage dtype: its result is narrowed back to x's)
    new = where(hit, placed.cast(x.dtype), flat).cast(x.dtype).reshape(x.shape)
    handle = x.backend.assign(x, new)
    capture.retire(x)   # x's old buffer is given up: captured programs reading it record again
    x.handle = handle


def _full_key(x, key):
    """The key as a tuple with Ellipsis expanded (a mask consumes as many dims as it has)."""
    if not isinstance(key, tuple):
        key = (key,)
    key = tuple(k if (mask := _as_mask(k)) is None else mask for k in key)
    consuming = sum(k.ndim if isinstance(k, Tensor) and k.dtype is bool_ else 1
                    for k in key if k is not None and k is not Ellipsis)
    ellipses = [i for i, k in enumerate(key) if k is Ellipsis]
    if len(ellipses) > 1:
        raise IndexingError("index: only one Ellipsis (...) allowed, got %r" % (key,))
    if consuming > x.ndim:
        raise IndexingError("index: %d indices for shape %s" % (consuming, x.shape))
    fill = (slice(None),) * (x.ndim - consuming)
    if ellipses:
        return key[:ellipses[0]] + fill + key[ellipses[0] + 1:]
    return key + fill


def _as_mask(k):
    """A bool tensor, or a list of bools as a bool tensor (None for anything else)."""
    if isinstance(k, Tensor):
        return k if k.dtype is bool_ else None
    if isinstance(k, list) and k:
        flat, shape = _flatten_nested(k)
        if all(isinstance(v, bool) for v in flat):
            return tensor(k, dtype=bool_)
    return None


def _masks_to_positions(x, key):
    """Replace a bool mask by the int positions of its True entries (dims it covers merged)."""
    dim = 0
    for i, k in enumerate(key):
        if isinstance(k, Tensor) and k.dtype is bool_:
            covered = x.shape[dim:dim + k.ndim]
            if k.shape != covered:
                raise IndexingError("index: mask of shape %s does not fit dims %d..%d of shape %s (%s)"
                                 % (k.shape, dim, dim + k.ndim - 1, x.shape, covered))
            x = x.reshape(x.shape[:dim] + (_numel(covered),) + x.shape[dim + k.ndim:])
            positions = [p for p, hit in enumerate(k.reshape(-1).tolist()) if hit]
            return x, key[:i] + (positions,) + key[i + 1:]
        if k is not None:
            dim += 1
    return x, key


def _index_tensor(x, index, dim):
    n = x.shape[dim]
    if isinstance(index, list):
        flat, shape = _flatten_nested(index)
        for i in flat:
            if isinstance(i, bool) or not isinstance(i, int):
                raise IndexingError("index: %r in an index list is %s; indices are ints (or all bools: a mask)"
                                 % (i, "a float" if isinstance(i, float) else type(i).__name__))
            if not -n <= i < n:
                raise IndexingError("index: %r out of range for axis %d of shape %s" % (i, dim, x.shape))
        return Tensor(x.backend, x.backend.from_flat(flat, shape, int32), shape, int32)
    x._same_device("index", index)
    if index.dtype is not int32:
        raise IndexingError("index: tensor indices must be int32 (or a bool mask), got %r" % (index.dtype,))
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
