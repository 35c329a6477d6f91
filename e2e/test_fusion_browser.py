"""cn.Fusion in real headless Chromium (Pyodide + WebGPU): the conformance table's ops replayed
on cn.Fusion(the page's WebGPU backend) match the desktop, the GELU chain is one launch, and a
user WGSL kernel (cn.fusion.custom_op) runs inside a fused kernel there."""
import json
import math

from browser_env import run_python
from primitive_trace import replay_conformance_table


def test_conformance_ops_on_browser_fusion_match_desktop(mnist_page):
    # Replayed on a Fusion around the page's backend.
    failures, total = replay_conformance_table(mnist_page, "cn.Fusion(_page_backend)")
    assert not failures, "%d of %d ops differ on the browser's fused WebGPU:\n%s" % (
        len(failures), total, "\n".join(failures))


def test_gelu_chain_is_one_launch_and_custom_kernels_fuse_in_the_browser(mnist_page):
    got = json.loads(run_python(mnist_page, """
import json, math
import cinders as cn
from cinders.web.bridge import current_backend
fused = cn.Fusion(current_backend())
xs = [i / 10.0 - 3.0 for i in range(64)]
x = cn.tensor(xs, backend=fused)
with cn.profile(fused) as p:
    y = fused.realize(x * ((x / math.sqrt(2.0)).erf() + 1) / 2)
gelu_launches = p.kernel_launches
gelu = await fused.to_flat_async(y.handle)
swish = cn.fusion.custom_op("swish_f", wgsl="fn swish_f(x: f32) -> f32 { return x / (1.0 + exp(-x)); }")
with cn.profile(fused) as p:
    z = fused.realize(swish(x * 2.0) + 1.0)
swish_launches = p.kernel_launches
json.dumps({"gelu": gelu, "gelu_launches": gelu_launches, "swish": await fused.to_flat_async(z.handle),
            "swish_launches": swish_launches, "max_buffers": fused.compiler.max_buffers})
"""))
    xs = [i / 10.0 - 3.0 for i in range(64)]
    assert got["gelu_launches"] == 1 and got["swish_launches"] == 1
    for v, x in zip(got["gelu"], xs):
        assert abs(v - x * 0.5 * (1 + math.erf(x / math.sqrt(2)))) <= 1e-5
    for v, x in zip(got["swish"], xs):
        assert abs(v - (2 * x / (1 + math.exp(-2 * x)) + 1)) <= 1e-5
    assert got["max_buffers"] >= 8
