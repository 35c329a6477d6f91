"""A user's own model (not MNIST) in their own page: `cinders export-web` writes a folder from a
fresh directory, `cinders serve` serves it on 127.0.0.1, the page answers input while the model
loads in its worker, and the page's output in Chromium (WebGPU on SwiftShader) equals
cn.NumPy()'s on the desktop. Every request must go to that
server (the folder is self-contained)."""
import json
import subprocess
import sys

import numpy as np
import pytest

import cinders as cn

from browser_env import answers_input_while_loading, wait_ready
from user_site import save_user_model


def guard(context, allowed):
    """Abort and record every request of the context not addressed to `allowed` (the site's
    server): the exported folder must be self-contained."""
    seen = []

    def outside(url):
        return not url.startswith((allowed, "data:", "blob:"))

    context.on("request", lambda request: outside(request.url) and seen.append(request.url))
    context.route("**/*", lambda r: r.abort() if outside(r.request.url) else r.continue_())
    return seen


@pytest.fixture(scope="module")
def served_site(tmp_path_factory):
    """A fresh folder with the user's model source and record, exported and served."""
    tmp_path = tmp_path_factory.mktemp("user")
    x, want = save_user_model(tmp_path)
    r = subprocess.run([sys.executable, "-m", "cinders", "export-web", "ring.safetensors",
                        "--model-source", "ring_model.py", "--out", "site"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    server = subprocess.Popen([sys.executable, "-m", "cinders", "serve", "site", "--port", "0"],
                              cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline()
        assert " at http://127.0.0.1:" in line, line + server.stderr.read()
        yield line.split(" at ")[1].split()[0], x, want
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_exported_site_runs_a_user_model_like_the_desktop(browser, served_site):
    url, x, want = served_site
    context = browser.new_context()
    seen = guard(context, url)
    try:
        page = context.new_page()
        page.on("console", lambda m: print("[console.%s] %s" % (m.type, m.text)))
        page.goto(url)
        wait_ready(page)
        assert page.text_content("#backend") == "webgpu"
        page.fill("#input", json.dumps(x.tolist()))
        page.click("#run")
        page.wait_for_function("() => document.querySelector('#output').textContent !== '' || "
                               "document.querySelector('#status').textContent.startsWith('error')",
                               timeout=60_000)
        assert page.text_content("#status") == "ready", page.text_content("#status")
        got = np.asarray(json.loads(page.text_content("#output")))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        page.fill("#input", json.dumps(x[0].tolist()))  # one sample: a batch of one
        page.click("#run")
        page.wait_for_function("(n) => JSON.parse(document.querySelector('#output').textContent).length === n",
                               arg=1, timeout=60_000)
        np.testing.assert_allclose(json.loads(page.text_content("#output")), want[:1], rtol=1e-4, atol=1e-4)
        page.fill("#input", "[1, 2, 3]")  # bad input: one line, and the old output is gone
        page.click("#run")
        page.wait_for_function("() => document.querySelector('#status').textContent.startsWith('error')",
                               timeout=60_000)
        assert page.text_content("#status") == \
            "error: ValueError: the input holds 3 numbers, not a multiple of 2 (shape (2,))"
        assert page.text_content("#output") == ""
    finally:
        context.close()
    assert seen == [], "requests left the site's server: %s" % seen


def test_exported_site_answers_input_while_the_model_loads(browser, served_site):
    """The model loads in a Web Worker (cinders.js): the page shows a progress bar, and clicks on
    the input box are answered while Pyodide and the model load."""
    url, x, want = served_site
    context = browser.new_context()
    seen = guard(context, url)
    try:
        page = context.new_page()
        inputs = answers_input_while_loading(page, url, lambda page, i: page.click("#input"), "export-web site")
        assert [i for i in inputs if i["bar"] and i["bytes"].endswith(" MB")], inputs  # steps and bytes shown
        assert page.is_hidden("#load-progress") and page.is_enabled("#run")
        page.fill("#input", json.dumps(x.tolist()))
        page.click("#run")
        page.wait_for_function("() => document.querySelector('#output').textContent !== ''", timeout=60_000)
        np.testing.assert_allclose(np.asarray(json.loads(page.text_content("#output"))), want, rtol=1e-4, atol=1e-4)
    finally:
        context.close()
    assert seen == [], "requests left the site's server: %s" % seen


def test_exported_site_without_webgpu_runs_on_its_own_wasm_kernels(launch_browser, served_site):
    """The site carries cn.Wasm()'s kernels (was: a 404 for /wasm-kernels/ and pure Python)."""
    from browser_env import QUIET_FLAGS
    url, x, want = served_site
    browser = launch_browser(args=QUIET_FLAGS)  # no --enable-unsafe-webgpu: no adapter
    try:
        context = browser.new_context()
        seen = guard(context, url)
        page = context.new_page()
        missing = []
        page.on("response", lambda r: missing.append(r.url) if r.status == 404 else None)
        page.goto(url)
        wait_ready(page)
        assert page.text_content("#backend") == "wasm"
        page.fill("#input", json.dumps(x.tolist()))
        page.click("#run")
        page.wait_for_function("() => document.querySelector('#output').textContent !== '' || "
                               "document.querySelector('#status').textContent.startsWith('error')",
                               timeout=60_000)
        np.testing.assert_allclose(np.asarray(json.loads(page.text_content("#output"))), want, rtol=1e-4, atol=1e-4)
        assert missing == [] and seen == [], (missing, seen)
    finally:
        browser.close()


# ---------------------------------------------------------------- apps and ONNX models
def export_and_serve(tmp_path, *export_args, in_subfolder=False):
    """`cinders export-web ... --out site` in a fresh folder, then `cinders serve site`; yields its
    URL. in_subfolder: serve the folder above instead, so the site lives at <server>/site/ (as on
    a host that serves several sites)."""
    r = subprocess.run([sys.executable, "-m", "cinders", "export-web", *export_args, "--out", "site"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    server = subprocess.Popen([sys.executable, "-m", "cinders", "serve", "." if in_subfolder else "site",
                               "--port", "0"],
                              cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline()
        assert " at http://127.0.0.1:" in line, line + server.stderr.read()
        yield line.split(" at ")[1].split()[0] + ("site/" if in_subfolder else "")
    finally:
        server.terminate()
        server.wait(timeout=30)


def guarded_page(browser, url):
    """(context, page, seen): seen lists requests that left the site and, as "404 <url>", files
    the site lacks (the kernels, the shared page JS: the folder must carry all it asks for)."""
    context = browser.new_context()
    seen = guard(context, url)
    page = context.new_page()
    page.on("console", lambda m: print("[console.%s] %s" % (m.type, m.text)))
    page.on("response", lambda r: r.status == 404 and seen.append("404 " + r.url))
    return context, page, seen


def finished(page, timeout=300_000):
    page.wait_for_function("() => { const s = document.querySelector('#status').textContent; "
                           "return s === 'done' || s.startsWith('error'); }", timeout=timeout)
    assert page.text_content("#status") == "done", page.text_content("#error")


def small_onnx(path):
    """A user's ONNX graph: MatMul -> Add -> Relu -> Softmax over a batch of 5-vectors."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(7)
    w = numpy_helper.from_array(rng.normal(size=(5, 4)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.normal(size=(4,)).astype(np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["a"]),
         helper.make_node("Relu", ["a"], ["r"]), helper.make_node("Softmax", ["r"], ["y"], axis=-1)],
        "user_graph", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])], initializer=[w, b])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def test_exported_onnx_model_runs_like_onnxruntime(browser, tmp_path):
    import onnxruntime as ort
    small_onnx(tmp_path / "user.onnx")
    session = ort.InferenceSession(str(tmp_path / "user.onnx"), providers=["CPUExecutionProvider"])
    for url in export_and_serve(tmp_path, "user.onnx"):
        context, page, seen = guarded_page(browser, url)
        try:
            page.goto(url)                    # index.html sends the browser on to model/
            wait_ready(page)
            assert page.url.endswith("/model/")
            page.fill("input.dim", "3")       # the symbolic batch: the values field is refilled
            page.click("#run")
            finished(page)
            x = np.array(json.loads(page.eval_on_selector("textarea[data-input=x]", "t => t.value")), np.float32)
            assert np.array_equal(x.reshape(3, 5), cn.random((3, 5), backend=cn.NumPy(), distribution="normal",
                                                             seed=0).numpy())
            out = json.loads(page.evaluate("() => JSON.stringify(window.cindersModel.result.outputs)"))
            assert out[0]["shape"] == [3, 4]
            want = session.run(None, {"x": x.reshape(3, 5)})[0]
            np.testing.assert_allclose(np.reshape(out[0]["values"], (3, 4)), want, rtol=1e-4, atol=1e-5)
        finally:
            context.close()
        assert seen == [], "requests left the site's server: %s" % seen


def test_exported_ocr_app_reads_a_picture(browser, tmp_path):
    from PIL import Image, ImageDraw, ImageFont
    image = Image.new("RGB", (320, 120), "white")
    ImageDraw.Draw(image).text((16, 30), "Cinders offline", fill="black",
                               font=ImageFont.truetype("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf", 30))
    image.save(tmp_path / "line.png")
    for url in export_and_serve(tmp_path, "--app", "ocr"):
        context, page, seen = guarded_page(browser, url)
        try:
            page.goto(url + "ocr/?side=160&backend=wasm")   # Wasm: the kernels are in the folder too
            wait_ready(page, timeout=300_000)
            assert page.text_content("#backend").startswith("wasm")
            page.set_input_files("#file", str(tmp_path / "line.png"))
            finished(page)
            lines = json.loads(page.evaluate("() => JSON.stringify(window.cindersOcr.result.lines)"))
            assert [line["text"] for line in lines] == ["Cinders offline"]
        finally:
            context.close()
        assert seen == [], "requests left the site's server: %s" % seen


def test_exported_vad_app_finds_silero_segments(browser, tmp_path):
    import torch
    from cinders import audio
    from cinders.apps import shipped
    from cinders.apps.vad import CHUNK, SAMPLE_RATE
    silero = pytest.importorskip("silero_vad.utils_vad", reason="silero-vad (the oracle) is in the dev extra")
    subprocess.run(["espeak-ng", "-s", "150", "-w", str(tmp_path / "espeak.wav"),
                    "Hello there. [[_:_:_:_:]] Goodbye for now."], check=True)
    samples, rate = audio.read_wav(str(tmp_path / "espeak.wav"))
    audio.write_wav(str(tmp_path / "talk.wav"), audio.resample(samples, rate, SAMPLE_RATE), SAMPLE_RATE)
    samples, _ = audio.read_wav(str(tmp_path / "talk.wav"))
    model = silero.OnnxWrapper(shipped.model_path("silero_vad.onnx"), force_onnx_cpu=True)
    want = [[s["start"], s["end"]] for s in
            silero.get_speech_timestamps(torch.tensor(samples, dtype=torch.float32), model)]
    assert len(want) == 2, want
    for url in export_and_serve(tmp_path, "--app", "vad", in_subfolder=True):
        context, page, seen = guarded_page(browser, url)
        try:
            page.goto(url + "vad/?backend=wasm")
            wait_ready(page, timeout=300_000)
            assert page.text_content("#backend").startswith("wasm")
            page.set_input_files("#file", str(tmp_path / "talk.wav"))
            finished(page)
            got = json.loads(page.evaluate("() => JSON.stringify(window.cindersVad.update.segments_samples)"))
            assert len(got) == len(want), (got, want)
            for g, w in zip(got, want):
                assert abs(g[0] - w[0]) <= CHUNK and abs(g[1] - w[1]) <= CHUNK, (got, want)
        finally:
            context.close()
        assert seen == [], "requests left the site's server: %s" % seen
