"""Issue 26: peak memory of loading a file, as a factor of the file's size, per reader. Each case
loads a 2 MB file in a fresh process (benchmarks/reader_memory.py measures the same at any size:
`.venv/bin/python benchmarks/reader_memory.py --mb 4`). The factors below are the documented
allowances (docs/records.md, docs/onnx.md): float32 data costs its bytes a few times over (the
file's bytes, the decoded array, the backend's copy); float16/bfloat16 double on widening to
float32; ONNX int64 initializers are stored as int32 arrays (saturated), not Python ints.

Graphs of tiny nodes: a node can be 2 bytes of file but costs a few KB once imported (its object,
its line of generated source, the compiled code), so no factor of the bytes holds for them;
instead cn.limits.max_graph_nodes() caps the nodes (and attributes) counted from the bytes
before any is built. The floods are refused at about the cost of holding the file, and a graph
that loads costs at most PEAK_PER_NODE bytes a node."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import reader_memory  # noqa: E402

FACTORS = {"onnx_float32": 4, "onnx_float16": 6, "onnx_bfloat16": 6, "onnx_int64": 4, "onnx_external": 4,
           "safetensors_float32": 3, "safetensors_float16": 5, "pytorch_zip": 2, "pytorch_legacy": 2,
           "pytorch_plain": 3, "onnx_empty_nodes": 2, "onnx_empty_attributes": 2, "onnx_node_chain": 2}
REFUSED = {"onnx_empty_nodes", "onnx_empty_attributes", "onnx_node_chain"}   # by cn.limits.max_graph_nodes()
PEAK_PER_NODE = {"onnx_chain_5k": 5000}   # measured ~3,100 bytes


def test_every_reader_has_a_factor():
    assert set(FACTORS) | set(PEAK_PER_NODE) == set(reader_memory.CASES)


@pytest.mark.parametrize("case", sorted(FACTORS))
def test_peak_memory_is_a_small_factor_of_the_file(case, tmp_path):
    result = reader_memory.measure(case, 2 << 20, str(tmp_path))
    assert result["factor"] <= FACTORS[case], result
    assert result["refused"] == (case in REFUSED), result


@pytest.mark.parametrize("case", sorted(PEAK_PER_NODE))
def test_a_graph_that_loads_costs_a_bounded_amount_per_node(case, tmp_path):
    result = reader_memory.measure(case, 2 << 20, str(tmp_path))
    assert not result["refused"] and result["peak_per_node"] <= PEAK_PER_NODE[case], result


def _graph_with_subgraph(chain):
    """y = If(c) then chain Relus of x else x: 2 + chain nodes, one in the else branch."""
    from onnx import TensorProto, helper
    vi = helper.make_tensor_value_info
    relus = [helper.make_node("Relu", ["x" if i == 0 else "t%d" % i], ["t%d" % (i + 1)]) for i in range(chain)]
    then = helper.make_graph(relus + [helper.make_node("Identity", ["t%d" % chain], ["o"])], "then", [],
                             [vi("o", TensorProto.FLOAT, [2])])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["o"])], "else", [], [vi("o", TensorProto.FLOAT, [2])])
    node = helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)
    graph = helper.make_graph([node], "g", [vi("c", TensorProto.BOOL, []), vi("x", TensorProto.FLOAT, [2])],
                              [vi("y", TensorProto.FLOAT, [2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_graph_node_limit_counts_subgraphs_and_names_itself():
    import cinders as cn
    import cinders.onnx
    data = _graph_with_subgraph(3)   # 1 If + 4 in then + 1 in else = 6 nodes, 2 attributes
    old = cn.limits.set_max_graph_nodes(6)
    try:
        model = cinders.onnx.load(data, backend=cn.NumPy())
        assert model(cn.tensor(True, backend=cn.NumPy()), cn.tensor([-1.0, 2.0], backend=cn.NumPy())).tolist() == [0.0, 2.0]
        cn.limits.set_max_graph_nodes(5)
        with pytest.raises(cinders.onnx.OnnxError, match=r"more than 5 nodes \(cn\.limits\.max_graph_nodes"):
            cinders.onnx.load(data, backend=cn.NumPy())
    finally:
        cn.limits.set_max_graph_nodes(old)
    assert cn.limits.max_graph_nodes() == cn.limits.DEFAULT_GRAPH_NODES
    with pytest.raises(cn.SizeLimitError):
        cn.limits.set_max_graph_nodes(0)
