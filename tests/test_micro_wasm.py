"""The board runtime inside MicroPython WebAssembly (npm @micropython/micropython-webassembly-pyscript),
run by Node: the same bundle as on the unix port, the same answers as cn.NumPy()."""
import json
import os
import shutil
import subprocess

import numpy as np
import pytest

import cinders as cn
from cinders import record
from cinders.assets import web_deps_dir
from cinders.data.mnist import MnistDigits
from cinders.micro import export, quantize
from cinders.models.mnist import MnistCNN, MnistMLP

HERE = os.path.dirname(os.path.abspath(__file__))
RUNNER = os.path.join(HERE, "micro_wasm_run.mjs")
TRAINED = os.path.join(os.path.dirname(HERE), "web_demos", "models", "mnist-%s.safetensors")


def micropython_mjs():
    return os.path.join(web_deps_dir(), "@micropython", "micropython-webassembly-pyscript",
                        "micropython.mjs")


def run_in_wasm(bundle, input_path, repeat=0):
    """(prediction dict, timings dict) of one bundle run under Node."""
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is needed for the MicroPython WebAssembly tests (install Node.js 20)")
    r = subprocess.run([node, RUNNER, micropython_mjs(), bundle, input_path, str(repeat)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.strip().splitlines()
    return json.loads(lines[-2]), json.loads(lines[-1])


@pytest.fixture(scope="module")
def digit(tmp_path_factory):
    image, label = MnistDigits("heldout")[7]
    path = str(tmp_path_factory.mktemp("wasm") / "digit.json")
    with open(path, "w") as f:
        json.dump([float(v) for v in image], f)
    return path


def _record(kind, tmp_path):
    if os.path.exists(TRAINED % kind):
        return TRAINED % kind
    cn.manual_seed(3)
    path = str(tmp_path / ("%s.safetensors" % kind))
    record.save((MnistMLP() if kind == "mlp" else MnistCNN()).to(cn.NumPy()), path)
    return path


@pytest.mark.parametrize("kind,int8,mpy", [("mlp", False, False), ("mlp", True, True),
                                           ("cnn", False, True)],
                         ids=["mlp-py", "mlp-int8-mpy", "cnn-mpy"])
def test_wasm_bundle_matches_numpy(digit, tmp_path, kind, int8, mpy):
    rec = _record(kind, tmp_path)
    if int8:
        rec = quantize.quantize_file(rec, str(tmp_path / "int8.safetensors"))
        model = record.load_model(rec, backend=cn.NumPy())
    else:
        model = record.load_model(rec, backend=cn.NumPy())
    bundle = str(tmp_path / "bundle")
    export.export_micro(rec, bundle, mpy=mpy)
    got, timings = run_in_wasm(bundle, digit)
    with open(digit) as f:
        pixels = json.load(f)
    want = model(cn.tensor(pixels, backend=cn.NumPy()).reshape(1, 1, 28, 28)).tolist()[0]
    assert got["engine"] == "array"
    assert got["class"] == int(np.argmax(want))
    np.testing.assert_allclose(got["logits"], want, rtol=1e-4, atol=1e-4)
    assert timings["interpreter_ready_ms"] > 0
