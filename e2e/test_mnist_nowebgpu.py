"""The pages in headless Chromium WITHOUT WebGPU (no --enable-unsafe-webgpu: requestAdapter()
resolves to null): they run on cn.Wasm(), the WebAssembly SIMD kernels, with the same answers
as the desktop; ?backend= forces a backend; pure Python stays the last fallback."""
import os

import pytest

import cinders as cn
from cinders import record
from cinders.assets import REPO_ROOT

from browser_env import QUIET_FLAGS, assert_drawn_digits_recognised, wait_ready
from digit_strokes import DIGITS, assert_heldout_digits_like_desktop, assert_page_predicts_like_desktop, heldout_digits
from primitive_trace import replay_conformance_table

MODEL = os.path.join(REPO_ROOT, "web_demos", "models", "mnist-cnn.safetensors")


@pytest.fixture(scope="module")
def desktop_model():
    return record.load_model(MODEL, backend=cn.NumPy())


@pytest.fixture(scope="module")
def no_webgpu_browser(launch_browser):
    browser = launch_browser(args=QUIET_FLAGS)
    yield browser
    browser.close()


@pytest.fixture(scope="module")
def wasm_page(new_page, no_webgpu_browser):
    # ?worker=0: the conformance replay runs Python in the page's Pyodide (the default page's
    # worker on cn.Wasm(): test_mnist_page.py's CPU fallback test and the ?backend= tests here).
    return wait_ready(new_page("/?worker=0", on_browser=no_webgpu_browser))


def test_page_runs_on_wasm_without_webgpu(wasm_page):
    assert wasm_page.text_content("#backend") == "wasm"
    # one friendly line; the runtime's reason (adapter error, browser flags) is the tooltip
    assert wasm_page.text_content("#backend-note") == "(no WebGPU in this browser, so it runs on WebAssembly)"
    note = wasm_page.get_attribute("#backend-note", "title")
    assert "WebGPU unavailable" in note and "running on wasm" in note
    assert wasm_page.evaluate("() => window.cindersDemo.model.backendName") == "cn.Wasm()"


def test_drawn_digits_are_recognised_on_wasm(wasm_page):
    assert_drawn_digits_recognised(wasm_page, DIGITS, "mnist on wasm")


def test_heldout_logits_equal_desktop_numpy(wasm_page, desktop_model):
    assert_heldout_digits_like_desktop(wasm_page, desktop_model)


def test_conformance_ops_on_browser_wasm_match_desktop(wasm_page):
    # The same Pyodide engine the page runs (JS calls into the module), every conformance case.
    failures, total = replay_conformance_table(wasm_page, "cn.Wasm()")
    assert not failures, "%d of %d ops differ on the browser's cn.Wasm():\n%s" % (
        len(failures), total, "\n".join(failures))


def test_backend_parameter_forces_python(new_page, no_webgpu_browser, desktop_model):
    page = wait_ready(new_page("/?backend=python", on_browser=no_webgpu_browser))
    assert page.text_content("#backend") == "cpu"
    assert "CPU backend requested" in page.text_content("#backend-note")
    assert_page_predicts_like_desktop(page, desktop_model, *heldout_digits(per_class=1)[3])


def test_backend_parameter_wasm_fails_loudly_when_forced_webgpu(new_page, no_webgpu_browser):
    page = new_page("/?backend=webgpu", on_browser=no_webgpu_browser)
    page.wait_for_function("() => document.querySelector('#status').textContent.startsWith('error')",
                           timeout=120_000)


def test_pyscript_page_runs_on_wasm(new_page, no_webgpu_browser):
    page = wait_ready(new_page("/pyscript/", on_browser=no_webgpu_browser))
    assert page.text_content("#backend") == "wasm", page.text_content("#backend-note")


def test_micro_page_runs_its_wasm_engine_and_python_forces_the_array_engine(new_page, no_webgpu_browser):
    # /mnist-micro/ (MicroPython WebAssembly): the board runtime's `wasm` engine on cn.Wasm()'s
    # kernels; ?backend=python keeps the plain array engine. Same predictions either way.
    digits = heldout_digits(per_class=1)[::3]
    predictions = {}
    for query, backend, engine in (("", "wasm", "wasm"), ("?backend=python", "cpu", "array")):
        page = wait_ready(new_page("/mnist-micro/" + query, on_browser=no_webgpu_browser))
        assert page.text_content("#backend") == backend
        results = page.evaluate(
            "async (inputs) => { const out = []; for (const x of inputs) out.push(await window.cindersDemo.predict(x)); return out; }",
            [pixels for pixels, _ in digits])
        assert {r["engine"] for r in results} == {engine}
        predictions[engine] = results
    for wasm, plain in zip(predictions["wasm"], predictions["array"]):
        assert wasm["class"] == plain["class"]
        assert max(abs(a - b) for a, b in zip(wasm["logits"], plain["logits"])) <= 1e-4
