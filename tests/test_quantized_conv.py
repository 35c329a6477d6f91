"""Quantized convolutions on cn.Wasm() as integer kernels (issue 28): ConvInteger, QLinearConv
and a QDQ graph's joined DequantizedConv read their 8-bit weight in place and multiply on
runtime.h conv2d_quantized (the i32x4.dot_i16x8_s products of matmul_quantized), group 1,
grouped and depthwise, on both engines: the tab's .wasm module (in Wasmtime) and the native
build. Integer outputs equal onnxruntime's (or cn.NumPy()'s, which tests/test_onnx_quant.py
holds to onnxruntime, where onnxruntime has no kernel: per-channel ConvInteger); float outputs
are held to 1e-4 of the output's largest magnitude, as tests/test_onnx_quant.py does."""

import logging
import warnings

import numpy as np
import pytest

import cinders as cn
from cinders.onnx import load
from capture_support import assert_replays_match_eager

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import helper, numpy_helper  # noqa: E402
from test_quantized_weights import _kernels_run, _resident_bytes  # noqa: E402

ENGINES = ["native", "wasmtime"]
RNG = np.random.default_rng(28)


@pytest.fixture(params=ENGINES)
def wasm(request):
    return cn.Wasm(engine=request.param)


def _conv_integer(c, o, group, kernel, x_type, per_channel, **attrs):
    """A one-node ConvInteger graph: 8-bit x (uint8 or int8 by x_type), int8 weight, zero points
    (per_channel None: none)."""
    signed = x_type == onnx.TensorProto.INT8
    inits = {"w": RNG.integers(-128, 128, (o, c // group) + kernel).astype(np.int8)}
    if per_channel is not None:
        inits.update(xz=np.array(-3 if signed else 129, np.int8 if signed else np.uint8),
                     wz=RNG.integers(-4, 4, o if per_channel else ()).astype(np.int8))
    node = helper.make_node("ConvInteger", ["x"] + list(inits), ["y"], group=group, **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", x_type, None)],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.INT32, None)],
                              [numpy_helper.from_array(v, n) for n, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model.SerializeToString()


# (C, O, group, kernel, image, attributes, per-channel weight zero point, x's type)
CONV_CASES = {
    "3x3 asymmetric pads": (4, 5, 1, (3, 3), (9, 9), dict(pads=[0, 1, 1, 0]), True, onnx.TensorProto.UINT8),
    "7x7 stride 2": (3, 8, 1, (7, 7), (20, 17), dict(pads=[3, 3, 3, 3], strides=[2, 2]), False,
                     onnx.TensorProto.UINT8),
    "depthwise dilated": (6, 6, 6, (3, 3), (11, 13), dict(pads=[1, 1, 1, 1], strides=[1, 2], dilations=[2, 1]),
                          True, onnx.TensorProto.INT8),
    "grouped": (8, 12, 4, (3, 2), (7, 7), dict(pads=[1, 0, 2, 1], strides=[2, 1]), False, onnx.TensorProto.UINT8),
    "1x1": (16, 32, 1, (1, 1), (5, 6), {}, True, onnx.TensorProto.UINT8),
    "1x1 stride 2, SAME_UPPER": (5, 7, 1, (1, 1), (6, 7), dict(strides=[2, 2], auto_pad="SAME_UPPER"), False,
                                 onnx.TensorProto.INT8),
    "long sum": (300, 3, 1, (3, 3), (3, 5), dict(pads=[1, 1, 1, 1]), False, onnx.TensorProto.UINT8),
    "no zero points": (4, 6, 2, (2, 3), (6, 5), dict(strides=[1, 2]), None, onnx.TensorProto.UINT8),
}


@pytest.mark.parametrize("case", list(CONV_CASES))
def test_conv_integer_is_exact_in_the_integer_kernel(wasm, monkeypatch, case):
    c, o, group, kernel, image, attrs, per_channel, x_type = CONV_CASES[case]
    data = _conv_integer(c, o, group, kernel, x_type, per_channel, **attrs)
    signed = x_type == onnx.TensorProto.INT8
    x = RNG.integers(-128 if signed else 0, 128 if signed else 256, (2, c) + image).astype(
        np.int8 if signed else np.uint8)
    run = lambda b: load(data, backend=b)(cn.tensor(x.astype(np.int32), backend=b)).numpy()  # noqa: E731
    got, names = _kernels_run(wasm, monkeypatch, lambda: run(wasm))
    assert names.count("conv2d_quantized") == 1, names
    assert not any(n in ("matmul_quantized", "unfold2d_f32", "conv2d_f32") for n in names), names
    if per_channel or signed:   # onnxruntime's ConvInteger: per-tensor, uint8 x only
        expected = run(cn.NumPy())
    else:
        expected = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)


# -- onnxruntime's quantizers on a CNN with every kind of convolution ------------------------------

SHAPE = (2, 3, 23, 19)


def _cnn():
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 16, 5, stride=2, padding=2)
            self.grouped = nn.Conv2d(16, 24, 3, padding=1, groups=4)
            self.depthwise = nn.Conv2d(24, 24, 3, stride=2, padding=2, dilation=2, groups=24)
            self.pointwise = nn.Conv2d(24, 32, 1)
            self.fc = nn.Linear(32, 5)

        def forward(self, x):
            x = torch.relu(self.stem(x))
            x = torch.relu(self.grouped(x))
            x = torch.relu(self.depthwise(x))
            x = torch.relu(self.pointwise(x))
            return self.fc(x.mean(dim=(2, 3)))
    torch.manual_seed(0)
    return Net().eval()


class _Data:
    def __init__(self):
        rng = np.random.default_rng(1)
        self.batches = iter([{"x": rng.standard_normal(SHAPE).astype(np.float32)} for _ in range(4)])

    def get_next(self):
        return next(self.batches, None)


VARIANTS = ("dynamic", "qdq", "qdq_u8", "qop_per_channel")


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    """{variant: path}: the float CNN and onnxruntime's quantized versions of it."""
    import torch
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic, quantize_static
    folder = tmp_path_factory.mktemp("qconv")
    paths = {v: str(folder / (v + ".onnx")) for v in ("f32",) + VARIANTS}
    logging.disable(logging.WARNING)   # the quantizers advise pre-processing on every call
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(_cnn(), (torch.randn(*SHAPE),), paths["f32"], dynamo=False, input_names=["x"],
                              output_names=["y"], opset_version=17)
            quantize_dynamic(paths["f32"], paths["dynamic"], weight_type=QuantType.QUInt8)
            # (QOperator with 7-bit weights, as tests/test_onnx_quant.py: onnxruntime's own u8s8
            # kernels saturate int16 pair sums on AVX2 with full-range weights)
            for variant, form, activations, per_channel in (
                    ("qdq", QuantFormat.QDQ, QuantType.QInt8, False),
                    ("qdq_u8", QuantFormat.QDQ, QuantType.QUInt8, True),
                    ("qop_per_channel", QuantFormat.QOperator, QuantType.QUInt8, True)):
                quantize_static(paths["f32"], paths[variant], _Data(), quant_format=form, activation_type=activations,
                                weight_type=QuantType.QInt8, per_channel=per_channel,
                                reduce_range=form == QuantFormat.QOperator)
    finally:
        logging.disable(logging.NOTSET)
    return paths


@pytest.mark.parametrize("variant", VARIANTS)
def test_quantized_cnn_runs_its_convolutions_in_the_integer_kernel(cnn, wasm, monkeypatch, variant):
    """Every convolution (stem, grouped, depthwise, pointwise) on conv2d_quantized, the output
    onnxruntime's (the graph as written: its optimizer turns QDQ into its own integer kernels)."""
    ops = [n.op_type for n in onnx.load(cnn[variant]).graph.node]
    assert ops.count({"dynamic": "ConvInteger", "qop_per_channel": "QLinearConv"}.get(variant, "Conv")) == 4, ops
    x = np.random.default_rng(5).standard_normal(SHAPE).astype(np.float32)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    expected = ort.InferenceSession(cnn[variant], options, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    model = load(cnn[variant], backend=wasm)
    got, names = _kernels_run(wasm, monkeypatch, lambda: model(cn.tensor(x, backend=wasm)).numpy())
    assert names.count("conv2d_quantized") == 4, names
    assert not any(n in ("unfold2d_f32", "conv2d_f32") for n in names), names
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4 * float(np.abs(expected).max()))


def test_quantized_conv_weights_stay_8_bit_in_the_heap(cnn):
    """The QDQ CNN's weights take about a quarter of the float32 model's bytes in the heap."""
    wasm = cn.Wasm()
    float_bytes, _ = _resident_bytes(wasm, open(cnn["f32"], "rb").read())
    int8_bytes, _ = _resident_bytes(wasm, open(cnn["qdq"], "rb").read())
    assert int8_bytes < 0.35 * float_bytes, (int8_bytes, float_bytes)


@pytest.mark.parametrize("variant", ["dynamic", "qdq"])
def test_captured_quantized_cnn_replays_the_same_answer(cnn, variant):
    """cn.capture replays conv2d_quantized like any other kernel (its scratch, the activations'
    quantization and the weights it reads in place)."""
    wasm = cn.Wasm()
    model = load(cnn[variant], backend=wasm)
    x = cn.tensor(np.random.default_rng(8).standard_normal(SHAPE).astype(np.float32), backend=wasm)
    assert_replays_match_eager(model, [x], calls=4, min_replays=1)
