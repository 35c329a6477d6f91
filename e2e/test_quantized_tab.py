"""q8 models in the tab (issue 28): `cinders export-web` of an MLP that onnxruntime's
quantize_dynamic wrote (int8 weights, DynamicQuantizeLinear + MatMulInteger) ships the q8 file
itself (a quarter of the float bytes, and that is what the page fetches); the site runs it on
WebGPU and on cn.Wasm() with onnxruntime's outputs, and on cn.Wasm() the model keeps its weights
at one byte each in the Wasm heap. A CNN that quantize_static wrote in QDQ form runs in the page
on cn.Wasm() with onnxruntime's outputs and int8 weights (its convolutions, depthwise too, import
as DequantizedConv, which cn.Wasm() runs on its integer conv kernel: tests/test_quantized_conv.py
checks the kernel in the same .wasm module on the desktop). (The page imports model.onnx with cinders.onnx.web, as the /onnx/ page imports
a picked file.)

onnxruntime runs the file as written (optimizations off): with full-range int8 weights its fused
x86 kernels saturate int16 sums (tests/test_onnx_quant.py says why), and this file is what
transformers.js-style q8 models look like. Float outputs are held to onnxruntime's own tolerance,
1e-4 of the largest magnitude."""
import base64
import json
import logging
import warnings

import numpy as np
import onnxruntime as ort
import pytest

import cinders as cn

from browser_env import wait_ready
from test_export_web import export_and_serve, finished, guarded_page

DIMS = (128, 256, 64, 10)   # x -> 256 -> 64 -> 10 logits: 49,792 weights


@pytest.fixture(scope="module")
def q8_mlp(tmp_path_factory):
    """(f32 path, q8 path): a float MLP and its quantize_dynamic (int8 weights) version."""
    from onnx import TensorProto, helper, numpy_helper, save
    from onnxruntime.quantization import QuantType, quantize_dynamic
    folder = tmp_path_factory.mktemp("q8")
    rng = np.random.default_rng(3)
    inits, nodes, last = [], [], "x"
    for i, (a, b) in enumerate(zip(DIMS, DIMS[1:])):
        inits += [numpy_helper.from_array((rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32), "w%d" % i),
                  numpy_helper.from_array((0.1 * rng.standard_normal(b)).astype(np.float32), "b%d" % i)]
        nodes += [helper.make_node("MatMul", [last, "w%d" % i], ["m%d" % i]),
                  helper.make_node("Add", ["m%d" % i, "b%d" % i], ["a%d" % i])]
        last = "a%d" % i
        if i < len(DIMS) - 2:
            nodes.append(helper.make_node("Relu", [last], ["r%d" % i]))
            last = "r%d" % i
    nodes[-1].output[0] = "y"
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", DIMS[0]])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", DIMS[-1]])], inits)
    f32, q8 = folder / "mlp.onnx", folder / "mlp.q8.onnx"
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(f32))
    logging.disable(logging.WARNING)   # the quantizer advises pre-processing
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            quantize_dynamic(str(f32), str(q8), weight_type=QuantType.QInt8)
    finally:
        logging.disable(logging.NOTSET)
    return f32, q8


def onnxruntime_as_written(path, x):
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def assert_like_onnxruntime(outputs, path, shape=(1, DIMS[0])):
    """The page's first output (window.*.result.outputs) against onnxruntime on the page's input
    of `shape`, the prefilled cn.random(normal, seed=0)."""
    x = cn.random(shape, backend=cn.NumPy(), distribution="normal", seed=0).numpy()
    expected = onnxruntime_as_written(path, x)
    assert outputs[0]["shape"] == list(expected.shape)
    got = np.reshape(outputs[0]["values"], expected.shape)
    assert np.abs(got - expected).max() <= 1e-4 * np.abs(expected).max(), (got, expected)


# The page's Python: the heap bytes each file's model holds once loaded on the page's cn.Wasm()
# (both kept alive), and the dtypes of the q8 model's weights (its tensors of 2 or more dims).
HEAP_BYTES = """
import base64
import json
from cinders.onnx import load
from cinders.web.bridge import current_backend
backend = current_backend()
held, models = {}, []
for name, data in FILES.items():
    backend.synchronize()
    before = backend.heap.in_use
    models.append(load(base64.b64decode(data), backend=backend))   # kept alive while the next loads
    backend.synchronize()
    held[name] = backend.heap.in_use - before
held["weight_dtypes"] = sorted({str(t.dtype) for t in models[1].state_dict().values() if len(t.shape) >= 2})
json.dumps(held)
"""


def heap_bytes(page, f32, q8):
    """{"f32", "q8": heap bytes, "weight_dtypes"} from the page's Pyodide (window.cindersModel)."""
    return json.loads(page.evaluate("""async ([code, files]) => {
        const py = window.cindersModel.runtime.pyodide;
        py.globals.set("FILES", py.toPy(files));
        return await py.runPythonAsync(code);
    }""", [HEAP_BYTES, {name: base64.b64encode(path.read_bytes()).decode() for name, path in (("f32", f32), ("q8", q8))}]))


def test_export_web_ships_the_q8_file_and_the_site_runs_it(browser, tmp_path, q8_mlp):
    f32, q8 = q8_mlp
    (tmp_path / "mlp.q8.onnx").write_bytes(q8.read_bytes())
    for url in export_and_serve(tmp_path, "mlp.q8.onnx"):
        shipped = (tmp_path / "site" / "model" / "model.onnx").read_bytes()
        assert shipped == q8.read_bytes()
        assert 0.25 <= len(shipped) / f32.stat().st_size < 0.3, (len(shipped), f32.stat().st_size)
        for backend in ("webgpu", "wasm"):
            context, page, seen = guarded_page(browser, url)
            fetched = []   # the responses that brought model.onnx
            page.on("response", lambda r: r.url.endswith("/model.onnx") and fetched.append(r))
            try:
                page.goto(url + "model/?backend=" + backend)
                wait_ready(page)
                assert page.text_content("#backend").startswith(backend)
                assert [len(r.body()) for r in fetched] == [len(shipped)]
                page.click("#run")
                finished(page)
                assert_like_onnxruntime(
                    json.loads(page.evaluate("() => JSON.stringify(window.cindersModel.result.outputs)")), q8)
                if backend == "wasm":   # the heap holds the q8 weights at one byte each: ¼ of the float bytes
                    held = heap_bytes(page, f32, q8)
                    print("[q8 in the Wasm heap] %s" % held)
                    assert held["weight_dtypes"] == ["cn.int8"], held
                    weights = sum(a * b for a, b in zip(DIMS, DIMS[1:]))
                    assert held["f32"] >= 4 * weights and 0.25 <= held["q8"] / held["f32"] < 0.27, held
            finally:
                context.close()
            assert seen == [], "requests left the site's server: %s" % seen


CNN_SHAPE = (1, 3, 12, 12)


@pytest.fixture(scope="module")
def qdq_cnn(tmp_path_factory):
    """(f32 path, q8 path): a small CNN (standard, depthwise and pointwise convs, a linear head)
    and its quantize_static QDQ version (int8 activations and weights)."""
    import torch
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 8, 3, padding=1)
            self.depthwise = nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=8)
            self.pointwise = nn.Conv2d(8, 16, 1)
            self.fc = nn.Linear(16, 5)

        def forward(self, x):
            x = torch.relu(self.pointwise(torch.relu(self.depthwise(torch.relu(self.stem(x))))))
            return self.fc(x.mean(dim=(2, 3)))

    class Calibration:
        def __init__(self):
            rng = np.random.default_rng(1)
            self.batches = iter([{"x": rng.standard_normal(CNN_SHAPE).astype(np.float32)} for _ in range(4)])

        def get_next(self):
            return next(self.batches, None)

    folder = tmp_path_factory.mktemp("qdq")
    f32, q8 = folder / "cnn.onnx", folder / "cnn.q8.onnx"
    torch.manual_seed(0)
    logging.disable(logging.WARNING)   # the quantizer advises pre-processing
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(Net().eval(), (torch.randn(*CNN_SHAPE),), str(f32), dynamo=False,
                              input_names=["x"], output_names=["y"], opset_version=17)
            quantize_static(str(f32), str(q8), Calibration(), quant_format=QuantFormat.QDQ,
                            activation_type=QuantType.QInt8, weight_type=QuantType.QInt8)
    finally:
        logging.disable(logging.NOTSET)
    return f32, q8


def test_a_qdq_cnn_runs_in_the_page_on_wasm_with_int8_weights(browser, tmp_path, qdq_cnn):
    f32, q8 = qdq_cnn
    (tmp_path / "cnn.q8.onnx").write_bytes(q8.read_bytes())
    for url in export_and_serve(tmp_path, "cnn.q8.onnx"):
        context, page, seen = guarded_page(browser, url)
        try:
            page.goto(url + "model/?backend=wasm")
            wait_ready(page)
            assert page.text_content("#backend").startswith("wasm")
            page.click("#run")
            finished(page)
            assert_like_onnxruntime(
                json.loads(page.evaluate("() => JSON.stringify(window.cindersModel.result.outputs)")), q8, CNN_SHAPE)
            assert heap_bytes(page, f32, q8)["weight_dtypes"] == ["cn.int8"]
        finally:
            context.close()
        assert seen == [], "requests left the site's server: %s" % seen
