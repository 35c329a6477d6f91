"""cn.Wasm()'s threaded build in the MNIST page (`cinders serve` sends COOP/COEP, so the page is
cross-origin isolated): the page starts the pool (wasm/kernel_threads.mjs) in its Pyodide worker
and on the page's own thread (?worker=0: the calling thread spins), the threads share the
products, and the digits' logits are the single-threaded build's, bit for bit."""
import pytest

from browser_env import wait_ready
from digit_strokes import heldout_digits

PREDICT_ALL = ("async (inputs) => { const out = []; for (const x of inputs) "
               "out.push((await window.cindersDemo.predict(x)).logits); return out; }")


@pytest.fixture(scope="module")
def digits():
    return [pixels for pixels, _ in heldout_digits(per_class=1)]


@pytest.fixture(scope="module")
def single_logits(new_page, digits):
    page = wait_ready(new_page("/?backend=wasm&threads=1"))
    assert page.evaluate("() => window.cindersDemo.model.wasmThreads") == 1
    return page.evaluate(PREDICT_ALL, digits)


def test_the_page_is_isolated_and_runs_the_threaded_build_in_its_worker(new_page, digits, single_logits):
    page = wait_ready(new_page("/?backend=wasm"))
    assert page.evaluate("() => crossOriginIsolated")
    cores = page.evaluate("() => navigator.hardwareConcurrency")
    assert page.evaluate("() => window.cindersDemo.model.wasmThreads") == max(1, min(cores, 4))
    assert page.evaluate(PREDICT_ALL, digits) == single_logits


def test_threads_on_the_pages_own_thread_share_the_work_and_answer_the_same(new_page, digits, single_logits):
    page = wait_ready(new_page("/?backend=wasm&worker=0&threads=3"))
    assert page.evaluate("() => window.cindersDemo.model.wasmThreads") == 3
    jobs = ("() => window.cindersDemo.model.runtime.pyodide.runPython("
            "'from cinders.wasm import engine_browser as e; e.loaded_engine().call(\"pool_jobs\")')")
    assert page.evaluate("() => window.cindersDemo.model.runtime.pyodide.runPython("
                         "'import cinders as cn; cn.Wasm().threads')") == 3
    before = page.evaluate(jobs)
    assert page.evaluate(PREDICT_ALL, digits) == single_logits
    assert page.evaluate(jobs) - before >= len(digits)   # (the convolutions and the first Linear)
