"""The MNIST drawing page in real headless Chromium: WebGPU, drawing, parity with the desktop,
CPU fallback, and the conformance table's ops on the browser's WebGPU device."""
import os

import pytest

import cinders as cn
from cinders import record
from cinders.assets import REPO_ROOT

from browser_env import QUIET_FLAGS, answers_input_while_loading, assert_drawn_digits_recognised, wait_ready
from digit_strokes import DIGITS, assert_heldout_digits_like_desktop, assert_page_predicts_like_desktop, heldout_digits
from primitive_trace import replay_conformance_table

MODEL = os.path.join(REPO_ROOT, "web_demos", "models", "mnist-cnn.safetensors")


@pytest.fixture(scope="module")
def desktop_model():
    return record.load_model(MODEL, backend=cn.NumPy())


# -- (a) ------------------------------------------------------------------------------------------
def test_page_is_ready_on_webgpu(mnist_page):
    assert mnist_page.text_content("#backend") == "webgpu"
    assert "ready" == mnist_page.text_content("#status")
    assert mnist_page.text_content("#load-time").endswith(" s")
    box = mnist_page.locator("#digit-canvas").bounding_box()
    assert box["width"] >= 280 and box["height"] >= 280
    assert mnist_page.locator("#probabilities > *").count() == 10


# -- (b) ------------------------------------------------------------------------------------------
def test_drawn_digits_are_recognised(mnist_page):
    def bar_is_drawn(page, prediction, widths):
        # the tallest bar's rendered length follows the probability
        rendered = page.evaluate("""(d) => { const bar = document.querySelectorAll('#probabilities .bar')[d];
            return bar.querySelector('.fill').getBoundingClientRect().width
                 / bar.querySelector('.track').getBoundingClientRect().width; }""", int(prediction))
        assert abs(rendered - max(widths) / 100) < 0.02

    assert_drawn_digits_recognised(mnist_page, DIGITS, "mnist", check=bar_is_drawn)


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
    assert_heldout_digits_like_desktop(mnist_page, desktop_model)


# -- (d) ------------------------------------------------------------------------------------------
def test_cpu_fallback_without_webgpu(launch_browser, new_page, desktop_model):
    # Without --enable-unsafe-webgpu, Chromium's requestAdapter() resolves to null: the page
    # falls back to the WebAssembly kernels (the whole no-WebGPU suite: test_mnist_nowebgpu.py).
    browser = launch_browser(args=QUIET_FLAGS)
    try:
        page = wait_ready(new_page("/", on_browser=browser))
        assert page.text_content("#backend") == "wasm"
        assert page.text_content("#backend-note") == "(no WebGPU in this browser, so it runs on WebAssembly)"
        note = page.get_attribute("#backend-note", "title")
        assert "WebGPU unavailable" in note and "null" in note
        assert_page_predicts_like_desktop(page, desktop_model, *heldout_digits(per_class=1)[7])
    finally:
        browser.close()


# -- (g) ------------------------------------------------------------------------------------------
def test_conformance_ops_on_browser_webgpu_match_desktop(mnist_page):
    # Replayed on the device's own kernels: plain cn.Wgpu, whatever decorator the page runs under.
    failures, total = replay_conformance_table(mnist_page, "cn.Wgpu(autotune=False)")
    assert not failures, "%d of %d ops differ on the browser's WebGPU:\n%s" % (
        len(failures), total, "\n".join(failures))


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
        const timings = window.cindersDemo.model.timings;
        return [inAsync, String(plain), timings.snapshot, timings.snapshot_error];
    }""", READS)
    assert got[2] is True, got[3]
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


def test_page_answers_input_while_the_model_loads_in_a_worker(browser, demo_server, outside_requests,
                                                              desktop_model):
    """Pyodide starts in a Web Worker (the default; ?worker=0 runs it on the page's thread, where
    one task of seconds freezes the page): while it loads, strokes on the canvas draw within
    100 ms and no task on the page's thread is long; once ready, the worker's model answers like the desktop."""
    context = outside_requests.attach(browser.new_context())
    try:
        page = context.new_page()

        box = {}

        def stroke(page, i):
            box.update(box or page.locator("#digit-canvas").bounding_box())
            x = box["x"] + 40 + 5 * (i % 40)
            page.mouse.move(x, box["y"] + 100)
            page.mouse.down()
            page.mouse.move(x, box["y"] + 180, steps=2)
            page.mouse.up()

        answers_input_while_loading(page, demo_server.url, stroke, "worker page")
        # The strokes were drawn (the DOM answered them): the canvas is no longer blank.
        assert page.evaluate("""() => { const c = document.querySelector('#digit-canvas');
            return c.getContext('2d').getImageData(0, 0, c.width, c.height).data.some((v) => v > 0); }""")
        assert page.text_content("#backend") == "webgpu"
        assert page.evaluate("() => window.cindersDemo.model.runtime") is None  # Pyodide is in the worker
        page.evaluate("() => window.cindersDemo.settled()")
        assert_heldout_digits_like_desktop(page, desktop_model)
    finally:
        context.close()
