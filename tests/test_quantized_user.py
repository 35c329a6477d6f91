"""Hostile and odd quantized graphs, tried as a new user would (issue 28): each either answers
what onnxruntime answers for the graph as written or is refused with an OnnxError, on every
backend, never a silent number where onnxruntime refuses the graph, never an IndexError.

The table: name -> (graph bytes, feeds). onnxruntime (optimizer off: its fusions quantize
activations the graph does not) decides which outcome is right."""

import os

import numpy as np
import pytest

import cinders as cn
from cinders.onnx import OnnxError, load

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto as TP  # noqa: E402
from onnx import helper, numpy_helper  # noqa: E402

RNG = np.random.default_rng(2811)
BACKENDS = {"python": cn.Python, "numpy": cn.NumPy, "wasm": cn.Wasm, "wgpu": lambda: cn.Wgpu(autotune=False)}
A = RNG.standard_normal((2, 64)).astype(np.float32)
MS = "com.microsoft"


@pytest.fixture(scope="module", params=list(BACKENDS))
def backend(request):
    return BACKENDS[request.param]()


def _graph(nodes, inits, inputs=(("a", (2, 64)),)):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TP.FLOAT, s) for n, s in inputs],
                              [helper.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)])
    model.ir_version = 10
    return model.SerializeToString()


def _t(name, onnx_type, values, shape=None):
    values = np.asarray(values)
    return helper.make_tensor(name, onnx_type, values.shape if shape is None else shape, values.ravel().tolist())


def _int8_w(k=64, n=8):
    return _t("w", TP.INT8, RNG.integers(-127, 128, (k, n)))


def _dq_matmul(w, scale, zero_point=None, inputs=(("a", (2, 64)),), **attrs):
    """DequantizeLinear(constant W) -> MatMul: the QDQ weight the importer joins (DequantizedMatMul)."""
    names = ["w", "s"] + (["z"] if zero_point is not None else [])
    inits = [w, scale] + ([zero_point] if zero_point is not None else [])
    return _graph([helper.make_node("DequantizeLinear", names, ["wf"], **attrs),
                   helper.make_node("MatMul", [inputs[0][0], "wf"], ["y"])], inits, inputs)


def _nbits(packed, scales, zero_points=None, k=64, n=8):
    inits = [numpy_helper.from_array(packed, "w"), numpy_helper.from_array(scales, "s")]
    names = ["a", "w", "s"]
    if zero_points is not None:
        inits.append(numpy_helper.from_array(zero_points, "z"))
        names.append("z")
    return _graph([helper.make_node("MatMulNBits", names, ["y"], domain=MS, K=k, N=n, bits=4, block_size=32)], inits)


def _qlinear_matmul(w_scale, w_zero_point):
    """a quantized to uint8, QLinearMatMul by an int8 W (|w| <= 63: onnxruntime's uint8 x int8
    kernels saturate pairs of products in int16 beyond), the result dequantized."""
    return _graph([helper.make_node("QuantizeLinear", ["a", "s", "z"], ["aq"]),
                   helper.make_node("QLinearMatMul", ["aq", "s", "z", "w", "ws", "wz", "s", "z"], ["q"]),
                   helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])],
                  [_t("s", TP.FLOAT, 0.05, ()), _t("z", TP.UINT8, 128, ()),
                   numpy_helper.from_array(RNG.integers(-63, 64, (64, 8)).astype(np.int8), "w"),
                   numpy_helper.from_array(w_scale, "ws"), numpy_helper.from_array(w_zero_point, "wz")])


def _qlinear_conv(w_scale, w_zero_point):
    """x (1, 4, 6, 6) quantized to uint8, QLinearConv by an int8 W (3, 4, 3, 3), dequantized."""
    return _graph([helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
                   helper.make_node("QLinearConv", ["xq", "s", "z", "w", "ws", "wz", "s", "z"], ["q"]),
                   helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])],
                  [_t("s", TP.FLOAT, 0.05, ()), _t("z", TP.UINT8, 128, ()),
                   numpy_helper.from_array(RNG.integers(-63, 64, (3, 4, 3, 3)).astype(np.int8), "w"),
                   numpy_helper.from_array(w_scale, "ws"), numpy_helper.from_array(w_zero_point, "wz")],
                  inputs=(("x", (1, 4, 6, 6)),))


def _bytes(*shape):
    return RNG.integers(0, 256, shape).astype(np.uint8)


def _floats(value, *shape):
    return np.full(shape, value, np.float32)


CASES = {
    # zero point of another type than its value (ONNX: one type T; onnxruntime refuses)
    "dq zero point uint8 for int8 weight": _dq_matmul(_int8_w(), _t("s", TP.FLOAT, _floats(0.1, 8)),
                                                      _t("z", TP.UINT8, np.zeros(8, int)), axis=1),
    "dq zero point int32 for int8 weight": _dq_matmul(_int8_w(), _t("s", TP.FLOAT, _floats(0.1, 8)),
                                                      _t("z", TP.INT32, np.zeros(8, int)), axis=1),
    "dq integer scale": _dq_matmul(_int8_w(), _t("s", TP.INT32, np.ones(8, int)), axis=1),
    "q uint8 then dq with int8 zero point": _graph(
        [helper.make_node("QuantizeLinear", ["a", "s", "z"], ["q"]),
         helper.make_node("DequantizeLinear", ["q", "s", "z8"], ["y"])],
        [_t("s", TP.FLOAT, 0.1, ()), _t("z", TP.UINT8, 3, ()), _t("z8", TP.INT8, 0, ())]),
    "MatMulInteger uint8 zero point for int8 B": _graph(
        [helper.make_node("DynamicQuantizeLinear", ["a"], ["aq", "as", "az"]),
         helper.make_node("MatMulInteger", ["aq", "w", "az", "wz"], ["i"]), helper.make_node("Cast", ["i"], ["y"], to=1)],
        [numpy_helper.from_array(RNG.integers(-63, 64, (64, 8)).astype(np.int8), "w"),
         numpy_helper.from_array(np.zeros(8, np.uint8), "wz")]),
    # a scale of 0: onnxruntime's answer (zeros; QuantizeLinear saturates x / 0)
    "dq scale 0": _dq_matmul(_int8_w(), _t("s", TP.FLOAT, _floats(0.0, 8)), axis=1),
    "q scale 0": _graph([helper.make_node("QuantizeLinear", ["a", "s", "z"], ["q"]),
                         helper.make_node("DequantizeLinear", ["q", "one", "z"], ["y"])],
                        [_t("s", TP.FLOAT, 0.0, ()), _t("one", TP.FLOAT, 1.0, ()), _t("z", TP.INT8, 0, ())]),
    "DynamicQuantizeMatMul scale 0": _graph(
        [helper.make_node("DynamicQuantizeMatMul", ["a", "w", "s"], ["y"], domain=MS)],
        [numpy_helper.from_array(RNG.integers(-63, 64, (64, 8)).astype(np.int8), "w"),
         numpy_helper.from_array(_floats(0.0, 8), "s")]),
    # 4-bit weights of an odd element count (the last byte half used)
    "int4 weight (63, 5) per axis": _dq_matmul(_t("w", TP.INT4, RNG.integers(-8, 8, (63, 5))),
                                               _t("s", TP.FLOAT, _floats(0.1, 5)), axis=1, inputs=(("a63", (2, 63)),)),
    "uint4 weight (7, 3) per tensor": _dq_matmul(_t("w", TP.UINT4, RNG.integers(0, 16, (7, 3))), _t("s", TP.FLOAT, 0.1, ()),
                                                 _t("z", TP.UINT4, 3, ()), inputs=(("a7", (2, 7)),)),
    # parameters whose shape does not fit the weight (onnxruntime refuses at run time)
    "blocked scale with a block too many": _dq_matmul(_int8_w(), _t("s", TP.FLOAT, _floats(0.1, 3, 8)),
                                                      axis=0, block_size=32),
    "blocked scale of other columns": _dq_matmul(_int8_w(), _t("s", TP.FLOAT, _floats(0.1, 2, 4)), axis=0, block_size=32),
    "blocked zero point of another shape": _dq_matmul(_int8_w(), _t("s", TP.FLOAT, _floats(0.1, 2, 8)),
                                                      _t("z", TP.INT8, np.zeros((2, 4), int)), axis=0, block_size=32),
    "blocked int4 scale with a block too many": _dq_matmul(_t("w", TP.INT4, RNG.integers(-8, 8, (64, 8))),
                                                           _t("s", TP.FLOAT, _floats(0.1, 3, 8)), axis=0, block_size=32),
    "per-axis scale one short": _dq_matmul(_int8_w(), _t("s", TP.FLOAT, _floats(0.1, 7)), axis=1),
    "2-D scale without block_size": _dq_matmul(_int8_w(), _t("s", TP.FLOAT, _floats(0.1, 2, 8)), axis=0),
    "MatMulNBits scales one short": _nbits(_bytes(8, 2, 16), _floats(0.1, 15)),
    "MatMulNBits packed weight of another shape": _nbits(_bytes(8, 2, 15), _floats(0.1, 16)),
    "MatMulNBits zero points too few": _nbits(_bytes(8, 2, 16), _floats(0.1, 16), np.full(3, 0x88, np.uint8)),
    "MatMulInteger zero point of other columns": _graph(
        [helper.make_node("DynamicQuantizeLinear", ["a"], ["aq", "as", "az"]),
         helper.make_node("MatMulInteger", ["aq", "w", "az", "wz"], ["i"]), helper.make_node("Cast", ["i"], ["y"], to=1)],
        [numpy_helper.from_array(RNG.integers(-63, 64, (64, 8)).astype(np.int8), "w"),
         numpy_helper.from_array(np.zeros(5, np.int8), "wz")]),
    "QLinearMatMul scale of other columns": _qlinear_matmul(_floats(0.01, 5), np.zeros(5, np.int8)),
    "QLinearConv weight scale of other channels": _qlinear_conv(_floats(0.01, 5), np.zeros(1, np.int8)),
    "QLinearConv weight zero point of other channels": _qlinear_conv(_floats(0.01, 3), np.zeros(2, np.int8)),
    "QLinearConv per channel": _qlinear_conv(_floats(0.01, 3), np.zeros(3, np.int8)),
    "dq axis outside the weight": _dq_matmul(_int8_w(), _t("s", TP.FLOAT, _floats(0.1, 8)), axis=2),
    "dq negative block_size": _dq_matmul(_int8_w(), _t("s", TP.FLOAT, _floats(0.1, 2, 8)), axis=0, block_size=-32),
    "MatMulNBits block_size 0": _graph(
        [helper.make_node("MatMulNBits", ["a", "w", "s"], ["y"], domain=MS, K=64, N=8, bits=4, block_size=0)],
        [numpy_helper.from_array(_bytes(8, 2, 16), "w"), numpy_helper.from_array(_floats(0.1, 16), "s")]),
    "DynamicQuantizeMatMul scales of other columns": _graph(
        [helper.make_node("DynamicQuantizeMatMul", ["a", "w", "s"], ["y"], domain=MS)],
        [numpy_helper.from_array(RNG.integers(-63, 64, (64, 8)).astype(np.int8), "w"),
         numpy_helper.from_array(_floats(0.1, 5), "s")]),
}


def _feeds(data):
    inputs = onnx.load_from_string(data).graph.input
    return {vi.name: RNG.standard_normal([d.dim_value for d in vi.type.tensor_type.shape.dim]).astype(np.float32)
            for vi in inputs}


FEEDS = {name: _feeds(data) for name, data in CASES.items()}


def _onnxruntime(data, feeds):
    """onnxruntime's answer for the graph as written, or None where it refuses the graph."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4
    try:
        return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    except Exception:   # onnxruntime's own exception classes: it refuses the graph
        return None


EXPECTED = {name: _onnxruntime(data, FEEDS[name]) for name, data in CASES.items()}


@pytest.mark.parametrize("name", list(CASES))
def test_answers_as_onnxruntime_or_refuses(backend, name):
    expected, feeds = EXPECTED[name], FEEDS[name]

    def run():
        model = load(CASES[name], backend=backend)
        return model(*[cn.tensor(v, backend=backend) for v in feeds.values()]).numpy()
    if expected is None:
        with pytest.raises(OnnxError):
            run()
    else:
        np.testing.assert_allclose(run(), expected, rtol=1e-5, atol=1e-5)


# ---- `cinders quantize` as a user runs it ----------------------------------------------------

def _cnn(path, depthwise=False):
    """A float CNN (opset 17, as torch exports): Conv -> Relu -> Conv (grouped where depthwise)
    -> GlobalAveragePool -> Flatten -> Gemm: its weights are nearly all Conv weights."""
    inits = [numpy_helper.from_array(RNG.standard_normal(s).astype(np.float32) / 8, n) for n, s in
             (("w1", (32, 8, 3, 3)), ("b1", (32,)), ("w2", (32, 1, 3, 3) if depthwise else (16, 32, 3, 3)),
              ("fc", (10, 32 if depthwise else 16)), ("fb", (10,)))]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], group=32 if depthwise else 1),
             helper.make_node("GlobalAveragePool", ["c2"], ["p"]), helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "fc", "fb"], ["y"], transB=1)]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TP.FLOAT, ("batch", 8, 16, 16))],
                              [helper.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def _held(backend):
    """Bytes backend holds: cn.Wgpu's device buffers, cn.Wasm's heap blocks."""
    backend.synchronize()
    return backend.memory_stats()["allocated_bytes"] if backend.name == "wgpu" else backend.heap.in_use


@pytest.mark.parametrize("mode", ["q8", "q4"])
@pytest.mark.parametrize("depthwise", [False, True], ids=["dense", "depthwise"])
def test_quantize_makes_conv_weights_int8(backend, tmp_path, capsys, mode, depthwise):
    """A CNN's Conv weights, not only its Gemm, become int8 (per output channel): the file and
    the weights held on cn.Wasm / cn.Wgpu take about a quarter of the float32 bytes, and every
    backend answers what onnxruntime answers for the quantized file."""
    from cinders import cli
    src = _cnn(str(tmp_path / "cnn.onnx"), depthwise)
    out = str(tmp_path / "cnn-q.onnx")
    assert cli.main(["quantize", src, "--out", out, "--mode", mode]) == 0
    assert "1 MatMul weights quantized, 2 Conv weights int8" in capsys.readouterr().out
    weights = [t for t in onnx.load(out).graph.initializer if len(t.dims) == 4]
    assert sorted(t.data_type for t in weights) == [TP.INT8, TP.INT8]
    assert os.path.getsize(out) < os.path.getsize(src) / 3
    x = RNG.standard_normal((2, 8, 16, 16)).astype(np.float32)
    want = ort.InferenceSession(out, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    sizes = []
    for path in (src, out):
        before = _held(backend) if backend.name in ("wgpu", "wasm") else 0
        model = load(path, backend=backend)
        sizes.append(_held(backend) - before if backend.name in ("wgpu", "wasm") else 0)
        got = model(cn.tensor(x, backend=backend)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    if backend.name in ("wgpu", "wasm"):
        assert sizes[1] < sizes[0] * 0.3


def test_quantize_refuses_mode_for_a_record_and_a_file_that_is_no_model(tmp_path, capsys):
    """--mode q4 on a record would silently write int8; a corrupt .onnx gave protobuf's trace."""
    from cinders import cli
    record = os.path.join(os.path.dirname(__file__), "..", "web_demos", "models", "mnist-mlp.safetensors")
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"this is no ONNX model\n")
    assert cli.main(["quantize", str(junk), "--out", str(tmp_path / "x.onnx")]) != 0
    assert "ONNX file corrupt" in capsys.readouterr().err
    assert cli.main(["quantize", record, "--out", str(tmp_path / "x.safetensors"), "--mode", "q4"]) != 0
    assert "--mode q4 is for ONNX models" in capsys.readouterr().err
    assert not (tmp_path / "x.safetensors").exists()


@pytest.mark.parametrize("mode", ["q8", "q4"])
def test_quantize_unnamed_nodes(tmp_path, mode):
    """Nodes without names (ONNX allows them; hand-made graphs have them): the nodes quantize
    adds get names of their own, never two alike (onnxruntime refuses a graph that has those)."""
    from cinders.onnx.quantize import quantize_model
    inits = [numpy_helper.from_array(RNG.standard_normal(s).astype(np.float32), n)
             for n, s in (("w1", (64, 32)), ("b1", (32,)), ("w2", (32, 16)), ("b2", (16,)))]
    graph = helper.make_graph([helper.make_node("Gemm", ["a", "w1", "b1"], ["h"]),
                               helper.make_node("Gemm", ["h", "w2", "b2"], ["y"])], "mlp",
                              [helper.make_tensor_value_info("a", TP.FLOAT, (2, 64))],
                              [helper.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    src, out = str(tmp_path / "mlp.onnx"), str(tmp_path / "mlp-q.onnx")
    onnx.save(model, src)
    assert quantize_model(src, out, mode) == (2, 0)
    want = ort.InferenceSession(out, providers=["CPUExecutionProvider"]).run(None, {"a": A})[0]
    np.testing.assert_allclose(load(out, backend=cn.NumPy())(cn.tensor(A, backend=cn.NumPy())).numpy(), want,
                               rtol=1e-4, atol=1e-4)


def test_quantize_refuses_a_float16_model(tmp_path, capsys):
    """A float16 model's MatMul became DynamicQuantizeMatMul of a float16 input: a graph
    onnxruntime refuses (and cinders ran). Refused with the way out instead."""
    from cinders import cli
    graph = helper.make_graph([helper.make_node("MatMul", ["a", "w"], ["y"])], "half",
                              [helper.make_tensor_value_info("a", TP.FLOAT16, (2, 64))],
                              [helper.make_tensor_value_info("y", TP.FLOAT16, None)],
                              [numpy_helper.from_array(RNG.standard_normal((64, 8)).astype(np.float16), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "half.onnx"))
    assert cli.main(["quantize", str(tmp_path / "half.onnx"), "--out", str(tmp_path / "q.onnx")]) != 0
    assert "float32 original" in capsys.readouterr().err and not (tmp_path / "q.onnx").exists()


def test_quantize_reports_accuracy_on_the_users_data(tmp_path, capsys):
    """The accuracy report runs on --data (a .npz by input name for ONNX, a JSON list as
    `cinders predict` reads for a record), and a record gets a report too (random samples of its
    model's input shape); a --data file that does not fit is refused before anything is written."""
    import json
    from cinders import cli
    src = _cnn(str(tmp_path / "cnn.onnx"))
    np.savez(tmp_path / "x.npz", x=RNG.standard_normal((3, 8, 16, 16)).astype(np.float32))
    assert cli.main(["quantize", src, "--out", str(tmp_path / "q.onnx"), "--data", str(tmp_path / "x.npz")]) == 0
    assert "accuracy on %s: max error" % (tmp_path / "x.npz") in capsys.readouterr().out
    np.savez(tmp_path / "other.npz", image=np.zeros((1, 8, 16, 16), np.float32))
    assert cli.main(["quantize", src, "--out", str(tmp_path / "q2.onnx"), "--data", str(tmp_path / "other.npz")]) != 0
    assert "lacks the inputs x" in capsys.readouterr().err and not (tmp_path / "q2.onnx").exists()
    record = os.path.join(os.path.dirname(__file__), "..", "web_demos", "models", "mnist-mlp.safetensors")
    digits = tmp_path / "digits.json"
    digits.write_text(json.dumps(RNG.uniform(0, 1, (2, 1, 28, 28)).round(3).tolist()))
    assert cli.main(["quantize", record, "--out", str(tmp_path / "q.safetensors"), "--data", str(digits)]) == 0
    printed = capsys.readouterr().out
    report = printed.split("accuracy on %s: max error " % digits)[1]
    assert 0 < float(report.split(" ")[0]) < 0.5 and "of the largest output), argmax agreement" in report
    assert cli.main(["quantize", record, "--out", str(tmp_path / "r.safetensors")]) == 0
    assert "accuracy on random inputs (batch 8): max error" in capsys.readouterr().out
