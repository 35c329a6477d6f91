"""Gradients on each Autodiff backend of tests/backends.py. Shapes are tiny: the Python backend
runs these too.

Every differentiable rule of the op table (core/ops.py) is checked by generated tests, on inputs
from the entry's domain: against PyTorch autograd, and against central differences in float64
of the op's cn.NumPy() kernel (run on float64 arrays), the forward the rule differentiates. A
wrong rule fails both (test_a_wrong_rule_fails_the_generated_checks). Composites, movement, images and losses,
and the table ops' special points (ties, zeros), are hand-written cases against torch below;
finite differences where PyTorch has no equivalent op.

Each hand-written case is (id, cinders fn, torch fn, inputs). Float inputs require grad;
int/bool inputs are constants. The loss is sum(out * w) with a fixed random w, so every output
element matters.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import backends as registry
import cinders as cn
import op_cases
from cinders import nn, ops

AUTODIFF = [n for n in registry.selected_names() if n.startswith("autodiff-")]


@pytest.fixture(scope="module", params=AUTODIFF)
def ad(request):
    return registry.BACKENDS[request.param]()


_rng = np.random.default_rng(0)


def randn(*shape):
    return _rng.standard_normal(shape).astype(np.float32)


def pos(*shape):  # away from 0, for log/sqrt/pow/div
    return _rng.uniform(0.5, 2.0, shape).astype(np.float32)


def ints(high, *shape):
    return _rng.integers(0, high, shape).astype(np.int32)


def _inputs(backend, arrays):
    cn_in = []
    for a in arrays:
        t = cn.tensor(a, backend=backend)
        cn_in.append(t.require_grad() if a.dtype == np.float32 else t)
    t_in = []
    for a in arrays:
        t = torch.tensor(a.astype(np.int64) if a.dtype == np.int32 else a)
        t_in.append(t.requires_grad_() if a.dtype == np.float32 else t)
    return cn_in, t_in


def check_against_torch(backend, cn_fn, torch_fn, arrays, rtol=1e-4, atol=1e-5):
    cn_in, t_in = _inputs(backend, arrays)
    t_out = torch_fn(*t_in)
    weight = randn(*t_out.shape)
    (t_out * torch.tensor(weight)).sum().backward()
    out = cn_fn(*cn_in)
    assert out.shape == tuple(t_out.shape)
    np.testing.assert_allclose(out.numpy(), t_out.detach().numpy(), rtol=rtol, atol=atol)
    grads = (out * cn.tensor(weight, backend=backend)).sum().backward()
    for i, (c, t) in enumerate(zip(cn_in, t_in)):
        if arrays[i].dtype != np.float32:
            continue
        g = c.grad(grads)
        expected = t.grad.numpy() if t.grad is not None else np.zeros(arrays[i].shape, np.float32)
        assert g is not None, "input %d got no gradient" % i
        assert g.backend == backend.inner and g.shape == arrays[i].shape
        np.testing.assert_allclose(g.numpy(), expected, rtol=rtol, atol=atol,
                                   err_msg="gradient of input %d" % i)


# -- the op table's rules, generated -------------------------------------------------------------

def differentiable_ops():
    return [name for name, op in ops.OPS.items() if op.grad is not None]


def table_gradient_inputs(name):
    """Float32 operands from the op's domain: a (2, 3) with a (1, 3) that broadcasts against it
    for binary ops (so the rule's result is summed back), a (3, 4) reduced along axis 1."""
    op = ops.OPS[name]
    rng = np.random.default_rng(sum(map(ord, name)))
    shapes = {"unary": [(2, 3)], "binary": [(2, 3), (1, 3)], "reduce": [(3, 4)]}[op.kind]
    return [op_cases.sample(domain, cn.float32, shape, rng) for domain, shape in zip(op.domain, shapes)]


def _tape_gradients(backend, name, arrays, weight):
    """The gradients of sum(op(inputs) * weight) that Autodiff computes with the table's rule."""
    inputs = [cn.tensor(a, backend=backend).require_grad() for a in arrays]
    out = op_cases.apply_protocol(name, inputs)
    grads = (out * cn.tensor(weight, backend=backend)).sum().backward()
    return [x.grad(grads).numpy() for x in inputs]


def _torch_loss(name, weight):
    fn = op_cases.torch_function(name)
    reduce = ops.OPS[name].kind == "reduce"
    return lambda *xs: ((fn(*xs, 1) if reduce else fn(*xs)) * torch.tensor(weight, dtype=torch.float64)).sum()


def _numpy_float64_loss(numpy_backend, name, weight):
    """sum(op(xs) * weight) with cn.NumPy()'s own kernel for the op, run on float64 arrays (NumPy's
    ufuncs keep the dtype they are given): the forward the rule must be the derivative of."""
    kind = ops.OPS[name].kind

    def loss(*xs):
        out = (numpy_backend.unary(name, *xs) if kind == "unary" else numpy_backend.binary(name, *xs)
               if kind == "binary" else numpy_backend.reduce(name, *xs, 1, False))
        assert out.dtype == np.float64, "%s: the NumPy kernel does not keep float64" % name
        return float((out * weight).sum())
    return loss


def _weight(name, arrays):
    shape = np.broadcast_shapes(*[a.shape for a in arrays])
    if ops.OPS[name].kind == "reduce":
        shape = shape[:1]
    return np.random.default_rng(7).standard_normal(shape)


def table_gradient_vs_torch(backend, name, rtol=1e-4, atol=1e-5):
    arrays = table_gradient_inputs(name)
    weight = _weight(name, arrays)
    t_in = [torch.tensor(a.astype(np.float64), requires_grad=True) for a in arrays]
    _torch_loss(name, weight)(*t_in).backward()
    for i, got in enumerate(_tape_gradients(backend, name, arrays, weight)):
        np.testing.assert_allclose(got, t_in[i].grad.numpy(), rtol=rtol, atol=atol,
                                   err_msg="%s: gradient of operand %d vs torch autograd" % (name, i))


def table_gradient_vs_central_differences(backend, name, numpy_backend=None, eps=1e-6, rtol=1e-4, atol=1e-5):
    arrays = table_gradient_inputs(name)
    weight = _weight(name, arrays)
    loss = _numpy_float64_loss(numpy_backend or cn.NumPy(), name, weight)
    for i, got in enumerate(_tape_gradients(backend, name, arrays, weight)):
        numeric = np.zeros(arrays[i].shape)
        for j in range(arrays[i].size):
            for sign in (1, -1):
                shifted = [a.astype(np.float64) for a in arrays]
                shifted[i].reshape(-1)[j] += sign * eps
                numeric.reshape(-1)[j] += sign * loss(*shifted) / (2 * eps)
        np.testing.assert_allclose(got, numeric, rtol=rtol, atol=atol,
                                   err_msg="%s: gradient of operand %d vs central differences" % (name, i))


@pytest.mark.parametrize("name", differentiable_ops())
def test_table_gradient(ad, name):
    table_gradient_vs_torch(ad, name)
    table_gradient_vs_central_differences(ad, name)


def _with_rule(name, grad):
    """The table entry of `name` with another gradient rule."""
    op = ops.OPS[name]
    return ops.Op(name, op.kind, op.rule, grad, op.operators, op.domain, op.exactness, op.torch)


@pytest.mark.parametrize("name,wrong", [
    ("tanh", lambda y, g: g * 7.0),
    ("div", (lambda b, g: g / b, lambda b, g: g * 7.0)),      # the second operand's rule only
    ("max", lambda x, y, g, axis: g.expand(x.shape) * 7.0),
])
def test_a_wrong_rule_fails_the_generated_checks(monkeypatch, name, wrong):
    ad = cn.Autodiff(cn.NumPy())
    table_gradient_vs_torch(ad, name)
    table_gradient_vs_central_differences(ad, name)
    monkeypatch.setitem(ops.OPS, name, _with_rule(name, wrong))
    with pytest.raises(AssertionError, match="vs torch autograd"):
        table_gradient_vs_torch(ad, name)
    with pytest.raises(AssertionError, match="vs central differences"):
        table_gradient_vs_central_differences(ad, name)


class _NumPyWithLog1p(cn.NumPy):
    """cn.NumPy() with the one kernel line a new op adds."""

    def unary(self, op, x):
        return np.log1p(x) if op == "log1p" else super().unary(op, x)


def test_a_new_op_is_checked_as_soon_as_it_is_in_the_table(monkeypatch):
    # The scenario: log1p added the README's way, then its rule replaced by g * 7.
    entry = ops.Op("log1p", "unary", ops.FLOAT, lambda x, g: g / (x + 1.0), (), ops.POSITIVE, ops.ULP)
    monkeypatch.setitem(ops.OPS, "log1p", entry)
    assert "log1p" in differentiable_ops()
    assert [r.label for r in op_cases.conformance_rows() if r.name == "log1p"]
    numpy_backend = _NumPyWithLog1p()
    ad = cn.Autodiff(numpy_backend)
    table_gradient_vs_torch(ad, "log1p")
    table_gradient_vs_central_differences(ad, "log1p", numpy_backend)
    monkeypatch.setitem(ops.OPS, "log1p", _with_rule("log1p", lambda g: g * 7.0))
    with pytest.raises(AssertionError, match="vs torch autograd"):
        table_gradient_vs_torch(ad, "log1p")
    with pytest.raises(AssertionError, match="vs central differences"):
        table_gradient_vs_central_differences(ad, "log1p", numpy_backend)


# -- hand-written cases -------------------------------------------------------------------------

UNARY = [
    ("sigmoid", lambda x: x.sigmoid(), torch.sigmoid, [randn(2, 3)]),
    ("relu", lambda x: x.relu(), torch.relu, [randn(3, 4)]),
    ("gelu", lambda x: x.gelu(), TF.gelu, [randn(3, 4)]),
    ("softmax", lambda x: x.softmax(-1), lambda x: torch.softmax(x, -1), [randn(2, 5)]),
    ("softmax_axis0", lambda x: x.softmax(0), lambda x: torch.softmax(x, 0), [randn(3, 2, 2)]),
    ("log_softmax", lambda x: x.log_softmax(1), lambda x: torch.log_softmax(x, 1), [randn(2, 5)]),
    ("clamp", lambda x: x.clamp(-0.5, 0.5), lambda x: x.clamp(-0.5, 0.5), [randn(3, 4)]),
    ("cast_float", lambda x: x.cast(cn.float32) * 2.0, lambda x: x.float() * 2.0, [randn(2, 2)]),
]

BINARY = [
    ("add_both_broadcast", lambda a, b: a + b, lambda a, b: a + b, [randn(2, 1, 3), randn(4, 1)]),
    ("rsub_scalar", lambda a: 1.5 - a, lambda a: 1.5 - a, [randn(2, 3)]),
    ("rdiv_scalar", lambda a: 2.0 / a, lambda a: 2.0 / a, [pos(3)]),
    ("pow_scalar", lambda a: a ** 3.0, lambda a: a ** 3.0, [randn(2, 3)]),
    ("pow_zero_base", lambda a, b: a ** b, lambda a, b: a ** b,
     [np.array([0.0, 0.0, 1.5, 2.0], np.float32), np.array([2.0, 0.0, 0.0, 1.5], np.float32)]),
    ("maximum_ties", lambda a, b: a.maximum(b), torch.maximum,
     [np.array([1.0, 2.0, 3.0], np.float32), np.array([1.0, 0.0, 3.0], np.float32)]),
    ("minimum_ties", lambda a, b: a.minimum(b), torch.minimum,
     [np.array([1.0, 2.0, -3.0], np.float32), np.array([1.0, 0.0, -3.0], np.float32)]),
    ("where", lambda c, a, b: cn.where(c, a, b), torch.where,
     [_rng.random((2, 3)) > 0.5, randn(2, 3), randn(1, 3)]),
    ("where_scalar", lambda c, a: cn.where(c, a, 0.0), lambda c, a: torch.where(c, a, 0.0),
     [_rng.random((2, 3)) > 0.5, randn(3)]),
]

REDUCE = [
    ("sum_keepdim", lambda x: x.sum(0, keepdim=True), lambda x: x.sum(0, keepdim=True), [randn(3, 2)]),
    ("sum_axes", lambda x: x.sum((0, 2)), lambda x: x.sum((0, 2)), [randn(2, 3, 4)]),
    ("sum_all", lambda x: x.sum(), lambda x: x.sum(), [randn(2, 3)]),
    ("mean", lambda x: x.mean(-1), lambda x: x.mean(-1), [randn(2, 3)]),
    ("mean_all", lambda x: x.mean(), lambda x: x.mean(), [randn(2, 3)]),
    ("min_axis", lambda x: x.min(0, keepdim=True), lambda x: x.amin(0, keepdim=True), [randn(3, 4)]),
    ("max_ties", lambda x: x.max(1), lambda x: x.amax(1),
     [np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]], np.float32)]),
    ("max_all_ties", lambda x: x.max(), lambda x: x.max(), [np.array([[1.0, 3.0], [3.0, 0.0]], np.float32)]),
    ("min_all", lambda x: x.min(), lambda x: x.min(), [randn(2, 3)]),
    ("prod_zeros_negatives", lambda x: x.prod(1), lambda x: x.prod(1),
     [np.array([[0.0, -2.0, 3.0], [0.0, 0.0, 4.0], [-1.5, 2.0, -0.5], [2.0, -3.0, 0.0]], np.float32)]),
    ("prod_all", lambda x: x.prod(), lambda x: x.prod(), [np.array([[1.5, -2.0], [0.0, 3.0]], np.float32)]),
]

LINALG_MOVEMENT = [
    ("matmul", lambda a, b: a @ b, torch.matmul, [randn(2, 3), randn(3, 4)]),
    ("matmul_batched_broadcast", lambda a, b: a @ b, torch.matmul, [randn(2, 1, 3, 4), randn(3, 4, 2)]),
    ("matmul_vec", lambda a, b: a @ b, torch.matmul, [randn(3), randn(2, 3, 4)]),
    ("matmul_mat_vec", lambda a, b: a @ b, torch.matmul, [randn(2, 3), randn(3)]),
    ("reshape", lambda x: x.reshape(3, 4) * 2.0, lambda x: x.reshape(3, 4) * 2.0, [randn(2, 6)]),
    ("permute", lambda x: x.permute(2, 0, 1), lambda x: x.permute(2, 0, 1), [randn(2, 3, 4)]),
    ("transpose", lambda x: x.transpose(0, 1), lambda x: x.transpose(0, 1), [randn(2, 3)]),
    ("expand", lambda x: x.expand(2, 3, 4), lambda x: x.expand(2, 3, 4), [randn(3, 1)]),
    ("slice_steps", lambda x: x[1:, ::2, 1:4:2], lambda x: x[1:, ::2, 1:4:2], [randn(3, 5, 5)]),
    ("slice_step_runs_past_end", lambda x: x[::3], lambda x: x[::3], [randn(7, 2)]),
    ("index_int", lambda x: x[1, :, 0], lambda x: x[1, :, 0], [randn(2, 3, 2)]),
    ("index_list", lambda x: x[:, [2, 0, 2]], lambda x: x[:, [2, 0, 2]], [randn(2, 3)]),
    ("slice_negative_steps", lambda x: x[::-1, 4:0:-2], lambda x: x.flip(0)[:, [4, 2]], [randn(3, 5)]),
    ("index_bool_mask", lambda x, m: x[m > 0], lambda x, m: x[m > 0], [randn(3, 4), ints(2, 3, 4)]),
    ("setitem_slice_and_value", lambda x, v: _assigned(x, (slice(None), 1), v),
     lambda x, v: _assigned(x, (slice(None), 1), v), [randn(3, 4), randn(3)]),
    ("setitem_mask_broadcast", lambda x, v: _assigned(x, x > 0.5, v), lambda x, v: _assigned(x, x > 0.5, v),
     [randn(3, 4), randn(1)]),
    ("setitem_list_negative_step", lambda x, v: _assigned(x, ([2, 0], slice(None, None, -1)), v),
     lambda x, v: _assigned(x, ([2, 0], slice(None)), v.flip(-1)), [randn(3, 4), randn(2, 4)]),
    ("cat", lambda a, b: cn.cat([a, b], 1), lambda a, b: torch.cat([a, b], 1), [randn(2, 3), randn(2, 1)]),
    ("stack", lambda a, b: cn.stack([a, b], 0), lambda a, b: torch.stack([a, b], 0), [randn(2, 3), randn(2, 3)]),
    ("pad", lambda x: cn.pad(x, (1, 2, 0, 1), 0.5), lambda x: TF.pad(x, (1, 2, 0, 1), value=0.5), [randn(2, 3)]),
    ("gather", lambda x, i: x.gather(1, i), lambda x, i: x.gather(1, i), [randn(3, 4), ints(4, 2, 5)]),
    ("gather_axis0", lambda x, i: x.gather(0, i), lambda x, i: x.gather(0, i), [randn(3, 4), ints(3, 4, 2)]),
    ("scatter_add", lambda x, i, s: x.scatter_add(1, i, s), lambda x, i, s: x.scatter_add(1, i, s),
     [randn(2, 4), ints(4, 2, 3), randn(2, 3)]),
]

IMAGES_LOSSES = [
    ("conv2d", lambda x, w, b: cn.conv2d(x, w, b), TF.conv2d, [randn(2, 3, 5, 5), randn(4, 3, 3, 3), randn(4)]),
    ("conv2d_stride_pad_dilation",
     lambda x, w: cn.conv2d(x, w, None, stride=2, padding=2, dilation=2),
     lambda x, w: TF.conv2d(x, w, None, stride=2, padding=2, dilation=2), [randn(1, 2, 6, 5), randn(3, 2, 3, 2)]),
    ("conv2d_groups", lambda x, w, b: cn.conv2d(x, w, b, padding=1, groups=2),
     lambda x, w, b: TF.conv2d(x, w, b, padding=1, groups=2), [randn(1, 4, 4, 4), randn(6, 2, 3, 3), randn(6)]),
    ("max_pool2d", lambda x: cn.max_pool2d(x, 2), lambda x: TF.max_pool2d(x, 2), [randn(2, 2, 4, 6)]),
    ("max_pool2d_stride_pad", lambda x: cn.max_pool2d(x, 3, stride=2, padding=1),
     lambda x: TF.max_pool2d(x, 3, stride=2, padding=1), [randn(1, 2, 5, 5)]),
    ("avg_pool2d", lambda x: cn.avg_pool2d(x, 2), lambda x: TF.avg_pool2d(x, 2), [randn(2, 2, 4, 4)]),
    ("avg_pool2d_pad_exclude", lambda x: cn.avg_pool2d(x, 3, 2, 1, count_include_pad=False),
     lambda x: TF.avg_pool2d(x, 3, 2, 1, count_include_pad=False), [randn(1, 2, 5, 5)]),
    ("cross_entropy", lambda x, y: nn.cross_entropy(x, y), lambda x, y: TF.cross_entropy(x, y),
     [randn(4, 5), ints(5, 4)]),
    ("cross_entropy_smoothing_sum", lambda x, y: nn.cross_entropy(x, y, "sum", 0.1),
     lambda x, y: TF.cross_entropy(x, y, reduction="sum", label_smoothing=0.1), [randn(3, 4), ints(4, 3)]),
    ("cross_entropy_probs", lambda x, p: nn.cross_entropy(x, p.softmax(1)),
     lambda x, p: TF.cross_entropy(x, p.softmax(1)), [randn(3, 4), randn(3, 4)]),
    ("mse_loss", nn.mse_loss, TF.mse_loss, [randn(3, 4), randn(3, 4)]),
    ("binary_cross_entropy", lambda x, t: nn.binary_cross_entropy(x.sigmoid(), t),
     lambda x, t: TF.binary_cross_entropy(x.sigmoid(), t), [randn(3, 4), _rng.random((3, 4)).astype(np.float32)]),
    ("bce_with_logits", nn.binary_cross_entropy_with_logits, TF.binary_cross_entropy_with_logits,
     [randn(3, 4), _rng.random((3, 4)).astype(np.float32)]),
    ("layer_norm", lambda x, w, b: nn.functional.layer_norm(x, (4,), w, b),
     lambda x, w, b: TF.layer_norm(x, (4,), w, b), [randn(2, 3, 4), randn(4), randn(4)]),
    ("batch_norm_train", lambda x, w, b: _batch_norm_train(x, w, b),
     lambda x, w, b: TF.batch_norm(x, None, None, w, b, training=True), [randn(3, 2, 2, 2), randn(2), randn(2)]),
    ("embedding", lambda i, w: nn.functional.embedding(i, w), TF.embedding, [ints(5, 2, 3), randn(5, 4)]),
]


def _assigned(x, key, value):
    """y = x * 2, then y[key] = value: torch's index_put on a non-leaf. (torch has no negative
    steps: its side of a row writes them out.)"""
    y = x * 2.0
    y[key] = value
    return y


def _batch_norm_train(x, w, b):
    layer = nn.BatchNorm2d(2, backend=x.backend)
    layer.weight, layer.bias = w, b
    return layer(x)


CASES = UNARY + BINARY + REDUCE + LINALG_MOVEMENT + IMAGES_LOSSES


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_gradient_matches_torch(ad, case):
    _, cn_fn, torch_fn, arrays = case
    check_against_torch(ad, cn_fn, torch_fn, arrays)


def _random_broadcast_shapes(rng):
    """Two shapes that broadcast: random rank 1-4, dims 1-3, some set to 1, ranks may differ."""
    rank = int(rng.integers(1, 5))
    full = [int(d) for d in rng.integers(1, 4, rank)]
    a = [1 if rng.random() < 0.3 else d for d in full]
    b = [1 if rng.random() < 0.3 else d for d in full]
    return tuple(a[int(rng.integers(0, rank)):]) or (1,), tuple(b)


BROADCAST_OPS = [
    ("add", lambda a, b: a + b, lambda a, b: a + b),
    ("mul", lambda a, b: a * b, lambda a, b: a * b),
    ("div", lambda a, b: a / (b.abs() + 0.5), lambda a, b: a / (b.abs() + 0.5)),
    ("maximum", lambda a, b: a.maximum(b), torch.maximum),
    ("matmul_like_sum", lambda a, b: (a * b).sum(-1), lambda a, b: (a * b).sum(-1)),
]


@pytest.mark.parametrize("seed", range(6))
def test_random_broadcast_shapes(ad, seed):
    rng = np.random.default_rng(100 + seed)
    shape_a, shape_b = _random_broadcast_shapes(rng)
    for _, cn_fn, torch_fn in BROADCAST_OPS:
        check_against_torch(ad, cn_fn, torch_fn, [randn(*shape_a), randn(*shape_b)])
    cond = rng.random(shape_b) > 0.5
    check_against_torch(ad, lambda c, a, b: cn.where(c, a, b), torch.where, [cond, randn(*shape_a), randn(*shape_b)])


# -- finite differences, for ops PyTorch has no equivalent of ----------------------------------

def finite_difference_check(backend, fn, arrays, eps=1e-2, rtol=2e-2, atol=2e-3):
    """Central differences in float64 on the host vs the tape's gradient of sum(fn(x) * w)."""
    inputs = [cn.tensor(a, backend=backend).require_grad() for a in arrays]
    out = fn(*inputs)
    weight = randn(*out.shape)
    grads = (out * cn.tensor(weight, backend=backend)).sum().backward()

    def loss(values):
        ts = [cn.tensor(v.astype(np.float32), backend=backend) for v in values]
        return float((fn(*ts).numpy().astype(np.float64) * weight).sum())

    for i, a in enumerate(arrays):
        numeric = np.zeros(a.shape)
        for j in range(a.size):
            for sign in (1, -1):
                shifted = [v.astype(np.float64).copy() for v in arrays]
                shifted[i].reshape(-1)[j] += sign * eps
                numeric.reshape(-1)[j] += sign * loss(shifted) / (2 * eps)
        np.testing.assert_allclose(inputs[i].grad(grads).numpy(), numeric, rtol=rtol, atol=atol,
                                   err_msg="input %d" % i)


def test_unfold2d_with_pad_value_finite_differences(ad):
    # unfold with a non-zero pad value (what max pooling uses) has no torch counterpart.
    fn = lambda x: cn.unfold2d(x, (2, 3), stride=(2, 1), padding=1, dilation=(1, 2), pad_value=0.25)[0].tanh()
    finite_difference_check(ad, fn, [randn(1, 2, 3, 4)])


def test_fold2d_finite_differences(ad):
    # fold2d is a primitive only (torch's fold has no pad/dilation pairing with our layout test).
    def fn(cols):
        out = ad.fold2d(cols.handle, (3, 4), (2, 2), (1, 1), (1, 0), (1, 1))
        return cn.Tensor(ad, out, (1, 2, 3, 4), cn.float32).sin()
    finite_difference_check(ad, fn, [randn(1, 8, 12)])


def test_scatter_add_with_larger_src_finite_differences(ad):
    # torch's autograd rejects src larger than index; the protocol allows it (src is cropped).
    index = cn.tensor(ints(4, 2, 3), backend=ad)
    fn = lambda x, src: x.scatter_add(1, index, src).sin()
    finite_difference_check(ad, fn, [randn(2, 4), randn(3, 5)])


# -- the autodiff API ---------------------------------------------------------------------------

def test_grad_accumulates_over_reuse_and_ignores_unused(ad):
    x = cn.tensor([1.0, 2.0], backend=ad).require_grad()
    unused = cn.tensor([5.0], backend=ad).require_grad()
    y = (x * x + x * 3.0).sum()
    grads = y.backward()
    assert x.grad(grads).tolist() == [5.0, 7.0]
    assert unused.grad(grads) is None


def test_no_grad_records_nothing(ad):
    x = cn.tensor([1.0, 2.0], backend=ad).require_grad()
    with cn.no_grad():
        assert not cn.is_grad_enabled()
        y = (x * 2.0).sum()
    assert cn.is_grad_enabled()
    with pytest.raises(cn.NotDifferentiableError, match="does not require grad"):
        y.backward()


def test_no_grad_is_per_thread(ad):
    import threading
    x = cn.tensor([1.0, 2.0], backend=ad).require_grad()
    inside, done = threading.Event(), threading.Event()
    results = {}

    def other_thread():
        inside.wait()
        results["grad"] = x.grad((x * x).sum().backward()).tolist()  # records despite main's no_grad
        done.set()

    worker = threading.Thread(target=other_thread)
    worker.start()
    with cn.no_grad():
        inside.set()
        done.wait(60)
    worker.join()
    assert results["grad"] == [2.0, 4.0]


def test_no_grad_as_decorator(ad):
    x = cn.tensor([1.0], backend=ad).require_grad()
    double = cn.no_grad()(lambda t: t * 2.0)
    assert not ad.requires_grad(double(x)) and ad.requires_grad(x * 2.0)


def test_detach_stops_gradient(ad):
    x = cn.tensor([1.0, 2.0], backend=ad).require_grad()
    grads = (x * x.detach()).sum().backward()
    assert x.grad(grads).tolist() == [1.0, 2.0]


def test_backward_frees_the_tape(ad):
    x = cn.tensor([1.0, 2.0], backend=ad).require_grad()
    y = (x.exp() * 2.0).sum()
    y.backward()
    with pytest.raises(cn.NotDifferentiableError, match="already freed"):
        y.backward()
    # leaves survive: a new graph from x differentiates again
    assert x.grad((x * 3.0).sum().backward()).tolist() == [3.0, 3.0]


def test_backward_needs_autodiff_backend():
    x = cn.tensor([1.0, 2.0], backend=cn.NumPy())
    with pytest.raises(cn.NotDifferentiableError, match=r"cn\.Autodiff"):
        x.require_grad()
    with pytest.raises(cn.NotDifferentiableError, match=r"cn\.Autodiff"):
        x.sum().backward()


def test_int_tensors_cannot_require_grad(ad):
    with pytest.raises(cn.DTypeError, match="float"):
        cn.tensor([1, 2], backend=ad).require_grad()


def test_device_key_and_inner(ad):
    assert ad.device_key() != ad.inner.device_key()
    assert ad != ad.inner
    x = cn.tensor([1.0], backend=ad)
    with pytest.raises(cn.DeviceError):
        x + cn.tensor([1.0], backend=ad.inner)


def test_gradients_are_per_backward_call(ad):
    # Two graphs over one parameter, e.g. two threads: each backward returns its own gradients.
    w = cn.tensor([1.0, 2.0], backend=ad).require_grad()
    g1 = (w * 2.0).sum().backward()
    g2 = (w * w).sum().backward()
    assert w.grad(g1).tolist() == [2.0, 2.0]
    assert w.grad(g2).tolist() == [2.0, 4.0]


def test_non_scalar_backward_seeds_ones(ad):
    x = cn.tensor([[1.0, 2.0]], backend=ad).require_grad()
    assert x.grad((x * 3.0).backward()).tolist() == [[3.0, 3.0]]
