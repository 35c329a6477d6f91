"""conv2d's backward kernels on cn.Wgpu() (wgpu_backend/conv_grad.py: dx as a transposed
implicit GEMM, dw as a split implicit-GEMM reduction, dbias as a reduction) against torch's
gradients, under cn.Autodiff and cn.Autodiff(cn.Fusion(...)); the composed reference
(unfold2d/fold2d + matmul) is what a backend without the flag runs. The same grid runs on
cn.Wasm()'s kernels (runtime.h conv2d_grad_input_f32, _weight_f32, _bias_f32) on its native and
wasmtime engines.

torch (CPU, float64 from the same float32 data) is the oracle. Shapes are small: lavapipe runs
on two shared CPU cores.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import cinders as cn
import cinders.nn.functional as F
from cinders.wgpu import DeviceLimitError

from test_conv_kernels import torch_conv  # the forward oracle both files check against

RNG = np.random.default_rng(7)

# One row per case: batch, in channels, (H, W), out channels, kernel, stride, dilation, groups,
# padding (int, pair or ((top, bottom), (left, right))), activation, and the dx and dw kernels
# it must run (taps/direct, gemm/direct; "+" once dw's reduction is split into slices).
CASES = [
    (2, 16, (17, 15), 32, (3, 3), 1, 1, 1, 1, None, "taps", "gemm+"),
    (1, 16, (8, 9), 16, (3, 2), 2, (1, 2), 1, ((2, 0), (1, 3)), "relu", "taps", "gemm"),
    (3, 16, (7, 6), 32, (2, 3), (2, 1), 2, 2, (1, 2), None, "taps", "gemm"),
    (2, 8, (11, 9), 16, (3, 3), (1, 2), 1, 1, ((0, 1), (2, 0)), "relu6", "taps", "gemm"),
    (3, 6, (9, 8), 12, (3, 3), 2, 1, 6, 1, "relu", "direct", "direct"),        # depthwise x2
    (1, 8, (10, 7), 8, (5, 3), 1, (2, 1), 8, ((2, 2), (1, 1)), None, "direct", "direct"),  # depthwise
    (2, 4, (9, 9), 6, (3, 3), 3, 1, 2, 0, None, "direct", "direct"),
    (1, 3, (13, 11), 16, (3, 3), 1, 1, 1, 1, "relu", "direct", "gemm"),
    (2, 1, (12, 12), 8, (3, 3), 1, 1, 1, 1, None, "direct", "direct+"),    # a first layer
    (2, 16, (7, 5), 16, (1, 1), 2, 1, 1, 0, None, "taps", "gemm"),   # pointwise, stride 2: odd pixels get 0
]
FIELDS = "n c hw o kernel stride dilation groups padding activation dx dw".split()


def _case(row):
    return dict(zip(FIELDS, row))


def _case_id(row):
    return "n{n}c{c}o{o}k{kernel}s{stride}d{dilation}g{groups}p{padding}{activation}".format(
        **_case(row)).replace(" ", "")


def _gradients(backend, case):
    """(cinders' gradients of x, w, b, torch's, the kernel names launched by backward())."""
    x = RNG.standard_normal((case["n"], case["c"]) + case["hw"]).astype(np.float32)
    w = RNG.standard_normal((case["o"], case["c"] // case["groups"]) + case["kernel"]).astype(np.float32)
    b = RNG.standard_normal(case["o"]).astype(np.float32)
    cx, cw, cb = (cn.tensor(a, backend=backend).require_grad() for a in (x, w, b))
    out = cn.conv2d(cx, cw, cb, case["stride"], case["padding"], case["dilation"],
                    case["groups"], activation=case["activation"])
    upstream = RNG.standard_normal(out.shape).astype(np.float32)
    loss = (out * cn.tensor(upstream, backend=backend)).sum()
    with cn.profile(backend) as prof:
        grads = loss.backward()
        mine = [t.grad(grads).numpy() for t in (cx, cw, cb)]
    tx, tw, tb = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (x, w, b))
    (torch_conv(tx, tw, tb, case) * torch.tensor(upstream, dtype=torch.float64)).sum().backward()
    kernels = [e["name"] for e in prof.events if e.get("kind") == "kernel"]
    return mine, [t.grad.numpy() for t in (tx, tw, tb)], kernels


@pytest.fixture(scope="module")
def gpu():
    return cn.Wgpu(autotune=False)


@pytest.mark.parametrize("row", CASES, ids=_case_id)
def test_gradients_against_torch(gpu, row):
    """dx, dw and dbias from the backward kernels equal torch's; each case runs the kernels its
    row names, and backward() launches no unfold2d, fold2d or matmul."""
    case = _case(row)
    mine, theirs, kernels = _gradients(cn.Autodiff(gpu), case)
    for name, got, want in zip("xwb", mine, theirs):
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3, err_msg="d" + name)
    assert not [k for k in kernels if "fold" in k or "matmul" in k], kernels
    dx = [k for k in kernels if k.startswith("conv2d_dx_")]
    dw = [k for k in kernels if k.startswith("conv2d_dw_")]
    assert len(dx) == 1 and dx[0].split("_")[2] == case["dx"], kernels
    assert len(dw) == 1 and dw[0].split("_")[2] == case["dw"].rstrip("+"), kernels
    # A split reduction sums its slices with one reduction kernel after the dw kernel.
    split = kernels[kernels.index(dw[0]) + 1:kernels.index(dw[0]) + 2] == ["reduce_sum"]
    assert split == case["dw"].endswith("+"), kernels
    assert kernels.count("conv2d_db") == 1, kernels


@pytest.mark.parametrize("row", CASES[::3], ids=_case_id)
def test_gradients_under_fusion(gpu, row):
    """cn.Fusion forwards the ability: the same kernels run with pending groups as inputs."""
    mine, theirs, kernels = _gradients(cn.Autodiff(cn.Fusion(gpu)), _case(row))
    for name, got, want in zip("xwb", mine, theirs):
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3, err_msg="d" + name)
    assert any(k.startswith("conv2d_dx_") for k in kernels) and "conv2d_db" in kernels


@pytest.mark.parametrize("tile", ["t16", "t32", "t64", "t128"])
def test_every_tile(gpu, tile, monkeypatch):
    """dx and dw on each tile shape (forced: the choice follows the channel counts), grouped,
    strided and asymmetrically padded, against torch."""
    from cinders.wgpu import conv_grad
    monkeypatch.setattr(conv_grad, "tile_for", lambda rows, cols, groups: tile)
    case = _case((2, 32, (7, 6), 32, (3, 2), (2, 1), 1, 2, ((1, 0), (2, 1)), None, "taps", "gemm"))
    mine, theirs, kernels = _gradients(cn.Autodiff(gpu), case)
    assert {"conv2d_dx_taps_" + tile, "conv2d_dw_gemm_" + tile} <= set(kernels), kernels
    for name, got, want in zip("xwb", mine, theirs):
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3, err_msg="d" + name)


def test_a_capped_split(gpu):
    """dw with the binding limit lowered so that only two of the three slices its reduction
    wants fit: the partial products, its one intermediate, never exceed the limit, and the
    gradients stay torch's."""
    x = RNG.standard_normal((1, 16, 24, 24)).astype(np.float32)      # 36 KiB
    w = RNG.standard_normal((32, 16, 5, 5)).astype(np.float32)       # one slice of dw: 50 KiB
    limit = 2 * 4 * w.size + 4                                       # the output (72 KiB) fits
    backend = cn.Autodiff(gpu)
    pool, saved = gpu.pool, gpu.pool.limit
    pool.limit = limit
    try:
        cx, cw = (cn.tensor(a, backend=backend).require_grad() for a in (x, w))
        with cn.profile(gpu) as prof:
            grads = cn.conv2d(cx, cw, padding=2).sum().backward()
            got = cx.grad(grads).numpy(), cw.grad(grads).numpy()
    finally:
        pool.limit = saved
    written = [e["bytes_written"] for e in prof.events
               if e.get("kind") == "kernel" and e["name"].startswith("conv2d_dw_gemm")]
    assert written == [2 * 4 * w.size]
    tx, tw = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (x, w))
    TF.conv2d(tx, tw, padding=2).sum().backward()
    np.testing.assert_allclose(got[0], tx.grad.numpy(), rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(got[1], tw.grad.numpy(), rtol=1e-3, atol=1e-3)


def test_a_step_trains_where_the_unfolded_image_exceeds_the_binding_limit(gpu):
    """One SGD step of a conv -> ReLU -> conv model whose unfolded images (2.4 MB and 4.7 MB)
    exceed the binding limit, lowered to 1 MiB for the test (a real 128 MB one needs a model
    too slow for lavapipe): the composed backward (unfold2d of x) is refused at that limit;
    the kernels' step gives torch's updated weights."""
    backend = cn.Autodiff(gpu)
    x = RNG.standard_normal((1, 16, 64, 64)).astype(np.float32)       # 256 KiB
    w1 = (RNG.standard_normal((32, 16, 3, 3)) * 0.1).astype(np.float32)
    w2 = (RNG.standard_normal((8, 32, 3, 3)) * 0.1).astype(np.float32)
    b1 = (RNG.standard_normal(32) * 0.1).astype(np.float32)
    pool, saved = gpu.pool, gpu.pool.limit
    pool.limit = 1 << 20
    try:
        with pytest.raises(DeviceLimitError):
            cn.unfold2d(cn.tensor(x, backend=gpu), (3, 3), 1, 1)
        params = [cn.tensor(a, backend=backend).require_grad() for a in (w1, b1, w2)]
        cx = cn.tensor(x, backend=backend)
        h = cn.conv2d(cx, params[0], params[1], padding=1, activation="relu")  # (1, 32, 64, 64)
        loss = (cn.conv2d(h, params[2], stride=2, padding=1) ** 2).mean()
        grads = loss.backward()
        stepped = [(backend.to_inner(p) - p.grad(grads) * 0.5).numpy() for p in params]
        got_loss = float(loss.item())
    finally:
        pool.limit = saved
    tp = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (w1, b1, w2)]
    th = TF.relu(TF.conv2d(torch.tensor(x, dtype=torch.float64), tp[0], tp[1], padding=1))
    tloss = (TF.conv2d(th, tp[2], stride=2, padding=1) ** 2).mean()
    tloss.backward()
    assert got_loss == pytest.approx(tloss.item(), rel=1e-4)
    for got, p in zip(stepped, tp):
        np.testing.assert_allclose(got, (p - p.grad * 0.5).detach().numpy(), rtol=1e-3, atol=1e-4)


def test_the_ability_is_declared_and_forwarded(gpu):
    """cn.Wgpu declares conv2d_backward_kernels, cn.Fusion forwards it; other backends keep the
    composed reference (and cn.Autodiff consumes the flag, it does not declare it)."""
    assert gpu.conv2d_backward_kernels is True
    assert cn.Fusion(gpu).conv2d_backward_kernels is True
    for backend in (cn.NumPy(), cn.Python(), cn.Fusion(cn.NumPy()), cn.Autodiff(gpu)):
        assert backend.conv2d_backward_kernels is False


def test_mnist_cnn_step_matches_the_composed_path(gpu):
    """The MNIST CNN's training step (cross-entropy) with the kernels equals the composed path's
    (cn.NumPy() under the same weights), loss and every gradient."""
    from cinders.models.mnist import MnistCNN
    x = RNG.random((4, 1, 28, 28), dtype=np.float32)
    y = RNG.integers(0, 10, 4).astype(np.int32)
    results = []
    for inner in (gpu, cn.NumPy()):
        backend = cn.Autodiff(inner)
        cn.manual_seed(3)
        model = MnistCNN().to(backend)
        loss = F.cross_entropy(model(cn.tensor(x, backend=backend)), cn.tensor(y, backend=backend))
        grads = loss.backward()
        results.append([float(loss.item())] + [p.grad(grads).numpy() for p in model.parameters()])
    assert results[0][0] == pytest.approx(results[1][0], rel=1e-5)
    for got, want in zip(results[0][1:], results[1][1:]):
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-5)


# -- cn.Wasm(): the same table on the native build and on the .wasm module in Wasmtime --------

WASM_ENGINES = ("native", "wasmtime")
WASM_BACKWARD_KERNELS = ["conv2d_grad_input_f32", "conv2d_grad_weight_f32", "conv2d_grad_bias_f32"]


@pytest.fixture(scope="module", params=WASM_ENGINES)
def wasm(request):
    return cn.Wasm(engine=request.param)


@pytest.mark.parametrize("row", CASES, ids=_case_id)
def test_wasm_gradients_against_torch(wasm, row):
    """dx, dw and dbias from cn.Wasm()'s kernels equal torch's on both engines; each runs once,
    and backward() runs no unfold2d, fold2d or matmul kernel (the composed path's)."""
    mine, theirs, kernels = _gradients(cn.Autodiff(wasm), _case(row))
    for name, got, want in zip("xwb", mine, theirs):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg="d" + name)
    assert [k for k in kernels if k in WASM_BACKWARD_KERNELS] == WASM_BACKWARD_KERNELS, kernels
    assert not [k for k in kernels if "fold" in k or "matmul" in k], kernels


def test_wasm_column_panels(monkeypatch):
    """With panels of 8 pixels (segments that start and end inside output rows, the gradient's
    panel copied out of its rows, dw's partial products summed over many panels) the grid's
    cases still give torch's gradients."""
    import cinders.wasm.backend as wasm_backend
    monkeypatch.setattr(wasm_backend, "CONV_PANEL_BYTES", 32)
    backend = cn.Autodiff(cn.Wasm(engine="native"))
    for row in CASES[::2]:
        mine, theirs, _ = _gradients(backend, _case(row))
        for name, got, want in zip("xwb", mine, theirs):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg="d%s %s" % (name, row))


def test_wasm_gradients_are_deterministic_and_read_views(wasm):
    """The same step twice gives the same bits (dw's sums run in one fixed order), and an output
    gradient that is a view (expanded from one value per channel) is read as its values."""
    case = _case(CASES[2])
    x = RNG.standard_normal((case["n"], case["c"]) + case["hw"]).astype(np.float32)
    w = RNG.standard_normal((case["o"], case["c"] // case["groups"]) + case["kernel"]).astype(np.float32)
    backend = cn.Autodiff(wasm)
    args = (case["stride"], case["padding"], case["dilation"], case["groups"])
    runs = []
    for _ in range(2):
        cx, cw = (cn.tensor(a, backend=backend).require_grad() for a in (x, w))
        out = cn.conv2d(cx, cw, None, *args)
        # a per-channel weighting broadcast over the image: the gradient arrives expanded
        scale = cn.tensor(np.arange(out.shape[1], dtype=np.float32).reshape(1, -1, 1, 1), backend=backend)
        grads = (out * scale).sum().backward()
        runs.append([t.grad(grads).numpy() for t in (cx, cw)])
    for first, second in zip(*runs):
        np.testing.assert_array_equal(first, second)
    tx, tw = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (x, w))
    tscale = torch.arange(out.shape[1], dtype=torch.float64).reshape(1, -1, 1, 1)
    (torch_conv(tx, tw, None, case) * tscale).sum().backward()
    np.testing.assert_allclose(runs[0][0], tx.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(runs[0][1], tw.grad.numpy(), rtol=1e-4, atol=1e-4)


def _torch_mnist_cnn(model):
    """torch's twin of MnistCNN with its weights (Sequential keys without "layers.")."""
    net = torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(1568, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    net.load_state_dict({k[len("layers."):]: torch.from_numpy(v.numpy().copy())
                         for k, v in model.state_dict().items()})
    return net.double()


def test_wasm_mnist_cnn_training_step_matches_torch(wasm):
    """One SGD step of the MNIST CNN on cn.Wasm(): the loss and every updated weight equal
    torch's (float64), and the step's convolutions ran their backward kernels (the max pools
    still fold: they are unfold2d + max on every backend without pool kernels)."""
    from cinders.models.mnist import MnistCNN
    x = RNG.random((8, 1, 28, 28), dtype=np.float32)
    y = RNG.integers(0, 10, 8).astype(np.int32)
    backend = cn.Autodiff(wasm)
    cn.manual_seed(5)
    model = MnistCNN().to(backend)
    net = _torch_mnist_cnn(model)
    with cn.profile(backend) as prof:
        loss = F.cross_entropy(model(cn.tensor(x, backend=backend)), cn.tensor(y, backend=backend))
        model = cn.optim.SGD(lr=0.1).step(model, loss.backward())
    names = [e["name"] for e in prof.events if e.get("kind") == "kernel"]
    tloss = TF.cross_entropy(net(torch.tensor(x, dtype=torch.float64)), torch.tensor(y, dtype=torch.int64))
    tloss.backward()
    with torch.no_grad():
        for p in net.parameters():
            p -= 0.1 * p.grad
    assert float(loss.item()) == pytest.approx(tloss.item(), rel=1e-5)
    theirs = net.state_dict()
    for key, value in model.state_dict().items():
        np.testing.assert_allclose(value.numpy(), theirs[key[len("layers."):]].numpy(),
                                   rtol=1e-4, atol=1e-5, err_msg=key)
    assert names.count("conv2d_grad_weight_f32") == 2 and names.count("conv2d_grad_input_f32") == 1
    assert names.count("conv2d_grad_bias_f32") == 2 and names.count("fold2d_f32") == 2, names


def test_wasm_declares_the_ability(wasm):
    """cn.Wasm declares conv2d_backward_kernels on every engine; cn.Autodiff over it consumes it."""
    assert wasm.conv2d_backward_kernels is True
    assert cn.Autodiff(wasm).conv2d_backward_kernels is False
