"""The generated forward frees each value after the last statement that reads it (codegen's `del`
lines): a long chain holds a few tensors at a time, not all of them until it returns; values read
again later, by a loop or by the outputs are kept; results match onnxruntime."""

import tracemalloc

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import cinders as cn
from cinders.onnx import load, to_source

N, STEPS = 1 << 18, 12   # 1 MB float32 values, a chain of 12 of them


def chain_model():
    """y = ((x + 1) * 2 + 1) * 2 ... STEPS ops; x also feeds a Loop that sums it twice and the
    last Add, so x and the loop's result live past their first use."""
    one = numpy_helper.from_array(np.array(1.0, np.float32), "one")
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    trips = numpy_helper.from_array(np.array(2, np.int64), "trips")
    nodes, prev = [], "x"
    for i in range(STEPS):
        out = "v%d" % i
        nodes.append(helper.make_node("Add" if i % 2 == 0 else "Mul", [prev, "one" if i % 2 == 0 else "two"], [out]))
        prev = out
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Add", ["acc_in", "x"], ["acc_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [N])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [N])])
    nodes += [helper.make_node("ConstantOfShape", ["shape"], ["zeros"],
                               value=helper.make_tensor("z", TensorProto.FLOAT, [1], [0.0])),
              helper.make_node("Loop", ["trips", "", "zeros"], ["looped"], body=body),
              helper.make_node("Add", [prev, "looped"], ["y"])]
    shape = numpy_helper.from_array(np.array([N], np.int64), "shape")
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [N])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [N])],
                              initializer=[one, two, trips, shape])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_forward_frees_values_after_their_last_read():
    data = chain_model()
    source = to_source(data)
    forward = source.split("def forward", 1)[1]
    assert "del " in forward and "del x" not in forward     # inputs stay the caller's
    model = load(data, backend=cn.NumPy())
    x = np.random.default_rng(0).standard_normal(N).astype(np.float32)
    tx = cn.tensor(x, backend=cn.NumPy())
    model(tx)   # warm
    tracemalloc.start()
    got = model(tx).numpy()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 6 * 4 * N, "the forward held %.1f values of 1 MB at once" % (peak / (4 * N))   # 12+ without dels
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
