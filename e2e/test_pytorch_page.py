"""load_pytorch in the browser: Pyodide (no NumPy, no torch) in headless Chromium fetches .pt
files written by torch.save from the demo server and reads them with the pure-Python reader;
the values equal torch's."""
import json

import numpy as np
import pytest
import torch

from browser_env import run_python


@pytest.fixture(scope="module")
def checkpoints(demo_server, tmp_path_factory):
    """The .pt files made here, served by the session's demo server under /checkpoints/."""
    folder = tmp_path_factory.mktemp("checkpoints")
    torch.manual_seed(0)
    base = torch.randn(3, 4)
    state = {"w": base, "col": base[:, 1], "t": base.t(), "h": torch.randn(5).half(), "bf": torch.randn(2).bfloat16(),
             "n": torch.tensor(42), "i8": torch.tensor([-3, 7], dtype=torch.int8), "b": torch.tensor([True, False]),
             "e": torch.zeros(0, 2), "s": torch.tensor(1.5)}
    torch.save({"model": state, "epoch": 3}, folder / "zip.pt")
    torch.save(state, folder / "legacy.pt", _use_new_zipfile_serialization=False)
    (folder / "evil.pt").write_bytes(b"\x80\x02cos\nsystem\n(X\x04\x00\x00\x00truetR.")
    handler = demo_server.httpd.RequestHandlerClass  # the server's mounts: add ours in front for this module
    served = handler.mounts
    handler.mounts = (("/checkpoints/", str(folder)),) + served
    yield state
    handler.mounts = served


def test_pyodide_reads_torch_checkpoints_fetched_from_the_server(mnist_page, checkpoints):
    state = checkpoints
    got = json.loads(run_python(mnist_page, """
import json, sys
import cinders as cn
from cinders.record import load_pytorch
from pyodide.http import pyfetch
out = {"numpy": "numpy" in sys.modules}
for name in ("zip.pt", "legacy.pt"):
    data = await (await pyfetch("/checkpoints/" + name)).bytes()
    loaded = load_pytorch(data, backend=cn.Python())
    out[name] = {"key": loaded.key, "other": loaded.other,
                 "tensors": {k: [list(t.shape), t.dtype.name, t.tolist()] for k, t in loaded.items()}}
try:
    load_pytorch(await (await pyfetch("/checkpoints/evil.pt")).bytes(), backend=cn.Python())
    out["evil"] = "loaded"
except cn.RecordError as e:
    out["evil"] = str(e)
json.dumps(out)
"""))
    assert got["numpy"] is False  # the pure-Python path: array/struct decoding
    assert got["zip.pt"]["key"] == "model" and got["zip.pt"]["other"] == {"epoch": "int 3"}
    assert got["legacy.pt"]["key"] is None
    for name in ("zip.pt", "legacy.pt"):
        tensors = got[name]["tensors"]
        assert list(tensors) == list(state)
        for key, t in state.items():
            shape, dtype, values = tensors[key]
            assert shape == list(t.shape), (name, key)
            assert dtype == ("bool" if t.dtype is torch.bool else "float32" if t.is_floating_point() else "int32")
            want = t.float() if t.is_floating_point() else t
            np.testing.assert_array_equal(np.array(values, dtype=want.numpy().dtype).reshape(t.shape), want.numpy(),
                                          err_msg="%s %s" % (name, key))
    assert "refused global os.system" in got["evil"]
