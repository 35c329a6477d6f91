"""conv2d without im2col: cn.Wgpu()'s implicit-GEMM and direct kernels (wgpu_backend/conv.py)
and cn.Wasm()'s kernel (wasm_backend/runtime.h) against torch, the optional conv2d primitive's
dispatch and gradient, and a convolution whose unfolded matrix would not fit one binding.

torch (CPU, float64 from the same float32 data) is the oracle; cn.NumPy() and cn.Python() run
the composed reference (unfold2d + matmul) through the same grid. Shapes are small: lavapipe
and the pure-Python backend share two CPU cores.
"""

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import cinders as cn
from cinders.errors import ArgumentError, ShapeError
from cinders.wgpu import DeviceLimitError

RNG = np.random.default_rng(21)

# (stride, dilation, groups, padding) covered in full (unequal pairs catch a swapped axis); the
# rest of a case (batch, sizes, channels, bias, activation) cycles through the lists below so
# every value meets several combinations. groups "dw" is depthwise (groups == C, channel multiplier 2).
STRIDES, DILATIONS, GROUPS = (1, 2, (2, 1)), (1, (1, 2)), (1, 2, "dw")
PADDINGS = (0, (1, 2), ((2, 0), (1, 3)))        # none, symmetric (ph, pw), asymmetric
SIZES = ((7, 9), (6, 5), (9, 8))                 # odd and even, never square
BATCHES, BIASES = (1, 3), (True, False)
ACTIVATIONS = (None, "relu", "relu6", "silu", "hardswish", "hardsigmoid")
OUT_CHANNELS = (16, 6)                           # 16: the tiled kernel (groups 1/2), 6: direct
# C is 16 or 8: K = (C/G) x taps, so the tiled kernel's 8-deep K steps end inside a tap or a channel


def _grid():
    cases = []
    combos = itertools.product(STRIDES, DILATIONS, GROUPS, PADDINGS)
    for i, (stride, dilation, groups, padding) in enumerate(combos):
        c = (16, 8, 8)[i % 3]
        o = 2 * c if groups == "dw" else OUT_CHANNELS[i % 2]
        g = c if groups == "dw" else groups
        cases.append(dict(n=BATCHES[i % 2], c=c, hw=SIZES[i % 3], o=o, kernel=(3, 2 + i % 2),
                          stride=stride, dilation=dilation, groups=g, padding=padding,
                          bias=BIASES[(i // 2) % 2], activation=ACTIVATIONS[i % len(ACTIVATIONS)]))
    return cases


GRID = _grid()


def _case_id(case):
    return "n{n}c{c}o{o}g{groups}s{stride}d{dilation}p{padding}{b}{act}".format(
        b="b" if case["bias"] else "", act=case["activation"] or "", **case).replace(" ", "")


def _arrays(case):
    x = RNG.standard_normal((case["n"], case["c"]) + case["hw"]).astype(np.float32)
    w = RNG.standard_normal((case["o"], case["c"] // case["groups"]) + case["kernel"]).astype(np.float32)
    b = RNG.standard_normal(case["o"]).astype(np.float32) if case["bias"] else None
    return x, w, b


def torch_conv(x, w, b, case):
    """torch's conv2d (+ activation) in float64; asymmetric padding through F.pad."""
    padding = case["padding"]
    if isinstance(padding, tuple) and isinstance(padding[0], tuple):
        (pt, pb), (pl, pr) = padding
        x, padding = TF.pad(x, (pl, pr, pt, pb)), 0
    y = TF.conv2d(x, w, b, case["stride"], padding, case["dilation"], case["groups"])
    return {None: y, "relu": TF.relu(y), "relu6": TF.relu6(y), "silu": TF.silu(y), "hardswish": TF.hardswish(y),
            "hardsigmoid": TF.hardsigmoid(y)}[case["activation"]]


def _cn_conv(backend, x, w, b, case):
    t = lambda a: None if a is None else cn.tensor(a, backend=backend)  # noqa: E731
    return cn.conv2d(t(x), t(w), t(b), case["stride"], case["padding"], case["dilation"],
                     case["groups"], activation=case["activation"])


def _expected(x, w, b, case):
    t = lambda a: None if a is None else torch.tensor(a, dtype=torch.float64)  # noqa: E731
    return torch_conv(t(x), t(w), t(b), case).numpy()


@pytest.fixture(scope="module")
def gpu():
    return cn.Wgpu(autotune=False)


@pytest.fixture
def gpu_kinds(monkeypatch):
    """The kernel choice a GPU gets (lavapipe, a CPU adapter, runs the direct kernel only)."""
    from cinders.wgpu import conv as wgpu_conv
    choose = wgpu_conv.kernel_kind
    monkeypatch.setattr(wgpu_conv, "kernel_kind", lambda og, k, cpu: choose(og, k, False))


@pytest.fixture(scope="module")
def wasm():
    return cn.Wasm()


@pytest.mark.parametrize("case", GRID, ids=_case_id)
def test_grid_against_torch(gpu, wasm, case):
    """Every case on cn.Wgpu() and cn.Wasm() (their kernels) and cn.NumPy() (the composed
    reference)."""
    x, w, b = _arrays(case)
    want = _expected(x, w, b, case)
    for backend in (gpu, wasm, cn.NumPy()):
        got = _cn_conv(backend, x, w, b, case)
        assert got.shape == want.shape
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4, err_msg=repr(backend))


def test_grid_sample_on_python():
    """The pure-Python backend (composed reference) on every 5th case."""
    for case in GRID[::5]:
        x, w, b = _arrays(case)
        got = np.array(_cn_conv(cn.Python(), x, w, b, case).tolist())
        np.testing.assert_allclose(got, _expected(x, w, b, case), rtol=1e-4, atol=1e-4)


def _kernels(backend, fn):
    with cn.profile(backend) as prof:
        out = fn()
        out.numpy()
    return [e["name"] for e in prof.events if e.get("kind") == "kernel"]


def test_wasm_column_panels_and_pointwise(wasm, monkeypatch):
    """cn.Wasm() gathers a convolution's columns a panel of pixels at a time: with panels of 8
    pixels (segments that start and end inside output rows) the grid still matches torch, and
    so does a 1x1 convolution, which multiplies the image itself."""
    import cinders.wasm.backend as wasm_backend
    monkeypatch.setattr(wasm_backend, "CONV_PANEL_BYTES", 32)
    pointwise = dict(GRID[0], kernel=(1, 1), stride=1, dilation=1, padding=0, groups=2)
    for case in GRID[::4] + [pointwise]:
        x, w, b = _arrays(case)
        got = _cn_conv(wasm, x, w, b, case).numpy()
        np.testing.assert_allclose(got, _expected(x, w, b, case), rtol=1e-4, atol=1e-4,
                                   err_msg=_case_id(case))


def test_the_grid_runs_both_kernels_and_never_unfolds(gpu, gpu_kinds):
    """The register-tiled implicit GEMM and the direct kernel each run in the grid, as one
    launch with bias and activation inside, and no unfold2d or matmul kernel is launched."""
    seen = set()
    for case in GRID:
        x, w, b = _arrays(case)
        names = _kernels(gpu, lambda: _cn_conv(gpu, x, w, b, case))
        convs = [n for n in names if n.startswith("conv2d_")]
        assert len(convs) == 1 and not [n for n in names if "unfold" in n or "matmul" in n], names
        assert convs[0].endswith("_" + case["activation"]) if case["activation"] else \
            not convs[0].endswith("relu") and not convs[0].endswith("relu6")
        seen.add(convs[0].split("_")[1])
    assert seen == {"reg", "direct"}


@pytest.mark.parametrize("tile", ["r64x128", "r64x64"])
def test_both_tiles_and_strided_weights(gpu, gpu_kinds, tile, monkeypatch):
    """Both register tiles of the implicit GEMM (the large one is chosen only for layers bigger
    than lavapipe can run quickly, so it is forced here) on the grid's tiled cases, with the
    weight contiguous (read at k) and as a permuted view (read through its strides)."""
    from cinders.wgpu import conv as wgpu_conv
    monkeypatch.setattr(wgpu_conv, "reg_tile_for", lambda og, cols, groups: tile)
    ran = 0
    for case in GRID[::3]:
        x, w, b = _arrays(case)
        want = _expected(x, w, b, case)
        names = _kernels(gpu, lambda: _cn_conv(gpu, x, w, b, case))
        ran += any(n.startswith("conv2d_reg_" + tile) for n in names)
        assert not [n for n in names if "_reg_" in n and tile not in n], names
        np.testing.assert_allclose(_cn_conv(gpu, x, w, b, case).numpy(), want,
                                   rtol=1e-4, atol=1e-4, err_msg=_case_id(case))
        # The same weight held as (O, kh, kw, C/G) and permuted back: no row is contiguous.
        w_view = cn.tensor(np.ascontiguousarray(w.transpose(0, 2, 3, 1)), backend=gpu).permute(0, 3, 1, 2)
        t = lambda a: None if a is None else cn.tensor(a, backend=gpu)  # noqa: E731
        got = cn.conv2d(t(x), w_view, t(b), case["stride"], case["padding"], case["dilation"],
                        case["groups"], activation=case["activation"])
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4, err_msg=_case_id(case))
    assert ran >= 6  # the grid's tiled cases among every third


def test_column_tiles_past_the_grid_limit_continue_in_z(gpu, gpu_kinds, monkeypatch):
    """More column tiles than a grid dimension holds (65,535 on real devices: a conv with over
    8.4 million output pixels) continue in z: with the limit lowered to 3, a conv of 5 column
    tiles runs on a 3 x 1 x 2 grid (the last z row half empty) and matches torch."""
    from cinders.wgpu import conv as wgpu_conv
    monkeypatch.setattr(wgpu_conv, "MAX_GROUPS", 3)
    monkeypatch.setattr(wgpu_conv, "reg_tile_for", lambda og, cols, groups: "r64x128")
    case = dict(GRID[0], n=1, c=16, hw=(20, 32), o=8, kernel=(3, 3), stride=1, dilation=1,
                padding=1, groups=1, bias=True, activation="relu")
    assert wgpu_conv.spill_grid(640, 8, 1, wgpu_conv.REG_TILES["r64x128"]) == (3, 1, 2)
    x, w, b = _arrays(case)
    np.testing.assert_allclose(_cn_conv(gpu, x, w, b, case).numpy(), _expected(x, w, b, case),
                               rtol=1e-4, atol=1e-4)


def test_strided_views_and_nan(gpu, wasm):
    """Inputs that are views (a permuted image, a sliced weight) are read right (Wgpu through
    their strides); NaN propagates through the relu epilogue like torch's relu."""
    x = RNG.standard_normal((2, 5, 4, 3)).astype(np.float32)        # (N, W, H, C): permuted below
    w = RNG.standard_normal((2, 16, 3, 3, 3)).astype(np.float32)    # the second half is used
    x[1, 2, 1, 0] = np.nan
    b = RNG.standard_normal(16).astype(np.float32)
    want = TF.relu(TF.conv2d(torch.tensor(x).permute(0, 3, 2, 1), torch.tensor(w[1]),
                             torch.tensor(b), padding=1)).numpy()
    assert np.isnan(want).any()
    for backend in (gpu, wasm):
        xs = cn.tensor(x, backend=backend).permute(0, 3, 2, 1)
        ws = cn.tensor(w, backend=backend)[1]
        got = cn.conv2d(xs, ws, cn.tensor(b, backend=backend), padding=1, activation="relu").numpy()
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_abilities_are_declared():
    """The conv2d kernel is a declared ability; decorators forward the flag of what they wrap."""
    gpu = cn.Wgpu(autotune=False)
    assert gpu.conv2d_kernel is True and cn.Wasm().conv2d_kernel is True
    assert cn.Autodiff(gpu).conv2d_kernel is True
    assert cn.Fusion(gpu).conv2d_kernel is True
    assert cn.Autodiff(cn.Fusion(gpu)).conv2d_kernel is True
    for backend in (cn.NumPy(), cn.Python(), cn.Autodiff(cn.NumPy()), cn.Fusion(cn.NumPy())):
        assert backend.conv2d_kernel is False


WRAPPED = {"autodiff-wgpu": lambda: cn.Autodiff(cn.Wgpu(autotune=False)),
           "autodiff-fusion-wgpu": lambda: cn.Autodiff(cn.Fusion(cn.Wgpu(autotune=False))),
           "autodiff-wasm": lambda: cn.Autodiff(cn.Wasm())}


@pytest.mark.parametrize("wrap", list(WRAPPED))
@pytest.mark.parametrize("case", [GRID[5], GRID[17], GRID[26], GRID[34]], ids=_case_id)
def test_gradient_against_torch(wrap, case):
    """d/dx, d/dw and d/dbias through the kernel (its rule composed from unfold2d/fold2d and
    matmul) equal torch's, the activation's gradient included."""
    backend = WRAPPED[wrap]()
    x, w, b = _arrays(case)
    cx, cw = (cn.tensor(a, backend=backend).require_grad() for a in (x, w))
    cb = None if b is None else cn.tensor(b, backend=backend).require_grad()
    upstream = RNG.standard_normal(_expected(x, w, b, case).shape).astype(np.float32)
    out = cn.conv2d(cx, cw, cb, case["stride"], case["padding"], case["dilation"], case["groups"],
                    activation=case["activation"])
    grads = (out * cn.tensor(upstream, backend=backend)).sum().backward()

    tx, tw = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (x, w))
    tb = None if b is None else torch.tensor(b, dtype=torch.float64, requires_grad=True)
    (torch_conv(tx, tw, tb, case) * torch.tensor(upstream, dtype=torch.float64)).sum().backward()
    pairs = [(cx, tx), (cw, tw)] + ([] if b is None else [(cb, tb)])
    for mine, theirs in pairs:
        np.testing.assert_allclose(mine.grad(grads).numpy(), theirs.grad.numpy(), rtol=1e-3, atol=1e-3)


def test_a_conv_whose_unfolded_matrix_exceeds_the_binding_limit(gpu):
    """A two-conv model whose im2col matrices (2.4 MB and 4.7 MB) exceed the binding limit runs.
    The limit the backend believes in is lowered to 1 MiB for this test (a real 128 MB one would
    need a model too slow for lavapipe); the composed path, unfold2d, is refused at that limit."""
    pool = gpu.pool
    saved = pool.limit
    x = RNG.standard_normal((1, 16, 64, 64)).astype(np.float32)      # 256 KiB
    w1 = (RNG.standard_normal((32, 16, 3, 3)) * 0.1).astype(np.float32)
    w2 = (RNG.standard_normal((32, 32, 3, 3)) * 0.1).astype(np.float32)
    b1 = RNG.standard_normal(32).astype(np.float32)
    tx, tw1, tw2, tb1 = (torch.tensor(a) for a in (x, w1, w2, b1))
    want = TF.conv2d(TF.relu(TF.conv2d(tx, tw1, tb1, padding=1)), tw2, None, stride=2, padding=1)
    pool.limit = 1 << 20
    try:
        cx = cn.tensor(x, backend=gpu)
        with pytest.raises(DeviceLimitError):
            cn.unfold2d(cx, (3, 3), 1, 1)
        h = cn.conv2d(cx, cn.tensor(w1, backend=gpu), cn.tensor(b1, backend=gpu), padding=1,
                      activation="relu")                                # (1, 32, 64, 64): 512 KiB
        got = cn.conv2d(h, cn.tensor(w2, backend=gpu), None, stride=2, padding=1).numpy()
    finally:
        pool.limit = saved
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-4)


ONNX_CONVS = [  # (x shape, w shape, Conv attributes)
    ((1, 3, 7, 8), (5, 3, 3, 3), dict(pads=[2, 0, 1, 3], strides=[2, 1])),
    ((2, 4, 9, 6), (8, 2, 3, 2), dict(pads=[1, 0, 2, 1], group=2, dilations=[2, 1])),
    ((1, 6, 5, 7), (6, 1, 3, 3), dict(auto_pad="SAME_LOWER", group=6, strides=[2, 1])),
    ((3, 4, 11), (16, 4, 3), dict(pads=[0, 2], strides=[2])),                       # 1-D
]


@pytest.mark.parametrize("x_shape, w_shape, attrs", ONNX_CONVS)
def test_onnx_conv_against_onnxruntime(gpu, x_shape, w_shape, attrs):
    """ONNX Conv (asymmetric pads, auto_pad, groups, 1-D) hands its pads to the kernel; the
    result equals onnxruntime's."""
    import onnxruntime
    from onnx import TensorProto, helper, numpy_helper
    from cinders.onnx import load
    w = RNG.standard_normal(w_shape).astype(np.float32)
    b = RNG.standard_normal(w_shape[0]).astype(np.float32)
    x = RNG.standard_normal(x_shape).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)
    graph = helper.make_graph([node], "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()
    want = onnxruntime.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = load(data, backend=gpu)(cn.tensor(x, backend=gpu)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_bad_arguments_are_clear_errors(gpu):
    x = cn.zeros((1, 2, 5, 5), backend=gpu)
    w = cn.zeros((4, 2, 3, 3), backend=gpu)
    with pytest.raises(ArgumentError, match="activation"):
        cn.conv2d(x, w, activation="gelu")
    with pytest.raises(ShapeError, match="padding"):
        cn.conv2d(x, w, padding=((1, 2), (3,)))
    with pytest.raises(ShapeError, match="padding"):
        cn.conv2d(x, w, padding=-1)
    with pytest.raises(ShapeError, match="too small"):
        cn.conv2d(x, w, padding=((0, 0), (0, 0)), dilation=3)
