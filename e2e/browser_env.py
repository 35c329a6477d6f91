"""What every e2e test and the browser benchmark share: the Chromium binary and its flags, waiting
for a page to be ready, and drawing on the MNIST pages (the DOM contract both pages keep).

WebGPU flags: `--enable-unsafe-webgpu` alone gives a SwiftShader adapter in headless Chromium 156
here, on http://127.0.0.1 (a secure context; navigator.gpu does not exist on about:blank).
`--enable-features=Vulkan`, `--use-angle=swiftshader` and `--use-webgpu-adapter=swiftshader`
change nothing on this machine; they are not needed. Without `--enable-unsafe-webgpu`,
navigator.gpu exists but requestAdapter() resolves to null (how the CPU-fallback test disables
WebGPU; `--disable-webgpu` does the same).
"""
import os

CHROMIUM = os.environ.get("CINDERS_CHROMIUM", "/usr/lib/chromium/chromium")
# Root in containers needs --no-sandbox; the rest keeps Chromium from calling home (the network
# is closed, and a test must see only its own requests).
QUIET_FLAGS = ["--no-sandbox", "--disable-background-networking", "--disable-component-update",
               "--disable-sync", "--no-first-run", "--disable-default-apps",
               "--disable-features=MediaRouter,OptimizationHints,Translate"]
WEBGPU_FLAGS = ["--enable-unsafe-webgpu"]
READY_TIMEOUT_MS = 120_000


def wait_ready(page, timeout=READY_TIMEOUT_MS):
    """Wait for #status to read `ready`; fail with what it says otherwise (error text)."""
    page.wait_for_function(
        "() => { const s = document.querySelector('#status'); "
        "return s && (s.textContent === 'ready' || s.textContent.startsWith('error')); }",
        timeout=timeout)
    status = page.text_content("#status")
    assert status == "ready", "page did not load: #status = %r" % status
    return page




def draw(page, strokes):
    """Draw unit-square strokes with the mouse over the middle 200x200 px of #digit-canvas."""
    box = page.locator("#digit-canvas").bounding_box()
    left, top = box["x"] + (box["width"] - 200) / 2, box["y"] + (box["height"] - 200) / 2
    for stroke in strokes:
        x, y = stroke[0]
        page.mouse.move(left + 200 * x, top + 200 * y)
        page.mouse.down()
        for x, y in stroke[1:]:
            page.mouse.move(left + 200 * x, top + 200 * y, steps=2)
        page.mouse.up()


def assert_drawn_digits_recognised(page, digits, name, check=None):
    """Clear, draw and let the page settle on each of `digits` ({digit: strokes}); the bars follow
    each prediction (the tallest bar is the predicted digit) and at least 8 of 10 are right.
    check(page, prediction, bar widths in %) runs while each drawing is still on the canvas."""
    got = {}
    for digit, strokes in digits.items():
        page.click("#clear")
        assert page.text_content("#prediction") == ""
        draw(page, strokes)
        page.evaluate("() => window.cindersDemo.settled()")
        got[digit] = page.text_content("#prediction")
        widths = page.eval_on_selector_all(
            "#probabilities .fill", "bars => bars.map(b => parseFloat(b.style.width))")
        assert len(widths) == 10 and str(widths.index(max(widths))) == got[digit]
        if check:
            check(page, got[digit], widths)
    assert page.text_content("#inference-time").endswith(" ms")
    page.click("#clear")
    right = [d for d in digits if got[d] == str(d)]
    print("[%s drawn digits] %d of %d recognised: %s" % (name, len(right), len(digits), got))
    assert len(right) >= 8, "recognised %d of %d drawn digits: %s" % (len(right), len(digits), got)


def run_python(page, code):
    """Run `code` in the page's Pyodide (where the demo loaded cinders); its last expression."""
    return page.evaluate("""async (code) => {
        const py = window.cindersDemo.model.runtime.pyodide;
        return await py.runPythonAsync(code);
    }""", code)
