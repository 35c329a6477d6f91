"""ONNX names in the code generator: every value, initializer, node and subgraph local gets its
own Python identifier, whatever it is called (builtins, keywords, the generator's own names,
Module attributes, names reused across scopes). Each model here passes onnx.checker (full check)
and the answer is onnxruntime's."""

import collections
import random

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import cinders as cn
from cinders.onnx import load

FLOAT = TensorProto.FLOAT


def model_of(nodes, inputs, outputs, initializers=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(model, full_check=True)
    return model


def check(model, feeds, tmp_path=None):
    """cinders (cn.NumPy()) gives onnxruntime's outputs; the loaded model saves."""
    data = model.SerializeToString()
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    expected = session.run(None, feeds)
    got = load(data, backend=cn.NumPy())(*[cn.tensor(v, backend=cn.NumPy()) for v in feeds.values()])
    got = got if isinstance(got, tuple) else (got,)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        g = np.asarray(g.tolist(), dtype=e.dtype).reshape(e.shape) if g.shape == e.shape else g.tolist()
        assert np.allclose(g, e, atol=1e-5), (g, e)
    if tmp_path is not None:
        load(data, backend=cn.NumPy()).save(str(tmp_path / "m.safetensors"))


def value(name, shape=(2, 3), elem=FLOAT):
    return helper.make_tensor_value_info(name, elem, list(shape))


def init(name, array):
    return numpy_helper.from_array(np.asarray(array, dtype=np.float32), name)


def branch(name, out, weight):
    """A subgraph that returns x + its own initializer `w` (of value `weight`)."""
    return helper.make_graph([helper.make_node("Add", ["x", "w"], [out])], name, [], [value(out)],
                             [init("w", np.full((2, 3), weight))])


X = np.arange(6, dtype=np.float32).reshape(2, 3) - 2


def test_if_branches_keep_their_own_initializers():
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=branch("then", "t", 10.0),
                              else_branch=branch("else", "e", -10.0))]
    model = model_of(nodes, [value("x")], [value("y")], [init("zero", 0.0)])
    check(model, {"x": X})
    check(model, {"x": -X - 5})


def test_layer_named_like_another_nodes_output():
    w1, w2 = np.ones((3, 4), np.float32) / 3, np.arange(8, dtype=np.float32).reshape(4, 2)
    nodes = [helper.make_node("Gemm", ["x", "w1"], ["fc"]),
             helper.make_node("Relu", ["fc"], ["r"]),
             helper.make_node("Gemm", ["r", "w2"], ["y"], name="fc")]
    check(model_of(nodes, [value("x")], [value("y", (2, 2))], [init("w1", w1), init("w2", w2)]), {"x": X})


def scan_model(local):
    """Scan over x's rows, summing them; the body names a value `local`."""
    body = helper.make_graph([helper.make_node("Add", ["acc", "row"], [local]),
                              helper.make_node("Identity", [local], ["acc_out"]),
                              helper.make_node("Identity", [local], ["each"])], "body",
                             [value("acc", (3,)), value("row", (3,))], [value("acc_out", (3,)), value("each", (3,))])
    nodes = [helper.make_node("Scan", ["zero", "x"], ["total", "steps"], body=body, num_scan_inputs=1)]
    return model_of(nodes, [value("x")], [value("total", (3,)), value("steps")], [init("zero", np.zeros(3))])


def test_value_named_like_the_scan_counter():
    check(scan_model("scan_step"), {"x": X})
    model = scan_model("s")   # an outer value named scan_step, read after the Scan
    model.graph.node.insert(0, helper.make_node("Neg", ["x"], ["scan_step"]))
    model.graph.output.append(value("scan_step"))
    onnx.checker.check_model(model, full_check=True)
    check(model, {"x": X})


def loop(outer_names, body_nodes_extra=()):
    """A Loop of 2 trips whose body adds 1 to the carried value and also emits it as a scan output."""
    it, cond, carried = outer_names
    body = helper.make_graph([helper.make_node("Add", [carried, "one"], ["next"]),
                              helper.make_node("Identity", [cond], ["cond_out"]),
                              helper.make_node("Identity", ["next"], ["emit"])] + list(body_nodes_extra),
                             "body", [value(it, (), TensorProto.INT64), value(cond, (), TensorProto.BOOL),
                                      value(carried)],
                             [value("cond_out", (), TensorProto.BOOL), value("next"), value("emit")],
                             [init("one", np.ones((2, 3)))])
    return body


def test_nested_unnamed_loops_keep_their_own_scan_lists():
    inner = loop(("j", "c2", "v"))
    outer = helper.make_graph([helper.make_node("Loop", ["n", "", "v"], ["v_after", "inner_scan"], body=inner),
                               helper.make_node("Identity", ["c1"], ["c1_out"])], "outer",
                              [value("i", (), TensorProto.INT64), value("c1", (), TensorProto.BOOL), value("v")],
                              [value("c1_out", (), TensorProto.BOOL), value("v_after"),
                               value("inner_scan", (3, 2, 3))])
    nodes = [helper.make_node("Loop", ["n", "", "v"], ["y", "scanned"], body=outer)]
    model = model_of(nodes, [value("v")], [value("y"), value("scanned", (3, 3, 2, 3))],
                     [numpy_helper.from_array(np.array(3, np.int64), "n")])
    check(model, {"v": X})


def test_loop_body_input_shadows_an_outer_value():
    body = loop(("i", "cond", "x"))
    nodes = [helper.make_node("Loop", ["n", "", "x"], ["y", "scanned"], body=body),
             helper.make_node("Add", ["y", "x"], ["z"])]   # the outer x, untouched by the body
    model = model_of(nodes, [value("x")], [value("z"), value("scanned", (2, 2, 3))],
                     [numpy_helper.from_array(np.array(2, np.int64), "n")])
    check(model, {"x": X})


def test_constant_of_shape_0_3_keeps_its_shape():
    empty = numpy_helper.from_array(np.zeros((0, 3), np.float32), "empty")
    nodes = [helper.make_node("Concat", ["empty", "x"], ["y"], axis=0)]
    check(model_of(nodes, [value("x")], [value("y")], [empty]), {"x": X})
    axes = numpy_helper.from_array(np.array([0], np.int64), "axes")
    nodes = [helper.make_node("ReduceSum", ["empty", "axes"], ["zeros"], keepdims=1),   # folded at import
             helper.make_node("Concat", ["x", "zeros"], ["y"], axis=0)]
    check(model_of(nodes, [value("x")], [value("y", (3, 3))], [empty, axes]), {"x": X})
    nodes = [helper.make_node("Constant", [], ["k"], value=empty),
             helper.make_node("Shape", ["k"], ["s"]),
             helper.make_node("Cast", ["s"], ["sf"], to=FLOAT),
             helper.make_node("ReduceSum", ["x"], ["t"], keepdims=0),
             helper.make_node("Add", ["sf", "t"], ["y"])]
    check(model_of(nodes, [value("x")], [value("y", (2,))]), {"x": X})


def test_top_level_control_flow_with_one_rank_2_float_input():
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=branch("then", "t", 1.0),
                              else_branch=branch("else", "e", 2.0))]
    check(model_of(nodes, [value("x")], [value("y")], [init("zero", 0.0)]), {"x": X})
    check(scan_model("sum"), {"x": X})


def test_values_named_like_builtins_the_code_calls(tmp_path):
    nodes = [helper.make_node("Relu", ["range"], ["float"]),
             helper.make_node("Add", ["float", "len"], ["int"])]
    check(model_of(nodes, [value("range")], [value("int")], [init("len", np.ones((2, 3)))]), {"range": X})
    check(scan_model("range"), {"x": X})


def test_initializers_named_like_module_attributes(tmp_path):
    nodes = [helper.make_node("Mul", ["x", "source"], ["a"]),
             helper.make_node("Add", ["a", "unrecorded_args"], ["y"])]
    model = model_of(nodes, [value("x")], [value("y")],
                     [init("source", np.full((2, 3), 2.0)), init("unrecorded_args", np.full((2, 3), 0.5))])
    check(model, {"x": X}, tmp_path)


# -- random graphs with hostile names ----------------------------------------------------------------

HOSTILE = ["range", "float", "len", "int", "print", "list", "class", "def", "lambda", "None", "True", "import",
           "self", "cn", "nn", "ops", "backend", "Model", "_", "x", "v", "v_2", "w", "w_2", "scan_step",
           "scan_scan_0", "loop_scan_0", "loop_step", "source", "unrecorded_args", "forward", "state_dict",
           "training", "input_names", "buffers", "parameters", "a.b", "a/b", "a_b", "1x", "__init__",
           "ñ", "值", "x\u200b", "a" * 200, "a" * 200 + "b", "fc", "fc_output_0", "layer", "t"]


class RandomGraph:
    """Builds a random valid graph of (2, 3) float values whose names come from HOSTILE: node
    outputs are unique over the whole model (ONNX's SSA rule); initializers reuse names across
    scopes and subgraph inputs shadow enclosing values."""

    def __init__(self, rng):
        self.rng, self.outputs, self.count, self.initializers, self.nodes = rng, set(), 0, [], set()

    def name(self, avoid=()):
        for _ in range(6):
            n = self.rng.choice(HOSTILE)
            if n not in self.outputs and n not in avoid:
                return n
        self.count += 1
        return "n%d" % self.count

    def output(self, avoid=()):
        n = self.name(avoid)
        self.outputs.add(n)
        return n

    def node_name(self):
        """No name or a hostile one (node names are unique; they may equal value names)."""
        n = self.rng.choice(HOSTILE + [""] * 20)
        if n in self.nodes:
            return ""
        self.nodes.add(n)
        return n

    def local(self, values, avoid=()):
        """The name of a subgraph input: often an enclosing value's (shadowing it)."""
        shadowed = [v for v in values if v not in avoid]
        return self.rng.choice(shadowed) if shadowed and self.rng.random() < 0.5 else self.output(avoid)

    def body(self, values, depth, nodes, inits, steps):
        """Appends `steps` random nodes reading `values` (a list, extended in place)."""
        rng = self.rng
        for _ in range(steps):
            kind = rng.choice(["unary", "binary", "const"] + (["if", "loop", "scan"] if depth > 0 else []))
            a = rng.choice(values)
            if kind == "unary":
                out = self.output(values)
                nodes.append(helper.make_node(rng.choice(["Relu", "Neg", "Abs", "Sigmoid"]), [a], [out],
                                              name=self.node_name()))
            elif kind in ("binary", "const"):
                if kind == "const":
                    reused = [n for n in self.initializers if n not in values and n not in {i.name for i in inits}]
                    b = self.rng.choice(reused) if reused and rng.random() < 0.5 else self.output(values)
                    self.initializers.append(b)
                    inits.append(init(b, np.round(np.asarray([rng.uniform(-2, 2) for _ in range(6)]), 2)
                                      .reshape(2, 3)))
                else:
                    b = rng.choice(values)
                out = self.output(values)
                nodes.append(helper.make_node(rng.choice(["Add", "Mul", "Sub"]), [a, b], [out],
                                              name=self.node_name()))
            elif kind == "if":
                s, c = self.output(values), self.output(values)
                nodes += [helper.make_node("ReduceSum", [a], [s], keepdims=0),
                          helper.make_node("Greater", [s, self.zero], [c])]
                out = self.output(values)
                branches = {}
                for key in ("then_branch", "else_branch"):
                    sub_nodes, sub_inits, sub_values = [], [], list(values)
                    self.body(sub_values, depth - 1, sub_nodes, sub_inits, rng.randint(1, 3))
                    result = self.output(values)
                    sub_nodes.append(helper.make_node("Identity", [sub_values[-1]], [result]))
                    branches[key] = helper.make_graph(sub_nodes, key, [], [value(result)], sub_inits)
                nodes.append(helper.make_node("If", [c], [out], name=self.node_name(), **branches))
            elif kind == "loop":
                carried = self.local(values)
                it = self.local(values, (carried,))
                cond = self.local(values, (carried, it))
                sub_nodes, sub_inits, sub_values = [], [], [v for v in values if v not in (it, cond)] + [carried]
                self.body(sub_values, depth - 1, sub_nodes, sub_inits, rng.randint(1, 3))
                cond_out, next_value, emitted = self.output(), self.output(), self.output()
                sub_nodes += [helper.make_node("Identity", [cond], [cond_out]),
                              helper.make_node("Identity", [sub_values[-1]], [next_value]),
                              helper.make_node("Identity", [carried], [emitted])]
                body = helper.make_graph(sub_nodes, "body", [value(it, (), TensorProto.INT64),
                                                             value(cond, (), TensorProto.BOOL), value(carried)],
                                         [value(cond_out, (), TensorProto.BOOL), value(next_value),
                                          value(emitted)], sub_inits)
                out, stacked, total = self.output(values), self.output(values), self.output(values)
                nodes += [helper.make_node("Loop", [self.trips, "", a], [out, stacked], body=body,
                                           name=self.node_name()),
                          helper.make_node("ReduceSum", [stacked, self.axis0], [total], keepdims=0)]
                values.append(out)
                out = total
            else:   # Scan over the rows of a, summing them into a state
                state = self.local([])
                row = self.local([], (state,))
                state_out, each = self.output(), self.output()
                body = helper.make_graph([helper.make_node("Add", [state, row], [state_out]),
                                          helper.make_node(rng.choice(["Relu", "Neg"]), [row], [each])], "scan",
                                         [value(state, (3,)), value(row, (3,))], [value(state_out, (3,)),
                                                                                   value(each, (3,))])
                final, rows, out = self.output(values), self.output(values), self.output(values)
                nodes += [helper.make_node("Scan", [self.row_zero, a], [final, rows], body=body, num_scan_inputs=1,
                                           name=self.node_name()),
                          helper.make_node("Add", [rows, final], [out])]
            values.append(out)

    def model(self):
        rng = self.rng
        x = self.output()
        self.zero, self.trips, self.axis0, self.row_zero = (self.output() for _ in range(4))
        inits = [init(self.zero, 0.0), numpy_helper.from_array(np.array(2, np.int64), self.trips),
                 numpy_helper.from_array(np.array([0], np.int64), self.axis0), init(self.row_zero, np.zeros(3))]
        nodes, values = [], [x]
        self.body(values, 2, nodes, inits, rng.randint(2, 5))
        outs = rng.sample(values[1:], min(len(values) - 1, 2))
        return model_of(nodes, [value(x)], [value(o) for o in outs], inits), x


def control_flow(graph, depth=0):
    """(op type, nesting depth) of every If / Loop / Scan in graph and its subgraphs."""
    found = []
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                found += [(node.op_type, depth)] * (attr.name != "else_branch") + control_flow(attr.g, depth + 1)
    return found


def test_random_graphs_with_hostile_names_match_onnxruntime():
    rng = random.Random(26)
    seen = collections.Counter()
    for _ in range(150):
        model, x = RandomGraph(rng).model()
        seen.update(control_flow(model.graph))
        check(model, {x: np.asarray([[rng.uniform(-3, 3) for _ in range(3)] for _ in range(2)], np.float32)})
    # the graphs hold each kind of subgraph, at the top and nested
    assert all(seen[(op, depth)] >= 5 for op in ("If", "Loop", "Scan") for depth in (0, 1)), seen
