"""In-place results (wgpu_backend/pool.py) on the browser's WebGPU device: a chain of
temporaries writes into one buffer, held tensors are never overwritten, and the values equal
the desktop's."""
import json
import math

from browser_env import run_python


def test_temporaries_give_their_buffers_in_the_browser(mnist_page):
    got = json.loads(run_python(mnist_page, """
import json
import cinders as cn
from cinders.web.bridge import current_backend
gpu = current_backend()
x = cn.tensor([float(i) / 8 for i in range(8)], backend=gpu)
held = x + 1
before = gpu.memory_stats()["inplace"]
out = ((x * 2).exp() + held) - 1     # exp, `+ held` and `- 1` all write into the buffer of `x * 2`
count = gpu.memory_stats()["inplace"] - before
json.dumps({"backend": gpu.name, "count": count, "out": await out.to_data_async(),
            "held": await held.to_data_async(), "x": await x.to_data_async()})
"""))
    values = [i / 8 for i in range(8)]
    assert got["backend"] == "wgpu"
    assert got["count"] == 3
    assert got["x"] == values
    assert got["held"] == [v + 1 for v in values]
    for a, v in zip(got["out"], values):
        assert math.isclose(a, math.exp(2 * v) + v + 1 - 1, rel_tol=1e-5)
