"""Half-precision ONNX files (issue 28): a float16 model, as onnxruntime's float16 converter
writes it (transformers.js ships such files for WebGPU), runs against onnxruntime on every
backend, its MatMul/Gemm/Conv weights staying float16 in memory where the backend multiplies
them in its matmul_quantized kernel (cn.NumPy, cn.Wgpu in both float16 layouts, cn.Wasm), float16 graph
inputs and outputs stay float16 and Cast to float16 rounds as ONNX says."""

import hashlib
import inspect
import io
import os
import warnings

import numpy as np
import pytest

import cinders as cn
from cinders.assets import cache_dir
from cinders.onnx import load
from cinders.onnx.ops.linalg import half_product

import onnx_models

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

# cn.Wasm() with the native engine (its desktop default), cn.Wgpu with float16 as array<f16>
# (lavapipe has shader-f16) and packed two to a u32 word
BACKENDS = {"numpy": lambda: cn.NumPy(), "native": lambda: cn.Wasm(engine="native"),
            "wgpu": lambda: cn.Wgpu(autotune=False), "wgpu-packed": lambda: cn.Wgpu(autotune=False, shader_f16=False)}


@pytest.fixture(scope="module", params=list(BACKENDS))
def backend(request):
    return request.param, BACKENDS[request.param]()


def _torch_models():
    """(name -> (torch module in eval mode, example input)): a BERT-style encoder from a
    `transformers` config (random weights) and a small CNN (conv, batch norm, ReLU, grouped conv,
    pooling, linear)."""
    import torch
    onnx_models._torchvision_models()   # transformers imports torchvision when present: the stub
    import transformers as tf
    torch.manual_seed(0)
    bert = tf.BertModel(tf.BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      intermediate_size=128, max_position_embeddings=64,
                                      attn_implementation="eager"))

    class Bert(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = bert

        def forward(self, x):
            return self.inner(input_ids=x).last_hidden_state

    cnn = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 16, 3, stride=2, padding=1, groups=4), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, padding=(1, 0)), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(), torch.nn.Linear(32, 10))
    with torch.no_grad():
        for m in (bert, cnn):
            for p in m.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        cnn[1].running_mean.uniform_(-0.2, 0.2)
        cnn[1].running_var.uniform_(0.5, 1.5)
    return {"bert": (Bert().eval(), torch.randint(0, 100, (2, 9))), "cnn": (cnn.eval(), torch.randn(2, 3, 16, 16))}


def _export_half(keep_io_types):
    """{name: float16 .onnx bytes} of both models, as onnxruntime's float16 converter writes them."""
    import torch
    from onnxruntime.transformers.float16 import convert_float_to_float16
    out = {}
    for name, (model, x) in _torch_models().items():
        f = io.BytesIO()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(model, (x,), f, dynamo=False, input_names=["x"], output_names=["y"],
                              dynamic_axes={"x": {0: "batch"}}, opset_version=17)
            half = convert_float_to_float16(onnx.load_from_string(f.getvalue()), keep_io_types=keep_io_types)
        out[name] = half.SerializeToString()
    return out


@pytest.fixture(scope="module")
def half_files():
    """{(name, keep_io_types): float16 .onnx bytes}, cached in CINDERS_CACHE/onnx/float16/."""
    import torch
    onnx_models._torchvision_models()
    import transformers
    key = hashlib.sha256(repr((torch.__version__, transformers.__version__, ort.__version__,
                               inspect.getsource(_torch_models), inspect.getsource(_export_half))).encode()
                         ).hexdigest()[:12]
    folder = os.path.join(cache_dir(), "onnx", "float16")
    os.makedirs(folder, exist_ok=True)
    files = {}
    for keep in (False, True):
        paths = {name: os.path.join(folder, "%s-%s-%s.onnx" % (name, "f32io" if keep else "f16io", key))
                 for name in ("bert", "cnn")}
        if not all(os.path.exists(p) for p in paths.values()):
            for name, data in _export_half(keep).items():
                with open(paths[name] + ".tmp", "wb") as f:
                    f.write(data)
                os.replace(paths[name] + ".tmp", paths[name])
        for name, path in paths.items():
            with open(path, "rb") as f:
                files[(name, keep)] = f.read()
    return files


def _input(name, half):
    rng = np.random.default_rng(3)
    if name == "bert":
        return rng.integers(0, 100, (2, 9)).astype(np.int64)
    x = rng.standard_normal((2, 3, 16, 16)).astype(np.float32)
    return x.astype(np.float16) if half else x


def _ort(data, x):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


@pytest.mark.parametrize("keep_io_types", [False, True], ids=["float16-io", "float32-io"])
@pytest.mark.parametrize("name", ["bert", "cnn"])
def test_half_model_matches_onnxruntime_with_half_weights(backend, half_files, name, keep_io_types):
    _, b = backend
    data = half_files[(name, keep_io_types)]
    x = _input(name, not keep_io_types)
    expected = _ort(data, x)
    model = load(data, backend=b)
    if x.dtype == np.int64:
        t = cn.tensor(x.astype(np.int32), backend=b)
    else:
        t = cn.tensor(x, backend=b, dtype=cn.float16 if x.dtype == np.float16 else cn.float32)
    y = model(t)
    # float16 outputs come back float16 (cast at the boundary), float32 ones float32
    assert y.dtype is (cn.float32 if keep_io_types else cn.float16)
    got = y.numpy()
    assert got.dtype == expected.dtype and got.shape == expected.shape
    # onnxruntime computes each op in float16, cinders in float32 (rounded where the graph
    # stores float16): a few float16 ulps of the outputs' scale apart
    scale = float(np.abs(expected.astype(np.float32)).max())
    err = float(np.abs(got.astype(np.float32) - expected.astype(np.float32)).max())
    assert err <= 4e-3 * max(1.0, scale), (err, scale)
    # the products' weights (every conv's, the grouped one's too, and BERT's embedding table)
    # stay float16: most of the weight bytes; small constants are widened at import
    weights = [v for v in model.state_dict().values() if v.ndim >= 2]
    half = sum(v.numel() for v in weights if v.dtype is cn.float16) / sum(v.numel() for v in weights)
    assert half >= 0.75, half
    assert all(v.dtype is cn.float16 for v in weights if v.ndim == 4)


def _matmul_file(w, rows=3):
    """a (rows, K) @ the constant w, in w's element type (float16 or float32)."""
    elem = TensorProto.FLOAT16 if w.dtype == np.float16 else TensorProto.FLOAT
    graph = helper.make_graph([helper.make_node("MatMul", ["a", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("a", elem, (rows, w.shape[0]))],
                              [helper.make_tensor_value_info("y", elem, (rows, w.shape[1]))],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


WEIGHT = np.random.default_rng(5).standard_normal((512, 512)).astype(np.float32)


def _held_bytes(b):
    b.synchronize()
    return b.memory_stats()["allocated_bytes"] if b.name == "wgpu" else b.heap.in_use


@pytest.mark.parametrize("name", ["native", "wgpu", "wgpu-packed"])
def test_half_weights_take_half_the_float_bytes(name):
    b = BACKENDS[name]()
    held = []
    for dtype in (np.float32, np.float16):
        if b.name == "wgpu":
            b.synchronize()
            b.empty_cache()
        before = _held_bytes(b)
        model = load(_matmul_file(WEIGHT.astype(dtype)), backend=b)
        held.append((_held_bytes(b) - before, model))
    (f32, _), (f16, half_model) = held
    assert f32 >= 4 * 512 * 512
    assert 0.5 <= f16 / f32 < 0.51, (f16, f32)
    a = np.random.default_rng(6).standard_normal((3, 512)).astype(np.float16)
    got = half_model(cn.tensor(a, backend=b, dtype=cn.float16)).numpy()
    expected = _ort(_matmul_file(WEIGHT.astype(np.float16)), a)
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), expected.astype(np.float32), rtol=4e-3, atol=0.05)


def test_cast_to_float16_rounds_as_onnx_says(backend):
    _, b = backend
    x = np.array([[0.1, 1 / 3, 65519.0, 70000.0, -2.5e-8, 1e-7]], np.float32)
    graph = helper.make_graph([helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16),
                               helper.make_node("Cast", ["h"], ["y"], to=TensorProto.FLOAT)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, x.shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    data = model.SerializeToString()
    got = load(data, backend=b)(cn.tensor(x, backend=b)).numpy()
    np.testing.assert_array_equal(got, _ort(data, x))
    with np.errstate(over="ignore"):   # (70000 rounds to infinity, as intended)
        np.testing.assert_array_equal(got, x.astype(np.float16).astype(np.float32))


@pytest.mark.parametrize("name", list(BACKENDS) + ["wasmtime"])
def test_every_finite_float16_weight_widens_exactly(name):
    """Identity @ W for a W holding every finite float16 bit pattern (subnormals included; -0
    sums to 0 in a product): the kernels' widening of a half weight is exact (cn.Wasm's .wasm
    module in Wasmtime too)."""
    b = cn.Wasm(engine="wasmtime") if name == "wasmtime" else BACKENDS[name]()
    bits = np.arange(1 << 16, dtype=np.uint16)
    w = bits.view(np.float16)[np.isfinite(bits.view(np.float16))].reshape(248, 256)
    a = cn.tensor(np.eye(248, dtype=np.float32), backend=b)
    for transposed in (False, True):   # (K, N) as MatMul reads it, (N, K) as Gemm's transB and Conv
        weight = cn.tensor(w.T.copy() if transposed else w, backend=b, dtype=cn.float16)
        got = half_product(a, weight, transposed)
        assert got.dtype is cn.float32
        np.testing.assert_array_equal(got.numpy(), w.astype(np.float32))
    special = np.array([[np.inf, -np.inf, np.nan, 65504.0]], np.float16)
    got = half_product(cn.tensor([[1.0]], backend=b), cn.tensor(special, backend=b, dtype=cn.float16))
    np.testing.assert_array_equal(got.numpy(), special.astype(np.float32))


def test_half_values_on_a_backend_without_float16_are_refused(half_files):
    """cn.Autodiff holds no storage dtypes, so it cannot round to float16: a Cast to float16 is
    refused with a clear error rather than computed unrounded."""
    b = cn.Autodiff(cn.NumPy())
    model = load(half_files[("cnn", True)], backend=b)
    with pytest.raises(cn.CindersError, match="float16"):
        model(cn.tensor(_input("cnn", False), backend=b))


def test_import_onnx_record_keeps_half_weights_and_runs_on_python(tmp_path, monkeypatch):
    """`cinders import-onnx` on the default backend (cn.NumPy) writes the half weights as
    safetensors F16; the written module loads them on cn.Python (no quantized_matmul: widened
    per call) with NumPy's answer."""
    import importlib
    from cinders.onnx import import_onnx
    path = tmp_path / "half.onnx"
    w = np.random.default_rng(8).standard_normal((24, 16)).astype(np.float16)
    path.write_bytes(_matmul_file(w))
    assert cn.default_backend().name == "numpy"
    py_path, st_path, _ = import_onnx(str(path), str(tmp_path / "out"), name="half_net")
    from safetensors.numpy import load_file
    assert load_file(st_path)["w"].dtype == np.float16
    monkeypatch.syspath_prepend(str(tmp_path / "out"))
    module = importlib.import_module("half_net")
    a = np.random.default_rng(9).standard_normal((3, 24)).astype(np.float16)
    got = module.Model.load(st_path, backend=cn.Python())(cn.tensor(a, backend=cn.Python(), dtype=cn.float16))
    expected = load(path.read_bytes(), backend=cn.NumPy())(cn.tensor(a, backend=cn.NumPy(), dtype=cn.float16))
    assert got.dtype is cn.float16
    np.testing.assert_array_equal(got.numpy(), expected.numpy())
