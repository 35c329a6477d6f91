"""4-bit QDQ weights (issue 28, items 2-3): DequantizeLinear of a constant int4/uint4 weight read by
a MatMul, Gemm or Conv stays packed two values a byte (codegen `packed_four_bit`) and is read
4-bit inside matmul_quantized on the backends that declare `quantized_matmul` (cn.NumPy, cn.Wasm
on both engines, cn.Wgpu on lavapipe). Blocks along N, 1-D and 3-D conv weights and 1x1 conv
blocks along C stay quantized too, 8-bit ones included (ops/quantization.py). Every answer is
onnxruntime's for the graph as written (its optimizer turns DequantizeLinear -> MatMul into
MatMulNBits, which may quantize A)."""

import numpy as np
import pytest

import cinders as cn
from cinders.onnx import load

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

RNG = np.random.default_rng(28)
BACKENDS = {"numpy": cn.NumPy, "wasm-native": lambda: cn.Wasm(engine="native"),
            "wasm-wasmtime": lambda: cn.Wasm(engine="wasmtime"), "wgpu": lambda: cn.Wgpu(autotune=False)}


@pytest.fixture(scope="module", params=list(BACKENDS))
def backend(request):
    return BACKENDS[request.param]()


TYPES = {"int4": TensorProto.INT4, "uint4": TensorProto.UINT4, "int8": TensorProto.INT8}
RANGES = {"int4": (-8, 8), "uint4": (0, 16), "int8": (-128, 128)}


def _quantized(name, values, kind):
    return helper.make_tensor(name, TYPES[kind], values.shape, values.flatten().tolist())


def _params(shape, kind, axis, block, zero_point):
    """Random W of `shape` and type `kind` with a scale (and zero point) per tensor (axis None),
    per axis, or in opset 21 blocks along `axis`: initializers and DequantizeLinear's inputs and
    attributes."""
    lo, hi = RANGES[kind]
    if axis is None:
        grid = ()
    elif block:
        grid = tuple(-(-d // block) if i == axis else d for i, d in enumerate(shape))
    else:
        grid = (shape[axis],)
    inits = [_quantized("w", RNG.integers(lo, hi, shape), kind),
             numpy_helper.from_array(RNG.uniform(0.01, 0.1, grid).astype(np.float32), "s")]
    if zero_point:
        inits.append(_quantized("z", RNG.integers(lo, hi, grid), kind))
    attrs = {"axis": axis or 0}
    if block:
        attrs["block_size"] = block
    return inits, helper.make_node("DequantizeLinear", ["w", "s", "z"][:len(inits)], ["wf"], **attrs)


def _model(node, x_shape, inits, dq):
    graph = helper.make_graph([dq, node], "g", [helper.make_tensor_value_info("x", 1, x_shape)],
                              [helper.make_tensor_value_info("y", 1, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model.SerializeToString()


def _onnxruntime(data, x):
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def _run(backend, data, x, monkeypatch):
    """The model's output on backend and the `bits` of each matmul_quantized call it made."""
    bits, inner = [], backend.matmul_quantized

    def counted(*args, **kwargs):
        bits.append(args[4].bits)
        return inner(*args, **kwargs)
    monkeypatch.setattr(backend, "matmul_quantized", counted)
    model = load(data, backend=backend)
    out = model(cn.tensor(x, backend=backend)).numpy()
    monkeypatch.undo()
    return out, bits, model


# (id, K, N, type, axis of B (K, N) or None: per tensor, block, zero point, op; GemmT: Gemm
# with transB, W stored (N, K))
PRODUCTS = [
    ("int4-block32-ragged", 70, 37, "int4", 0, 32, False, "MatMul"),    # MatMulNBitsQuantizer's QDQ form
    ("uint4-block16-zp", 48, 24, "uint4", 0, 16, True, "MatMul"),
    ("int4-block16-zp-gemm", 40, 17, "int4", 0, 16, True, "Gemm"),
    ("int4-block16-zp-transB", 40, 17, "int4", 0, 16, True, "GemmT"),
    ("uint4-block32-ragged-transB", 70, 37, "uint4", 0, 32, False, "GemmT"),
    ("uint4-per-column-odd", 33, 9, "uint4", 1, 0, True, "MatMul"),
    ("int4-per-row-gemm", 33, 9, "int4", 0, 0, True, "Gemm"),
    ("int4-per-column-transB", 33, 9, "int4", 1, 0, False, "GemmT"),
    ("uint4-per-tensor-odd", 35, 11, "uint4", None, 0, True, "MatMul"),
    ("int4-per-tensor-transB", 35, 11, "int4", None, 0, False, "GemmT"),
    ("int4-blocks-along-n", 33, 21, "int4", 1, 8, True, "MatMul"),
    ("uint4-blocks-along-n-gemm", 20, 40, "uint4", 1, 16, False, "Gemm"),
    ("int4-blocks-along-n-transB", 20, 40, "int4", 1, 16, True, "GemmT"),
    ("int8-blocks-along-n", 33, 21, "int8", 1, 8, True, "MatMul"),
    ("int8-blocks-along-n-transB", 20, 40, "int8", 1, 16, False, "GemmT"),
]


@pytest.mark.parametrize("case", PRODUCTS, ids=[c[0] for c in PRODUCTS])
def test_qdq_products_read_the_quantized_weight_and_give_onnxruntimes_answer(backend, case, monkeypatch):
    _, k, n, kind, axis, block, zero_point, op = case
    transposed = op == "GemmT"
    shape = (n, k) if transposed else (k, n)
    stored_axis = None if axis is None else (1 - axis if transposed else axis)
    inits, dq = _params(shape, kind, stored_axis, block, zero_point)
    node = helper.make_node("Gemm" if transposed else op, ["x", "wf"], ["y"], **({"transB": 1} if transposed else {}))
    x = RNG.standard_normal((3, k)).astype(np.float32)
    data = _model(node, x.shape, inits, dq)
    got, bits, model = _run(backend, data, x, monkeypatch)
    blocks_along_n = block and axis == 1
    width = 8 if kind == "int8" else 4
    assert bits == [width] * (-(-n // block) if blocks_along_n else 1), bits
    held = [t.dtype for t in model.state_dict().values() if t.numel() == (k * n if width == 8 else (k * n + 1) // 2)]
    assert held == [cn.int8 if width == 8 else cn.uint8], held   # one byte, or two values a byte
    np.testing.assert_allclose(got, _onnxruntime(data, x), rtol=1e-5, atol=1e-5)


def test_without_the_ability_the_composition_gives_the_same_answer(monkeypatch):
    """cn.Python has no quantized_matmul: the packed bytes are unpacked per call, the same numbers."""
    inits, dq = _params((20, 7), "int4", 0, 8, True)
    data = _model(helper.make_node("MatMul", ["x", "wf"], ["y"]), (2, 20), inits, dq)
    x = RNG.standard_normal((2, 20)).astype(np.float32)
    got = load(data, backend=cn.Python())(cn.tensor(x, backend=cn.Python())).numpy()
    np.testing.assert_allclose(got, _onnxruntime(data, x), rtol=1e-5, atol=1e-5)


# (id, W shape, type, axis or None, block, zero point, Conv attributes, group, x shape)
CONVS = [
    ("int4-2d-per-channel", (6, 3, 3, 3), "int4", 0, 0, False, dict(pads=[1, 0, 0, 1], strides=[2, 2]), (2, 3, 9, 8)),
    ("uint4-1d-per-tensor", (5, 4, 3), "uint4", None, 0, True, dict(pads=[1, 1]), (2, 4, 11)),
    ("int4-3d-per-channel", (4, 3, 2, 3, 3), "int4", 0, 0, True,
     dict(pads=[1, 0, 1, 0, 1, 1], strides=[2, 1, 1], dilations=[1, 2, 1]), (1, 3, 6, 7, 6)),
    ("uint4-1x1-blocks-along-c", (7, 20, 1, 1), "uint4", 1, 8, True, {}, (1, 20, 5, 5)),
    ("int8-1x1-blocks-along-c", (7, 20, 1, 1), "int8", 1, 16, False, dict(strides=[2, 2]), (1, 20, 5, 5)),
]


@pytest.mark.parametrize("case", CONVS, ids=[c[0] for c in CONVS])
def test_qdq_conv_weights_stay_quantized(backend, case, monkeypatch):
    _, shape, kind, axis, block, zero_point, attrs, x_shape = case
    inits, dq = _params(shape, kind, axis, block, zero_point)
    data = _model(helper.make_node("Conv", ["x", "wf"], ["y"], **attrs), x_shape, inits, dq)
    x = RNG.standard_normal(x_shape).astype(np.float32)
    got, bits, _ = _run(backend, data, x, monkeypatch)
    assert bits == [8 if kind == "int8" else 4], bits
    np.testing.assert_allclose(got, _onnxruntime(data, x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("group", [1, 2])
def test_int8_conv3d_weight_stays_8_bit(backend, group, monkeypatch):
    """An int8 Conv3d weight (per output channel) is the 2-D (O, C*KD, kh, kw) weight of the
    image's depth taps, the same bytes: read 8-bit inside matmul_quantized at group 1, dequantized
    for a grouped one (no grouped quantized_conv), both onnxruntime's answer."""
    w = RNG.integers(-127, 128, (4, 4 // group, 3, 2, 2)).astype(np.int8)
    inits = [numpy_helper.from_array(w, "w"),
             numpy_helper.from_array(RNG.uniform(0.01, 0.02, 4).astype(np.float32), "s")]
    dq = helper.make_node("DequantizeLinear", ["w", "s"], ["wf"], axis=0)
    conv = helper.make_node("Conv", ["x", "wf"], ["y"], pads=[1, 1, 0, 1, 1, 0], strides=[2, 1, 1], group=group)
    data = _model(conv, (1, 4, 5, 4, 4), inits, dq)
    x = RNG.standard_normal((1, 4, 5, 4, 4)).astype(np.float32)
    got, bits, model = _run(backend, data, x, monkeypatch)
    assert bits == ([8] if group == 1 else []), bits
    assert any(t.dtype is cn.int8 for t in model.state_dict().values())
    np.testing.assert_allclose(got, _onnxruntime(data, x), rtol=1e-5, atol=1e-5)


def test_conv_weights_blocked_or_per_input_channel(backend, monkeypatch):
    """A 3x3 conv weight in blocks along C (ragged: 12 = 8 + 4) is read 4-bit one kernel tap at a
    time (ops/quantization.py conv_weight_layouts), one per input channel (axis 1) in one
    product; one per kernel row (axis 2) has no layout and is dequantized per call
    (docs/onnx.md). Each gives onnxruntime's answer."""
    for axis, block, calls in ((1, 8, [4] * 9), (1, 0, [4]), (2, 0, [])):
        inits, dq = _params((5, 12, 3, 3), "int4", axis, block, True)
        data = _model(helper.make_node("Conv", ["x", "wf"], ["y"], pads=[1, 0, 1, 1], strides=[1, 2]), (1, 12, 6, 7),
                      inits, dq)
        x = RNG.standard_normal((1, 12, 6, 7)).astype(np.float32)
        got, bits, _ = _run(backend, data, x, monkeypatch)
        assert bits == calls, bits
        np.testing.assert_allclose(got, _onnxruntime(data, x), rtol=1e-5, atol=1e-5)


def _held_bytes(backend, model):
    """Bytes the model's tensors hold: cn.Wgpu's device buffers (memory_stats), cn.Wasm's heap
    blocks, cn.NumPy's arrays."""
    if backend.name == "numpy":
        return sum(t.handle.nbytes for t in model.state_dict().values())
    backend.synchronize()
    return backend.memory_stats()["allocated_bytes"] if backend.name == "wgpu" else backend.heap.in_use


def test_a_four_bit_model_holds_an_eighth_of_the_float_bytes(backend):
    k, n = 512, 512
    w = RNG.standard_normal((k, n)).astype(np.float32)
    float_data = _model(helper.make_node("MatMul", ["x", "wf"], ["y"]), (3, k), [numpy_helper.from_array(w, "w")],
                        helper.make_node("Identity", ["w"], ["wf"]))
    inits, dq = _params((k, n), "int4", 0, 32, False)
    q4_data = _model(helper.make_node("MatMul", ["x", "wf"], ["y"]), (3, k), inits, dq)
    sizes = []
    for data in (float_data, q4_data):
        if backend.name == "wgpu":
            backend.synchronize()
            backend.empty_cache()
        before = 0 if backend.name == "numpy" else _held_bytes(backend, None)
        model = load(data, backend=backend)
        sizes.append(_held_bytes(backend, model) - before)
        del model
    f32, q4 = sizes
    assert f32 >= 4 * k * n
    # k * n / 2 bytes of nibbles and a float32 scale per 32 values (1/32 of the float bytes)
    assert 0.125 <= q4 / f32 < 0.165, (q4, f32)


def test_import_onnx_record_holds_the_packed_bytes(tmp_path, monkeypatch):
    """`cinders import-onnx` writes a 4-bit QDQ weight as its packed bytes (safetensors U8, half a
    byte a value); the written module loads them on cn.Python (no quantized_matmul: unpacked per
    call) with onnxruntime's answer."""
    import importlib
    from cinders.onnx import import_onnx
    inits, dq = _params((40, 9), "int4", 0, 16, False)
    data = _model(helper.make_node("MatMul", ["x", "wf"], ["y"]), (2, 40), inits, dq)
    path = tmp_path / "q4.onnx"
    path.write_bytes(data)
    py_path, st_path, _ = import_onnx(str(path), str(tmp_path / "out"), name="q4_net")
    from safetensors.numpy import load_file
    assert [(a.dtype, a.shape) for a in load_file(st_path).values() if a.dtype == np.uint8] == [(np.uint8, (180,))]
    monkeypatch.syspath_prepend(str(tmp_path / "out"))
    module = importlib.import_module("q4_net")
    x = RNG.standard_normal((2, 40)).astype(np.float32)
    got = module.Model.load(st_path, backend=cn.Python())(cn.tensor(x, backend=cn.Python()))
    np.testing.assert_allclose(got.numpy(), _onnxruntime(data, x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("symmetric", [True, False], ids=["int4", "uint4-zero-points"])
def test_matmul_nbits_quantizer_qdq_files(backend, symmetric, monkeypatch):
    """What onnxruntime's MatMulNBitsQuantizer writes with quant_format=QDQ: DequantizeLinear of
    an int4 weight (symmetric) or a uint4 one with uint4 zero points, blocks of 16 along K (70:
    a ragged last block), feeding each MatMul."""
    import logging
    from onnxruntime.quantization import QuantFormat
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y"])]
    weights = {"w1": RNG.standard_normal((70, 40)), "w2": RNG.standard_normal((40, 13))}
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", 1, (3, 70))],
                              [helper.make_tensor_value_info("y", 1, None)],
                              [numpy_helper.from_array(w.astype(np.float32), n) for n, w in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    config = DefaultWeightOnlyQuantConfig(block_size=16, is_symmetric=symmetric, quant_format=QuantFormat.QDQ)
    logging.disable(logging.INFO)   # (the quantizer logs every node)
    try:
        quantizer = MatMulNBitsQuantizer(model, algo_config=config)
        quantizer.process()
    finally:
        logging.disable(logging.NOTSET)
    data = quantizer.model.model.SerializeToString()
    assert {t.data_type for t in quantizer.model.model.graph.initializer} == \
        ({TensorProto.INT4, TensorProto.FLOAT} if symmetric else {TensorProto.UINT4, TensorProto.FLOAT})
    x = RNG.standard_normal((3, 70)).astype(np.float32)
    got, bits, _ = _run(backend, data, x, monkeypatch)
    assert bits == [4, 4], bits
    np.testing.assert_allclose(got, _onnxruntime(data, x), rtol=1e-5, atol=1e-4)


@pytest.fixture(scope="module")
def static_int4_file(tmp_path_factory):
    """onnxruntime's quantize_static with weight_type=QInt4 (QDQ, per channel) of a small CNN."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    folder = tmp_path_factory.mktemp("static_int4")
    nodes = [helper.make_node("Conv", ["x", "wc", "bc"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]), helper.make_node("Flatten", ["r"], ["f"]),
             helper.make_node("MatMul", ["f", "wm"], ["y"])]
    inits = {"wc": RNG.standard_normal((8, 3, 3, 3)), "bc": RNG.standard_normal(8),
             "wm": RNG.standard_normal((288, 10)) * 0.1}
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", 1, (1, 3, 6, 6))],
                              [helper.make_tensor_value_info("y", 1, None)],
                              [numpy_helper.from_array(v.astype(np.float32), n) for n, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    onnx.save(model, str(folder / "f.onnx"))
    samples = iter([{"x": RNG.standard_normal((1, 3, 6, 6)).astype(np.float32)} for _ in range(4)])

    class Samples(CalibrationDataReader):
        def get_next(self):
            return next(samples, None)
    quantize_static(str(folder / "f.onnx"), str(folder / "q.onnx"), Samples(), quant_format=QuantFormat.QDQ,
                    weight_type=QuantType.QInt4, activation_type=QuantType.QUInt8, per_channel=True)
    return (folder / "q.onnx").read_bytes()


def test_quantize_static_int4_weights(backend, static_int4_file, monkeypatch):
    """quantize_static's int4 Conv and MatMul weights between uint8 activation round trips are
    read 4-bit in both products; the output is onnxruntime's (it is requantized: within one
    quantization step where a float32 rounding lands a value on the other side of a rounding
    boundary)."""
    data = static_int4_file
    x = RNG.standard_normal((1, 3, 6, 6)).astype(np.float32)
    got, bits, _ = _run(backend, data, x, monkeypatch)
    assert bits == [4, 4], bits
    step = float(numpy_helper.to_array([t for t in onnx.load_from_string(data).graph.initializer
                                        if t.name == "y_scale"][0]))
    np.testing.assert_allclose(got, _onnxruntime(data, x), rtol=0, atol=step * 1.001)


@pytest.mark.parametrize("k,n", [(3000, 200), (3001, 97)], ids=["even-odd-panels", "odd"])
@pytest.mark.parametrize("stored", ["kn", "nk"])
def test_numpy_reads_nibble_panels_from_whole_bytes(k, n, stored):
    """cn.NumPy dequantizes a 4-bit B a panel of columns at a time, unpacking a strided view of
    whole bytes where rows start on a byte (an odd panel start or stride: index arrays); blocks
    of 32 along K with zero points. The panels (87 columns of K = 3000) start odd and even."""
    from cinders.backend import QuantizedLayout
    numpy = cn.NumPy()
    values = RNG.integers(0, 16, k * n)
    packed = np.zeros((k * n + 1) // 2, np.uint8)
    packed[:] = values[0::2]
    packed[:len(values[1::2])] |= (values[1::2] << 4).astype(np.uint8)
    blocks = -(-k // 32)
    scale = RNG.uniform(0.5, 1.5, blocks * n).astype(np.float32)
    zp = RNG.integers(0, 16, blocks * n).astype(np.uint8)
    grid = (0, 1, blocks) if stored == "nk" else (0, n, 1)
    layout = QuantizedLayout(k, n, 4, 32, (0, 1, k) if stored == "nk" else (0, n, 1), scale=grid, zp=grid)
    a = RNG.standard_normal((3, k)).astype(np.float32)
    got = numpy.matmul_quantized(a, packed, scale, zp, layout)
    q = values.reshape((n, k)).T if stored == "nk" else values.reshape((k, n))
    rows = np.arange(k) // 32
    s, z = (scale.reshape(n, blocks).T, zp.reshape(n, blocks).T) if stored == "nk" else \
        (scale.reshape(blocks, n), zp.reshape(blocks, n))
    expected = a.astype(np.float64) @ ((q - z[rows].astype(np.int64)) * s[rows].astype(np.float64))
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-3)
