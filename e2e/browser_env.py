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



# Installed before a page's own scripts (page.add_init_script) by answers_input_while_loading: how
# long each pointerdown waited for the page's thread (event.timeStamp is when the browser received
# it) and the status and progress bar it met, the page's long tasks (> 50 ms), and when #status
# first read "ready".
WATCH_THE_PAGES_THREAD = """
window.inputDelays = [];
addEventListener('pointerdown', (event) => {
    const text = (selector) => document.querySelector(selector) ? document.querySelector(selector).textContent : '';
    const bar = document.querySelector('#load-progress');
    window.inputDelays.push({ms: performance.now() - event.timeStamp, status: text('#status'),
                             bar: bar && !bar.hidden ? bar.value : null, bytes: text('#load-bytes')});
}, true);
window.longTasks = [];
new PerformanceObserver((list) => { for (const e of list.getEntries()) window.longTasks.push([e.startTime, e.duration]); })
    .observe({type: 'longtask', buffered: true});
window.readyAt = null;
addEventListener('DOMContentLoaded', () => {
    const status = document.querySelector('#status');
    const seen = () => { if (window.readyAt === null && status.textContent === 'ready') window.readyAt = performance.now(); };
    new MutationObserver(seen).observe(status, {childList: true, characterData: true, subtree: true});
});
"""


def answers_input_while_loading(page, url, poke, name):
    """Open `url` in `page` and poke(page, i) (one input: a click, a stroke) every 20 ms until
    #status reads ready; assert that the page's thread answered while the model loaded (in a
    worker): nine in ten inputs within 100 ms, and no task on the page's thread over 500 ms (on
    two cores shared with other sessions a task of the page sometimes waits for a core, up to
    200 ms seen; a Pyodide started on the page's thread is one task of 1-18 s). Returns the
    inputs answered while loading ({ms, status, bar: #load-progress's value or None when hidden,
    bytes: #load-bytes' text})."""
    page.add_init_script(WATCH_THE_PAGES_THREAD)
    page.goto(url)
    page.wait_for_selector("#status")
    pokes = 0
    status = page.text_content("#status")
    while status != "ready" and not status.startswith("error"):
        poke(page, pokes)
        pokes += 1
        page.wait_for_timeout(20)
        status = page.text_content("#status")
    wait_ready(page)
    delays, long_tasks, ready_at = page.evaluate("() => [window.inputDelays, window.longTasks, window.readyAt]")
    long_tasks = [(t, d) for t, d in long_tasks if t < ready_at]   # while loading
    inputs = [d for d in delays if d["status"] != "ready"]
    while_loading = sorted(d["ms"] for d in inputs)
    print("[%s] %d inputs answered while loading: median %.0f ms, slowest %.0f ms; long tasks on the "
          "page's thread while loading (ready at %.0f ms): %s" % (
              name, len(while_loading), while_loading[len(while_loading) // 2] if while_loading else -1,
              max(while_loading, default=-1), ready_at, ["%.0f ms at %.0f ms" % (d, t) for t, d in long_tasks]))
    assert len(while_loading) >= 5, "the page answered %d inputs while loading" % len(while_loading)
    assert while_loading[len(while_loading) * 9 // 10] < 100, while_loading
    assert [d for _, d in long_tasks if d > 500] == [], long_tasks
    return inputs


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
