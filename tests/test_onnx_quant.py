"""Quantized ONNX models: ONNX's node cases for the ai.onnx quantization ops, the com.microsoft
quantized ops against onnxruntime, and whole models that onnxruntime's own quantization tools
write (quantize_dynamic, quantize_static in QDQ and QOperator form, MatMulNBitsQuantizer)
imported and run next to onnxruntime.

Integer outputs must be equal. Float outputs are held to 1e-4 of the output's largest magnitude
(onnxruntime's own tests use 1e-4 to 1e-3 for float models): onnxruntime and cinders compute the
same integer products and dequantize with the same float32 multiplications, so they differ only
in float32 summation order.

onnxruntime's fused integer kernels on x86 without AVX-VNNI multiply uint8 activations by int8
weights with an instruction (pmaddubsw) whose int16 sums saturate: with full 8-bit int8 weights
its optimized answer differs from its own unoptimized one (and from the float model) by far
more than quantization error. onnxruntime's quantizers offer `reduce_range=True` (7-bit weights)
for that; those files are compared with onnxruntime fully optimized, files with full-range int8
weights with onnxruntime running the graph as written (optimizations off). The QDQ file with
AveragePool is compared optimized only: its float average of quantized values often lands
exactly on a rounding tie, where the last float bit of the sum decides (onnxruntime's
unoptimized float pooling and cinders' can then differ by one quantization step).
"""

import logging
import os
import sys
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import cinders as cn
from cinders.onnx import OnnxError, load

sys.path.insert(0, os.path.dirname(__file__))
import onnx_node_cases  # noqa: E402

QUANT_OPS = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "ConvInteger",
             "QLinearMatMul", "QLinearConv"}
# Element types cinders does not emulate: their cases must be refused with a clear error.
REFUSED_TYPES = ("e4m3", "e5m2", "float4", "int2", "uint2")
BACKENDS = {"python": lambda: cn.Python(), "numpy": lambda: cn.NumPy(), "wgpu": lambda: cn.Wgpu(autotune=False),
            "wasm": lambda: cn.Wasm()}
_CASES = []


def quant_cases():
    if not _CASES:
        _CASES.extend(c for c in onnx_node_cases.collect() if onnx_node_cases.main_op(c[0], c[6]) in QUANT_OPS)
    return _CASES


def _widened(case):
    """The case with its int4/uint4 arrays (ml_dtypes, which cn.tensor does not take) as int8/uint8:
    the values, not their storage, are what the ops must get right."""
    def widen(a):
        a = onnx_node_cases._array(a)
        kind = getattr(getattr(a, "dtype", None), "name", "")
        return a.astype(np.int8 if kind == "int4" else np.uint8) if kind in ("int4", "uint4") else a
    data_sets = [([widen(a) for a in ins], [widen(a) for a in outs]) for ins, outs in case[3]]
    return case[:3] + (data_sets,) + case[4:]


@pytest.fixture(scope="module", params=list(BACKENDS))
def backend(request):
    return BACKENDS[request.param]()


def test_onnx_node_cases_of_the_quantization_ops(backend):
    """Every case of the ai.onnx quantization ops passes, or (float8, 2- and 4-bit types) is refused
    with a clear error: never a wrong number."""
    cases = quant_cases()
    assert len(cases) >= 40
    wrong = []
    for case in cases:
        status, reason = onnx_node_cases.run_case(_widened(case), backend)
        refused = status == "unsupported" or (status == "fail" and "OnnxError" in reason)
        if status == "pass" or (refused and any(t in case[0] for t in REFUSED_TYPES)):
            continue
        wrong.append("%s: %s %s" % (case[0], status, reason))
    assert not wrong, "\n".join(wrong)


# -- com.microsoft ops against onnxruntime --------------------------------------------------------

OPSETS = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]


def _model(node, inputs, outputs, initializers=()):
    graph = helper.make_graph([node], "g", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=OPSETS)
    model.ir_version = 8
    return model.SerializeToString()


def _ort(data, feeds):
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)


def _cinders(data, feeds, backend):
    model = load(data, backend=backend)
    out = model(*[cn.tensor(v, backend=backend) for v in feeds.values()])
    return [o.numpy() for o in (out if isinstance(out, tuple) else (out,))]


def _q(rng, shape, dtype):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, size=shape).astype(dtype)


def _init(name, value):
    return numpy_helper.from_array(np.asarray(value), name)


def _vi(name, dtype, shape):
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), shape)


def _check(data, feeds, backend, integer):
    expected, got = _ort(data, feeds), _cinders(data, feeds, backend)
    for e, g in zip(expected, got):
        assert g.shape == e.shape
        if integer:
            np.testing.assert_array_equal(g.astype(np.int64), e.astype(np.int64))
        else:
            np.testing.assert_allclose(g, e, rtol=0, atol=1e-4 * max(1.0, float(np.abs(e).max())))


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("op_type", ["QLinearAdd", "QLinearMul"])
def test_qlinear_binary_ops(backend, op_type, dtype):
    rng = np.random.default_rng(0)
    a, b = _q(rng, (2, 3, 8), dtype), _q(rng, (3, 8), dtype)
    zp = lambda v: np.array(v, dtype=dtype)  # noqa: E731
    inits = [_init("as", np.float32(0.05)), _init("az", zp(3)), _init("bs", np.float32(0.02)),
             _init("bz", zp(-5 if dtype == np.int8 else 130)),
             _init("cs", np.float32(0.07 if op_type == "QLinearAdd" else 0.01)), _init("cz", zp(10))]
    node = helper.make_node(op_type, ["a", "as", "az", "b", "bs", "bz", "cs", "cz"], ["c"], domain="com.microsoft")
    data = _model(node, [_vi("a", dtype, a.shape), _vi("b", dtype, b.shape)], [_vi("c", dtype, None)], inits)
    _check(data, {"a": a, "b": b}, backend, integer=True)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_qlinear_sigmoid_and_global_average_pool(backend, dtype):
    rng = np.random.default_rng(1)
    x = _q(rng, (2, 4, 5, 5), dtype)
    zp = np.array(-7 if dtype == np.int8 else 120, dtype=dtype)
    yzp = np.array(-128 if dtype == np.int8 else 0, dtype=dtype)
    inits = [_init("xs", np.float32(0.04)), _init("xz", zp), _init("ys", np.float32(1 / 256)), _init("yz", yzp)]
    node = helper.make_node("QLinearSigmoid", ["x", "xs", "xz", "ys", "yz"], ["y"], domain="com.microsoft")
    _check(_model(node, [_vi("x", dtype, x.shape)], [_vi("y", dtype, None)], inits), {"x": x}, backend, True)
    inits[2:] = [_init("ys", np.float32(0.03)), _init("yz", zp)]
    node = helper.make_node("QLinearGlobalAveragePool", ["x", "xs", "xz", "ys", "yz"], ["y"], domain="com.microsoft")
    _check(_model(node, [_vi("x", dtype, x.shape)], [_vi("y", dtype, None)], inits), {"x": x}, backend, True)


def test_qlinear_concat(backend):
    rng = np.random.default_rng(2)
    a, b = _q(rng, (2, 3, 4), np.uint8), _q(rng, (2, 5, 4), np.uint8)
    inits = [_init("ys", np.float32(0.05)), _init("yz", np.uint8(128)), _init("as", np.float32(0.05)),
             _init("az", np.uint8(128)), _init("bs", np.float32(0.031)), _init("bz", np.uint8(100))]
    node = helper.make_node("QLinearConcat", ["ys", "yz", "a", "as", "az", "b", "bs", "bz"], ["y"], axis=1,
                            domain="com.microsoft")
    data = _model(node, [_vi("a", np.uint8, a.shape), _vi("b", np.uint8, b.shape)], [_vi("y", np.uint8, None)], inits)
    _check(data, {"a": a, "b": b}, backend, integer=True)


@pytest.mark.parametrize("requantized", [True, False])
def test_qgemm(backend, requantized):
    rng = np.random.default_rng(3)
    a, w = _q(rng, (4, 300), np.uint8), _q(rng, (6, 300), np.int8) // 2   # K > 258: chunked exact product
    inits = [_init("as", np.float32(0.02)), _init("az", np.uint8(121)), _init("w", w),
             _init("ws", np.float32(0.003)), _init("wz", np.int8(0)),
             _init("c", rng.integers(-5000, 5000, 6).astype(np.int32))]
    names = ["a", "as", "az", "w", "ws", "wz", "c"]
    if requantized:
        inits += [_init("ys", np.float32(2.0)), _init("yz", np.uint8(128))]
        names += ["ys", "yz"]
    node = helper.make_node("QGemm", names, ["y"], transB=1, alpha=1.0, domain="com.microsoft")
    out = _vi("y", np.uint8 if requantized else np.float32, None)
    _check(_model(node, [_vi("a", np.uint8, a.shape)], [out], inits), {"a": a}, backend, requantized)


@pytest.mark.parametrize("weights", [np.int8, np.uint8])
def test_dynamic_quantize_matmul(backend, weights):
    rng = np.random.default_rng(4)
    a = rng.standard_normal((3, 5, 40)).astype(np.float32)
    w = _q(rng, (40, 7), weights) // (2 if weights == np.int8 else 1)   # 7-bit int8: no pmaddubsw saturation
    zp = np.zeros(7, dtype=weights) if weights == np.int8 else rng.integers(100, 150, 7).astype(np.uint8)
    inits = [_init("w", w), _init("ws", rng.uniform(0.01, 0.02, 7).astype(np.float32)), _init("wz", zp),
             _init("bias", rng.standard_normal(7).astype(np.float32))]
    node = helper.make_node("DynamicQuantizeMatMul", ["a", "w", "ws", "wz", "bias"], ["y"], domain="com.microsoft")
    _check(_model(node, [_vi("a", np.float32, a.shape)], [_vi("y", np.float32, None)], inits), {"a": a}, backend, False)


@pytest.mark.parametrize("k,block,bits,zero_points", [   # onnxruntime has no 8-bit with float zero points
    (64, 32, 4, "packed"), (64, 32, 4, "none"), (64, 32, 4, "float"), (40, 16, 4, "packed"), (40, 16, 4, "none"),
    (40, 16, 4, "float"), (40, 16, 8, "packed"), (40, 16, 8, "none")])
def test_matmul_nbits(backend, zero_points, k, block, bits):
    """4-bit (and 8-bit) blocks; K need not be a multiple of the block (the last block is padded)."""
    rng = np.random.default_rng(5)
    n, blocks = 6, -(-k // block)
    a = rng.standard_normal((2, 3, k)).astype(np.float32)
    b = rng.integers(0, 256, (n, blocks, block * bits // 8)).astype(np.uint8)
    scales = rng.uniform(0.01, 0.1, n * blocks).astype(np.float32)
    inits = [_init("b", b), _init("s", scales)]
    names = ["a", "b", "s"]
    if zero_points == "packed":
        inits.append(_init("z", rng.integers(0, 256, n * -(-blocks * bits // 8)).astype(np.uint8)))
        names.append("z")
    elif zero_points == "float":
        inits.append(_init("z", rng.uniform(5, 10, n * blocks).astype(np.float32)))
        names.append("z")
    node = helper.make_node("MatMulNBits", names, ["y"], K=k, N=n, bits=bits, block_size=block, domain="com.microsoft")
    _check(_model(node, [_vi("a", np.float32, a.shape)], [_vi("y", np.float32, None)], inits), {"a": a}, backend, False)


def test_contrib_ops_need_their_domain():
    """A com.microsoft op name in the default domain is not a known ONNX op."""
    node = helper.make_node("QLinearSigmoid", ["x", "s", "z", "s", "z"], ["y"])
    data = _model(node, [_vi("x", np.uint8, (2,))], [_vi("y", np.uint8, None)],
                  [_init("s", np.float32(0.1)), _init("z", np.uint8(0))])
    with pytest.raises(OnnxError, match="QLinearSigmoid"):
        load(data, backend=cn.NumPy())


def test_ops_joined_at_import_are_not_ops_a_file_can_name():
    """DequantizedConv and QuantizeDequantize are what the importer joins nodes into (domain
    cinders.joined); in a file's default domain they are unknown, as in onnxruntime."""
    x, w = np.ones((1, 1, 3, 3), np.float32), np.ones((1, 1, 1, 1), np.int8)
    node = helper.make_node("DequantizedConv", ["x", "w", "s"], ["y"])
    data = _model(node, [_vi("x", np.float32, x.shape)], [_vi("y", np.float32, None)],
                  [_init("w", w), _init("s", np.float32(0.5))])
    with pytest.raises(OnnxError, match="DequantizedConv"):
        load(data, backend=cn.NumPy())


def test_quantize_linear_zero_point_through_identity_keeps_its_type():
    """A zero point passed through Identity is folded at import as the same int8 constant: its
    type still tells int8 from uint8, and the result is onnxruntime's."""
    nodes = [helper.make_node("Identity", ["z"], ["z2"]), helper.make_node("QuantizeLinear", ["x", "s", "z2"], ["y"])]
    graph = helper.make_graph(nodes, "g", [_vi("x", np.float32, (3,))], [_vi("y", np.int8, None)],
                              [_init("s", np.float32(0.1)), _init("z", np.int8(-3))])
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    x = np.array([-20.0, 0.0, 1.0], np.float32)
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = load(data, backend=cn.NumPy())(cn.tensor(x, backend=cn.NumPy()))
    assert got.tolist() == want.tolist() == [-128, -3, 7]


def test_quantize_linear_whose_type_is_unknown_is_refused():
    """A zero point computed at run time (no type in the graph) cannot tell int8 from uint8."""
    nodes = [helper.make_node("Cast", ["x"], ["xi"], to=TensorProto.INT8),
             helper.make_node("Add", ["xi", "xi"], ["z2"]), helper.make_node("QuantizeLinear", ["x", "s", "z2"], ["y"])]
    graph = helper.make_graph(nodes, "g", [_vi("x", np.float32, (1,))], [_vi("y", np.int8, None)],
                              [_init("s", np.float32(0.1))])
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    with pytest.raises(OnnxError, match="int8 or uint8"):
        load(data, backend=cn.NumPy())(cn.tensor([1.0], backend=cn.NumPy()))


# -- whole models quantized by onnxruntime ---------------------------------------------------------

class _Data:
    """onnxruntime's CalibrationDataReader protocol: a few batches of random inputs."""

    def __init__(self, shape):
        rng = np.random.default_rng(1)
        self.batches = iter([{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(8)])

    def get_next(self):
        return next(self.batches, None)


SHAPES = {"cnn": (2, 3, 16, 16), "mlp": (2, 10, 64), "pools": (2, 3, 16, 16)}


def _torch_models():
    import torch
    nn = torch.nn

    class CNN(nn.Module):   # convs, a residual add, global average pooling, a linear head
        def __init__(self):
            super().__init__()
            self.c1, self.c2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 16, 3, stride=2, padding=1)
            self.c3, self.fc = nn.Conv2d(16, 16, 3, padding=1), nn.Linear(16, 5)

        def forward(self, x):
            b = torch.relu(self.c2(torch.relu(self.c1(x))))
            return self.fc((torch.relu(self.c3(b)) + b).mean((2, 3)))

    class MLP(nn.Module):   # a transformer's feed-forward block: MatMuls, GELU, residual, LayerNorm
        def __init__(self):
            super().__init__()
            self.up, self.down = nn.Linear(64, 300), nn.Linear(300, 64)
            self.norm, self.head = nn.LayerNorm(64), nn.Linear(64, 7)

        def forward(self, x):
            return self.head(self.norm(x + self.down(nn.functional.gelu(self.up(x)))))

    class Pools(nn.Module):   # what QOperator turns into QLinearLeakyRelu/AveragePool/Sigmoid/Concat
        def __init__(self):
            super().__init__()
            self.c1, self.c2, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3, padding=1), nn.Linear(128, 5)

        def forward(self, x):
            a = nn.functional.max_pool2d(torch.relu(self.c1(x)), 2)
            b = nn.functional.avg_pool2d(nn.functional.leaky_relu(self.c2(a), 0.1), 2)
            return self.fc(torch.cat([b, torch.sigmoid(b)], 1)[:, :8].flatten(1))

    torch.manual_seed(0)
    return {"cnn": CNN().eval(), "mlp": MLP().eval(), "pools": Pools().eval()}


# name -> (float model, how onnxruntime quantizes it, onnxruntime optimizes it when comparing).
# quantize_static's defaults (int8 activations and weights) are the files of issue 28.
VARIANTS = {
    "cnn_qdq": ("cnn", "static QDQ", False),
    "cnn_qdq_u8": ("cnn", "static QDQ u8", False),
    "cnn_qdq_per_channel": ("cnn", "static QDQ per-channel", False),
    "cnn_qdq_reduced": ("cnn", "static QDQ reduce_range", True),
    "cnn_qop": ("cnn", "static QOperator u8 reduce_range", True),
    "cnn_qop_per_channel": ("cnn", "static QOperator per-channel reduce_range", True),
    "cnn_dynamic_u8": ("cnn", "dynamic u8", True),
    "cnn_dynamic_s8": ("cnn", "dynamic s8 reduce_range", True),
    "mlp_qdq": ("mlp", "static QDQ", False),
    "mlp_qdq_u8_reduced": ("mlp", "static QDQ u8 reduce_range", True),
    "mlp_qop": ("mlp", "static QOperator reduce_range", True),
    "mlp_dynamic_s8": ("mlp", "dynamic s8 reduce_range", True),
    "mlp_q4": ("mlp", "4-bit asymmetric block 32", True),
    "mlp_q4_symmetric": ("mlp", "4-bit symmetric block 16", True),
    "pools_qdq": ("pools", "static QDQ reduce_range", True),
    "pools_qop": ("pools", "static QOperator reduce_range", True),
    "pools_qop_u8": ("pools", "static QOperator u8 reduce_range", True),
}


def _quantize(src, dst, how, shape):
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic, quantize_static
    if how.startswith("4-bit"):
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
        q = MatMulNBitsQuantizer(onnx.load(src), block_size=int(how.split()[-1]), is_symmetric="asym" not in how)
        q.process()
        q.model.save_model_to_file(dst)
        return
    options = dict(reduce_range="reduce_range" in how, per_channel="per-channel" in how)
    if how.startswith("dynamic"):
        quantize_dynamic(src, dst, weight_type=QuantType.QInt8 if "s8" in how else QuantType.QUInt8,
                         reduce_range=options["reduce_range"])
        return
    activations = QuantType.QUInt8 if "u8" in how else QuantType.QInt8
    quantize_static(src, dst, _Data(shape), quant_format=QuantFormat.QDQ if "QDQ" in how else QuantFormat.QOperator,
                    activation_type=activations, weight_type=QuantType.QInt8, **options)


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    import torch
    folder = tmp_path_factory.mktemp("quant")
    logging.disable(logging.WARNING)   # the quantizers advise pre-processing on every call
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for name, model in _torch_models().items():
                torch.onnx.export(model, (torch.randn(*SHAPES[name]),), str(folder / (name + ".onnx")), dynamo=False,
                                  input_names=["x"], output_names=["y"], opset_version=17)
            for variant, (name, how, _) in VARIANTS.items():
                _quantize(str(folder / (name + ".onnx")), str(folder / (variant + ".onnx")), how, SHAPES[name])
    finally:
        logging.disable(logging.NOTSET)
    return folder


def _onnxruntime(path, x, optimized):
    options = ort.SessionOptions()
    if not optimized:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]).run(None, {"x": x})


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_quantized_model_matches_onnxruntime(quantized, variant):
    name, how, optimized = VARIANTS[variant]
    path = quantized / (variant + ".onnx")
    ops = {n.op_type for n in onnx.load(str(path)).graph.node}
    assert ops & (QUANT_OPS | {"MatMulNBits", "QGemm", "QLinearAdd", "QLinearMul"}), ops
    assert variant != "pools_qop" or {"QLinearLeakyRelu", "QLinearAveragePool", "QLinearConcat"} <= ops, ops
    x = np.random.default_rng(5).standard_normal(SHAPES[name]).astype(np.float32)
    expected = _onnxruntime(path, x, optimized)[0]
    backend = cn.NumPy()
    got = load(str(path), backend=backend)(cn.tensor(x, backend=backend)).numpy()
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4 * float(np.abs(expected).max()))
    # and close to the float model, as a quantized model should be
    reference = _onnxruntime(quantized / (name + ".onnx"), x, True)[0]
    assert np.abs(got - reference).max() < 0.1 * np.abs(reference).max()


@pytest.mark.parametrize("backend_name", ["python", "wgpu", "wasm"])
def test_qdq_cnn_on_every_backend(quantized, backend_name):
    """The statically quantized CNN of issue 28: QDQ with int8 activations, whose negative values
    the importer once clamped to 0..255 (every negative logit came out as one number)."""
    path = quantized / "cnn_qdq.onnx"
    x = np.random.default_rng(6).standard_normal(SHAPES["cnn"]).astype(np.float32)
    expected = _onnxruntime(path, x, False)[0]
    backend = BACKENDS[backend_name]()
    got = load(str(path), backend=backend)(cn.tensor(x, backend=backend)).numpy()
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4 * float(np.abs(expected).max()))


@pytest.mark.parametrize("variant,kind", [("cnn_qop", TensorProto.UINT8), ("cnn_qop_per_channel", TensorProto.INT8)])
def test_qoperator_integer_output_is_exact(quantized, tmp_path, variant, kind):
    """The quantized tensor a QOperator graph computes before its last DequantizeLinear: equal to
    onnxruntime's value for value."""
    model = onnx.load(str(quantized / (variant + ".onnx")))
    last = [n for n in model.graph.node if n.op_type == "DequantizeLinear"][-1]
    model.graph.output.append(helper.make_tensor_value_info(last.input[0], kind, None))
    path = tmp_path / "two_outputs.onnx"
    onnx.save(model, str(path))
    x = np.random.default_rng(7).standard_normal(SHAPES["cnn"]).astype(np.float32)
    expected = _onnxruntime(path, x, True)[1]
    backend = cn.NumPy()
    got = load(str(path), backend=backend)(cn.tensor(x, backend=backend))[1].numpy()
    assert got.shape == expected.shape
    np.testing.assert_array_equal(got, expected.astype(np.int64))


# -- unsupported ops: counted by type on one screen, named behind --verbose ------------------------

def test_unsupported_ops_are_counted_by_type(tmp_path):
    import subprocess
    nodes = [helper.make_node("FancyOp", ["x"], ["a0"], name="fancy_0")]
    nodes += [helper.make_node("FancyOp", ["a%d" % i], ["a%d" % (i + 1)], name="fancy_%d" % (i + 1)) for i in range(20)]
    nodes += [helper.make_node("FusedThing", ["a21"], ["y"], domain="com.microsoft", name="fused")]
    graph = helper.make_graph(nodes, "g", [_vi("x", np.float32, (2,))], [_vi("y", np.float32, (2,))])
    model = helper.make_model(graph, opset_imports=OPSETS)
    with pytest.raises(OnnxError) as info:
        load(model.SerializeToString())
    text = str(info.value)
    assert "22 node(s) unsupported" in text and "FancyOp \u00d721, com.microsoft::FusedThing \u00d71" in text
    assert "fancy_" not in text and len(text) < 400
    assert len(info.value.nodes) == 22 and "FancyOp 'fancy_20' at opset 17: op not supported" in info.value.nodes
    path = tmp_path / "fancy.onnx"
    path.write_bytes(model.SerializeToString())
    for verbose in (False, True):
        done = subprocess.run([sys.executable, "-m", "cinders", "import-onnx", str(path), "--out", str(tmp_path)]
                              + ["--verbose"] * verbose, capture_output=True, text=True, timeout=120)
        assert done.returncode == 1 and "FancyOp \u00d721" in done.stderr
        assert ("'fancy_13'" in done.stderr) == verbose
        assert len(done.stderr.splitlines()) == (23 if verbose else 1)


@pytest.mark.parametrize("raw", [True, False])
@pytest.mark.parametrize("kind", [TensorProto.INT4, TensorProto.UINT4])
def test_four_bit_weights_blocked(kind, raw):
    """int4/uint4 initializers (two values a byte, an odd count padded) dequantized in blocks
    (opset 21), as onnxruntime's 4-bit QDQ weight format stores them."""
    rng = np.random.default_rng(8)
    lo, hi = (-8, 7) if kind == TensorProto.INT4 else (0, 15)
    w = rng.integers(lo, hi + 1, (9, 5))
    packed = helper.make_tensor("w", kind, w.shape, w.flatten().tolist())
    if raw:   # the same nibbles as raw bytes
        nibbles = (w.flatten() & 15).tolist() + [0]
        packed = helper.make_tensor("w", kind, w.shape, bytes(a | b << 4 for a, b in zip(nibbles[0::2], nibbles[1::2])),
                                    raw=True)
    scale = _init("s", rng.uniform(0.01, 0.1, (3, 5)).astype(np.float32))
    zp = helper.make_tensor("z", kind, (3, 5), rng.integers(lo, hi + 1, 15).tolist())
    nodes = [helper.make_node("DequantizeLinear", ["w", "s", "z"], ["wf"], axis=0, block_size=4),
             helper.make_node("MatMul", ["x", "wf"], ["y"])]
    graph = helper.make_graph(nodes, "g", [_vi("x", np.float32, (2, 9))], [_vi("y", np.float32, None)],
                              [packed, scale, zp])
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]).SerializeToString()
    _check(data, {"x": rng.standard_normal((2, 9)).astype(np.float32)}, cn.NumPy(), integer=False)


def test_dynamic_quantize_lstm(tmp_path):
    """quantize_dynamic turns an LSTM into com.microsoft DynamicQuantizeLSTM: the input sequence and
    every step's hidden state are quantized to uint8 at run time. onnxruntime's LSTM computes
    sigmoid/tanh with its own approximations (MlasComputeLogistic/Tanh), so the hidden states differ
    in the last float32 bits and, re-quantized at every step, a value now and then rounds to the
    neighbouring uint8: the outputs agree to about a quantization step (1% of the output's range
    here), not to 1e-4. Both stay as close to the float model as each other."""
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic

    class Tagger(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = torch.nn.LSTM(12, 20, batch_first=True, bidirectional=True)
            self.head = torch.nn.Linear(40, 4)

        def forward(self, x):
            return self.head(self.lstm(x)[0])

    torch.manual_seed(0)
    src, dst = str(tmp_path / "lstm.onnx"), str(tmp_path / "lstm_q8.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Tagger().eval(), (torch.randn(2, 7, 12),), src, dynamo=False, input_names=["x"],
                          output_names=["y"], opset_version=17)
    logging.disable(logging.WARNING)
    try:
        quantize_dynamic(src, dst, weight_type=QuantType.QInt8, reduce_range=True)
    finally:
        logging.disable(logging.NOTSET)
    assert "DynamicQuantizeLSTM" in {n.op_type for n in onnx.load(dst).graph.node}
    x = np.random.default_rng(0).standard_normal((2, 7, 12)).astype(np.float32)
    expected, reference = _onnxruntime(dst, x, True)[0], _onnxruntime(src, x, True)[0]
    backend = cn.NumPy()
    got = load(dst, backend=backend)(cn.tensor(x, backend=backend)).numpy()
    scale = float(np.abs(expected).max())
    assert np.abs(got - expected).max() < 0.01 * scale
    assert np.abs(got - reference).max() < 2 * np.abs(expected - reference).max() + 1e-3 * scale


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_qlinear_softmax(backend, dtype):
    """onnxruntime computes QLinearSoftmax from a fixed-point table of exponentials, cinders as the
    float softmax of the dequantized values: they may differ by one step where a value lies next
    to a rounding boundary (none of these 160 values does, on uint8 or int8)."""
    rng = np.random.default_rng(9)
    x = _q(rng, (16, 10), dtype)
    zp = np.array(-3 if dtype == np.int8 else 125, dtype=dtype)
    yzp = np.array(-128 if dtype == np.int8 else 0, dtype=dtype)
    inits = [_init("xs", np.float32(0.05)), _init("xz", zp), _init("ys", np.float32(1 / 256)), _init("yz", yzp)]
    node = helper.make_node("QLinearSoftmax", ["x", "xs", "xz", "ys", "yz"], ["y"], axis=-1, opset=13,
                            domain="com.microsoft")
    data = _model(node, [_vi("x", dtype, x.shape)], [_vi("y", dtype, None)], inits)
    expected = _ort(data, {"x": x})[0].astype(np.int64)
    got = _cinders(data, {"x": x}, backend)[0].astype(np.int64)
    assert got.shape == expected.shape
    assert np.abs(got - expected).max() <= 1 and (got != expected).mean() < 0.1


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_qdq_activation_round_trips_run_as_one_op(backend, dtype):
    """QuantizeLinear -> DequantizeLinear with per-tensor parameters (a QDQ graph's activations)
    is joined at import into one elementwise op: values on rounding ties, saturating at both
    ends, equal onnxruntime's unoptimized graph to the last bit; a quantized value that is also a
    graph output keeps its QuantizeLinear."""
    rng = np.random.default_rng(5)
    x = np.concatenate([rng.standard_normal(60).astype(np.float32) * 3,
                        np.array([0.25, 0.75, -0.25, -1.25, 1e6, -1e6, 0.0], np.float32)])
    zp = dtype(3 if dtype == np.int8 else 130)
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s2", "z"], ["y"]),
             helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q_out"]),
             helper.make_node("DequantizeLinear", ["q_out", "s", "z"], ["y2"])]
    graph = helper.make_graph(nodes, "g", [_vi("x", np.float32, x.shape)],
                              [_vi("y", np.float32, x.shape), _vi("q_out", dtype, x.shape), _vi("y2", np.float32, x.shape)],
                              [_init("s", np.float32(0.5)), _init("s2", np.float32(0.03)), _init("z", zp)])
    model = helper.make_model(graph, opset_imports=OPSETS)
    model.ir_version = 8
    data = model.SerializeToString()
    assert "QuantizeDequantize" in cn.onnx.to_source(data)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    expected = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for e, g in zip(expected, _cinders(data, {"x": x}, backend)):
        np.testing.assert_array_equal(g.astype(e.dtype), e)


@pytest.mark.parametrize("variant", ["cnn_dynamic_u8", "cnn_dynamic_s8", "mlp_dynamic_s8", "cnn_qdq_u8", "mlp_qdq"])
def test_quantized_model_matches_onnxruntime_on_wgpu(quantized, variant, monkeypatch):
    """quantize_dynamic's and quantize_static's models on cn.Wgpu, whose DynamicQuantizeLinear and
    QDQ round trips are kernels of their own (the dynamic_quantize and quantize_dequantize
    abilities): onnxruntime's answer, as on cn.NumPy above."""
    name, how, optimized = VARIANTS[variant]
    path = quantized / (variant + ".onnx")
    x = np.random.default_rng(5).standard_normal(SHAPES[name]).astype(np.float32)
    expected = _onnxruntime(path, x, optimized)[0]
    backend = BACKENDS["wgpu"]()
    calls = []

    def spy(ability):
        kernel = getattr(backend, ability)

        def call(*args):
            calls.append(ability)
            return kernel(*args)
        return call
    for ability in ("dynamic_quantize", "quantize_dequantize"):
        monkeypatch.setattr(backend, ability, spy(ability))
    got = load(str(path), backend=backend)(cn.tensor(x, backend=backend)).numpy()
    assert calls and set(calls) == {"dynamic_quantize" if "dynamic" in how else "quantize_dequantize"}, calls
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4 * float(np.abs(expected).max()))


# DynamicQuantizeLinear's edge inputs (name -> x, whether onnxruntime is the reference). Cinders'
# rule: the range skips NaN, a NaN quotient (a NaN x, inf / inf) saturates to 0, an empty x gets
# scale 1 and zero point 0. onnxruntime agrees where a NaN leads its vector lanes or is alone;
# further into a long vector its min/max lanes drop other values (the range of [1.5, -2, NaN x 9,
# 0.25 x 6] comes out [0, 0.25]), and with -inf its zero point is 255: there every backend gives
# cn.Python's composition instead.
DYNAMIC_EDGES = {"nan": ([np.nan, 1, 2, 3, -1], True), "inf": ([np.inf, 1.0], True), "all nan": ([np.nan] * 6, True),
                 "empty": ([], True), "nan in a long vector": ([1.5, -2.0] + [np.nan] * 9 + [0.25] * 6, False),
                 "-inf": ([2.0, -np.inf, 0.5], False)}


@pytest.mark.parametrize("edge", list(DYNAMIC_EDGES))
def test_dynamic_quantize_linear_edges_are_one_rule(backend, edge):
    """The composition (cn.Python, cn.NumPy, under cn.Fusion) and the one-kernel abilities
    (cn.Wgpu's Program, cn.Wasm's runtime.h kernel) give the same y, scale and zero point on NaN,
    infinities and an empty x: onnxruntime's where it is defined (above)."""
    values, ort_defined = DYNAMIC_EDGES[edge]
    x = np.array(values, np.float32).reshape(-1)
    graph = helper.make_graph([helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])],
                              [helper.make_tensor_value_info(n, t, None) for n, t in
                               (("y", TensorProto.UINT8), ("s", TensorProto.FLOAT), ("z", TensorProto.UINT8))])
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()
    if ort_defined:
        expected = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    else:
        expected = [t.numpy() for t in load(data, backend=cn.Python())(cn.tensor(x, backend=cn.Python()))]
        assert 0 <= expected[2] <= 255 and all(0 <= v <= 255 for v in expected[0])
    for b in (backend, cn.Fusion(backend)):
        got = [t.numpy() for t in load(data, backend=b)(cn.tensor(x, backend=b))]
        for g, e in zip(got, expected):
            np.testing.assert_array_equal(np.asarray(g, np.float64), np.asarray(e, np.float64))
