"""The op table (core/ops.py) is the one place an op is defined: these tests fail when a backend
lacks a kernel for a table op (unless it lists the op in `unsupported_ops` with a reason), when
an op that returns floats has neither a gradient rule nor NOT_DIFFERENTIABLE, when an entry's
test fields (domain, exactness, torch oracle) are not ones the generated suites understand, and
when the derived pieces (protocol lists, Tensor methods, Autodiff) drift from the table. Every
test here is generated from the table: an entry added is an entry checked."""

import numpy as np
import pytest

import cinders as cn
from cinders import backend as protocol
from cinders import dtypes, ops
from cinders.autodiff import Autodiff

import op_cases
from backends import BACKENDS, selected_names

# Base backends hold kernels; decorators (Autodiff, Fusion) pass ops through to them.
KERNEL_BACKENDS = [n for n in selected_names() if not n.startswith(("autodiff-", "fusion-"))]
VALUES = {dtypes.float32: [0.5, -1.5, 2.0], dtypes.int32: [3, -2, 1], dtypes.bool_: [1, 0, 1]}


@pytest.fixture(scope="module", params=KERNEL_BACKENDS)
def backend(request):
    return BACKENDS[request.param]()


def computing_dtypes(name):
    """The dtypes a backend receives for this op after the tensor layer's casts."""
    return sorted({c for _, c in op_cases.computing_dtypes(name)}, key=lambda d: d.name)


@pytest.mark.parametrize("name", list(ops.OPS))
def test_every_backend_has_a_kernel_for_every_op(backend, name):
    reason = getattr(backend, "unsupported_ops", {}).get(name)
    if reason is not None:
        assert isinstance(reason, str) and reason.strip(), "%r: give a reason for not supporting %s" % (backend, name)
        pytest.skip("%r declares %s unsupported: %s" % (backend, name, reason))
    op = ops.OPS[name]
    for dtype in computing_dtypes(name):
        h = backend.from_flat(VALUES[dtype], (3,), dtype)
        if op.kind == "unary":
            out = backend.unary(name, h)
        elif op.kind == "binary":
            out = backend.binary(name, h, h)
        else:
            out = backend.reduce(name, h, 0, False)
        assert backend.dtype(out) is ops.result_dtype(name, dtype), (name, dtype)
        assert len(backend.to_flat(out)) == (1 if op.kind == "reduce" else 3)


@pytest.mark.parametrize("name", [n for n in ops.OPS if ops.float_result(n)])
def test_every_float_op_has_a_gradient_or_says_it_has_none(name):
    op = ops.OPS[name]
    assert op.grad is not None or op.not_differentiable
    if op.kind == "binary" and op.grad is not None:
        assert len(op.params) == 2, "%s: a binary op has one rule per operand" % name
    allowed = {"unary": {"x", "y", "g"}, "binary": {"a", "b", "out", "g"},
               "reduce": {"x", "y", "g", "axis", "shape"}}[op.kind]
    for params in op.params:
        assert "g" in params and set(params) <= allowed, (name, params)


# What each domain means, as a test of a sampled value; the generated suites sample inside it.
DOMAINS = {ops.ANY: lambda v: np.isfinite(v), ops.POSITIVE: lambda v: v > 0, ops.UNIT: lambda v: np.abs(v) < 1,
           ops.NONZERO: lambda v: v != 0}


@pytest.mark.parametrize("name", list(ops.OPS))
def test_every_op_says_what_its_tests_need(name):
    op = ops.OPS[name]
    assert len(op.domain) == (2 if op.kind == "binary" else 1), "%s: one domain per operand" % name
    assert op.exactness in (ops.EXACT, ops.ULP, ops.ACCUMULATED), (name, op.exactness)
    assert callable(op_cases.torch_function(name)), "%s: no PyTorch function %r" % (name, op.torch)
    rng = np.random.default_rng(0)
    for domain in op.domain:
        for dtype in (dtypes.float32, dtypes.int32):
            assert DOMAINS[domain](op_cases.sample(domain, dtype, 50, rng)).all(), (name, domain, dtype)
    # the oracle computes the op in the dtypes the table gives, on samples of each dtype it accepts
    for dtype, _ in op_cases.computing_dtypes(name):
        arrays = [op_cases.sample(d, dtype, (2, 3), rng) for d in op.domain]
        expected, result = op_cases.oracle(name, arrays, 1 if op.kind == "reduce" else None)
        assert result is ops.result_dtype(name, ops.input_dtype(name, dtype))
        assert expected.shape == ((2,) if op.kind == "reduce" else (2, 3)), (name, dtype, expected.shape)


def test_a_float_op_without_a_gradient_is_refused_when_the_table_is_built():
    with pytest.raises(TypeError, match="gradient rule or NOT_DIFFERENTIABLE"):
        ops.Op("softsign", "unary", ops.FLOAT, None, ())
    assert ops.Op("softsign", "unary", ops.FLOAT, ops.NOT_DIFFERENTIABLE, ()).grad is None


def test_protocol_lists_and_tensor_methods_come_from_the_table():
    assert set(protocol.UNARY_OPS) | set(protocol.BINARY_OPS) | set(protocol.REDUCE_OPS) == set(ops.OPS)
    for name, op in ops.OPS.items():
        assert callable(getattr(cn.Tensor, name)), name
        for dunder in op.operators:
            assert getattr(cn.Tensor, dunder).__name__ == dunder


def test_autodiff_reads_the_tables_rules():
    # Autodiff keeps no rule table of its own: a rule added to the table is the one it runs.
    import cinders.autodiff as ad
    assert not [n for n in vars(ad) if n.endswith("_GRAD")]
    x = cn.tensor([0.5, 2.0], backend=Autodiff(cn.NumPy())).require_grad()
    grads = x.tanh().sum().backward()
    expected = [1 - v * v for v in cn.tensor([0.5, 2.0]).tanh().tolist()]
    assert x.grad(grads).tolist() == pytest.approx(expected, rel=1e-6)
