"""MicroPython with ulab built from source (micro/firmware.py) and the ulab engine on it.

Three unix-port builds, as boards ship them: float32 with 4-D ulab, float32 with stock 2-D ulab,
and double with 2-D (the unix port's default). On each, .mpy bundles of the trained MLP and CNN,
float32 and int8, run under `-X heapsize=160K` (an ESP32's free heap; the array engine's
figure) on real held-out digits and must match cn.NumPy() to 1e-4; the engine must detect the
build's float width and dims itself. A frozen firmware (`export-micro --freeze`) runs the int8
CNN with no code on the heap. Builds are cached under .cache/firmware (first run ~30 s each).
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import cinders as cn
from cinders import record
from cinders.errors import FirmwareError, FirmwareSourcesMissing
from cinders.micro import export, firmware

import firmware_support as fs
from test_micro import all_layers_model

HEAP = "160K"


@pytest.fixture(scope="session", params=sorted(fs.UNIX_BUILDS))
def unix_build(request):
    return request.param, fs.build(port="unix", **fs.UNIX_BUILDS[request.param])


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    return fs.records(str(tmp_path_factory.mktemp("records")))


@pytest.fixture(scope="module")
def bundles(records, tmp_path_factory):
    d = tmp_path_factory.mktemp("bundles")
    out = {}
    for kind, path in records.items():
        out[kind] = str(d / kind)
        export.export_micro(path, out[kind], mpy=True)
    return out


def _run(exe, bundle, input_path, heap=HEAP):
    r = subprocess.run([exe, "-X", "heapsize=" + heap, "predict.py", input_path], cwd=bundle,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, "predict.py failed at heap %s in %s:\n%s%s" % (
        heap, bundle, r.stdout[-2000:], r.stderr[-2000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_engine_detects_float_width_and_dims(unix_build, bundles):
    name, fw = unix_build
    code = ("import sys; sys.path.insert(0, 'lib')\nimport ulab, cinders\nfrom cinders import _ulab\n"
            "print(ulab.__version__, cinders.ENGINE, _ulab.FLOAT_BYTES, _ulab.DIMS)")
    r = subprocess.run([fw.path, "-c", code], cwd=bundles["mlp"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    version, engine, float_bytes, dims = r.stdout.split()
    assert version.startswith("6.12.0-%dD" % fw.dims), version
    assert (engine, int(float_bytes), int(dims)) == ("ulab", 4 if fw.float == "float" else 8, fw.dims)


@pytest.mark.parametrize("kind", ["mlp", "mlp-int8", "cnn", "cnn-int8"])
def test_ulab_engine_matches_numpy_at_160k(unix_build, bundles, records, kind, tmp_path):
    _, fw = unix_build
    for i, (pixels, _) in enumerate(fs.digits(2 if kind.startswith("mlp") else 1)):
        path = fs.write_digit(pixels, str(tmp_path / ("d%d.json" % i)))
        fs.check_answer(_run(fw.path, bundles[kind], path), records[kind], pixels, "ulab")


def test_every_layer_on_ulab(unix_build, tmp_path):
    """Strides, padding, dilation, overlapping and padded pools (not folded into the bands),
    both average modes, folded BatchNorm, GELU, Sigmoid, Tanh, Softmax."""
    _, fw = unix_build
    model, src = all_layers_model(tmp_path)
    path = str(tmp_path / "all.safetensors")
    record.save(model, path)
    bundle = str(tmp_path / "bundle")
    export.export_micro(path, bundle, model_file=str(src), mpy=True, input_shape=(1, 28, 28))
    pixels = fs.digits(1)[0][0]
    got = _run(fw.path, bundle, fs.write_digit(pixels, str(tmp_path / "d.json")))
    want = model(cn.tensor(pixels, backend=cn.NumPy()).reshape(1, 1, 28, 28)).tolist()[0]
    assert got["engine"] == "ulab"
    np.testing.assert_allclose(got["logits"], want, rtol=1e-4, atol=1e-5)


def test_frozen_firmware_runs_the_int8_cnn(records, tmp_path):
    """export-micro --freeze writes frozen/ + manifest.py; the firmware built from it runs
    predict.py with no runtime or model source in the bundle, in less heap than from .mpy."""
    bundle = str(tmp_path / "frozen-bundle")
    r = subprocess.run([sys.executable, "-m", "cinders", "export-micro", records["cnn-int8"],
                        "--out", bundle, "--freeze"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    manifest = os.path.join(bundle, "manifest.py")
    assert "package(\"cinders\", base_path=\"frozen\")" in open(manifest).read()
    assert sorted(os.listdir(bundle)) == ["frozen", "manifest.py", "model.safetensors", "predict.py"]
    fw = fs.build(port="unix", float="float", dims=4, manifest=manifest)
    assert fw.frozen and "frozen" in fw.name
    pixels = fs.digits(1)[0][0]
    got = _run(fw.path, bundle, fs.write_digit(pixels, str(tmp_path / "d.json")), heap="96K")
    fs.check_answer(got, records["cnn-int8"], pixels, "ulab")
    # the code really is frozen: nothing on the filesystem to import it from
    r = subprocess.run([fw.path, "-c", "import cinders.run, model; print(cinders.run.__file__)"],
                       cwd=str(tmp_path), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "cinders/run.py", r.stdout + r.stderr


def test_build_is_cached_and_keyed_by_options(unix_build):
    _, fw = unix_build
    again = fs.build(port="unix", float=fw.float, dims=fw.dims)
    assert again.path == fw.path and os.path.exists(fw.path)
    with open(os.path.join(os.path.dirname(fw.path), "firmware.json")) as f:
        info = json.load(f)
    assert (info["float"], info["dims"], info["port"]) == (fw.float, fw.dims, "unix")


def test_firmware_errors_name_the_fix(monkeypatch, tmp_path):
    monkeypatch.delenv("CINDERS_MICROPYTHON_SRC", raising=False)
    monkeypatch.setenv("CINDERS_ULAB_SRC", str(tmp_path))
    with pytest.raises(FirmwareSourcesMissing, match="CINDERS_MICROPYTHON_SRC is not set"):
        firmware.build(port="unix")
    monkeypatch.setenv("CINDERS_MICROPYTHON_SRC", str(tmp_path / "nothing.tar.gz"))
    with pytest.raises(FirmwareSourcesMissing, match="no such file"):
        firmware.build(port="unix")
    with pytest.raises(FirmwareError, match="float must be"):
        firmware.build(port="unix", float="half")
    with pytest.raises(FirmwareError, match="heapsize"):
        firmware.build(port="unix", heap=65536)
    with pytest.raises(FirmwareError, match="manifest .* not found"):
        firmware.build(port="unix", manifest=str(tmp_path / "manifest.py"))
