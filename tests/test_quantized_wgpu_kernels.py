"""cn.Wgpu's quantized and half-precision convolutions on its conv kernels (issue 28): the direct
and the register-tiled forward kernels read an int8/uint8 weight from its packed words (or a
float16 one, in both storage layouts) and dequantize it as they stage it; an integer image sums
exactly in i32, a QDQ activation in f32. No unfold2d, no matmul, no float32 copy of the weight.
Both kernel kinds are forced on lavapipe (a CPU adapter, which runs only the direct kernel).
Integer results equal cn.NumPy()'s conv2d_quantized (tests/test_onnx_quant.py holds that to
onnxruntime); float results are held to 1e-4 of the output's largest magnitude."""

import numpy as np
import pytest

import cinders as cn
from cinders.onnx import load

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from test_onnx_float16 import _input, _ort, half_files  # noqa: E402  (the float16 models' files)
from test_quantized_conv import SHAPE, VARIANTS, cnn  # noqa: E402  (onnxruntime's quantized CNNs)
from test_quantized_weights import _kernels_run, _resident_bytes  # noqa: E402

__all__ = ["cnn", "half_files"]   # (fixtures shared with those modules)

RNG = np.random.default_rng(2028)


@pytest.fixture(scope="module")
def gpus():
    """cn.Wgpu with float16 as array<f16> (lavapipe has shader-f16) and packed two to a word
    (8-bit values are packed four to a word in both)."""
    return {"f16": cn.Wgpu(autotune=False), "packed": cn.Wgpu(autotune=False, shader_f16=False)}


@pytest.fixture(params=["direct", "reg", "reg-r64x128"])
def kind(request, monkeypatch):
    """The conv kernel kind the test forces where the product allows it (the tiled kernel needs
    8 output channels a group and 16 deep sums, conv.kernel_kind), and the tiled kernel's wider
    tile (chosen only for layers larger than lavapipe runs quickly)."""
    from cinders.wgpu import conv as wgpu_conv
    choose = wgpu_conv.kernel_kind
    monkeypatch.setattr(wgpu_conv, "kernel_kind", lambda og, k, cpu: choose(og, k, request.param == "direct"))
    if request.param == "reg-r64x128":
        monkeypatch.setattr(wgpu_conv, "reg_tile_for", lambda og, cols, groups: "r64x128")
    return request.param


# name: (N, C, image, O, kernel, stride, padding ((top, bottom), (left, right)), dilation, groups,
#        weight dtype, per-channel scale/zero point, weight held as a permuted view)
CASES = {
    "3x3 pad 1": (2, 8, (9, 9), 16, (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 1, "int8", True, False),
    "stem 5x5 stride 2, K=75": (1, 3, (13, 11), 16, (5, 5), (2, 2), ((2, 2), (2, 2)), (1, 1), 1, "uint8", False, False),
    "grouped asymmetric pads": (1, 16, (8, 7), 32, (3, 3), (2, 1), ((1, 0), (0, 2)), (1, 1), 2, "uint8", True, False),
    "depthwise dilated": (1, 12, (11, 9), 12, (3, 3), (1, 2), ((2, 2), (2, 2)), (2, 1), 12, "int8", True, False),
    "1x1 K=24": (2, 24, (5, 6), 24, (1, 1), (1, 1), ((0, 0), (0, 0)), (1, 1), 1, "int8", False, False),
    "strided weight view": (1, 8, (7, 7), 16, (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 1, "uint8", True, True),
    "long sum K=2700": (1, 300, (3, 4), 8, (3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), 1, "int8", True, False),
}
MODES = ["integer", "qdq", "half"]   # (the weight dtype matters only to the first two)


def _case(name, mode):
    n, c, image, o, kernel, stride, padding, dilation, groups, wtype, per_channel, view = CASES[name]
    lo, hi = (-128, 127) if wtype == "int8" else (0, 255)
    q = RNG.integers(lo, hi + 1, (o, c // groups) + kernel).astype(wtype)
    zp = RNG.integers(lo, hi + 1, o if per_channel else 1).astype(wtype)
    scale = RNG.uniform(0.001, 0.01, o if per_channel else 1).astype(np.float32)
    bias = RNG.standard_normal(o).astype(np.float32)
    if mode == "integer":   # uint8 image minus its zero point: exact int32 sums
        x, x_param = RNG.integers(0, 256, (n, c) + image).astype(np.int32), np.array(131, np.int32)
        return x, x_param, q, None, zp, None
    if mode == "qdq":       # a QDQ activation: int8 values times their scale
        x_scale = np.float32(0.03)
        x = (RNG.integers(-128, 128, (n, c) + image) * x_scale).astype(np.float32)
        return x, np.array(x_scale), q, scale, zp, bias
    x = RNG.standard_normal((n, c) + image).astype(np.float32)
    return x, None, RNG.standard_normal(q.shape).astype(np.float16), None, None, bias


def _conv(backend, name, arrays):
    """conv2d_quantized on `backend` (the weight as a permuted view where the case says)."""
    x, x_param, q, scale, zp, bias = arrays
    stride, padding, dilation, groups, view = CASES[name][5:9] + CASES[name][11:]
    put = lambda a, dtype=None: None if a is None else cn.tensor(a, backend=backend, dtype=dtype)  # noqa: E731
    qdtype = getattr(cn, q.dtype.name)
    if view:   # held (O, kh, kw, C/G) and permuted back: no weight row is contiguous
        w = put(np.ascontiguousarray(q.transpose(0, 2, 3, 1)), qdtype).permute(0, 3, 1, 2)
    else:
        w = put(q, qdtype)
    handles = [put(x, cn.int32 if x.dtype == np.int32 else None), put(x_param, cn.int32 if x.dtype == np.int32 else None),
               w, put(scale), put(zp, None if zp is None else qdtype), put(bias)]
    handles = [None if t is None else t.handle for t in handles]
    out = backend.conv2d_quantized(*handles, stride, padding, dilation, groups)
    return cn.Tensor(backend, out, backend.shape(out), cn.int32 if x.dtype == np.int32 and scale is None
                     else cn.float32).numpy()


def _torch_half(name, arrays):
    """The half case's convolution in float64 (torch) of the widened weight, + bias."""
    import torch
    x, _, q, _, _, bias = arrays
    stride, ((pt, pb), (pl, pr)), dilation, groups = CASES[name][5:9]
    xp = torch.nn.functional.pad(torch.from_numpy(x).double(), (pl, pr, pt, pb))
    return torch.nn.functional.conv2d(xp, torch.from_numpy(q.astype(np.float64)), torch.from_numpy(bias).double(),
                                      stride, 0, dilation, groups).numpy()


@pytest.mark.parametrize("name,mode,layout", [(name, mode, layout) for name in CASES for mode in MODES
                                              for layout in (("f16", "packed") if mode == "half" else ("f16",))])
def test_quantized_conv_on_both_kernels(gpus, kind, monkeypatch, name, mode, layout):
    gpu = gpus[layout]
    arrays = _case(name, mode)
    got, names = _kernels_run(gpu, monkeypatch, lambda: _conv(gpu, name, arrays))
    convs = [n for n in names if n.startswith("conv2d_q")]
    assert len(convs) == 1 and names == convs, names   # one launch: no unfold2d, matmul or copy
    n, c, _, o, kernel, *_, groups = CASES[name][:9]
    tiled = kind != "direct" and o // groups >= 8 and c // groups * kernel[0] * kernel[1] >= 16
    assert ("_reg_" in convs[0]) == tiled and (not tiled or convs[0].endswith(kind[4:] or "r64x64")), convs
    if mode == "half":
        want = _torch_half(name, arrays)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
        return
    want = _conv(cn.NumPy(), name, arrays)
    assert got.dtype == want.dtype and got.shape == want.shape
    if mode == "integer":
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("variant", VARIANTS)
def test_quantized_cnn_runs_every_conv_in_the_kernels(cnn, monkeypatch, variant):
    """onnxruntime's quantized CNN (stem, grouped, depthwise, pointwise convolutions): each
    convolution is one conv2d_qint8 launch on cn.Wgpu (no unfold2d, no float conv, no
    copy of the weight; the Linear is not a convolution), the output onnxruntime's; on
    cn.Fusion(cn.Wgpu()) too."""
    x = np.random.default_rng(5).standard_normal(SHAPE).astype(np.float32)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    expected = ort.InferenceSession(cnn[variant], options, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    gpu = cn.Wgpu(autotune=False)
    model = load(cnn[variant], backend=gpu)
    got, names = _kernels_run(gpu, monkeypatch, lambda: model(cn.tensor(x, backend=gpu)).numpy())
    assert len([n for n in names if n.startswith("conv2d_q")]) == 4, names
    assert names.count("matmul_quantized") <= 1, names   # (the Linear, where it is quantized)
    assert not [n for n in names if n.startswith(("unfold", "conv2d_reg", "conv2d_direct", "copy"))], names
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4 * float(np.abs(expected).max()))
    fused = cn.Fusion(gpu)
    got = load(cnn[variant], backend=fused)(cn.tensor(x, backend=fused)).numpy()
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4 * float(np.abs(expected).max()))


def _qdq_conv(quantized):
    """A 64 -> 64 channel 3x3 Conv of a QDQ activation whose weight is a DequantizeLinear of an
    int8 constant (per-channel scale), or (quantized False) the same conv with a float32 weight."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(64)
    w = rng.integers(-127, 128, (64, 64, 3, 3)).astype(np.int8)
    scale = rng.uniform(0.001, 0.01, 64).astype(np.float32)
    inits = {"xs": np.float32(0.05), "xz": np.int8(3), "b": rng.standard_normal(64).astype(np.float32)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"])]
    if quantized:
        inits.update(wq=w, ws=scale)
        nodes.append(helper.make_node("DequantizeLinear", ["wq", "ws"], ["w"], axis=0))
    else:
        inits["w"] = w.astype(np.float32) * scale.reshape(-1, 1, 1, 1)
    nodes.append(helper.make_node("Conv", ["xd", "w", "b"], ["y"], pads=[1, 1, 1, 1]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 64, 6, 6))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(np.asarray(v), n) for n, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model.SerializeToString()


def test_qdq_conv_weight_stays_8_bit_in_memory():
    """The joined DequantizedConv holds its weight at a quarter of the float32 bytes in
    memory_stats and reads it packed in one conv2d_qint8 launch (no unfold2d, no copy or cast of
    the weight: no kernel writes more than the image's bytes), the output onnxruntime's."""
    gpu = cn.Wgpu(autotune=False)
    f32, kept = _resident_bytes(gpu, _qdq_conv(False))
    q8, model = _resident_bytes(gpu, _qdq_conv(True))
    assert f32 >= 4 * 64 * 64 * 9 and q8 < 0.3 * f32, (q8, f32)
    x = RNG.standard_normal((1, 64, 6, 6)).astype(np.float32)
    t = cn.tensor(x, backend=gpu)
    with cn.profile(gpu) as p:
        got = model(t).numpy()
    kernels = [(e["name"], e["bytes_written"]) for e in p.events if e["kind"] == "kernel"]
    names = [name for name, _ in kernels]
    assert [n for n in names if n.startswith(("conv2d", "unfold", "copy", "matmul"))] == ["conv2d_qint8_direct"], names
    # no kernel writes anything the size of the weight (a float32 or int32 copy would be 147 KiB)
    assert max(written for _, written in kernels) <= 4 * x.size, kernels
    expected = ort.InferenceSession(_qdq_conv(True), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4 * float(np.abs(expected).max()))


@pytest.mark.parametrize("layout", ["f16", "packed"])
def test_half_cnn_runs_its_convs_on_the_float16_weights(half_files, monkeypatch, layout):
    """onnxruntime's float16 CNN (keep_io_types): its convolutions, the grouped one too, run on
    the conv kernels with the weight read as float16 (conv2d_qfloat16: no unfold2d, no matmul_quantized),
    the output onnxruntime's to a few float16 ulps (tests/test_onnx_float16.py); on
    cn.Fusion(cn.Wgpu()) too."""
    data, x = half_files[("cnn", True)], _input("cnn", False)
    expected = _ort(data, x)
    gpu = cn.Wgpu(autotune=False, shader_f16=layout == "f16")
    model = load(data, backend=gpu)
    got, names = _kernels_run(gpu, monkeypatch, lambda: model(cn.tensor(x, backend=gpu)).numpy())
    assert len([n for n in names if n.startswith("conv2d_qfloat16_")]) == 3, names   # (the grouped one too)
    assert not [n for n in names if n.startswith(("unfold", "copy"))] and "matmul_quantized" in names, names
    bound = 4e-3 * max(1.0, float(np.abs(expected).max()))
    assert np.abs(got - expected).max() <= bound
    fused = cn.Fusion(gpu)
    assert np.abs(load(data, backend=fused)(cn.tensor(x, backend=fused)).numpy() - expected).max() <= bound


# ---- matmul_quantized on the register-tiled loop --------------------------------------------

# name: (M, K, N, B's storage: dtype, bits, stored (N, K) "nk" or (K, N) "kn", block)
PRODUCTS = {
    "int8 (N, K) words": (96, 64, 80, "int8", 8, "nk", 0),
    "uint8 (K, N) words": (70, 48, 128, "uint8", 8, "kn", 0),
    "int8 single values": (65, 70, 67, "int8", 8, "nk", 0),
    "4-bit blocks of 16": (64, 96, 72, "uint8", 4, "nk", 16),
    "float16 (N, K)": (80, 40, 64, "float16", 16, "nk", 0),
    "small: the 32 x 32 tiles": (5, 64, 96, "int8", 8, "nk", 0),
}


def _product(name, integer):
    """(a, B's packed values, scale, zero point, QuantizedLayout, B as a float64 (K, N) matrix
    dequantized by the layout's definition, core/backend.py QuantizedLayout)."""
    from cinders.backend import QuantizedLayout
    m, k, n, dtype, bits, stored, block = PRODUCTS[name]
    a = RNG.integers(-255, 256, (m, k)).astype(np.int32) if integer else RNG.standard_normal((m, k)).astype(np.float32)
    if dtype == "float16":
        w = RNG.standard_normal((n, k)).astype(np.float16)
        return a, w.reshape(-1), None, None, QuantizedLayout(k, n, 16, k, (0, 1, k)), w.T.astype(np.float64)
    lo, hi = (-128, 127) if dtype == "int8" else (0, 255) if bits == 8 else (0, 15)
    values = RNG.integers(lo, hi + 1, (n, k) if stored == "nk" else (k, n))
    b = (values.T if stored == "nk" else values).astype(np.float64)
    block = block or k
    blocks = -(-k // block)
    zp = RNG.integers(lo, min(hi, lo + 20) + 1, (n, blocks))
    scale = RNG.uniform(0.5, 1.5, (n, blocks)).astype(np.float32)
    b = b - np.repeat(zp.T, block, axis=0)[:k]
    if not integer:
        b = b * np.repeat(scale.T, block, axis=0)[:k]
    q = (0, 1, k) if stored == "nk" else (0, n, 1)
    scale = None if integer else scale.reshape(-1)
    if bits == 4:   # two nibbles a byte, low first (rows of whole bytes)
        values, zp = values.reshape(-1), zp.reshape(-1)
        return a, (values[0::2] | (values[1::2] << 4)).astype(np.uint8), scale, \
            (zp[0::2] | (zp[1::2] << 4)).astype(np.uint8), \
            QuantizedLayout(k, n, 4, block, q, (0, 1, blocks), (0, 1, blocks), zp_bits=4), b
    return a, values.astype(dtype).reshape(-1), scale, zp.astype(dtype).reshape(-1), \
        QuantizedLayout(k, n, 8, block, q, (0, 1, blocks), (0, 1, blocks)), b


@pytest.mark.parametrize("name,integer,layout", [(name, integer, layout) for name in PRODUCTS for integer in (False, True)
                                                 for layout in (("f16", "packed") if "float16" in name else ("f16",))
                                                 if not (integer and "float16" in name)])
def test_quantized_matmul_on_the_register_tiles(gpus, monkeypatch, name, integer, layout):
    """The GPU's choice (forced on lavapipe): products whose sides fill 64 x 64 tiles run on the
    register-tiled loop (matmul_quantized_reg64; B stored (N, K) transposed so that its packed
    rows are the loop's k-contiguous operand), smaller ones on the 32 x 32 tiles; B dequantized
    as it is fetched (per-column and per-block scale and zero point, 8 and 4 bits, float16 in
    both layouts), integer A summed exactly in i32."""
    from cinders.wgpu import backend as wgpu_backend
    choose = wgpu_backend.quantized_tiling
    monkeypatch.setattr(wgpu_backend, "quantized_tiling", lambda m, n, cpu: choose(m, n, False))
    gpu = gpus[layout]
    a, packed, scale, zp, qlayout, b = _product(name, integer)
    qdtype = getattr(cn, packed.dtype.name)
    handles = [None if v is None else cn.tensor(v, backend=gpu, dtype=d).handle
               for v, d in ((a, None), (packed, qdtype), (scale, None), (zp, qdtype))]
    with cn.profile(gpu) as p:
        out = gpu.matmul_quantized(*handles, qlayout)
        got = cn.Tensor(gpu, out, (a.shape[0], qlayout.n), cn.int32 if integer else cn.float32).numpy()
    names = [e["name"] for e in p.events if e["kind"] == "kernel"]
    m, n = a.shape[0], qlayout.n
    assert names == ["matmul_quantized_reg64" if min(m, n) >= 64 else "matmul_quantized"], names
    want = a.astype(np.float64) @ b
    if integer:
        np.testing.assert_array_equal(got, want.astype(np.int64))
    else:
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_padded_rows_past_k_are_never_read_as_values(gpus, monkeypatch):
    """B stored (N, K) with rows padded to whole words (K 66, row stride 68) and blocks of 33: the
    register tiles read its words whole, and the two values of the last word past K (whose block
    would read a scale past the scales' end) stay 0, whatever the pool's buffers held before
    (here inf and NaN; a leftover NaN once gave a NaN column)."""
    import gc
    from cinders.backend import QuantizedLayout
    from cinders.wgpu import backend as wgpu_backend
    choose = wgpu_backend.quantized_tiling
    monkeypatch.setattr(wgpu_backend, "quantized_tiling", lambda m, n, cpu: choose(m, n, False))
    gpu = gpus["f16"]
    k, stride, n, block, m = 66, 68, 80, 33, 70
    packed = RNG.integers(-128, 128, (n, stride)).astype(np.int8)
    scale = RNG.uniform(0.5, 1.5, (n, 2)).astype(np.float32)
    a = RNG.standard_normal((m, k)).astype(np.float32)
    for fill in (np.inf, np.nan):
        for size in (161, 170, 192, 200, 256, 300, 512):   # stale values in the pool's buffers
            cn.tensor(np.full(size, fill, np.float32), backend=gpu).numpy()
        gc.collect()
        layout = QuantizedLayout(k, n, 8, block, (0, 1, stride), scale=(0, 1, 2))
        out = gpu.matmul_quantized(cn.tensor(a, backend=gpu).handle,
                                   cn.tensor(packed.reshape(-1), backend=gpu, dtype=cn.int8).handle,
                                   cn.tensor(scale.reshape(-1), backend=gpu).handle, None, layout)
        got = cn.Tensor(gpu, out, (m, n), cn.float32).numpy()
        want = a.astype(np.float64) @ (packed[:, :k].T * np.repeat(scale.T, block, axis=0)[:k])
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
