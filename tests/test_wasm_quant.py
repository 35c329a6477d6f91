"""cn.Wasm()'s integer product (runtime.h mm_pairs: int16 pairs on i32x4.dot_i16x8_s) and its
float16 storage.

MatMulInteger and DynamicQuantizeMatMul with 8-bit weights run the pairs kernel; the shapes
below cover its tiles' edges (rows past a multiple of 4, columns past 8 and 4, odd K, panels of
several column blocks). Integer outputs equal onnxruntime's exactly (7-bit int8 weights:
onnxruntime's u8 x s8 kernel saturates int16 pair sums with full-range ones, see
test_onnx_quant.py) and NumPy's int64 product with full-range weights; an A that does not fit
int16 takes the general int32 loop and is exact too."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import cinders as cn
from cinders.backend import QuantizedLayout
from cinders.onnx import load
from cinders.onnx.ops.quantization import quantized_product


@pytest.fixture(scope="module")
def wasm():
    return cn.Wasm()


def _matmul_integer(w, wz):
    node = helper.make_node("MatMulInteger", ["a", "w", "az", "wz"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", 2, None)],
                              [helper.make_tensor_value_info("y", 6, None)],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.uint8(117), "az"),
                               numpy_helper.from_array(wz, "wz")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


@pytest.mark.parametrize("m,k,n", [(1, 7, 5), (3, 9, 13), (4, 16, 8), (5, 33, 6), (9, 64, 44),
                                   (6, 255, 20), (17, 300, 300)])
@pytest.mark.parametrize("weights", [np.int8, np.uint8])
def test_matmul_integer_is_exact_against_onnxruntime(wasm, m, k, n, weights):
    rng = np.random.default_rng(m * 1000 + k + n)
    a = rng.integers(0, 256, (m, k)).astype(np.uint8)
    if weights == np.int8:
        w, wz = rng.integers(-63, 64, (k, n)).astype(np.int8), rng.integers(-3, 4, n).astype(np.int8)
    else:
        w, wz = rng.integers(0, 256, (k, n)).astype(np.uint8), rng.integers(0, 256, n).astype(np.uint8)
    data = _matmul_integer(w, wz)
    expected = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"a": a})[0]
    got = load(data, backend=wasm)(cn.tensor(a.astype(np.int32), backend=wasm)).numpy()
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(got, (a.astype(np.int64) - 117) @ (w.astype(np.int64) - wz))


def _product(wasm, a, q, zp, k, n, block=None):
    layout = QuantizedLayout(k, n, 8, block or k, (0, n, 1), zp=(0, 0 if zp is None else n, 1))
    dtype = cn.int8 if q.dtype == np.int8 else cn.uint8
    return quantized_product(cn.tensor(a, backend=wasm), cn.tensor(q, backend=wasm, dtype=dtype), None,
                             None if zp is None else cn.tensor(zp, backend=wasm, dtype=dtype), layout).numpy()


def test_full_range_weights_blocked_zero_points_and_wide_values(wasm):
    rng = np.random.default_rng(5)
    k, n = 70, 12
    a = rng.integers(-255, 256, (6, k)).astype(np.int32)
    q = rng.integers(-128, 128, (k, n)).astype(np.int8)
    for block in (32, 7):   # (an odd block: pairs of k that straddle two blocks)
        zp = rng.integers(-128, 128, (-(-k // block), n)).astype(np.int8)
        centered = q.astype(np.int64) - np.repeat(zp.astype(np.int64), block, axis=0)[:k]
        np.testing.assert_array_equal(_product(wasm, a, q, zp, k, n, block=block), a.astype(np.int64) @ centered)
    # an A past int16 (not MatMulInteger's, but the primitive's contract): the general loop, wrapping
    a[2, 5] = 40000
    a[4, 0] = -2 ** 31
    expected = ((a.astype(np.int64) @ q.astype(np.int64) + 2 ** 31) % 2 ** 32 - 2 ** 31).astype(np.int32)
    np.testing.assert_array_equal(_product(wasm, a, q, None, k, n), expected)


def test_dynamic_quantize_matmul_of_a_transformer_layer(wasm):
    """transformers.js' q8 form on a BERT-sized projection (panels of several column blocks)."""
    rng = np.random.default_rng(6)
    a = rng.standard_normal((1, 24, 256)).astype(np.float32)
    w = rng.integers(-63, 64, (256, 1000)).astype(np.int8)
    node = helper.make_node("DynamicQuantizeMatMul", ["a", "w", "ws"], ["y"], domain="com.microsoft")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", 1, a.shape)],
                              [helper.make_tensor_value_info("y", 1, None)],
                              [numpy_helper.from_array(w, "w"),
                               numpy_helper.from_array(rng.uniform(0.01, 0.02, 1000).astype(np.float32), "ws")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    data = model.SerializeToString()
    expected = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"a": a})[0]
    got = load(data, backend=wasm)(cn.tensor(a, backend=wasm)).numpy()
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4 * float(np.abs(expected).max()))


@pytest.mark.parametrize("values", ["normal", "positive", "zeros", "ties"])
def test_dynamic_quantize_linear_in_one_kernel_equals_onnxruntime(wasm, values, monkeypatch):
    rng = np.random.default_rng(7)
    x = {"normal": rng.standard_normal((3, 37)) * 4, "positive": rng.uniform(1, 2, (5, 8)),
         "zeros": np.zeros((2, 3)),
         "ties": np.array([[-2.0, 0.5, 1.5, 2.5, 3.5, 125.5, 253.0, -1.0, 0.0, 1.0, 7.25]])}[values]
    x = x.astype(np.float32)
    node = helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", 1, None)],
                              [helper.make_tensor_value_info(n, t, None) for n, t in (("y", 2), ("s", 1), ("z", 2))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    data = model.SerializeToString()
    expected = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    names, queue = [], wasm.commands.add
    monkeypatch.setattr(wasm, "_run", lambda name, *args: (names.append(name), queue(name, *args)))
    got = [t.numpy() for t in load(data, backend=wasm)(cn.tensor(x, backend=wasm))]
    assert names == ["dynamic_quantize_f32"], names
    for e, g in zip(expected, got):
        np.testing.assert_array_equal(g, e)


@pytest.mark.parametrize("engine", ["native", "wasmtime", "node"])
@pytest.mark.parametrize("values", ["nan", "huge", "negative_zero"])
def test_dynamic_quantize_kernel_is_the_composition(engine, values):
    """runtime.h dynamic_quantize_f32 (its range on pmin/pmax, which skip NaN as onnxruntime's
    range does, the clamp to 0..255 sending NaN to 0, the integer read from the float's bits)
    equals the composition of tensor ops on cn.Python() value for value, on vectors of 4k + 3
    values (the scalar tail too) with a NaN, a value of 1e30 or a -0 in the vector part and in
    the tail. Node runs the tab's module on V8, which lowers pmin/pmax itself."""
    from cinders.onnx.ops.quantization import DynamicQuantizeLinear
    rng = np.random.default_rng(8)
    x = (rng.standard_normal(203) * 3).astype(np.float32)
    special = {"nan": np.nan, "huge": -1e30, "negative_zero": -0.0}[values]
    x[[17, 201]] = special
    if values == "negative_zero":
        x = -np.abs(x)   # (every value <= 0: the range's top is 0 or -0)
    backend = cn.Wasm(engine=engine)
    got = [t.numpy() for t in DynamicQuantizeLinear(cn.tensor(x, backend=backend), outputs=3)]
    reference = cn.Python()
    expected = [t.numpy() for t in DynamicQuantizeLinear(cn.tensor(x, backend=reference), outputs=3)]
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(g, e)


# (m, k, n): K past and short of the 8 values pack_pairs reads per step, M = 1, the largest K
# of the pairs kernel (runtime.h Q_PANEL / 2 = 8192, odd), and past it the general int32 loop,
# once with sums of 255 * 255 terms that wrap int32 (K = 40,000 > 2**31 / 255**2)
EXTREME_SHAPES = [(1, 7, 4), (1, 9, 13), (5, 17, 8), (6, 24, 21), (7, 1030, 36), (3, 8191, 9), (1, 8193, 6),
                  (1, 40000, 3)]


def _extreme(rng, shape, low, high):
    """Integers of [low, high] with a third of them at each end (the largest products)."""
    v = rng.integers(low, high + 1, shape)
    ends = rng.random(shape)
    return np.where(ends < 1 / 3, low, np.where(ends > 2 / 3, high, v))


@pytest.mark.parametrize("engine", ["native", "wasmtime", "node"])
@pytest.mark.parametrize("weights", [np.int8, np.uint8])
def test_integer_product_is_exact_over_shapes_on_every_engine(engine, weights):
    """matmul_quantized's int32 product (MatMulInteger's) and its scaled float product (a QDQ
    activation's, a_scale) equal NumPy's, wrapped to int32, with A's values at +-255 and B's
    differences at +-255 (full-range 8-bit weights minus a zero point at the other end)."""
    backend = cn.Wasm(engine=engine)
    rng = np.random.default_rng(9)
    info = np.iinfo(weights)
    for m, k, n in EXTREME_SHAPES:
        a = _extreme(rng, (m, k), -255, 255).astype(np.int32)
        q = _extreme(rng, (k, n), info.min, info.max).astype(weights)
        zp = np.where(np.arange(n) % 2, info.min, info.max).astype(weights)   # (q - zp: +-255)
        expected = a.astype(np.int64) @ (q.astype(np.int64) - zp)
        expected = ((expected + 2 ** 31) % 2 ** 32 - 2 ** 31).astype(np.int32)
        np.testing.assert_array_equal(_product(backend, a, q, zp, k, n), expected, err_msg=str((m, k, n)))
        if k > 8192:   # (the scaled product sums integers only where the pairs kernel runs)
            continue
        a_scale, scale = np.float32(0.037), rng.uniform(0.001, 0.01, n).astype(np.float32)
        dtype = cn.int8 if weights == np.int8 else cn.uint8
        layout = QuantizedLayout(k, n, 8, k, (0, n, 1), scale=(0, 0, 1), zp=(0, 0, 1))
        got = quantized_product(cn.tensor((a * a_scale).astype(np.float32), backend=backend),
                                cn.tensor(q, backend=backend, dtype=dtype), cn.tensor(scale, backend=backend),
                                cn.tensor(zp, backend=backend, dtype=dtype), layout,
                                cn.tensor(a_scale, backend=backend)).numpy()
        np.testing.assert_array_equal(got, expected.astype(np.float32) * (a_scale * scale), err_msg=str((m, k, n)))
    # A values past int16, in a step of 8 and in the tail: the general loop, exact
    q = rng.integers(info.min, int(info.max) + 1, (21, 5)).astype(weights)
    for at, value in (((1, 9), 40000), ((2, 19), -40000)):
        a = rng.integers(-255, 256, (3, 21)).astype(np.int32)
        a[at] = value
        np.testing.assert_array_equal(_product(backend, a, q, None, 21, 5), a.astype(np.int64) @ q.astype(np.int64))
