"""QDQ transformers on the integer kernels (issue 28): a BERT-style encoder that onnxruntime's
quantize_static writes in QDQ form (QuantizeLinear -> DequantizeLinear around every MatMul
input, DequantizeLinear of int8 weight initializers) runs each weight MatMul as
matmul_quantized with its activation's scale (a_scale: the activation's integers multiply the
weight's in exact int32 sums, scaled once) and a float matmul only where both operands are
activations (attention's QK^T and PV), and equals onnxruntime's run of the graph as written.
The kernel's a_scale product is held to the exact integer product bit for bit."""

import logging
import os
import sys
import warnings

import numpy as np
import pytest

import cinders as cn
from cinders.backend import QuantizedLayout
from cinders.onnx import load
from capture_support import assert_replays_match_eager

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
sys.path.insert(0, os.path.dirname(__file__))
from test_onnx_transformers import TINY, _cached  # noqa: E402

BACKENDS = {"numpy": lambda: cn.NumPy(), "wasm-native": lambda: cn.Wasm(engine="native"),
            "wasm-wasmtime": lambda: cn.Wasm(engine="wasmtime"), "wgpu": lambda: cn.Wgpu(autotune=False)}
IDS = np.random.default_rng(28).integers(0, TINY["vocab"], (2, 10)).astype(np.int64)


class _Calibration:   # onnxruntime's CalibrationDataReader: a few random batches of token ids
    def __init__(self):
        rng = np.random.default_rng(1)
        self.batches = iter([{"x": rng.integers(0, TINY["vocab"], (2, 10)).astype(np.int64)} for _ in range(3)])

    def get_next(self):
        return next(self.batches, None)


@pytest.fixture(scope="module")
def qdq_bert(tmp_path_factory):
    """Path of the TINY BERT (tests/test_onnx_transformers.py) quantized by quantize_static, QDQ,
    int8 activations and weights (its defaults, as benchmarks/quantized.py's q8_qdq)."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static
    path = str(tmp_path_factory.mktemp("qdq") / "bert_qdq.onnx")
    logging.disable(logging.WARNING)   # the quantizer advises pre-processing
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            quantize_static(_cached("bert", "torchscript", False), path, _Calibration(), quant_format=QuantFormat.QDQ,
                            activation_type=QuantType.QInt8, weight_type=QuantType.QInt8)
    finally:
        logging.disable(logging.NOTSET)
    return path


def _matmuls(path):
    """(weight MatMuls: a DequantizeLinear of an int8 initializer as B, MatMuls of two activations)."""
    graph = onnx.load(path).graph
    inits = {i.name for i in graph.initializer}
    makers = {o: n for n in graph.node for o in n.output}
    weight = [n for n in graph.node if n.op_type == "MatMul" and makers.get(n.input[1]) is not None
              and makers[n.input[1]].op_type == "DequantizeLinear" and makers[n.input[1]].input[0] in inits]
    return len(weight), sum(n.op_type == "MatMul" for n in graph.node) - len(weight)


@pytest.mark.parametrize("name", list(BACKENDS))
def test_qdq_bert_runs_its_weight_matmuls_on_the_integer_kernel(qdq_bert, name, monkeypatch):
    backend = BACKENDS[name]()
    model = load(qdq_bert, backend=backend)
    products, floats = [], []
    quantized, plain = backend.matmul_quantized, backend.matmul

    def matmul_quantized(*args, a_scale=None):
        products.append(a_scale is not None)
        return quantized(*args, a_scale=a_scale)

    def matmul(a, b):
        floats.append(backend.shape(b))
        return plain(a, b)
    monkeypatch.setattr(backend, "matmul_quantized", matmul_quantized)
    monkeypatch.setattr(backend, "matmul", matmul)
    got = model(cn.tensor(IDS.astype(np.int32), backend=backend)).numpy()
    weights, activations = _matmuls(qdq_bert)
    assert weights == 12 and activations == 4, (weights, activations)
    assert products == [True] * weights, products       # every weight MatMul: integers and a scale
    assert len(floats) == activations, floats            # a float matmul only for two activations
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    expected = ort.InferenceSession(qdq_bert, options, providers=["CPUExecutionProvider"]).run(None, {"x": IDS})[0]
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4 * np.abs(expected).max())


@pytest.mark.parametrize("engine", ["native", "wasmtime"])
@pytest.mark.parametrize("transposed", [False, True])
def test_scaled_activation_product_is_the_exact_integer_product(engine, transposed):
    """matmul_quantized(a, W, scale, zp, layout, a_scale): a's integers (a / a_scale) times W's
    in exact int32 sums, then * a_scale * scale[n] once: bit for bit the integer product scaled
    in float32 (odd K, N not a multiple of 4, a Gemm's transposed (N, K) weight)."""
    backend = cn.Wasm(engine=engine)
    rng = np.random.default_rng(7)
    m, k, n = 9, 301, 23
    a_scale = np.float32(0.037)
    a_int = rng.integers(-128, 128, (m, k))
    w = rng.integers(-128, 128, (n, k) if transposed else (k, n)).astype(np.int32)
    zp, scale = rng.integers(-5, 5, n).astype(np.int32), rng.uniform(0.001, 0.01, n).astype(np.float32)
    put = lambda v, dtype=None: cn.tensor(v, backend=backend) if dtype is None else \
        cn.tensor(v, backend=backend).cast(dtype)  # noqa: E731
    layout = QuantizedLayout(k, n, 8, k, (0, 1, k) if transposed else (0, n, 1), scale=(0, 0, 1), zp=(0, 0, 1))
    out = backend.matmul_quantized(put((a_int * a_scale).astype(np.float32)).handle, put(w, cn.int8).handle,
                                   put(scale).handle, put(zp, cn.int8).handle, layout, a_scale=put(a_scale).handle)
    got = cn.Tensor(backend, out, (m, n), cn.float32).numpy()
    b = (w.T if transposed else w) - zp
    np.testing.assert_array_equal(got, (a_int @ b).astype(np.float32) * (a_scale * scale))


def _blocked_and_1d_model():
    """An opset-21 QDQ graph whose weights widen nowhere: a MatMul's int8 (K, N) weight and a
    Gemm's transposed (N, K) one with blocked scales and zero points (block_size along K), and a
    1-D Conv's per-channel int8 weight, its input a QDQ activation (the integer conv kernel)."""
    from onnx import helper, numpy_helper
    rng = np.random.default_rng(21)
    k, n, block = 96, 40, 32
    inits = {"wm": rng.integers(-128, 128, (k, n)).astype(np.int8),
             "sm": rng.uniform(0.002, 0.01, (k // block, n)).astype(np.float32),
             "zm": rng.integers(-3, 4, (k // block, n)).astype(np.int8),
             "wg": rng.integers(-128, 128, (n, k)).astype(np.int8),
             "sg": rng.uniform(0.002, 0.01, (n, k // block)).astype(np.float32),
             "wc": rng.integers(-128, 128, (6, 4, 7)).astype(np.int8),
             "sc": rng.uniform(0.01, 0.02, 6).astype(np.float32), "xs": np.float32(0.03), "xz": np.int8(1)}
    nodes = [helper.make_node("DequantizeLinear", ["wm", "sm", "zm"], ["wmf"], axis=0, block_size=block),
             helper.make_node("MatMul", ["a", "wmf"], ["ym"]),
             helper.make_node("DequantizeLinear", ["wg", "sg"], ["wgf"], axis=1, block_size=block),
             helper.make_node("Gemm", ["a", "wgf"], ["yg"], transB=1),
             helper.make_node("QuantizeLinear", ["c", "xs", "xz"], ["cq"]),
             helper.make_node("DequantizeLinear", ["cq", "xs", "xz"], ["cd"]),
             helper.make_node("DequantizeLinear", ["wc", "sc"], ["wcf"], axis=0),
             helper.make_node("Conv", ["cd", "wcf"], ["yc"], pads=[2, 1], strides=[2])]
    graph = helper.make_graph(nodes, "blocked", [helper.make_tensor_value_info("a", 1, (3, k)),
                                                 helper.make_tensor_value_info("c", 1, (2, 4, 31))],
                              [helper.make_tensor_value_info(v, 1, None) for v in ("ym", "yg", "yc")],
                              [numpy_helper.from_array(v, name) for name, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model.SerializeToString(), {"a": rng.standard_normal((3, k)).astype(np.float32),
                                       "c": rng.standard_normal((2, 4, 31)).astype(np.float32)}


@pytest.mark.parametrize("name", list(BACKENDS))
def test_blocked_and_1d_conv_weights_stay_8_bit(name, monkeypatch):
    """Blocked (opset 21) and 1-D conv weights are held int8 and read inside matmul_quantized /
    the integer conv kernel: no cast of a whole weight to float32 on any call."""
    backend = BACKENDS[name]()
    data, feeds = _blocked_and_1d_model()
    model = load(data, backend=backend)
    held = {t.dtype for t in model.state_dict().values() if t.numel() in (96 * 40, 6 * 4 * 7)}
    assert held == {cn.int8}, held
    casts, plain_cast = [], backend.cast

    def cast(x, dtype):
        casts.append((backend.dtype(x), int(np.prod(backend.shape(x)))))
        return plain_cast(x, dtype)
    monkeypatch.setattr(backend, "cast", cast)
    got = [t.numpy() for t in model(*(cn.tensor(v, backend=backend) for v in feeds.values()))]
    widened = [c for c in casts if c[0] in (cn.int8, cn.uint8) and c[1] in (96 * 40, 6 * 4 * 7)]
    assert not widened, widened
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    expected = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=0, atol=1e-4 * np.abs(e).max())


@pytest.mark.parametrize("name", ["numpy", "wasm-native", "wasm-wasmtime", "wgpu"])
@pytest.mark.parametrize("zero_points", [(np.int8(-3), np.int8(-3)), (np.uint8(130), np.uint8(128)), (np.int8(5), np.int8(-7))])
def test_quantize_dequantize_kernel_is_the_composition(name, zero_points):
    """The quantize_dequantize ability's one kernel equals QuantizeLinear then DequantizeLinear
    (onnxruntime's) value for value: rounding ties to even, saturation, NaN, odd lengths, a
    dequantizing zero point other than the quantizing one."""
    from onnx import helper, numpy_helper
    backend = BACKENDS[name]()
    yz, xz = zero_points
    scale = np.float32(0.25)
    x = np.concatenate([np.arange(-40, 40, 0.125), [np.nan, np.inf, -np.inf, 1e9, -1e9, 0.0625]]).astype(np.float32)
    inits = {"s": scale, "yz": yz, "xz": xz}
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "yz"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "xz"], ["y"])]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", 1, x.shape)],
                              [helper.make_tensor_value_info("y", 1, None)],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()
    calls, kernel = [], backend.quantize_dequantize

    def quantize_dequantize(*args):
        calls.append(args[-2:])
        return kernel(*args)
    backend.quantize_dequantize = quantize_dequantize
    got = load(data, backend=backend)(cn.tensor(x, backend=backend)).numpy()
    assert len(calls) == 1, calls
    expected = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    finite = np.isfinite(x)   # (onnxruntime saturates NaN to a number; the composition keeps it)
    np.testing.assert_array_equal(got[finite], expected[finite])
    reference = load(data, backend=cn.Python())(cn.tensor(x, backend=cn.Python())).numpy()
    np.testing.assert_array_equal(got, reference)


def test_captured_qdq_bert_replays_the_same_answer(qdq_bert):
    """cn.capture replays the integer products and the one-kernel round trips on cn.Wasm() (the
    pages run models captured): the same answer as the uncaptured call."""
    wasm = cn.Wasm()
    model = load(qdq_bert, backend=wasm)
    ids = cn.tensor(IDS.astype(np.int32), backend=wasm)
    assert_replays_match_eager(model, [ids], calls=4, min_replays=1)


def test_qdq_bert_round_trips_are_one_launch_each_on_wgpu(qdq_bert, monkeypatch):
    """cn.Wgpu's quantize_dequantize: each activation round trip one launch (the composition
    adds a cast of each zero point), the same answer as the composition's."""
    backend = cn.Wgpu(autotune=False)
    model = load(qdq_bert, backend=backend)
    trips = sum(n.op_type == "QuantizeLinear" for n in onnx.load(qdq_bert).graph.node)
    ids = cn.tensor(IDS.astype(np.int32), backend=backend)
    launches, outs = [], []
    for ability in (True, False):
        if not ability:
            monkeypatch.setattr(backend, "quantize_dequantize", False)
        outs.append(model(ids).numpy())
        with cn.profile(backend) as p:
            model(ids).numpy()
        launches.append(p.kernel_launches)
    assert launches[0] <= launches[1] - trips, (launches, trips)
    np.testing.assert_array_equal(outs[0], outs[1])
