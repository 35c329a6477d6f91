"""The pages in headless Chromium WITHOUT WebGPU (no --enable-unsafe-webgpu: requestAdapter()
resolves to null): they run on cn.Wasm(), the WebAssembly SIMD kernels, with the same answers
as the desktop; ?backend= forces a backend; pure Python stays the last fallback."""
import os

import pytest

import cinders as cn
from cinders import record
from cinders.assets import REPO_ROOT

from browser_env import QUIET_FLAGS, assert_drawn_digits_recognised, wait_ready
from digit_strokes import (DIGITS, assert_heldout_digits_like_desktop, assert_page_predicts_like_desktop, desktop_logits,
                           heldout_digits)
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


# ---- the page's own replay of the captured forward (wasm/cinders.js Replay) --------------------
# Counts, on window.pageReplays, the predictions the page's own replay answered (no Python).
COUNT_PAGE_REPLAYS = """() => {
  const replay = window.cindersDemo.model.replay, run = replay.run.bind(replay);
  window.pageReplays = 0;
  if (replay.counted) return;   // (pages shared by several tests: wrapped once)
  replay.counted = true;
  replay.run = (pixels) => { const out = run(pixels); if (out !== null) window.pageReplays++; return out; };
}"""

FAST_AND_SLOW = """async (inputs) => {
  const model = window.cindersDemo.model, py = model.runtime.pyodide, replay = model.replay;
  py.globals.set("P", model._predictor);
  const replays = () => py.runPython("P.forward.replays");   // Python's replays of the forward
  for (let i = 0; i < 4; i++) await model.predict(inputs[0]);  // warm, two recordings, a replay
  const before = replays(), fast = [], slow = [];
  window.pageReplays = 0;
  for (const x of inputs) fast.push(await model.predict(x));
  const pythonReplays = replays() - before, pageReplays = window.pageReplays;
  for (const x of inputs) {   // through Python
    model.replay = null;
    slow.push(await model.predict(x));
    model.replay = replay;
  }
  return { fast, slow, pythonReplays, pageReplays };
}"""


def test_page_replays_the_captured_forward_itself_with_the_answers_of_python(wasm_page, desktop_model):
    """Once the forward replays, the page runs the captured program with no Python at all, and
    answers exactly as the Python path does (and as the desktop, to 1e-4)."""
    digits = heldout_digits(per_class=1)
    wasm_page.evaluate(COUNT_PAGE_REPLAYS)
    got = wasm_page.evaluate(FAST_AND_SLOW, [pixels for pixels, _ in digits])
    assert got["pythonReplays"] == 0 and got["pageReplays"] == len(digits)
    for (pixels, label), fast, slow in zip(digits, got["fast"], got["slow"]):
        assert {k: fast[k] for k in ("class", "logits", "probabilities")} == \
            {k: slow[k] for k in ("class", "logits", "probabilities")}
        want = desktop_logits(desktop_model, pixels)
        assert max(abs(a - b) for a, b in zip(fast["logits"], want)) <= 1e-4
        assert abs(sum(fast["probabilities"]) - 1) < 1e-6


def test_other_inputs_go_through_python_and_the_page_replay_goes_on(wasm_page):
    """An input of another length raises through Python as before (the plan stays); a batch of
    another shape captures its own program; single images then answer as before, and the page
    replays them again."""
    pixels = heldout_digits(per_class=1)[2][0]
    wasm_page.evaluate(COUNT_PAGE_REPLAYS)
    got = wasm_page.evaluate("""async (x) => {
      const model = window.cindersDemo.model;
      for (let i = 0; i < 4; i++) await model.predict(x);
      const want = await model.predict(x);
      let error = null;
      try { await model.predict(new Float32Array(100)); } catch (e) { error = String(e.message); }
      window.pageReplays = 0;
      const after = await model.predict(x), kept = window.pageReplays === 1;
      const batch = await model.predictBatch([x, x, x]);
      const again = [];
      for (let i = 0; i < 5; i++) again.push(await model.predict(x));
      return { want, error, kept, after, batch, again, pageReplays: window.pageReplays };
    }""", pixels)
    assert "expected 784 values" in got["error"], got["error"]
    assert got["kept"] and got["pageReplays"] >= 2   # (the first after the batch: through Python)
    for result in [got["after"]] + got["again"]:
        assert result["logits"] == got["want"]["logits"] and result["class"] == got["want"]["class"]
    for result in got["batch"]:
        assert max(abs(a - b) for a, b in zip(result["logits"], got["want"]["logits"])) <= 1e-5


def test_a_weight_change_is_seen_by_the_page_replay(new_page, no_webgpu_browser):
    """Weights replaced (load_state_dict: the program goes stale) or written in place (a queued
    copy) reach the very next prediction: the page's replay gives way to Python, which records
    again or runs the queued copy first."""
    page = wait_ready(new_page("/?worker=0&model=/models/mnist-mlp.safetensors", on_browser=no_webgpu_browser))
    pixels = heldout_digits(per_class=1)[5][0]
    page.evaluate(COUNT_PAGE_REPLAYS)
    got = page.evaluate("""async (x) => {
      const model = window.cindersDemo.model, py = model.runtime.pyodide;
      py.globals.set("P", model._predictor);
      const byPage = async () => {   // one prediction: was it the page's own replay?
        const before = window.pageReplays, result = await model.predict(x);
        return [result, window.pageReplays === before + 1];
      };
      const settle = async () => { for (let i = 0; i < 4; i++) await model.predict(x); return (await byPage())[1]; };
      const replaying = [await settle()];
      const [before] = await byPage();
      py.runPython(`
m = P.model
bias = [path for path, _ in m.named_parameters() if path.endswith("bias")][-1]
m.load_state_dict({bias: m.state_dict()[bias] + 1.0}, strict=False)`);
      const [replaced, replacedByPage] = await byPage();
      replaying.push(await settle());
      py.runPython(`
from cinders.capture import assign
b = m.state_dict()[bias]
assign(b, b + 1.0)`);
      const [inPlace, inPlaceByPage] = await byPage();
      replaying.push(await settle());
      const [later] = await byPage();
      return { before, replaced, inPlace, later, replaying, byPage: [replacedByPage, inPlaceByPage] };
    }""", pixels)
    assert got["replaying"] == [True, True, True] and got["byPage"] == [False, False]
    for key, shift in (("replaced", 1.0), ("inPlace", 2.0), ("later", 2.0)):
        assert max(abs(a - b - shift) for a, b in zip(got[key]["logits"], got["before"]["logits"])) <= 1e-5, key
