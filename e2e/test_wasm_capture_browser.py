"""cn.capture on cn.Wasm() in real headless Chromium without WebGPU (Pyodide, the module called
through JS): replays of the MNIST CNN equal uncaptured runs, each replay is ONE call into the
module (run_commands), and the guards raise as on the desktop."""
import json

import pytest

from browser_env import QUIET_FLAGS, run_python, wait_ready


@pytest.fixture(scope="module")
def no_webgpu_browser(launch_browser):
    browser = launch_browser(args=QUIET_FLAGS)
    yield browser
    browser.close()


def test_captured_forward_on_wasm_in_the_page(new_page, no_webgpu_browser):
    page = wait_ready(new_page("/?worker=0", on_browser=no_webgpu_browser))  # Pyodide in the page
    assert page.text_content("#backend") == "wasm"
    got = json.loads(run_python(page, """
import json
import cinders as cn
from cinders.models.mnist import MnistCNN
from cinders.web.bridge import current_backend
backend = current_backend()
out = {"backend": repr(backend)}
previous = cn.default_backend()
cn.set_default_backend(backend)
cn.manual_seed(0)
model = MnistCNN().eval()
fast = cn.capture(model)
diffs = []
for i in range(5):
    x = cn.tensor([((i * 7 + j) % 13) / 13.0 for j in range(784)], backend=backend).reshape(1, 1, 28, 28)
    got, want = fast(x).tolist(), model(x).tolist()
    diffs.append(max(abs(a - b) for a, b in zip(got[0], want[0])))
out["diff"], out["captures"], out["replays"] = max(diffs), fast.captures, fast.replays
engine = backend.engine
calls = []
real_call = engine.call
engine.call = lambda name, *args: calls.append(name) or real_call(name, *args)
try:
    y = fast(x)
finally:
    del engine.call
out["calls"] = calls
out["replay_equals_eager"] = y.tolist() == model(x).tolist()
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
"""))
    assert got["backend"] == "cn.Wasm()", got
    assert got["diff"] <= 1e-6, got
    assert (got["captures"], got["replays"]) == (1, 2), got
    assert got["calls"] == ["run_commands"], got
    assert got["replay_equals_eager"], got
    assert "different kernel sequence" in got["guard"], got["guard"]
