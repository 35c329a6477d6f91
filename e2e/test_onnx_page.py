"""The /onnx/ page: ONNX files picked or dropped in the tab are imported by cinders.onnx in Pyodide
and run on the browser's WebGPU device (captured, no device read) or, in a browser without
WebGPU, on cn.Wasm(); outputs match onnxruntime on the desktop for the prefilled inputs and for
inputs typed into the page. A model with external data (.onnx + .onnx.data, as torch.onnx.export
writes it) loads from both files; a decoder with a KV cache generates the tokens of an
onnxruntime greedy loop, and sampled with a seed those of cinders.onnx.generate on the desktop."""
import base64
import json
import os
import sys
import warnings

import numpy as np
import onnxruntime as ort
import pytest

import cinders as cn

from browser_env import QUIET_FLAGS, wait_ready

TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
sys.path.insert(0, TESTS)
import onnx_models  # noqa: E402
from test_onnx_transformers import decoder_path, _ort_generate as ort_generate  # noqa: E402,F401 (a fixture)

TOLERANCE = 1e-4


def _wait_done(page, timeout=300_000):
    page.wait_for_function("() => { const s = document.querySelector('#status').textContent; "
                           "return s === 'done' || s.startsWith('error'); }", timeout=timeout)
    assert page.text_content("#status") == "done", page.text_content("#status")


def _wait_error(page, timeout=120_000):
    page.wait_for_function("() => document.querySelector('#status').textContent.startsWith('error')",
                           timeout=timeout)
    status = page.text_content("#status")
    assert "Traceback" not in status and "\n" not in status, status
    assert page.evaluate("() => document.querySelector('#error').open") is False  # details folded
    return status


def _upload(page, paths):
    page.set_input_files("#file", files=[{"name": os.path.basename(p), "mimeType": "application/octet-stream",
                                          "buffer": open(p, "rb").read()} for p in paths])


def _drop(page, paths):
    """Drop files on the page's drop zone, as a visitor dragging them from a file manager does."""
    page.evaluate("""(files) => {
        const dt = new DataTransfer();
        for (const [name, b64] of files) {
            dt.items.add(new File([Uint8Array.from(atob(b64), (c) => c.charCodeAt(0))], name));
        }
        document.querySelector('#drop').dispatchEvent(new DragEvent('drop', { dataTransfer: dt, bubbles: true,
                                                                               cancelable: true }));
    }""", [[os.path.basename(p), base64.b64encode(open(p, "rb").read()).decode()] for p in paths])


def _result(page):
    return json.loads(page.evaluate("() => JSON.stringify(window.cindersOnnx.result)"))


def _fields(page):
    """{input name: (shape, values)} as the page's input fields hold them now."""
    info = json.loads(page.evaluate("() => JSON.stringify(window.cindersOnnx.info)"))
    out = {}
    for i in info["inputs"]:
        text = page.eval_on_selector("textarea[data-input=%s]" % json.dumps(i["name"]), "t => t.value")
        out[i["name"]] = (i["type"], json.loads(text))
    return out


def _assert_close(got, expected):
    assert got.shape == expected.shape, (got.shape, expected.shape)
    assert np.abs(got - expected).max() <= TOLERANCE * max(1.0, float(np.abs(expected).max()))


def _output(result, index=0):
    o = result["outputs"][index]
    return np.array(o["values"], dtype=np.float32).reshape(o["shape"])


@pytest.fixture(scope="module")
def encoder_with_data(tmp_path_factory):
    """A torch.nn.TransformerEncoder text classifier exported by torch.onnx.export's default
    (dynamo) exporter: enc.onnx and its weights in enc.onnx.data."""
    import torch
    folder = tmp_path_factory.mktemp("encoder")
    model, inputs, names = onnx_models.build("transformer_encoder")
    path = str(folder / "enc.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, inputs, path, dynamo=True, input_names=names, output_names=["y"])
    assert os.path.exists(path + ".data"), os.listdir(folder)
    return path


def _encoder_inputs(fields):
    (_, tokens), (_, padding) = fields["tokens"], fields["padding"]
    return {"tokens": np.array(tokens, np.int64).reshape(2, 12), "padding": np.array(padding, bool).reshape(2, 12)}


@pytest.fixture(scope="module")
def no_webgpu_browser(launch_browser):
    browser = launch_browser(args=QUIET_FLAGS)  # no --enable-unsafe-webgpu: no adapter
    yield browser
    browser.close()


def test_mobilenet_v2_upload_matches_onnxruntime(new_page):
    path = onnx_models.export("mobilenet_v2", "torchscript")
    page = wait_ready(new_page("/onnx/"))
    assert page.text_content("#backend").startswith("webgpu")
    assert page.text_content("#backend-note") == "(?backend=auto)"
    _upload(page, [path])
    _wait_done(page)
    info = json.loads(page.evaluate("() => JSON.stringify(window.cindersOnnx.info)"))
    assert info["inputs"][0]["name"] == "image" and info["inputs"][0]["shape"][1:] == [3, 64, 64]
    assert "ops.Conv(" in info["source"] and "class Model(cn.nn.Module)" in info["source"]
    assert page.locator("#source").text_content().startswith("# Generated by cinders")
    # the symbolic batch is a field of its own; the values field holds cn.random(normal, seed=0)
    assert page.eval_on_selector_all("input.dim", "fields => fields.map(f => f.value)") == ["1"]
    x = cn.random((1, 3, 64, 64), backend=cn.NumPy(), distribution="normal", seed=0).numpy()
    assert np.array_equal(np.array(_fields(page)["image"][1], np.float32).reshape(x.shape), x)
    result = _result(page)
    expected = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"image": x})[0]
    _assert_close(_output(result), expected)
    assert result["warm_ms"] > 0 and "warm run" in page.text_content("#timings")
    assert result["captured"], "the page's warm run should be a cn.capture replay on WebGPU"


def test_transformer_with_external_data_on_webgpu_captured(new_page, encoder_with_data):
    """The .onnx alone is refused in one line naming its data file; with both it runs captured
    with no device read and matches onnxruntime, for the prefilled and for typed integer inputs."""
    path = encoder_with_data
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    page = wait_ready(new_page("/onnx/?backend=webgpu"))
    assert page.text_content("#backend-note") == "(?backend=webgpu)"
    _upload(page, [path])
    status = _wait_error(page)
    assert status == "error: OnnxError: enc.onnx keeps its weights in 'enc.onnx.data': pick it together " \
                     "with the .onnx file", status
    _upload(page, [path, path + ".data"])
    _wait_done(page)
    assert page.locator("#error").is_hidden()
    fields = _fields(page)
    tokens = fields["tokens"][1]
    assert all(type(t) is int for t in tokens) and len(set(tokens)) > 1, tokens   # small ints, not zeros
    result = _result(page)
    assert result["captured"] and result["device_reads"] == 0, result
    _assert_close(_output(result), session.run(None, _encoder_inputs(fields))[0])

    # typed inputs: other tokens, the end of the second row padded
    tokens = [int(t) for t in np.random.default_rng(3).integers(0, 100, 24)]
    padding = [False] * 12 + [False] * 9 + [True] * 3
    page.fill("textarea[data-input=tokens]", json.dumps(tokens))
    page.fill("textarea[data-input=padding]", json.dumps(padding))
    page.click("#run")
    _wait_done(page)
    result = _result(page)
    assert result["captured"] and result["device_reads"] == 0
    _assert_close(_output(result), session.run(None, _encoder_inputs(_fields(page)))[0])

    # an integer input given a fraction: one line, and the old outputs are gone
    page.fill("textarea[data-input=tokens]", json.dumps([1.5] * 24))
    page.click("#run")
    assert _wait_error(page) == "error: OnnxError: input 'tokens' (int64): 1.5 is not an integer"
    assert page.text_content("#outputs") == ""


def test_without_webgpu_a_dropped_transformer_runs_on_wasm(new_page, no_webgpu_browser, encoder_with_data):
    path = encoder_with_data
    page = wait_ready(new_page("/onnx/", on_browser=no_webgpu_browser))
    assert page.text_content("#backend").startswith("wasm")
    note = page.text_content("#backend-note")
    assert note == "(?backend=auto · no WebGPU in this browser, so it runs on WebAssembly)", note
    assert "enable-unsafe-webgpu" not in page.inner_text("body")   # the long hint stays in the tooltip
    _drop(page, [path, path + ".data"])
    _wait_done(page)
    expected = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(
        None, _encoder_inputs(_fields(page)))[0]
    _assert_close(_output(_result(page)), expected)


def test_without_webgpu_mobilenet_runs_on_wasm(new_page, no_webgpu_browser):
    path = onnx_models.export("mobilenet_v2", "torchscript")
    page = wait_ready(new_page("/onnx/", on_browser=no_webgpu_browser))
    assert page.text_content("#backend").startswith("wasm")
    _upload(page, [path])
    _wait_done(page)
    x = cn.random((1, 3, 64, 64), backend=cn.NumPy(), distribution="normal", seed=0).numpy()
    expected = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"image": x})[0]
    _assert_close(_output(_result(page)), expected)


def _generate(page, new_tokens, temperature="0", top_k="", seed=""):
    page.fill("#new-tokens", str(new_tokens))
    page.fill("#temperature", temperature)
    page.fill("#top-k", top_k)
    page.fill("#seed", seed)
    page.click("#generate-button")
    _wait_done(page)
    return json.loads(page.evaluate("() => JSON.stringify(window.cindersOnnx.generation)"))


@pytest.mark.parametrize("webgpu", [True, False], ids=["webgpu", "wasm"])
def test_a_decoder_generates_the_desktop_tokens_greedy_and_sampled(new_page, decoder_path, no_webgpu_browser, webgpu):
    """Generation in the tab (the optimum-style decoder, whose decode steps and picks replay
    captured programs), on WebGPU and on cn.Wasm(): greedy gives the tokens of an onnxruntime
    greedy loop; sampled with a seed, those of cinders.onnx.generate on the desktop with that
    seed (and of the same draw on onnxruntime's logits). Tokens appear one by one, with tokens/s."""
    from cinders.onnx import generate, load
    path = decoder_path("optimum")
    page = wait_ready(new_page("/onnx/", on_browser=None if webgpu else no_webgpu_browser))
    assert page.text_content("#backend") == ("webgpu" if webgpu else "wasm")
    _upload(page, [path])
    _wait_done(page)
    assert page.locator("#generate").is_visible()
    page.fill("#prompt", "5 7 9 11")
    generation = _generate(page, 10)
    expected = ort_generate(path, [[5, 7, 9, 11]], 10)[0][4:]
    assert generation["tokens"] == generation["result"]["tokens"] == expected
    assert len(generation["seconds"]) == 10 and generation["seconds"] == sorted(generation["seconds"])
    assert page.text_content("#tokens") == "5 7 9 11 | " + " ".join(map(str, expected))
    assert page.text_content("#tokens-per-s").split()[1] == "tokens/s"
    assert generation["result"]["tokens_per_s"] > 0
    # steps 5-10 and picks 5-10 replay (tests/test_onnx_transformers.py counts them on the desktop)
    assert generation["result"]["replays"] == 6 + 6, generation["result"]

    sampled = _generate(page, 12, temperature="0.9", top_k="10", seed="3")
    desktop = generate(load(path, backend=cn.NumPy()), [[5, 7, 9, 11]], 12, temperature=0.9, top_k=10, seed=3)[0][4:]
    assert sampled["options"] == {"temperature": 0.9, "top_k": 10, "seed": 3}
    assert sampled["tokens"] == sampled["result"]["tokens"] == desktop
    assert desktop == ort_generate(path, [[5, 7, 9, 11]], 12, 0.9, 10, 3)[0][4:]
    assert desktop[:10] != expected   # it did sample
    # the greedy call's step program is kept (4 + 12 tokens: the same window of 16): all 11 decode
    # steps replay; the sampled pick is a program of its own: picks 5-12 replay
    assert sampled["result"]["replays"] == 11 + 8 and sampled["result"]["tokens_per_s"] > 0

    # a bad field is one line, before anything runs
    page.fill("#top-k", "0")
    page.click("#generate-button")
    assert _wait_error(page) == "error: top-k must be an integer ≥ 1 or empty, got \"0\""


@pytest.mark.parametrize("path", ["/onnx/", "/mnist-micro/"])
def test_the_page_loads_with_no_404(new_page, demo_server, path):
    """Nothing the page asks for is missing, and it declares its icon inline (`<link rel="icon"
    href="data:,">`): headless Chromium never asks for /favicon.ico, a visitor's browser does."""
    first = new_page("/onnx/style.css")  # a guarded context; the page itself is watched from its first request
    page = first.context.new_page()
    missing = []
    page.on("response", lambda r: missing.append(r.url) if r.status == 404 else None)
    page.goto(demo_server.url + path.lstrip("/"))
    wait_ready(page)
    page.wait_for_timeout(1000)  # the favicon is asked for after the load event
    assert missing == [], missing
    assert page.evaluate("() => document.querySelector('link[rel=icon]')?.getAttribute('href')") == "data:,"


def test_a_bad_file_is_one_readable_line_with_the_traceback_folded(new_page):
    page = wait_ready(new_page("/onnx/?backend=python"))
    page.set_input_files("#file", files=[{"name": "broken.onnx", "mimeType": "application/octet-stream",
                                          "buffer": b"\x08\x07not an onnx model at all"}])
    status = _wait_error(page)
    assert "Error" in status, status
    assert "Traceback" in page.text_content("#error-details")
