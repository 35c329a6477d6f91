"""The MicroPython-wasm MNIST page (/mnist-micro/) in real headless Chromium: same DOM contract as
the Pyodide page, on both loaders; drawing; parity of held-out digits with cn.NumPy() on the
desktop; nothing fetched from outside 127.0.0.1.

Its bundle (<cache>/mnist-micro-bundle/) is built by the demo server's set-up
(`ensure_setup`, which the `demo_server` fixture runs like `cinders demo` does). Cold start is
printed (run with -s to see it), never asserted: speed is measured in benchmarks/micro.py.
"""
import os
import time

import pytest

import cinders as cn
from cinders.assets import REPO_ROOT

from browser_env import assert_drawn_digits_recognised, wait_ready
from digit_strokes import DIGITS, assert_page_predicts_like_desktop, desktop_logits, heldout_digits

MODEL = os.path.join(REPO_ROOT, "web_demos", "models", "mnist-mlp.safetensors")
INTERPRETER_WASM = "micropython-webassembly-pyscript/micropython.wasm"


def open_micro_page(new_page, loader=None):
    """The micro page, waited on until `ready`; prints its cold start (navigation -> ready)."""
    started = time.perf_counter()
    page = wait_ready(new_page("/mnist-micro/" + ("?loader=%s" % loader if loader else "")))
    wall_ms = 1000 * (time.perf_counter() - started)
    load_ms = page.evaluate("() => window.cindersDemo.loadMs")
    print("[mnist-micro cold start] loader=%s: %.0f ms navigation -> ready (page's own clock), "
          "%.0f ms from the test's goto" % (loader or "pyscript", load_ms, wall_ms))
    return page


def assert_dom_contract(page):
    assert page.text_content("#status") == "ready"
    assert page.text_content("#backend") == "wasm"  # the runtime's wasm engine (cn.Wasm()'s kernels)
    assert page.text_content("#load-time").endswith(" s")
    box = page.locator("#digit-canvas").bounding_box()
    assert box["width"] >= 280 and box["height"] >= 280
    assert page.locator("#clear").count() == 1
    assert page.locator("#probabilities > *").count() == 10
    assert page.text_content("#prediction") == ""


def assert_served_locally(page, server):
    """Everything the page loaded came from the test server, the interpreter's wasm included
    (the `no_outside_requests` guard of conftest.py aborts and fails anything else)."""
    served = page.evaluate("() => performance.getEntriesByType('resource').map(e => e.name)")
    assert any(INTERPRETER_WASM in url for url in served), served
    outside = [url for url in served
               if not url.startswith((server.url, "data:", "blob:"))]
    assert outside == [], outside


@pytest.fixture(scope="module")
def micro_page(new_page):
    """The micro page on its default loader (PyScript, <script type="mpy">), loaded once."""
    page = open_micro_page(new_page)
    yield page
    page.context.close()


@pytest.fixture(scope="module")
def desktop_mlp():
    return cn.load_model(MODEL, backend=cn.NumPy())


# -- (a) + (d) ------------------------------------------------------------------------------------
def test_ready_on_pyscript_loader(micro_page, demo_server):
    assert_dom_contract(micro_page)
    # PyScript ran main.py from a <script type="mpy"> with the bundle's config
    assert micro_page.locator('script[type="mpy"][src="main.py"]').count() == 1
    assert "MicroPython" in micro_page.text_content("#backend-note")
    assert_served_locally(micro_page, demo_server)


def test_ready_on_direct_loader(new_page, demo_server, desktop_mlp):
    page = open_micro_page(new_page, loader="direct")
    try:
        assert_dom_contract(page)
        assert page.locator('script[type="mpy"]').count() == 0  # no PyScript on this path
        served = page.evaluate("() => performance.getEntriesByType('resource').map(e => e.name)")
        assert not any("@pyscript/core" in url for url in served), served
        assert_served_locally(page, demo_server)
        # the same interpreter and bundle answer as on the PyScript path
        assert_page_predicts_like_desktop(page, desktop_mlp, *heldout_digits(per_class=1)[4])
    finally:
        page.context.close()


# -- (b) ------------------------------------------------------------------------------------------
def test_drawn_digits_are_recognised(micro_page):
    assert_drawn_digits_recognised(micro_page, DIGITS, "mnist-micro")


# -- (c) ------------------------------------------------------------------------------------------
def test_heldout_digits_match_desktop_numpy(micro_page, desktop_mlp):
    digits = heldout_digits(per_class=1)[1::2]  # five held-out digits: classes 1, 3, 5, 7, 9
    results = micro_page.evaluate(
        "async (inputs) => { const out = []; for (const x of inputs) out.push(await window.cindersDemo.predict(x)); return out; }",
        [pixels for pixels, _ in digits])
    assert len(results) == len(digits)
    worst_seen = 0.0
    for (pixels, label), got in zip(digits, results):
        want = desktop_logits(desktop_mlp, pixels)
        assert len(got["logits"]) == 10
        assert got["class"] == max(range(10), key=want.__getitem__), (label, got, want)
        worst = max(abs(a - b) for a, b in zip(got["logits"], want))
        assert worst <= 1e-4, "digit %d: logits differ by %g from cn.NumPy()" % (label, worst)
        worst_seen = max(worst_seen, worst)
        assert abs(sum(got["probabilities"]) - 1) < 1e-6
        assert got["engine"] == "wasm"  # cn.Wasm()'s kernels (the array engine: ?backend=python)
        assert got["class"] == label
    print("[mnist-micro parity] %d held-out digits, largest logit difference to cn.NumPy(): %.2g"
          % (len(digits), worst_seen))
