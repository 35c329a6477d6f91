"""Linear over a batch of rows for the array engine (see _array.linear): imported only when a
batch holds more than one sample."""

from cinders._array import _buffer, _indices
from cinders._tensor import Tensor


def linear_rows(x, weight, bias, n_out):
    """y[r, j] = scale[j] * (W[j] . x[r]) + b[j] for each row r of x (..., n_in), skipping the
    zeros of x. Each weight row is read once (from the file, when streamed) for the whole batch."""
    xd = x.data
    n_in = x.shape[-1]
    rows = len(xd) // n_in
    idx = _indices(len(xd))
    nonzero = []  # per row of x: a view of idx holding the columns where x is not 0
    m = 0
    for r in range(rows):
        first = m
        base = r * n_in
        for i in range(n_in):
            if xd[base + i] != 0.0:
                idx[m] = i
                m += 1
        nonzero.append(idx[first:m])
    out, slot = _buffer(x, rows * n_out)
    scale = weight.scale
    b = bias.data if bias is not None else None
    for j, _, row in weight.chunks(1):
        for r in range(rows):
            base = r * n_in
            s = 0.0
            for i in nonzero[r]:
                s += row[i] * xd[base + i]
            if scale is not None:
                s *= scale[j]
            if b is not None:
                s += b[j]
            out[r * n_out + j] = s
    return Tensor(out, x.shape[:-1] + (n_out,), slot)
