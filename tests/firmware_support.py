"""What tests/test_firmware.py and tests/test_board.py share: firmware built from the source
archives (skipped with the reason where CINDERS_MICROPYTHON_SRC / CINDERS_ULAB_SRC are unset;
.ci/run sets them, so CI builds), the trained records, real held-out digits, desktop answers."""
import contextlib
import json
import os
import re
import subprocess
import time

import numpy as np
import pytest

import cinders as cn
from cinders import record
from cinders.data.mnist import MnistDigits
from cinders.micro import firmware, quantize

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAINED = {"mlp": os.path.join(REPO, "web_demos", "models", "mnist-mlp.safetensors"),
           "cnn": os.path.join(REPO, "web_demos", "models", "mnist-cnn.safetensors")}
UNIX_BUILDS = {"float32-4d": dict(float="float", dims=4), "float32-2d": dict(float="float", dims=2),
               "float64-2d": dict(float="double", dims=2)}
TOLERANCE = dict(rtol=1e-4, atol=1e-4)  # float32 and double builds alike (observed <= 4e-6)


def build(**options):
    """firmware.build(**options); skipped (with the reason) only where the variables are unset:
    a variable naming a missing archive, or a failed build, fails the test."""
    if not any(os.environ.get(v) for v in firmware.SOURCE_ENV.values()):
        pytest.skip("firmware sources absent: set %s and %s to the archives in ../shared/vendor "
                    "(.ci/run does)" % tuple(firmware.SOURCE_ENV.values()))
    return firmware.build(**options)


@contextlib.contextmanager
def qemu_pty(fw):
    """The pty of the qemu firmware `fw` booted with its UART there; the emulator is stopped on
    leaving."""
    proc = subprocess.Popen(fw.qemu_command(serial="pty"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        port = None
        deadline = time.time() + 30
        while port is None and time.time() < deadline:
            line = proc.stdout.readline()
            m = re.search(r"(/dev/pts/\d+)", line)
            if m:
                port = m.group(1)
            elif not line and proc.poll() is not None:
                break
        if port is None:
            pytest.fail("qemu-system-arm did not open a pty: %s" % " ".join(fw.qemu_command()))
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def records(tmp_dir):
    """{"mlp", "cnn", "mlp-int8", "cnn-int8": record path} of the trained MNIST models."""
    for path in TRAINED.values():
        if not os.path.exists(path):
            pytest.fail("%s is missing: the trained records ship with the repository" % path)
    out = dict(TRAINED)
    for k in ("mlp", "cnn"):
        out[k + "-int8"] = quantize.quantize_file(TRAINED[k], os.path.join(tmp_dir, k + "-int8.safetensors"))
    return out


def digits(n):
    """n held-out digits of different classes: [(784 floats, label)]."""
    data = MnistDigits("heldout")
    picked, seen = [], set()
    for i in range(len(data)):
        image, label = data[i]
        if label not in seen:
            seen.add(label)
            picked.append(([float(v) for v in image], label))
            if len(picked) == n:
                break
    return picked


def write_digit(pixels, path):
    with open(path, "w") as f:
        json.dump(pixels, f)
    return path


def desktop_logits(record_path, pixels):
    model = record.load_model(record_path, backend=cn.NumPy())
    x = cn.tensor(pixels, backend=cn.NumPy()).reshape(1, 1, 28, 28)
    return model(x).tolist()[0]


def check_answer(got, record_path, pixels, engine):
    want = desktop_logits(record_path, pixels)
    assert got["engine"] == engine, got
    assert got["class"] == int(np.argmax(want)), (got, want)
    np.testing.assert_allclose(got["logits"], want, **TOLERANCE)
