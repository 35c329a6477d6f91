"""cinders.onnx.load(..., fixed_inputs=): inputs that are the same on every call become constants,
so an If on them is decided at import (only the branch taken is written) and a captured call
reads nothing from the device."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import cinders as cn
from cinders.onnx import OnnxError, load, to_source
from cinders.wgpu import Wgpu


def rate_switch_model():
    """y = x * 2 if sr == 16000 else x * 3 (an If on a scalar input, like Silero VAD's)."""
    two = helper.make_graph([helper.make_node("Mul", ["x", "c2"], ["y2"])], "then", [],
                            [helper.make_tensor_value_info("y2", TensorProto.FLOAT, None)],
                            [helper.make_tensor("c2", TensorProto.FLOAT, [], [2.0])])
    three = helper.make_graph([helper.make_node("Mul", ["x", "c3"], ["y3"])], "else", [],
                              [helper.make_tensor_value_info("y3", TensorProto.FLOAT, None)],
                              [helper.make_tensor("c3", TensorProto.FLOAT, [], [3.0])])
    nodes = [helper.make_node("Equal", ["sr", "k"], ["is16k"]),
             helper.make_node("If", ["is16k"], ["y"], then_branch=two, else_branch=three)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
                                           helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor("k", TensorProto.INT64, [], [16000])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


@pytest.mark.parametrize("rate", [16000, 8000])
def test_the_branch_is_decided_at_import_and_equals_onnxruntime(rate):
    data = rate_switch_model()
    source = to_source(data, fixed_inputs={"sr": rate})
    assert "ops.truth" not in source and ("then_branch taken" if rate == 16000 else "else_branch taken") in source
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(
        None, {"x": x, "sr": np.array(rate, np.int64)})[0]
    model = load(data, backend=cn.NumPy(), fixed_inputs={"sr": rate})
    assert model.input_names == ["x"]
    assert np.array_equal(model(cn.tensor(x, backend=cn.NumPy())).numpy(), want)


def test_a_captured_call_reads_no_device_value():
    backend = Wgpu()
    model = load(rate_switch_model(), backend=backend, fixed_inputs={"sr": 16000})
    x = cn.tensor(np.ones((1, 4), np.float32), backend=backend)
    forward = cn.capture(model)
    with cn.profile(backend) as p:
        results = [forward(x) for _ in range(4)]
    assert p.device_reads == 0 and forward.replays == 1
    assert results[-1].tolist() == [[2.0] * 4]


def test_a_fixed_input_must_be_an_input_of_the_right_shape():
    with pytest.raises(OnnxError, match="not an input of the graph"):
        load(rate_switch_model(), backend=cn.NumPy(), fixed_inputs={"rate": 16000})
    with pytest.raises(OnnxError, match="shape"):
        load(rate_switch_model(), backend=cn.NumPy(), fixed_inputs={"sr": [16000, 8000]})
    with pytest.raises(OnnxError, match="not a number"):
        load(rate_switch_model(), backend=cn.NumPy(), fixed_inputs={"sr": "16k"})


def test_fixed_input_shapes_decide_silero_shape_arithmetic_at_import():
    """input_shapes= fixes the graph's symbolic dims: silero VAD's Shape/Gather/Equal chains and the
    Ifs on them fold (what the board needs), and the model still equals onnxruntime chunk by
    chunk with its state carried; other shapes are refused."""
    from cinders.apps import shipped
    path = shipped.model_path("silero_vad.onnx")
    shapes = {"input": [1, 576], "state": [2, 1, 128]}
    source = to_source(path, fixed_inputs={"sr": 16000}, input_shapes=shapes)
    assert "ops.Shape(" not in source and "ops.truth(" not in source and "ops.LSTM(" in source
    model = load(path, backend=cn.NumPy(), fixed_inputs={"sr": 16000}, input_shapes=shapes)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(3)
    state, mine = np.zeros((2, 1, 128), np.float32), cn.zeros(2, 1, 128, backend=cn.NumPy())
    for _ in range(3):
        x = (rng.standard_normal((1, 576)) * 0.3).astype(np.float32)
        want, state = session.run(None, {"input": x, "state": state, "sr": np.array(16000, np.int64)})
        got, mine = model(cn.tensor(x, backend=cn.NumPy()), mine)
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(mine.numpy(), state, rtol=1e-4, atol=1e-5)
    with pytest.raises(OnnxError, match="declares"):
        model(cn.zeros(1, 512, backend=cn.NumPy()), mine)
    with pytest.raises(OnnxError, match="does not fit"):
        to_source(path, input_shapes={"state": [3, 1, 128]})
    with pytest.raises(OnnxError, match="not an input"):
        to_source(path, input_shapes={"audio": [1, 576]})
