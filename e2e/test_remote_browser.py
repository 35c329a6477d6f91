"""cn.Remote in a real page: Pyodide on the browser's own WebSocket, against a `serve-backend`
server started here on 127.0.0.1. Ops are sent as the page computes, values are awaited
(`await t.to_data_async()`), and they equal cn.NumPy()'s on the desktop; a blocking read says
how to read instead."""
import json
import secrets

import numpy as np

import cinders as cn
from cinders.remote_server import BackendServer

from browser_env import run_python

PAGE_CODE = """
import json
import cinders as cn
remote = await cn.Remote.open("%(url)s", token="%(token)s")
x = cn.tensor([[1.0, -2.0], [3.0, 4.0]], backend=remote)
y = (x.relu() @ x.T).softmax(axis=-1)
backend = cn.Autodiff(remote)
w = cn.tensor([[0.5, -1.0], [2.0, 0.25]], backend=backend).require_grad()
loss = (w @ w).gelu().sum()
grads = loss.backward()
out = {"y": await y.to_data_async(), "loss": await loss.to_data_async(),
       "grad": await w.grad(grads).to_data_async()}
try:
    x.tolist()
    out["blocking"] = "no error"
except cn.CindersError as e:
    out["blocking"] = str(e)
out["after"] = await (x * 2.0).to_data_async()  # the failed read sent nothing: still in step
remote.close()
json.dumps(out)
"""


def test_a_page_computes_on_a_remote_backend(mnist_page):
    lines, token = [], secrets.token_hex(16)
    server = BackendServer(cn.NumPy(), token, host="127.0.0.1", port=0, log=lines.append).start()
    try:
        got = json.loads(run_python(mnist_page, PAGE_CODE % {"url": "ws://127.0.0.1:%d" % server.port,
                                                             "token": token}))
    finally:
        server.stop()
    backend = cn.Autodiff(cn.NumPy())
    x = cn.tensor([[1.0, -2.0], [3.0, 4.0]], backend=cn.NumPy())
    w = cn.tensor([[0.5, -1.0], [2.0, 0.25]], backend=backend).require_grad()
    loss = (w @ w).gelu().sum()
    np.testing.assert_allclose(got["y"], (x.relu() @ x.T).softmax(axis=-1).numpy(), rtol=1e-6)
    np.testing.assert_allclose(got["loss"], loss.item(), rtol=1e-6)
    np.testing.assert_allclose(got["grad"], w.grad(loss.backward()).numpy(), rtol=1e-6)
    assert "await t.to_data_async()" in got["blocking"]
    assert got["after"] == [[2.0, -4.0], [6.0, 8.0]]
    assert any(" ops, 4 reads" in line for line in lines), lines
