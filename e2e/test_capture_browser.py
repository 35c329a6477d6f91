"""cn.capture in real headless Chromium (Pyodide + WebGPU on SwiftShader): replays of the MNIST
CNN equal uncaptured runs, one submit (one call into JS) per replay, and guards raise as on the
desktop (a Python branch that changes the kernels). Speed: benchmarks/browser.py."""
import json

from browser_env import run_python


def test_captured_forward_in_the_browser(mnist_page):
    got = json.loads(run_python(mnist_page, """
import json
import cinders as cn
from cinders.models.mnist import MnistCNN
from cinders.web.bridge import current_backend
out = {}
previous = cn.default_backend()
for name, backend in (("wgpu", current_backend()), ("fusion", cn.Fusion(current_backend()))):
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
    with cn.profile(backend) as p:
        y = fast(x)
    await y.to_data_async()
    out[name] = {"diff": max(diffs), "captures": counts[0], "replays": counts[1],
                 "submits": p.submits, "kernels": p.kernel_launches}
backend = current_backend()
cn.set_default_backend(backend)
calls = [0]
def branches(x):
    calls[0] += 1
    return x.exp() if calls[0] % 2 else x.tanh()
guarded = cn.capture(branches)
x = cn.tensor([1.0, 2.0], backend=backend)
guarded(x)
guarded(x)
try:
    guarded(x)
    out["guard"] = "no error"
except cn.CaptureError as e:
    out["guard"] = str(e)
cn.set_default_backend(previous)
json.dumps(out)
"""))
    for name in ("wgpu", "fusion"):
        r = got[name]
        assert r["diff"] <= 1e-5, r
        assert (r["captures"], r["replays"]) == (1, 2), r
        assert r["submits"] == 1 and r["kernels"] >= 5, r
    # The line (code run by runPythonAsync is the file "<exec>"; its line 51 is the read).
    assert "different kernel sequence" in got["guard"], got["guard"]
