"""cn.capture in real headless Chromium, on each page backend: WebGPU (SwiftShader; plain and
under cn.Fusion) and cn.Wasm() (a browser without WebGPU, the module called through JS). Replays
of the MNIST CNN equal uncaptured runs, each replay is ONE call into JS (one GPU submit; one
`run_commands` call into the module), and the guards raise as on the desktop (a Python branch
that changes the kernels). Speed: benchmarks/browser.py."""
import json

import pytest

from browser_env import QUIET_FLAGS, run_python, wait_ready

# The stacks captured on each page, and how a replay's calls into JS are counted there.
CAPTURE_IN_PAGE = """
import json
import cinders as cn
from cinders.models.mnist import MnistCNN
from cinders.web.bridge import current_backend
STACKS = {"webgpu": ["wgpu", "fusion"], "wasm": ["wasm"]}[PAGE]


def calls_into_js(backend, run):
    '''What one replay asks of JS: its GPU submits, or its calls into the Wasm module.'''
    if PAGE == "webgpu":
        with cn.profile(backend) as p:
            run()
        return p.submits
    engine, calls = backend.engine, []
    real_call = engine.call
    engine.call = lambda name, *args: calls.append(name) or real_call(name, *args)
    try:
        run()
    finally:
        del engine.call
    return calls


out = {"backend": repr(current_backend())}
previous = cn.default_backend()
for name in STACKS:
    backend = cn.Fusion(current_backend()) if name == "fusion" else current_backend()
    cn.manual_seed(0)
    cn.set_default_backend(backend)  # created there: moving would read back (no JSPI here)
    model = MnistCNN().eval()
    fast = cn.capture(model)
    diffs = []
    for i in range(5):
        x = cn.tensor([((i * 7 + j) % 13) / 13.0 for j in range(784)], backend=backend).reshape(1, 1, 28, 28)
        got = await fast(x).to_data_async()
        want = await model(x).to_data_async()
        diffs.append(max(abs(a - b) for a, b in zip(got[0], want[0])))
    counts = (fast.captures, fast.replays)
    replayed = []
    calls = calls_into_js(backend, lambda: replayed.append(fast(x)))
    got, want = await replayed[0].to_data_async(), await model(x).to_data_async()
    diffs.append(max(abs(a - b) for a, b in zip(got[0], want[0])))
    out[name] = {"diff": max(diffs), "captures": counts[0], "replays": counts[1], "calls": calls}
backend = current_backend()
cn.set_default_backend(backend)
n = [0]
def branches(x):
    n[0] += 1
    return x.exp() if n[0] % 2 else x.tanh()
guarded = cn.capture(branches)
v = cn.tensor([1.0, 2.0], backend=backend)
guarded(v)
guarded(v)
try:
    guarded(v)
    out["guard"] = "no error"
except cn.CaptureError as e:
    out["guard"] = str(e)
cn.set_default_backend(previous)
json.dumps(out)
"""


@pytest.fixture(scope="module")
def no_webgpu_browser(launch_browser):
    browser = launch_browser(args=QUIET_FLAGS)
    yield browser
    browser.close()


@pytest.mark.parametrize("page_backend", ["webgpu", "wasm"])
def test_captured_forward_in_the_page(page_backend, request, new_page):
    if page_backend == "webgpu":
        page = request.getfixturevalue("mnist_page")
    else:
        page = wait_ready(new_page("/?worker=0", on_browser=request.getfixturevalue("no_webgpu_browser")))
        assert page.text_content("#backend") == "wasm"
    got = json.loads(run_python(page, "PAGE = %r\n" % page_backend + CAPTURE_IN_PAGE))
    if page_backend == "wasm":
        assert got["backend"] == "cn.Wasm()", got
    for name in {"webgpu": ("wgpu", "fusion"), "wasm": ("wasm",)}[page_backend]:
        r = got[name]
        assert r["diff"] <= {"webgpu": 1e-5, "wasm": 1e-6}[page_backend], r
        assert (r["captures"], r["replays"]) == (1, 2), r
        assert r["calls"] == {"webgpu": 1, "wasm": ["run_commands"]}[page_backend], r
    assert "different kernel sequence" in got["guard"], got["guard"]
