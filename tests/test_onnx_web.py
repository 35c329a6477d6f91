"""cinders.onnx.web, what the /onnx/ page calls in Pyodide, run here on the desktop (its backend
chosen by cinders.web.bridge as in the page, ?backend=python): several files (a model and its
external data), the example inputs the page prefills, the edited inputs it parses, greedy
generation token by token; onnxruntime is the oracle."""
import asyncio
import json

import numpy as np
import onnxruntime as ort
import pytest

from cinders.onnx import OnnxError, web
from cinders.web import bridge

from test_onnx_transformers import decoder_path, _ort_generate as ort_generate  # noqa: F401 (a fixture)


@pytest.fixture(scope="module", autouse=True)
def page_backend():
    asyncio.run(bridge.init("python"))   # NumPy where it imports, as a page that has it


@pytest.fixture(scope="module")
def with_data(tmp_path_factory):
    """m.onnx: y = x @ W (x float (batch, 4)) and e = E[ids] (ids int64 (batch, 3)); W and E in
    m.onnx.data, as torch.onnx.export writes a model's weights by default."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.standard_normal((4, 5)).astype(np.float32), "W")
    e = numpy_helper.from_array(rng.standard_normal((10, 2)).astype(np.float32), "E")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"]), helper.make_node("Gather", ["E", "ids"], ["e"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4]),
         helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 5]),
         helper.make_tensor_value_info("e", TensorProto.FLOAT, ["batch", 3, 2])], initializer=[w, e])
    folder = tmp_path_factory.mktemp("with_data")
    path = str(folder / "m.onnx")
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path,
                    save_as_external_data=True, all_tensors_to_one_file=True, location="m.onnx.data", size_threshold=0)
    return path


def _files(path, *extra):
    return {name.rsplit("/", 1)[-1]: open(name, "rb").read() for name in (path,) + extra}


def _ort(path, feeds):
    return ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)


def test_a_model_and_its_external_data_import_and_run_on_the_prefilled_inputs(with_data):
    info = web.import_files(_files(with_data, with_data + ".data"))
    x, ids = info["inputs"]
    assert (x["shape"], x["example_shape"], ids["type"]) == (["batch", 4], [1, 4], "int64")
    values = json.loads(ids["values"])
    assert all(type(v) is int and 0 <= v < 10 for v in values) and any(values), values   # never silently zeros
    assert not info["generates"]
    result = asyncio.run(web.run([{"shape": i["example_shape"], "values": i["values"]} for i in info["inputs"]]))
    want = _ort(with_data, {"x": np.array(json.loads(x["values"]), np.float32).reshape(1, 4),
                            "ids": np.array(values, np.int64).reshape(1, 3)})
    for got, expected in zip(result["outputs"], want):
        np.testing.assert_allclose(np.reshape(got["values"], got["shape"]), expected, rtol=1e-5, atol=1e-6)
    assert result["device_reads"] == 0


def test_edited_inputs_of_another_batch_run(with_data):
    web.import_files(_files(with_data, with_data + ".data"))
    x = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    ids = [[9, 0, 3], [1, 1, 1], [2, 8, 4]]
    result = asyncio.run(web.run([{"shape": [3, 4], "values": json.dumps(x.tolist())},
                                  {"shape": [3, 3], "values": json.dumps(ids)}]))
    want = _ort(with_data, {"x": x, "ids": np.array(ids, np.int64)})
    np.testing.assert_allclose(np.reshape(result["outputs"][1]["values"], (3, 3, 2)), want[1], rtol=1e-6)
    np.testing.assert_allclose(np.reshape(result["outputs"][0]["values"], (3, 5)), want[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fields, message", [
    ([{"shape": [1, 4], "values": "[1, 2, 3, 4]"}], "1 inputs given, the model takes 2"),
    ([{"shape": [1, 5], "values": "[1, 2, 3, 4, 5]"}, {"shape": [1, 3], "values": "[1, 2, 3]"}],
     "input 'x': shape [1, 5] does not fit the graph's ['batch', 4]"),
    ([{"shape": [1, 4], "values": "[1, 2, 3]"}, {"shape": [1, 3], "values": "[1, 2, 3]"}],
     "input 'x': 3 values for shape [1, 4], which holds 4"),
    ([{"shape": [1, 4], "values": "[1, 2, 3, 4]"}, {"shape": [1, 3], "values": "[1, 2.5, 3]"}],
     "input 'ids' (int64): 2.5 is not an integer"),
    ([{"shape": [1, 4], "values": "[1, 2, 3, 4"}, {"shape": [1, 3], "values": "[1, 2, 3]"}],
     "input 'x': not a JSON list of numbers"),
    ([{"shape": [1, 4], "values": "[1, 2, true, 4]"}, {"shape": [1, 3], "values": "[1, 2, 3]"}],
     "input 'x' (float32): true is not a number"),
])
def test_bad_edited_inputs_are_one_line_errors(with_data, fields, message):
    web.import_files(_files(with_data, with_data + ".data"))
    with pytest.raises(OnnxError) as e:
        asyncio.run(web.run(fields))
    assert str(e.value).startswith(message) and "\n" not in str(e.value), str(e.value)


def test_a_missing_data_file_is_named(with_data):
    with pytest.raises(OnnxError, match=r"^m.onnx keeps its weights in 'm.onnx.data': pick it together with "
                                        r"the .onnx file$"):
        web.import_files(_files(with_data))


@pytest.mark.parametrize("names, message", [(["a.txt"], "pick one .onnx file (and its external data files): "
                                                       "got no .onnx among ['a.txt']"),
                                            (["a.onnx", "b.onnx"], "pick one .onnx file (and its external data "
                                                                   "files): got 'a.onnx', 'b.onnx'"),
                                            (["m.onnx", ".."], "'..' is not a file name")])
def test_one_onnx_file_is_picked(names, message):
    with pytest.raises(OnnxError) as e:
        web.import_files({n: b"" for n in names})
    assert str(e.value) == message


def test_a_decoder_generates_tokens_one_by_one_greedy_and_sampled(decoder_path):
    path = decoder_path("optimum")
    info = web.import_files(_files(path))
    assert info["generates"]
    seen = []
    done = asyncio.run(web.generate([5, 7, 9, 11], 8, lambda token, seconds: seen.append((token, seconds))))
    assert done["tokens"] == [t for t, _ in seen] == ort_generate(path, [[5, 7, 9, 11]], 8)[0][4:]
    assert [s for _, s in seen] == sorted(s for _, s in seen) and done["tokens_per_s"] > 0
    sampled = asyncio.run(web.generate([5, 7, 9, 11], 8, None, temperature=0.9, top_k=10, seed=3))
    assert sampled["tokens"] == ort_generate(path, [[5, 7, 9, 11]], 8, 0.9, 10, 3)[0][4:] != done["tokens"]
