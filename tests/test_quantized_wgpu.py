"""Weights stay quantized on cn.Wgpu (issue 28, item 3): int8 and 4-bit weights of MatMulInteger,
DynamicQuantizeMatMul and MatMulNBits stay packed in device memory and are dequantized inside
the matmul kernel (matmul_quantized); the float32 model's weights take 4x / ~8x the bytes. The
outputs equal cn.NumPy()'s, which tests/test_onnx_quant.py holds to onnxruntime's."""

import numpy as np
import pytest

import cinders as cn
from cinders.onnx import load

onnx = pytest.importorskip("onnx")
pytest.importorskip("wgpu")
from onnx import helper, numpy_helper  # noqa: E402

K, N = 512, 512
RNG = np.random.default_rng(11)
A = RNG.standard_normal((3, K)).astype(np.float32)


def _model(op, inputs, inits, domain="", **attrs):
    node = helper.make_node(op, ["a"] + inputs, ["y"], domain=domain, **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", 1, A.shape)],
                              [helper.make_tensor_value_info("y", 1, None)],
                              [numpy_helper.from_array(v, n) for n, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10
    return model.SerializeToString()


def float_model():
    return _model("MatMul", ["w"], {"w": RNG.standard_normal((K, N)).astype(np.float32)})


def int8_model():
    """DynamicQuantizeMatMul: what `cinders quantize --mode q8` and quantize_dynamic write."""
    return _model("DynamicQuantizeMatMul", ["w", "s", "z"], {
        "w": RNG.integers(-63, 64, (K, N)).astype(np.int8),
        "s": RNG.uniform(0.01, 0.02, N).astype(np.float32), "z": np.zeros(N, np.int8)},
        domain="com.microsoft")


def int4_model():
    """MatMulNBits, 4-bit blocks of 32 with packed zero points (MatMul4BitsQuantizer's layout)."""
    blocks = K // 32
    return _model("MatMulNBits", ["w", "s", "z"], {
        "w": RNG.integers(0, 256, (N, blocks, 16)).astype(np.uint8),
        "s": RNG.uniform(0.01, 0.1, N * blocks).astype(np.float32),
        "z": RNG.integers(0, 256, N * blocks // 2).astype(np.uint8)},
        domain="com.microsoft", K=K, N=N, bits=4, block_size=32)


def _resident_bytes(gpu, data):
    """Device bytes a loaded model holds, and the model (kept alive while measured)."""
    gpu.synchronize()
    gpu.empty_cache()
    before = gpu.memory_stats()["allocated_bytes"]
    model = load(data, backend=gpu)
    gpu.synchronize()
    return gpu.memory_stats()["allocated_bytes"] - before, model


def test_quantized_weights_take_a_quarter_and_an_eighth_of_the_float_bytes():
    gpu = cn.Wgpu(autotune=False)
    f32, kept = _resident_bytes(gpu, float_model())
    assert f32 >= 4 * K * N
    q8, kept8 = _resident_bytes(gpu, int8_model())
    q4, kept4 = _resident_bytes(gpu, int4_model())
    # int8: K*N bytes and N scales/zero points; 4-bit: K*N/2 bytes, a float32 scale per 32 values
    # (1/32 of the float bytes) and the packed zero points.
    assert 0.25 <= q8 / f32 < 0.26, (q8, f32)
    assert 0.125 <= q4 / f32 < 0.165, (q4, f32)
    del kept, kept8, kept4


@pytest.mark.parametrize("make", [int8_model, int4_model], ids=["int8", "int4"])
def test_quantized_matmul_runs_in_the_kernel_and_equals_numpy(make):
    data = make()
    gpu = cn.Wgpu(autotune=False)
    model = load(data, backend=gpu)
    x = cn.tensor(A, backend=gpu)
    with cn.profile(gpu) as p:
        got = model(x).numpy()
    names = [e["name"] for e in p.events if e["kind"] == "kernel"]
    assert "matmul_quantized" in names, names
    assert not any(n.startswith("matmul_") and n != "matmul_quantized" for n in names), names
    expected = load(data, backend=cn.NumPy())(cn.tensor(A, backend=cn.NumPy())).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)


def test_matmul_integer_is_exact_in_the_kernel():
    a = RNG.integers(0, 256, (4, 300)).astype(np.uint8)
    w = RNG.integers(-128, 128, (300, 9)).astype(np.int8)
    wz = RNG.integers(-3, 3, 9).astype(np.int8)
    node = helper.make_node("MatMulInteger", ["a", "w", "az", "wz"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", 2, a.shape)],
                              [helper.make_tensor_value_info("y", 6, None)],
                              [numpy_helper.from_array(w, "w"),
                               numpy_helper.from_array(np.uint8(131), "az"),
                               numpy_helper.from_array(wz, "wz")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    data = model.SerializeToString()
    gpu = cn.Wgpu(autotune=False)
    with cn.profile(gpu) as p:
        got = load(data, backend=gpu)(cn.tensor(a.astype(np.int32), backend=gpu)).numpy()
    assert "matmul_quantized" in [e["name"] for e in p.events if e["kind"] == "kernel"]
    # exact integers (onnxruntime's u8 x s8 kernel saturates pairs of products in int16 here)
    expected = (a.astype(np.int64) - 131) @ (w.astype(np.int64) - wz)
    np.testing.assert_array_equal(got, expected)
