"""Fuzzing the ONNX importer (issue 26): small valid models (a Gemm/Reshape/Softmax chain, a
conv net, an If with subgraph branches, a chain of run-time size ops: Range, TopK, CumSum, Pad,
Tile, Expand), a Loop whose body holds an If (nested subgraphs, values named like builtins and
the generator's words) mutated at the protobuf level (missing/extra inputs and outputs,
attributes of the wrong type or none, duplicate attributes, unknown domains and opsets, bad dims
and data types, int64 values that size outputs up to 2**62, a value renamed in every scope to a
hostile or colliding name) and at the byte level. Each must import and run or raise a
CindersError: never another exception, a hang, or memory beyond the cap; a renamed model that
runs gives onnxruntime's answer wherever onnxruntime runs it. A second fuzzer points external
data regions (shared, overlapping, out of the file, out of the folder) at one data file. Fixed
seeds and counts; the counts are printed (`pytest -s`)."""

import collections
import json
import os
import random

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, TensorProto, numpy_helper

import cinders as cn
import cinders.onnx
from cinders.errors import CindersError

from fuzz_support import Bounds

SEED = int(os.environ.get("CINDERS_FUZZ_SEED", 26))
CASES = int(os.environ.get("CINDERS_FUZZ_CASES", 1500))
CASE_SECONDS = 10
MEMORY_CAP = 512 * 2 ** 20


def base_models():
    X = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    Y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    w = numpy_helper.from_array(np.ones((3, 3), np.float32), "w")
    b = numpy_helper.from_array(np.ones((3,), np.float32), "b")
    shp = numpy_helper.from_array(np.array([3, 2], np.int64), "shp")
    ms = []
    g = helper.make_graph([helper.make_node("Gemm", ["x", "w", "b"], ["h"], transB=1),
                           helper.make_node("Relu", ["h"], ["r"]),
                           helper.make_node("Reshape", ["r", "shp"], ["q"]),
                           helper.make_node("Transpose", ["q"], ["t"], perm=[1, 0]),
                           helper.make_node("Softmax", ["t"], ["y"], axis=1)], "g", [X], [Y], [w, b, shp])
    ms.append(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    X4 = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4])
    Y4 = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    k = numpy_helper.from_array(np.ones((2, 1, 3, 3), np.float32), "k")
    g = helper.make_graph([helper.make_node("Conv", ["x", "k"], ["c"], pads=[1, 1, 1, 1], strides=[1, 1]),
                           helper.make_node("MaxPool", ["c"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
                           helper.make_node("Concat", ["p", "p"], ["cc"], axis=1),
                           helper.make_node("Slice", ["cc", "st", "en"], ["y"])],
                          "g2", [X4], [Y4], [k, numpy_helper.from_array(np.array([0], np.int64), "st"),
                                               numpy_helper.from_array(np.array([2], np.int64), "en")])
    ms.append(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    # If with subgraphs
    c = helper.make_tensor_value_info("c", TensorProto.BOOL, [])
    then = helper.make_graph([helper.make_node("Constant", [], ["a"], value=numpy_helper.from_array(np.ones(3, np.float32)))], "t", [], [helper.make_tensor_value_info("a", TensorProto.FLOAT, [3])])
    els = helper.make_graph([helper.make_node("Constant", [], ["e"], value=numpy_helper.from_array(np.zeros(3, np.float32)))], "e", [], [helper.make_tensor_value_info("e", TensorProto.FLOAT, [3])])
    g = helper.make_graph([helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=els)], "g3", [c], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    ms.append(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    xs = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    ys = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    one = numpy_helper.from_array(np.array(1, np.int64), "one")
    lim = numpy_helper.from_array(np.array(3, np.int64), "lim")
    g = helper.make_graph([helper.make_node("Range", ["one", "lim", "one"], ["r"]),
                           helper.make_node("Cast", ["r"], ["rf"], to=1),
                           helper.make_node("TopK", ["x", "k"], ["tv", "ti"], axis=0),
                           helper.make_node("CumSum", ["tv", "ax"], ["cs"]),
                           helper.make_node("Pad", ["cs", "pd"], ["pp"], mode="edge"),
                           helper.make_node("Tile", ["pp", "rep"], ["tt"]),
                           helper.make_node("Expand", ["tt", "es"], ["y"])], "g4", [xs], [ys],
                          [one, lim, numpy_helper.from_array(np.array([2], np.int64), "k"),
                           numpy_helper.from_array(np.array(0, np.int64), "ax"),
                           numpy_helper.from_array(np.array([1, 1], np.int64), "pd"),
                           numpy_helper.from_array(np.array([2], np.int64), "rep"),
                           numpy_helper.from_array(np.array([2, 8], np.int64), "es")])
    ms.append(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    ms.append(nested_model())
    return ms


def nested_model():
    """y = Loop(2 trips) over x of If(cond, float + range, float - range): three scopes, with
    values named like builtins (float, range), `self` and the generator's Scan/Loop counter."""
    vi = helper.make_tensor_value_info
    F, B, I = TensorProto.FLOAT, TensorProto.BOOL, TensorProto.INT64
    then = helper.make_graph([helper.make_node("Add", ["float", "range"], ["self"])], "then", [], [vi("self", F, [3])])
    other = helper.make_graph([helper.make_node("Sub", ["float", "range"], ["self"])], "else", [], [vi("self", F, [3])])
    body = helper.make_graph([helper.make_node("Identity", ["cond"], ["cond_out"]),
                              helper.make_node("If", ["cond"], ["float_out"], then_branch=then, else_branch=other)],
                             "body", [vi("scan_step", I, []), vi("cond", B, []), vi("float", F, [3])],
                             [vi("cond_out", B, []), vi("float_out", F, [3])])
    g = helper.make_graph([helper.make_node("Identity", ["x"], ["float0"]),
                           helper.make_node("Loop", ["trips", "c", "float0"], ["y"], body=body)], "g5",
                          [vi("c", B, []), vi("x", F, [3])], [vi("y", F, [3])],
                          [numpy_helper.from_array(np.array(2, np.int64), "trips"),
                           numpy_helper.from_array(np.array([1, 2, 3], np.float32), "range")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


HOSTILE_NAMES = ["range", "float", "self", "scan_step", "source", "unrecorded_args", "ops", "cn", "outputs",
                 "backend", "opset", "class", "None", "__init__", "forward", "x", "y", "c", "w", "1st",
                 "a.b", "\x1b[2J", "\u00e4", "v" * 300]


def graphs_of(graph):
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("g"):
                yield from graphs_of(attr.g)
            for sub in attr.graphs:
                yield from graphs_of(sub)


def rename_everywhere(m, rng):
    """One value name, picked among all scopes, renamed in every graph (a collision when the new
    name exists already: still a model to refuse or run correctly)."""
    graphs = list(graphs_of(m.graph))
    names = sorted({v for g in graphs for n in g.node for v in list(n.input) + list(n.output) if v}
                   | {t.name for g in graphs for t in g.initializer})
    old, new = rng.choice(names), rng.choice(HOSTILE_NAMES)
    for g in graphs:
        for n in g.node:
            n.input[:] = [new if v == old else v for v in n.input]
            n.output[:] = [new if v == old else v for v in n.output]
            if rng.random() < 0.5:
                n.name = new   # node names share the identifiers' space in layer-style import
        for v in list(g.input) + list(g.output) + list(g.value_info) + list(g.initializer):
            if v.name == old:
                v.name = new


ORT_TYPES = {"tensor(float)": np.float32, "tensor(bool)": np.bool_, "tensor(int64)": np.int64}


def onnxruntime_agrees(data, model):
    """None when onnxruntime cannot run the model (then nothing to compare), else whether the
    cinders model's outputs on inputs of ones are onnxruntime's."""
    try:
        session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
        feeds = {i.name: np.ones([d if isinstance(d, int) else 1 for d in i.shape], ORT_TYPES[i.type])
                 for i in session.get_inputs()}
        expected = session.run(None, feeds)
    except Exception:  # noqa: BLE001  (onnxruntime refusing the mutated model: nothing to compare)
        return None
    if sorted(feeds) != sorted(model.input_names):
        return False
    got = model(*[cn.tensor(feeds[n].tolist(), backend=cn.NumPy()) for n in model.input_names])
    got = got if isinstance(got, tuple) else (got,)
    return len(got) == len(expected) and all(
        tuple(g.shape) == e.shape and np.allclose(np.asarray(g.tolist(), np.float64).reshape(e.shape), e, atol=1e-5)
        for g, e in zip(got, expected))

VALS = [None, 0, -1, 2**40, "", "x", "y", "w", "\x1b[2J", "range", [], [0], [-1, 5]]

def mutate(rng, m):
    m = onnx.ModelProto.FromString(m.SerializeToString())
    g = m.graph
    kind = rng.randrange(30)
    node = rng.choice(g.node) if len(g.node) else None
    if kind == 0 and node:
        del node.input[:]  # no inputs
    elif kind == 1 and node:
        node.input.append(rng.choice(["", "zz", "x", "w"]))
    elif kind == 2 and node:
        del node.output[:]
    elif kind == 3 and node and node.attribute:
        a = rng.choice(node.attribute); a.type = rng.choice([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13])
    elif kind == 4 and node and node.attribute:
        a = rng.choice(node.attribute); a.ClearField(rng.choice(["ints", "i", "f", "t", "g"]))
    elif kind == 5 and node:
        node.attribute.append(helper.make_attribute(rng.choice(["axis", "perm", "pads", "to", "kernel_shape", "then_branch"]), rng.choice([1, [1], 1.5, "s", [0.5]])))
    elif kind == 6 and g.initializer:
        t = rng.choice(g.initializer); t.data_type = rng.choice([0, 2, 7, 8, 9, 10, 11, 13, 16, 17, 23])
    elif kind == 7 and g.initializer:
        t = rng.choice(g.initializer); del t.dims[:]; t.dims.extend([rng.choice([0, 1, 3, 7, 2**33]) for _ in range(rng.randrange(4))])
    elif kind == 8:
        del g.input[:]
    elif kind == 9:
        del g.output[:]
    elif kind == 10 and g.output:
        g.output[0].name = rng.choice(["", "zz", "x", "w"])
    elif kind == 11 and g.input:
        g.input[0].type.tensor_type.elem_type = rng.choice([0, 7, 8, 16, 23])
    elif kind == 12 and g.input:
        d = g.input[0].type.tensor_type.shape.dim
        if len(d): d[0].dim_value = rng.choice([0, -1, 2**40]);
    elif kind == 13:
        del m.opset_import[:]
        m.opset_import.append(helper.make_opsetid(rng.choice(["", "ai.onnx", "x"]), rng.choice([0, 1, 7, 99, -1])))
    elif kind == 14 and node:
        node.op_type = rng.choice(["", "Foo", "If", "Loop", "Scan", "Constant", "Gemm"])
    elif kind == 15 and node:
        node.domain = rng.choice(["x", "com.microsoft", "ai.onnx.ml"])
    elif kind == 16 and node:
        del node.attribute[:]
    elif kind == 17 and g.input:
        g.input[0].ClearField("type")
    elif kind == 18 and node:
        node.output.append(rng.choice(["x", "w", "y", ""]))
    elif kind == 19 and g.initializer:
        rng.choice(g.initializer).name = rng.choice(["", "x", "y", "zz"])
    elif kind == 20:
        g.node.add().CopyFrom(helper.make_node("Constant", [], ["kk"]))
    elif kind == 21:
        g.sparse_initializer.add()
    elif kind == 22 and node:
        node.attribute.append(helper.make_attribute(rng.choice(["axis", "perm", "to", "value", "body"]), rng.choice([numpy_helper.from_array(np.ones(2, np.float32)), ["a", "b"], [1.0, 2.0]])))
    elif kind == 23 and g.input:
        g.input[0].type.tensor_type.shape.dim.add().dim_param = rng.choice(["", "N", "\x1b"])
    elif kind == 24 and node:
        g.node.remove(node)
    elif kind == 25 and g.initializer:
        t = rng.choice(g.initializer); t.ClearField("raw_data"); t.float_data.extend([1.0] * rng.randrange(3))
    elif kind in (26, 27) and g.initializer:  # run-time size ops: a value that sizes an output
        # (not a Loop's trip count: that is the model's running time, in onnxruntime too)
        t = rng.choice([t for t in g.initializer if all(n.op_type != "Loop" or n.input[:1] != [t.name] for n in g.node)])
        shape = tuple(t.dims)
        n = int(np.prod(shape)) if shape else 1
        if t.data_type == TensorProto.INT64 and n <= 16:
            values = [rng.choice([0, -1, 2, 10 ** 6, 10 ** 9, 10 ** 12, 2 ** 62]) for _ in range(n)]
            t.CopyFrom(numpy_helper.from_array(np.array(values, np.int64).reshape(shape), t.name))
    elif kind in (28, 29):
        rename_everywhere(m, rng)
        return m.SerializeToString(), "names"
    data = bytearray(m.SerializeToString())
    kind = "structure-%d" % kind
    if rng.random() < 0.3:
        kind = "bytes"
        for _ in range(rng.randrange(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
    return bytes(data), kind


def test_mutated_onnx_models_import_or_raise_cinders_errors():
    rng = random.Random(SEED)
    bases = base_models()
    counts = collections.Counter()
    by_kind = collections.defaultdict(collections.Counter)
    failures = []
    old_limit = cn.limits.set_max_elements(10 ** 8)  # the run-time size ops meet a fixed limit
    try:
        with Bounds(CASE_SECONDS, MEMORY_CAP) as bounds:
            for case in range(CASES):
                data, kind = mutate(rng, rng.choice(bases))
                with bounds.case("case %d (%s)" % (case, kind)):
                    try:
                        model = cinders.onnx.load(data, backend=cn.NumPy())
                        feeds = [cn.ones(tuple(d if isinstance(d, int) else 1 for d in shape), backend=cn.NumPy())
                                 for shape in model.input_shapes if shape is not None]
                        if len(feeds) == len(model.input_names) and all(s is not None for s in model.input_shapes):
                            model(*feeds)
                        outcome = "ran"
                        if kind == "names":
                            agrees = onnxruntime_agrees(data, model)
                            counts["compared with onnxruntime"] += agrees is not None
                            if agrees is False:
                                failures.append("case %d (names): not onnxruntime's answer" % case)
                    except CindersError as e:
                        assert str(e).isprintable(), "case %d: %r" % (case, str(e)[:200])
                        outcome = "refused"
                    except Exception as e:  # noqa: BLE001  (the point: nothing else may escape)
                        outcome = "failure"
                        failures.append("case %d (%s): %s: %s" % (case, kind, type(e).__name__, str(e)[:150]))
                counts[outcome] += 1
                by_kind[kind.split("-")[0]][outcome] += 1
    finally:
        cn.limits.set_max_elements(old_limit)
    print("onnx fuzz:", json.dumps({"cases": CASES, **counts, "by_kind": by_kind}, sort_keys=True))
    assert not failures, failures[:20]
    assert counts["ran"] > CASES // 10 and counts["refused"] > CASES // 4, counts


EXTERNAL_CASES = int(os.environ.get("CINDERS_FUZZ_CASES", 1500)) // 5
LOCATIONS = ["w.bin", "w.bin", "w.bin", "inside.bin", "link_out.bin", "../secret.bin", "/etc/passwd", "fifo",
             "sub", "missing.bin", "w.bin\x00x", "", "sub/../w.bin"]


def external_model(rng, n, regions):
    """y = Sum of len(regions) float32 initializers of n elements, each read from the external
    data region (location, offset, length) given (None: the key is left out)."""
    inits = []
    for i, (location, offset, length) in enumerate(regions):
        t = onnx.TensorProto(name="w%d" % i, data_type=TensorProto.FLOAT, dims=[n],
                             data_location=onnx.TensorProto.EXTERNAL)
        for key, v in (("location", location), ("offset", offset), ("length", length)):
            if v is not None:
                entry = t.external_data.add()
                entry.key, entry.value = key, str(v)
        inits.append(t)
    g = helper.make_graph([helper.make_node("Sum", [t.name for t in inits], ["y"])], "ext", [],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_external_data_regions_load_exactly_or_raise_cinders_errors(tmp_path):
    """Regions of one 4 KB data file: shared by several initializers, overlapping, past its end,
    through a symlink inside the folder (fine) or out of it, a FIFO, a directory, a missing file.
    What loads holds exactly the bytes of its regions; the rest is a CindersError; no case hangs
    (a FIFO opened would) or grows memory past the cap."""
    rng = random.Random(SEED)
    folder = tmp_path / "model"
    (folder / "sub").mkdir(parents=True)
    weights = np.arange(1024, dtype=np.float32) * 0.5
    (folder / "w.bin").write_bytes(weights.tobytes())
    (tmp_path / "secret.bin").write_bytes(np.full(1024, 7, np.float32).tobytes())
    os.symlink(str(folder / "w.bin"), str(folder / "inside.bin"))
    os.symlink(str(tmp_path / "secret.bin"), str(folder / "link_out.bin"))
    os.mkfifo(str(folder / "fifo"))
    path = str(folder / "m.onnx")
    counts, failures = collections.Counter(), []
    with Bounds(CASE_SECONDS, MEMORY_CAP) as bounds:
        for case in range(EXTERNAL_CASES):
            n = rng.choice([1, 4, 256, 1024])
            regions = [("w.bin", 4 * rng.randrange(1025 - n), rng.choice([4 * n, None])) if rng.random() < 0.7 else
                       (rng.choice(LOCATIONS), rng.choice([0, 4, 4 * rng.randrange(1024), 4095, -4, 2 ** 40, "x", None]),
                        rng.choice([4 * n, None, 4 * n + 4, 0, 2 ** 40]))
                       for _ in range(rng.choice([1, 1, 2, 3, 5, 8]))]
            with open(path, "wb") as f:
                f.write(external_model(rng, n, regions))
            label = "external case %d (n=%d, %s)" % (case, n, ascii(regions)[:200])
            with bounds.case(label):
                try:
                    got = cinders.onnx.load(path, backend=cn.NumPy())()
                    raw = weights.tobytes()
                    expected = sum(np.frombuffer(raw[int(o or 0):int(o or 0) + 4 * n], np.float32) for _, o, _ in regions)
                    if not np.array_equal(np.asarray(got.tolist(), np.float32), expected):
                        failures.append("%s: loaded other bytes than its regions'" % label)
                    outcome = "loaded"
                except CindersError as e:
                    assert str(e).isprintable(), "%s: %r" % (label, str(e)[:200])
                    outcome = "refused"
                except Exception as e:  # noqa: BLE001
                    outcome = "failure"
                    failures.append("%s: %s: %s" % (label, type(e).__name__, str(e)[:150]))
            counts[outcome] += 1
            counts["shared regions"] += len(set(regions)) < len(regions)
    print("onnx external-data fuzz:", json.dumps({"cases": EXTERNAL_CASES, **counts}, sort_keys=True))
    assert not failures, failures[:20]
    assert counts["loaded"] > EXTERNAL_CASES // 10 and counts["refused"] > EXTERNAL_CASES // 4, counts
