"""Playwright end-to-end fixtures: Debian Chromium (headless, WebGPU on SwiftShader) against the
demo server, started here on 127.0.0.1 and stopped at the end of the session.

Run: .venv/bin/python -m pytest e2e -q      (about 2-3 minutes on 2 busy cores)
Chromium: $CINDERS_CHROMIUM or /usr/lib/chromium/chromium (never `playwright install`).

test_mnist_page.py      the drawing page: WebGPU ready, mouse/touch/pen drawing, held-out digits
                        equal to cn.NumPy() on the desktop, CPU fallback, the conformance table
                        replayed on the browser's WebGPU device, async/JSPI reads
test_pyscript_and_offline.py   the PyScript example; no page requests anything off 127.0.0.1
test_mnist_micro_page.py       the MicroPython-wasm page (/mnist-micro/): both loaders ready on
                               cpu, drawing, held-out digits equal to cn.NumPy(), local requests only

Flags (and which WebGPU flags give an adapter here): browser_env.py. One WebGPU browser per
session (pytest-playwright's `browser`, launched with our `browser_type_launch_args`); the MNIST
page is loaded once per session (`mnist_page`) and shared by the tests that only read from it.

Every page opens in a context whose requests are checked: anything not addressed to the test
server (http://127.0.0.1:<port>/) is aborted and recorded, and the test that made it fails.
"""
import pytest

from cinders.web.server import DemoServer, ensure_setup

from browser_env import CHROMIUM, QUIET_FLAGS, WEBGPU_FLAGS, wait_ready


@pytest.fixture(scope="session")
def demo_server():
    ensure_setup()
    server = DemoServer(port=0).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def browser_type_launch_args():
    # pytest-playwright's `browser` fixture launches with these.
    return {"executable_path": CHROMIUM, "headless": True, "args": QUIET_FLAGS + WEBGPU_FLAGS}


class OutsideRequests:
    """Aborts and records every request that does not go to the test server."""

    def __init__(self, server):
        self.allowed = server.url  # "http://127.0.0.1:<port>/"
        self.seen = []

    def _outside(self, url):
        return not url.startswith((self.allowed, "data:", "blob:"))

    def attach(self, context):
        # The listener records (it sees every request); the route makes sure none gets out.
        context.on("request", lambda request: self._outside(request.url) and self.seen.append(request.url))
        context.route("**/*", lambda r: r.abort() if self._outside(r.request.url) else r.continue_())
        return context


@pytest.fixture(scope="session")
def outside_requests(demo_server):
    return OutsideRequests(demo_server)


@pytest.fixture(scope="session")
def new_page(browser, demo_server, outside_requests):
    """new_page(path, browser=None) -> a page in a fresh guarded context, console echoed."""
    contexts = []

    def open_page(path, on_browser=None):
        context = outside_requests.attach((on_browser or browser).new_context())
        contexts.append(context)
        page = context.new_page()
        page.on("console", lambda m: print("[console.%s] %s" % (m.type, m.text)))
        page.on("pageerror", lambda e: print("[pageerror] %s" % (e,)))
        page.goto(demo_server.url + path.lstrip("/"))
        return page

    yield open_page
    for context in contexts:
        try:
            context.close()
        except Exception:  # the browser that owned it may be closed already
            pass


@pytest.fixture(scope="session")
def mnist_page(new_page):
    """The MNIST page on WebGPU, loaded once for the session, with Pyodide on the page's thread
    (?worker=0) so tests can run Python in it (window.cindersDemo.model.runtime.pyodide)."""
    return wait_ready(new_page("/?worker=0"))


@pytest.fixture(autouse=True)
def no_outside_requests(outside_requests):
    before = len(outside_requests.seen)
    yield
    assert outside_requests.seen[before:] == [], "requests left 127.0.0.1: %s" % outside_requests.seen[before:]
