"""Test cases generated from the op table (core/ops.py): each entry's domain, exactness class and
PyTorch oracle give its conformance rows (tests/test_conformance.py), its gradient checks
(tests/test_gradients.py) and the op-table checks (tests/test_op_table.py). Nothing here names
an op: a new table entry is covered by every suite as it is.

The oracle is the entry's PyTorch function in float64 (int64 for ints), on the operands the
tensor layer would hand the backend (`ops.input_dtype`), its result rounded to `ops.result_dtype`.
"""

import functools

import numpy as np
import torch

import cinders as cn
from cinders import dtypes, ops

NP_OF = {dtypes.float32: np.float32, dtypes.int32: np.int32, dtypes.bool_: np.bool_}
DTYPE_OF = {np.dtype(n): d for d, n in NP_OF.items()}

# Float edge values every float row meets, wherever the op's domain lies: infinities, NaN, signed
# zeros, halves (round half to even), values near 0 (erf, sin) and past exp's float32 range.
FLOAT_EDGES = np.array([-np.inf, -100.0, -2.5, -1.5, -1.0, -0.5, -1e-4, -0.0, 0.0, 1e-4, 0.5, 1.0, 1.5,
                        2.5, 7.25, 100.0, np.inf, np.nan], np.float32)
INT_EDGES = np.array([-7, -6, -2, -1, 0, 1, 2, 5, 7], np.int32)

# (low, high) of the uniform float samples of each domain; NONZERO's get a random sign.
_FLOAT_RANGE = {ops.ANY: (-3.0, 3.0), ops.POSITIVE: (0.1, 3.0), ops.UNIT: (-0.95, 0.95),
                ops.NONZERO: (0.5, 3.0)}
_INT_RANGE = {ops.ANY: (-6, 7), ops.POSITIVE: (1, 7), ops.UNIT: (0, 1), ops.NONZERO: (1, 7)}  # UNIT ints: 0


def computing_dtypes(name):
    """The operand dtypes the op accepts, each with the dtype the backend computes it in."""
    return [(d, c) for d in dtypes.COMPUTE_DTYPES if (c := ops.input_dtype(name, d)) is not None]


def sample(domain, dtype, shape, rng):
    """Values of `dtype` inside `domain`, as a NumPy array of that dtype."""
    if dtype is dtypes.bool_:  # computes as 0 and 1: a divisor or a positive operand is True
        return (rng.integers(0, 2, shape) | (domain in (ops.POSITIVE, ops.NONZERO))).astype(np.bool_)
    if dtype is dtypes.int32:
        lo, hi = _INT_RANGE[domain]
        values = rng.integers(lo, hi, shape)
    else:
        lo, hi = _FLOAT_RANGE[domain]
        values = rng.uniform(lo, hi, shape)
    if domain == ops.NONZERO:
        values = values * rng.choice([-1, 1], shape)
    return values.astype(NP_OF[dtype])


class Row:
    """One generated conformance row: op `name` on `inputs`; `axis` for reductions."""

    def __init__(self, label, name, inputs, axis=None):
        self.label, self.name, self.inputs, self.axis = label, name, inputs, axis

    def __repr__(self):
        return self.label


def conformance_rows():
    """Rows for every op of the table and every dtype it accepts: samples from the op's domain,
    the edge values (every pair of them for binary ops), broadcasting for binary ops, and both
    axes plus NaN-holding rows for reductions."""
    rows = []
    for name, op in ops.OPS.items():
        rng = np.random.default_rng(sum(map(ord, name)))
        for dtype, _ in computing_dtypes(name):
            label = "%s %s" % (name, dtype.name)
            edges = {dtypes.float32: FLOAT_EDGES, dtypes.int32: INT_EDGES,
                     dtypes.bool_: np.array([False, True])}[dtype]
            if op.kind == "unary":
                rows.append(Row(label, name, [sample(op.domain[0], dtype, 8, rng)]))
                rows.append(Row(label + " edges", name, [edges]))
            elif op.kind == "binary":
                rows.append(Row(label, name, [sample(d, dtype, 8, rng) for d in op.domain]))
                rows.append(Row(label + " broadcast", name, [sample(op.domain[0], dtype, (2, 3), rng),
                                                             sample(op.domain[1], dtype, (3,), rng)]))
                a, b = np.repeat(edges, len(edges)), np.tile(edges, len(edges))  # every pair
                if dtype is not dtypes.float32 and op.domain[1] == ops.NONZERO:
                    # x // 0 and x % 0 are the protocol's own (0; torch refuses them): the
                    # hand-written rows of tests/test_conformance.py check those
                    a, b = a[b != 0], b[b != 0]
                rows.append(Row(label + " edges", name, [a, b]))
            else:
                for axis in (0, 1):
                    rows.append(Row("%s axis %d" % (label, axis), name,
                                    [sample(op.domain[0], dtype, (3, 5), rng)], axis))
                if dtype is dtypes.float32:  # -inf among finite values; inf and NaN
                    rows.append(Row(label + " edges", name, [FLOAT_EDGES[:15].reshape(3, 5)], 1))
                    rows.append(Row(label + " edges NaN", name, [FLOAT_EDGES[3:].reshape(3, 5)], 1))
    return rows


def apply_method(name, tensors, axis=None):
    """The op through the Tensor API (the tensor layer's casts included): x.exp(), a.pow(b), x.sum(1)."""
    method = getattr(tensors[0], name)
    return method(axis) if ops.OPS[name].kind == "reduce" else method(*tensors[1:])


def apply_protocol(name, tensors, axis=1):
    """The op straight through the backend protocol, on tensors of the dtype it computes in and
    one rank: for an op the Tensor class has no method for yet (one a test registers)."""
    op, x = ops.OPS[name], tensors[0]
    backend = x.backend
    if op.kind == "unary":
        handle, shape = backend.unary(name, x.handle), x.shape
    elif op.kind == "binary":
        handle = backend.binary(name, x.handle, tensors[1].handle)
        shape = tuple(np.broadcast_shapes(x.shape, tensors[1].shape))
    else:
        handle = backend.reduce(name, x.handle, axis, False)
        shape = x.shape[:axis] + x.shape[axis + 1:]
    return cn.Tensor(backend, handle, shape, ops.result_dtype(name, x.dtype))


def torch_function(name):
    """The op's PyTorch function (the entry's `torch`: a name, or a name and keyword arguments)."""
    spec = ops.OPS[name].torch
    fn_name, kwargs = spec if isinstance(spec, tuple) else (spec, {})
    return functools.partial(getattr(torch, fn_name), **kwargs)


def oracle(name, arrays, axis=None):
    """The op's PyTorch function in float64/int64 on `arrays` (NumPy arrays of one dtype), as the
    tensor layer would compute them: (expected NumPy array, expected cinders dtype)."""
    op = ops.OPS[name]
    compute = ops.input_dtype(name, DTYPE_OF[arrays[0].dtype])
    fn = torch_function(name)
    if compute is dtypes.float32:
        operands = [torch.tensor(a.astype(np.float64)) for a in arrays]
    elif compute is dtypes.bool_ and op.rule == ops.LOGICAL:
        operands = [torch.tensor(a) for a in arrays]
    else:  # ints, and bools of ops torch may not define on bools (maximum, comparisons): int64
        operands = [torch.tensor(a.astype(np.int64)) for a in arrays]
    with torch.no_grad():
        out = fn(*operands, axis) if op.kind == "reduce" else fn(*operands)
    return out.numpy(), ops.result_dtype(name, compute)
