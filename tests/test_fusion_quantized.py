"""cn.Fusion forwards the products whose weights stay packed (core/fusion/backend.py,
"quantized_matmul" and "quantized_conv2d"): under cn.Fusion(cn.Wgpu()) an int8, 4-bit or
float16 model holds its weights at their size, reads them inside the inner backend's kernel and
gives cn.Wgpu()'s answer (tests/test_quantized_weights.py and test_onnx_float16.py hold that to
onnxruntime); cn.Fusion(cn.NumPy()), which passes every op through, keeps them packed too."""

import numpy as np
import pytest

import cinders as cn
from cinders.onnx import load

from test_onnx_float16 import WEIGHT, _matmul_file
from test_quantized_weights import A, _qdq_model, float_model, int4_model, int8_model


def half_model():
    return _matmul_file(WEIGHT.astype(np.float16))


def _loaded(backend, data):
    """(device bytes the loaded model holds, the model)."""
    gpu = backend.inner if backend.name == "fusion" else backend
    gpu.synchronize()
    gpu.empty_cache()
    before = gpu.memory_stats()["allocated_bytes"]
    model = load(data, backend=backend)
    gpu.synchronize()
    return gpu.memory_stats()["allocated_bytes"] - before, model


def _run(backend, model, x):
    """(output, names of the kernels that ran)."""
    with cn.profile(backend) as p:
        t = cn.tensor(x, backend=backend, dtype=cn.float16 if x.dtype == np.float16 else cn.float32)
        out = model(t).numpy()
    return out, [e["name"] for e in p.events if e["kind"] == "kernel"]


# (model, its input, the share of the float32 weights' bytes it holds)
MODELS = {"int8": (int8_model, A, (0.25, 0.26)), "int4": (int4_model, A, (0.125, 0.165)),
          "float16": (half_model, A.astype(np.float16), (0.5, 0.51))}


@pytest.mark.parametrize("kind", list(MODELS))
def test_packed_weights_stay_packed_under_fusion(kind):
    make, x, (lo, hi) = MODELS[kind]
    fused = cn.Fusion(cn.Wgpu(autotune=False))
    assert fused.quantized_matmul and fused.quantized_conv2d == fused.inner.quantized_conv2d
    f32, kept = _loaded(fused, float_model())
    data = make()   # (the builders draw new weights on every call)
    held, model = _loaded(fused, data)
    assert lo <= held / f32 < hi, (held, f32)
    got, names = _run(fused, model, x)
    assert any(n.startswith("matmul_quantized") for n in names), names
    plain = cn.Wgpu(autotune=False)
    expected, _ = _run(plain, load(data, backend=plain), x)
    np.testing.assert_allclose(got.astype(np.float32), expected.astype(np.float32), rtol=1e-5, atol=1e-4)
    del kept


def test_qdq_conv_gemm_and_matmul_read_8_bit_weights_under_fusion():
    x = np.random.default_rng(4).standard_normal((2, 3, 10, 10)).astype(np.float32)
    data = _qdq_model()
    fused = cn.Fusion(cn.Wgpu(autotune=False))
    got, names = _run(fused, load(data, backend=fused), x)
    packed = [n for n in names if n.startswith(("matmul_quantized", "conv2d_q"))]
    assert len(packed) == 3, names
    assert not any(n.startswith(("matmul", "conv")) for n in names if n not in packed), names
    plain = cn.Wgpu(autotune=False)
    expected, plain_names = _run(plain, load(data, backend=plain), x)
    # the same packed-weight kernels as cn.Wgpu runs alone
    assert sorted(packed) == sorted(n for n in plain_names if n.startswith(("matmul_quantized", "conv2d_q")))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_fusion_over_numpy_keeps_int8_weights():
    """cn.Fusion(cn.NumPy()) passes ops through: the weights are cn.NumPy()'s int8 arrays and the
    answer is cn.NumPy()'s."""
    fused = cn.Fusion(cn.NumPy())
    data = int8_model()
    model = load(data, backend=fused)
    assert any(v.dtype is cn.int8 for v in model.state_dict().values())
    got = model(cn.tensor(A, backend=fused)).numpy()
    expected = load(data, backend=cn.NumPy())(cn.tensor(A, backend=cn.NumPy())).numpy()
    np.testing.assert_array_equal(got, expected)
