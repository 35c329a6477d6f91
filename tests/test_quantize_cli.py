"""`cinders quantize MODEL.onnx --mode q8|q4`: the written file runs in onnxruntime and in cinders
with the same answer, close to the float model's, with weights at a quarter / an eighth."""

import os

import numpy as np
import pytest

import cinders as cn
from cinders import cli
from cinders import onnx as cn_onnx

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")

from cinders.onnx.quantize import quantize_q4  # noqa: E402  (needs numpy only)


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    """A float MLP exported by torch: a Gemm with bias and a MatMul whose K = 72 is no multiple of 32 (padded)."""
    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(64, 72)
            self.w = torch.nn.Parameter(torch.randn(72, 10) / 10)

        def forward(self, x):
            return torch.relu(self.a(x)) @ self.w

    torch.manual_seed(0)
    path = str(tmp_path_factory.mktemp("q") / "mlp.onnx")
    torch.onnx.export(MLP(), torch.randn(3, 64), path, input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "batch"}}, dynamo=False)
    ops = {n.op_type for n in onnx.load(path).graph.node}
    assert {"Gemm", "MatMul"} <= ops
    return path


def _weight_bytes(path):
    return sum(len(t.raw_data) for t in onnx.load(path).graph.initializer if len(t.dims) >= 2)


@pytest.mark.parametrize("mode,ratio,tolerance", [("q8", 4, 0.05), ("q4", 8, 0.3)])
def test_quantize_onnx_matches_onnxruntime(mlp, tmp_path, capsys, mode, ratio, tolerance):
    out = str(tmp_path / ("mlp-%s.onnx" % mode))
    assert cli.main(["quantize", mlp, "--out", out, "--mode", mode]) == 0
    printed = capsys.readouterr().out
    assert "2 MatMul weights quantized" in printed and "argmax agreement" in printed
    ops = {n.op_type for n in onnx.load(out).graph.node}
    assert ("DynamicQuantizeMatMul" if mode == "q8" else "MatMulNBits") in ops and not {"Gemm", "MatMul"} & ops
    assert _weight_bytes(out) <= _weight_bytes(mlp) / ratio * 1.1
    x = np.random.default_rng(1).standard_normal((6, 64)).astype(np.float32)
    want = ort.InferenceSession(out).run(None, {"x": x})[0]
    float_answer = ort.InferenceSession(mlp).run(None, {"x": x})[0]
    for backend in (cn.NumPy(), cn.Python()):
        got = cn_onnx.load(out, backend=backend)(cn.tensor(x, backend=backend)).numpy()
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
    assert 0 < np.abs(want - float_answer).max() < tolerance


def test_q4_layout_is_low_nibble_first():
    w = np.zeros((64, 1), np.float32)
    w[0, 0], w[1, 0], w[33, 0] = 7.0, -7.0, 1.0
    packed, scales = quantize_q4(w)
    assert packed.shape == (1, 2, 16) and scales.tolist() == [1.0, np.float32(1.0 / 7)]
    assert packed[0, 0, 0] == (7 + 8) | ((-7 + 8) << 4)
    assert packed[0, 1, 0] == 8 | ((7 + 8) << 4)  # k = 32 is 0 (stored 8), k = 33 is 1.0 = 7 * scale


def test_quantize_refuses_a_model_without_weights(tmp_path, capsys):
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])
    graph = onnx.helper.make_graph([onnx.helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    path = str(tmp_path / "relu.onnx")
    onnx.save(onnx.helper.make_model(graph), path)
    assert cli.main(["quantize", path, "--out", str(tmp_path / "q.onnx")]) != 0
    assert "no MatMul, Gemm or Conv" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "q.onnx")
