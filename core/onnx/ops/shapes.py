"""ONNX operators: shapes and movement."""

import math

import cinders as cn
from ...backend import numel
from ...dtypes import bool_, float16, float32, int32
from ...functional import stack
from ...indexing import _take
from ...limits import LIST_ELEMENT_BYTES, check_elements, check_shape
from ..proto import OnnxError
from .base import _axis, _const, _slice_axis, dtype_of, host, host_backend, ints, op, scalar


def _reverse(x, axis):
    n = x.shape[axis]
    idx = cn.arange(n - 1, -1, -1, backend=x.backend) if n else cn.zeros(0, backend=x.backend, dtype=int32)
    return _take(x, axis, idx)


@op(host=("shape",))
def Reshape(data, shape, allowzero=0):
    shape = ints(shape)
    if not allowzero:
        shape = [data.shape[i] if d == 0 and i < data.ndim else d for i, d in enumerate(shape)]
    return data.reshape(tuple(shape))


def _check_dims(op_name, dims, element_bytes=4):
    """OnnxError for a negative dim, SizeLimitError for more elements than cn.limits allows:
    before a shape read from a tensor's values builds anything."""
    if any(d < 0 for d in dims):
        raise OnnxError("%s: negative dimension in %s" % (op_name, list(dims)))
    check_shape(op_name, tuple(dims), element_bytes)


@op()
def Flatten(input, axis=1):
    a = _axis(axis, input.ndim)
    return input.reshape(numel(input.shape[:a]), numel(input.shape[a:]))


@op()
def Transpose(data, perm=None):
    return data.permute(tuple(perm) if perm is not None else tuple(range(data.ndim - 1, -1, -1)))


@op(host=("axes",))
def Squeeze(data, axes=None):
    axes = ints(axes)
    if axes is None:
        return data.reshape(tuple(d for d in data.shape if d != 1))
    axes = {_axis(a, data.ndim) for a in axes}
    return data.reshape(tuple(d for i, d in enumerate(data.shape) if i not in axes))


@op(host=("axes",))
def Unsqueeze(data, axes):
    axes = ints(axes)
    rank = data.ndim + len(axes)
    axes = sorted(_axis(a, rank) for a in axes)
    shape = list(data.shape)
    for a in axes:
        shape.insert(a, 1)
    return data.reshape(tuple(shape))


@op()
def Concat(*inputs, axis):
    inputs = [t for t in inputs if t.ndim != 1 or t.shape[0] or len(inputs) == 1] or inputs[:1]
    a = _axis(axis, inputs[0].ndim)
    if len(inputs) == 1:
        return inputs[0]
    dtype = inputs[0].dtype
    return cn.cat([t.cast(dtype) for t in inputs], a)


@op(host=("split",), multi=True)
def Split(input, split=None, axis=0, num_outputs=None, outputs=1):
    a = _axis(axis, input.ndim)
    n = input.shape[a]
    sizes = ints(split)
    if not sizes:
        count = num_outputs or outputs
        size = -(-n // count)
        sizes = [min(size, n - i * size) for i in range(count)]
    parts, start = [], 0
    for s in sizes:
        parts.append(_slice_axis(input, a, start, start + s))
        start += s
    return tuple(parts) if len(parts) > 1 or outputs > 1 else parts[0]



@op(host=("starts", "ends", "axes", "steps"))
def Slice(data, starts=None, ends=None, axes=None, steps=None):
    starts, ends = ints(starts), ints(ends)
    axes = ints(axes) if axes is not None else list(range(len(starts)))
    steps = ints(steps) if steps is not None else [1] * len(starts)
    key = [slice(None)] * data.ndim
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = _axis(a, data.ndim)
        n = data.shape[a]
        # ONNX clamps out-of-range bounds (INT64_MAX / INT64_MIN mean "to the end"); so do slices
        key[a] = slice(max(-n - 1, min(s, n + 1)), max(-n - 1, min(e, n + 1)), st)
    return data[tuple(key)]


@op()
def Gather(data, indices, axis=0):
    if data.ndim == 1 and data.backend is host_backend() and indices.backend is host_backend() and indices.numel():
        picked = _pick_from_host_vector(data.tolist(), indices.tolist())
        if picked is not None:
            return cn.tensor(picked, backend=data.backend, dtype=data.dtype)
    out = _take(data, _axis(axis, data.ndim), indices.cast(int32))
    return out.cast(float32) if out.dtype is float16 else out   # a half model's embedding rows


def _pick_from_host_vector(values, picks):
    """Gather of a shape vector (`Gather(Shape(x), 1)`, run per call) with Python lists: a tensor
    operation per element would cost more than the model's arithmetic at batch 1. None when an
    index is out of range (the tensor path raises the error)."""
    if isinstance(picks, list):
        rows = [_pick_from_host_vector(values, p) for p in picks]
        return None if any(r is None for r in rows) else rows
    n = len(values)
    return values[int(picks)] if -n <= picks < n else None


@op()
def GatherElements(data, indices, axis=0):
    return data.gather(_axis(axis, data.ndim), indices.cast(int32))


def _linear_index(data, indices, batch_dims=0):
    """indices (..., k) into data's first k dims -> flat row numbers (...)."""
    k = indices.shape[-1]
    dims = data.shape[:k]
    strides = [numel(dims[i + 1:]) for i in range(k)]
    idx = indices.cast(int32)
    idx = cn.where(idx < 0, idx + _const(list(dims), idx), idx)
    return (idx * _const(strides, idx)).sum(-1), k


@op()
def GatherND(data, indices, batch_dims=0):
    if batch_dims:
        b = numel(data.shape[:batch_dims])
        d = data.reshape((b,) + data.shape[batch_dims:])
        i = indices.reshape((b,) + indices.shape[batch_dims:])
        parts = [GatherND(d[j], i[j]) for j in range(b)]
        out = stack(parts, 0)
        return out.reshape(data.shape[:batch_dims] + out.shape[1:])
    flat, k = _linear_index(data, indices)
    rows = data.reshape((numel(data.shape[:k]),) + data.shape[k:])
    return _take(rows, 0, flat)


def _scatter_rows(data_rows, axis, index, updates, reduction):
    """data with updates written at index along axis (index shaped like updates)."""
    if reduction == "add":
        return data_rows.scatter_add(axis, index, updates)
    if reduction == "mul":
        raise OnnxError("ScatterElements/ScatterND: reduction 'mul' is not supported")
    zeros = cn.zeros(*data_rows.shape, backend=data_rows.backend, dtype=float32)
    hit = zeros.scatter_add(axis, index, cn.ones(*updates.shape, backend=updates.backend)) > 0
    written = zeros.scatter_add(axis, index, updates.cast(float32))
    if reduction == "none":
        return cn.where(hit, written.cast(data_rows.dtype), data_rows)
    pick = data_rows.maximum if reduction == "max" else data_rows.minimum
    return cn.where(hit, pick(written.cast(data_rows.dtype)), data_rows)


@op()
def ScatterElements(data, indices, updates, axis=0, reduction="none"):
    return _scatter_rows(data, _axis(axis, data.ndim), indices.cast(int32), updates, reduction)


@op()
def Scatter(data, indices, updates, axis=0):
    return ScatterElements(data, indices, updates, axis)


@op()
def ScatterND(data, indices, updates, reduction="none"):
    flat, k = _linear_index(data, indices)
    rest = data.shape[k:]
    rows = data.reshape((numel(data.shape[:k]),) + rest)
    n = numel(flat.shape)
    upd = updates.reshape((n,) + rest)
    index = flat.reshape((n,) + (1,) * len(rest)).expand((n,) + rest)
    return _scatter_rows(rows, 0, index, upd, reduction).reshape(data.shape)


@op(host=("shape",))
def Expand(input, shape):
    shape = ints(shape)
    n = max(len(shape), input.ndim)
    a = [1] * (n - input.ndim) + list(input.shape)
    b = [1] * (n - len(shape)) + list(shape)
    target = tuple(x if y == 1 else y for x, y in zip(a, b))
    _check_dims("Expand", target)
    return input.reshape(tuple(a)).expand(target)


@op(host=("repeats",))
def Tile(input, repeats):
    repeats = ints(repeats)
    if len(repeats) != input.ndim:
        raise OnnxError("Tile: %d repeats for a tensor of rank %d" % (len(repeats), input.ndim))
    _check_dims("Tile", [r * d for r, d in zip(repeats, input.shape)])
    inter, target = [], []
    for r, d in zip(repeats, input.shape):
        inter += [1, d]
        target += [r, d]
    out = input.reshape(tuple(inter)).expand(tuple(target))
    return out.reshape(tuple(r * d for r, d in zip(repeats, input.shape)))


@op()
def Shape(data, start=0, end=None):
    """On the host (cn.Python()): shapes are known without touching the device."""
    dims = list(data.shape)
    n = len(dims)
    s = max(0, min(n, start + n if start < 0 else start))
    e = n if end is None else max(0, min(n, end + n if end < 0 else end))
    return cn.tensor(dims[s:e], backend=host_backend(), dtype=int32) if e > s else \
        cn.zeros(0, backend=host_backend(), dtype=int32)


@op()
def Size(data):
    return cn.tensor(data.numel(), backend=host_backend(), dtype=int32)


@op(host=("input",))
def ConstantOfShape(input, value=None, backend=None):
    shape = tuple(ints(input))
    _check_dims("ConstantOfShape", shape)
    if value is None:
        return cn.zeros(*shape, backend=backend)
    type_name, _, flat = value
    return cn.full(shape, flat[0], backend=backend, dtype=dtype_of(type_name))


@op(host=("start", "limit", "delta"))
def Range(start, limit, delta, backend=None):
    start, limit, delta = scalar(start), scalar(limit), scalar(delta)
    if delta == 0 or not all(isinstance(v, int) or math.isfinite(v) for v in (start, limit, delta)):
        raise OnnxError("Range: start %r, limit %r, delta %r do not give a finite range" % (start, limit, delta))
    n = max(0, math.ceil((limit - start) / delta))
    check_elements("Range", n, (n,), LIST_ELEMENT_BYTES)  # the Python list below
    is_int = all(isinstance(v, int) for v in (start, limit, delta))
    dtype = int32 if is_int else float32
    if not n:
        return cn.zeros(0, backend=backend, dtype=dtype)
    return cn.tensor([start + i * delta for i in range(n)], backend=backend, dtype=dtype)


@op()
def EyeLike(input, dtype=None, k=0):
    rows, cols = input.shape
    out = cn.arange(rows, backend=input.backend).reshape(rows, 1) + k == cn.arange(cols, backend=input.backend)
    return out.cast(dtype_of(dtype) if dtype else input.dtype)


@op(host=("k",))
def Trilu(input, k=None, upper=1):
    k = 0 if k is None else int(scalar(k))
    rows, cols = input.shape[-2:]
    r = cn.arange(rows, backend=input.backend).reshape(rows, 1)
    c = cn.arange(cols, backend=input.backend).reshape(1, cols)
    keep = (c - r >= k) if upper else (c - r <= k)
    return cn.where(keep, input, _const(0, input))


@op(host=("depth", "values"))
def OneHot(indices, depth, values, axis=-1):
    depth = int(scalar(depth))
    off, on = host(values)
    idx = indices.cast(int32)
    idx = cn.where(idx < 0, idx + depth, idx)
    a = _axis(axis, indices.ndim + 1)
    classes = cn.arange(depth, backend=idx.backend).reshape([depth if d == a else 1 for d in range(indices.ndim + 1)])
    hot = idx.unsqueeze(a) == classes
    return cn.where(hot, on, off)


@op(host=("axis",))
def CumSum(x, axis, exclusive=0, reverse=0):
    """Prefix sums by doubling (Hillis-Steele): ceil(log2 n) shifted adds, so n log n work and
    memory of a few copies of x (an n x n triangular matrix was 14 GB and minutes for n = 60,000);
    int32 stays int32 and exact."""
    a = _axis(int(scalar(axis)), x.ndim)
    if not 0 <= a < x.ndim:
        raise OnnxError("CumSum: axis %d of a tensor of rank %d" % (int(scalar(axis)), x.ndim))
    n = x.shape[a]
    out = (x if x.dtype in (float32, int32) else x.cast(float32)).transpose(a, -1)

    def shifted(t, by):   # t moved `by` places along its last axis (towards the end unless reverse), zeros in
        zeros = cn.zeros(*t.shape[:-1], by, backend=t.backend, dtype=t.dtype)
        return cn.cat([t[..., by:], zeros], -1) if reverse else cn.cat([zeros, t[..., :n - by]], -1)

    step = 1
    while step < n:
        out = out + shifted(out, step)
        step *= 2
    if exclusive and n:
        out = shifted(out, 1)
    out = out.transpose(a, -1)
    return out if out.dtype is x.dtype else out.cast(x.dtype)


@op(host=("K",), multi=True)
def TopK(X, K, axis=-1, largest=1, sorted=1, outputs=2):  # noqa: A002
    """k argmax passes when k is small (3 ops each); else a bitonic sort of the axis, ~log2(n)**2 / 2
    compare-exchange stages: k = n = 60,000 took minutes of passes. Ties: the lower index first,
    as in onnxruntime."""
    k = int(scalar(K))
    a = _axis(axis, X.ndim)
    if not 0 <= a < X.ndim:
        raise OnnxError("TopK: axis %d of a tensor of rank %d" % (axis, X.ndim))
    if not 0 <= k <= X.shape[a]:
        raise OnnxError("TopK: k = %d on an axis of %d elements" % (k, X.shape[a]))
    x = X.cast(float32)
    x = x if largest else -x
    n = X.shape[a]
    m = 1 << max(n - 1, 0).bit_length()   # the axis padded to a power of two
    stages = m.bit_length() * (m.bit_length() - 1) // 2
    if 0 < k <= 4 * stages:
        check_elements("TopK", k * numel(X.shape))  # k passes over the input
        values, indices = [], []
        positions = cn.arange(n, backend=X.backend).reshape([n if d == a else 1 for d in range(X.ndim)])
        for _ in range(k):
            i = x.argmax(a, keepdim=True)
            values.append(X.gather(a, i))
            indices.append(i)
            x = cn.where(positions == i, -math.inf, x)
        v, i = cn.cat(values, a), cn.cat(indices, a)
    else:
        i = _slice_axis(_bitonic_order(x.transpose(a, -1), m).transpose(a, -1), a, 0, k)
        v = X.gather(a, i)
    return (v, i)[:outputs] if outputs > 1 else v


def _bitonic_order(x, m):
    """The indices that sort the last axis of x (n <= m elements, m a power of two) largest first,
    ties by the lower index: a bitonic network of compare-exchanges on (value, index) pairs."""
    lead, n = x.shape[:-1], x.shape[-1]
    check_elements("TopK", 4 * numel(lead) * m)
    idx = cn.arange(m, backend=x.backend).reshape(*[1] * len(lead), m).expand(*lead, m)
    if m > n:   # padding sorts last: -inf, and indices past every real one
        x = cn.cat([x, cn.full((*lead, m - n), -math.inf, backend=x.backend)], -1)
    size = 2
    while size <= m:
        j = size // 2
        while j >= 1:
            blocks = m // (2 * j)
            # block q holds the pairs (q*2j + r, q*2j + r + j); it sorts largest first where bit
            # `size` of its start is 0 (all of them in the last round)
            first = cn.tensor([[((q * 2 * j) & size) == 0] for q in range(blocks)], backend=x.backend)
            xs, ids = x.reshape(*lead, blocks, 2, j), idx.reshape(*lead, blocks, 2, j)
            xa, xb, ia, ib = xs[..., 0, :], xs[..., 1, :], ids[..., 0, :], ids[..., 1, :]
            a_first = (xa > xb) | ((xa == xb) & (ia < ib))
            keep = a_first == first
            x = cn.cat([cn.where(keep, xa, xb).unsqueeze(-2), cn.where(keep, xb, xa).unsqueeze(-2)], -2).reshape(*lead, m)
            idx = cn.cat([cn.where(keep, ia, ib).unsqueeze(-2), cn.where(keep, ib, ia).unsqueeze(-2)], -2).reshape(*lead, m)
            j //= 2
        size *= 2
    return idx


@op(host=("condition",))
def Compress(input, condition, axis=None):
    keep = [i for i, c in enumerate(ints(condition)) if c]
    x = input if axis is not None else input.reshape(-1)
    a = 0 if axis is None else _axis(axis, input.ndim)
    keep = [i for i in keep if i < x.shape[a]]
    return _take(x, a, cn.tensor(keep, backend=x.backend, dtype=int32))


@op(reads=True)
def NonZero(X):
    flat = X.reshape(-1).tolist()
    shape = X.shape
    hits = [i for i, v in enumerate(flat) if v]
    coords = []
    for d in range(len(shape)):
        stride = numel(shape[d + 1:])
        coords.append([(i // stride) % shape[d] for i in hits])
    if not hits:
        return cn.zeros(len(shape), 0, backend=X.backend, dtype=int32)
    return cn.tensor(coords, backend=X.backend, dtype=int32)


@op()
def DepthToSpace(input, blocksize, mode="DCR"):
    n, c, h, w = input.shape
    b = blocksize
    if mode == "DCR":
        x = input.reshape(n, b, b, c // (b * b), h, w).permute(0, 3, 4, 1, 5, 2)
    else:
        x = input.reshape(n, c // (b * b), b, b, h, w).permute(0, 1, 4, 2, 5, 3)
    return x.reshape(n, c // (b * b), h * b, w * b)


@op()
def SpaceToDepth(input, blocksize):
    n, c, h, w = input.shape
    b = blocksize
    x = input.reshape(n, c, h // b, b, w // b, b).permute(0, 3, 5, 1, 2, 4)
    return x.reshape(n, c * b * b, h // b, w // b)


@op(host=("pads", "constant_value", "axes"))
def Pad(data, pads=None, constant_value=None, axes=None, mode="constant", value=0.0, paddings=None):
    pads = ints(pads if pads is not None else paddings)
    rank = data.ndim
    axes = [_axis(a, rank) for a in ints(axes)] if axes is not None else list(range(rank))
    k = len(axes)
    if len(pads) != 2 * k:
        raise OnnxError("Pad: %d pads for %d axes (needs %d)" % (len(pads), k, 2 * k))
    _check_dims("Pad", [d + pads[axes.index(i)] + pads[axes.index(i) + k] if i in axes else d
                        for i, d in enumerate(data.shape)], LIST_ELEMENT_BYTES if mode != "constant" else 4)
    before, after = [0] * rank, [0] * rank
    for i, a in enumerate(axes):
        before[a], after[a] = pads[i], pads[i + k]
    fill = value if constant_value is None else scalar(constant_value)
    x = data
    for a in range(rank):  # negative pads crop
        if before[a] < 0 or after[a] < 0:
            n = x.shape[a]
            x = _slice_axis(x, a, max(0, -before[a]), n - max(0, -after[a]))
            before[a], after[a] = max(0, before[a]), max(0, after[a])
    if mode == "constant":
        flat = []
        for a in range(rank - 1, -1, -1):
            flat += [before[a], after[a]]
        if x.dtype is not float32:
            fill = int(fill)
        return cn.pad(x, flat, fill)
    for a in range(rank):
        if not before[a] and not after[a]:
            continue
        n = x.shape[a]
        idx = []
        for i in range(-before[a], n + after[a]):
            if mode == "edge":
                j = min(max(i, 0), n - 1)
            elif mode == "reflect":
                period = 2 * (n - 1) if n > 1 else 1
                j = i % period if period else 0
                j = period - j if j >= n else j
            elif mode == "wrap":
                j = i % n
            else:
                raise OnnxError("Pad: mode %r is not supported" % (mode,))
            idx.append(j)
        x = _take(x, a, cn.tensor(idx, backend=x.backend, dtype=int32))
    return x


@op(multi=True)
def Dropout(data, ratio=None, training_mode=None, seed=None, is_test=None, outputs=1):
    """Inference: the identity (and an all-true mask when asked for)."""
    if outputs > 1:
        return data, cn.full(data.shape, True, backend=data.backend, dtype=bool_)
    return data


@op(host=("axis",))
def CumProd(x, axis, exclusive=0, reverse=0):
    a = _axis(int(scalar(axis)), x.ndim)
    n = x.shape[a]
    parts, running = [], None
    order = range(n - 1, -1, -1) if reverse else range(n)
    for i in order:
        item = _slice_axis(x, a, i, i + 1)
        if exclusive:
            parts.append(running if running is not None else cn.ones(*item.shape, backend=x.backend, dtype=x.dtype))
            running = item if running is None else running * item
        else:
            running = item if running is None else running * item
            parts.append(running)
    if reverse:
        parts.reverse()
    return cn.cat(parts, a) if parts else x


@op(host=("shape",))
def CenterCropPad(input_data, shape, axes=None):
    shape = ints(shape)
    axes = [_axis(a, input_data.ndim) for a in axes] if axes is not None else list(range(input_data.ndim))
    x = input_data
    for a, want in zip(axes, shape):
        n = x.shape[a]
        if want < n:      # crop: the extra element goes to the end
            start = (n - want) // 2
            x = _slice_axis(x, a, start, start + want)
        elif want > n:    # pad: the extra element goes to the end
            before = (want - n) // 2
            flat = [0, 0] * (x.ndim - 1 - a) + [before, want - n - before]
            x = cn.pad(x, flat, 0 if x.dtype is not float32 else 0.0)
    return x


@op(multi=True, reads=True)
def Unique(X, axis=None, sorted=1, outputs=1):  # noqa: A002
    """Computed on the host: the result's size depends on the values (like NonZero)."""
    if axis is None:
        items = [(v,) for v in X.reshape(-1).tolist()]
        source, a = X.reshape(-1), 0
    else:
        a = _axis(axis, X.ndim)
        moved = X.transpose(0, a) if a else X
        items = [tuple(_flat_list(row)) for row in moved.tolist()]
        source = X
    first, counts, order = {}, {}, []
    for i, key in enumerate(items):
        if key not in first:
            first[key] = i
            order.append(key)
        counts[key] = counts.get(key, 0) + 1
    if sorted:
        order.sort()
    position = {key: j for j, key in enumerate(order)}
    backend = X.backend
    picked = cn.tensor([first[k] for k in order], backend=backend, dtype=int32)
    y = _take(source, a, picked)
    results = (y, picked, cn.tensor([position[k] for k in items], backend=backend, dtype=int32),
               cn.tensor([counts[k] for k in order], backend=backend, dtype=int32))[:outputs]
    return results if outputs > 1 else y


def _flat_list(v):
    return [v] if not isinstance(v, list) else [x for item in v for x in _flat_list(item)]
