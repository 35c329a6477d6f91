"""A plain `pip install` of the wheel that `python -m build` makes, in fresh virtual environments
that see nothing of the developer's: every command that needs no optional dependency works
(predict, import-onnx, export-micro, setup-web, export-web + serve checked in Chromium, demo),
and a missing extra or missing browser packages are one line that says what to install or run.
"""
import json
import os
import shutil
import subprocess
import sys
import tomllib
import urllib.request
import zipfile

import numpy as np
import pytest

import cinders as cn
from cinders.assets import REPO_ROOT
from cinders.data.mnist import MnistDigits
from cinders.extras import EXTRA_OF_MODULE

import install_support as inst

MODELS = os.path.join(REPO_ROOT, "web_demos", "models")
POINT_MODEL = '''
from cinders import nn


class PointNet(nn.Module):
    """A user's own model of 2-D points."""

    def __init__(self, hidden=8):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(2, hidden), nn.Tanh(), nn.Linear(hidden, 3))

    def forward(self, x):
        return self.layers(x)
'''


@pytest.fixture(scope="module")
def wheel():
    return inst.built_wheel()


@pytest.fixture(scope="module")
def plain(wheel, tmp_path_factory):
    """bin/ of a fresh venv holding the wheel and nothing else."""
    return inst.fresh_venv(tmp_path_factory.mktemp("venv-plain"), wheel)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    return inst.user_env(inst.private_cache(tmp_path_factory.mktemp("cache") / "cinders"))


def one_line_error(r):
    assert r.returncode == 1, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cinders: "), r.stderr
    return lines[0]


def held_out_digit(folder):
    image, label = MnistDigits("heldout")[0]
    with open(os.path.join(folder, "digit.json"), "w") as f:
        json.dump([float(v) for v in image], f)
    return np.asarray(image, dtype=np.float32), label


def test_wheel_carries_the_web_assets_and_no_generated_files(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in ("cinders/web/assets/wasm/cinders.js", "cinders/web/assets/wasm/package.json",
                 "cinders/web/assets/wasm/precompile.mjs", "cinders/web/assets/web_demos/mnist/index.html",
                 "cinders/web/assets/web_demos/onnx/app.js", "cinders/web/assets/web_demos/model/index.html",
                 "cinders/web/assets/web_demos/models/mnist-cnn.safetensors",
                 "cinders/micro/runtime/cinders/__init__.py", "cinders/wasm/runtime.h", "cinders/cli.py"):
        assert name in names, name
    assert not [n for n in names if "/bundle/" in n or "__pycache__" in n or n.startswith("tests/")]


def test_plain_install_predicts_in_pure_python(plain, env, tmp_path):
    assert inst.run(plain, ["cinders", "--version"], tmp_path, env).stdout.strip() == "cinders " + cn.__version__
    shutil.copyfile(os.path.join(MODELS, "mnist-cnn.safetensors"), tmp_path / "mnist-cnn.safetensors")
    image, label = held_out_digit(tmp_path)
    out = json.loads(inst.run(plain, ["cinders", "predict", "mnist-cnn.safetensors", "digit.json"], tmp_path, env).stdout)
    want = cn.load_model(os.path.join(MODELS, "mnist-cnn.safetensors"), backend=cn.NumPy())(
        cn.tensor(image.reshape(1, 1, 28, 28), backend=cn.NumPy())).numpy()[0]
    assert out["class"] == label == int(want.argmax())
    np.testing.assert_allclose(out["logits"], want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("argv, extra", [
    (["predict", "mnist-cnn.safetensors", "digit.json", "--backend", "numpy"], "numpy"),
    (["predict", "mnist-cnn.safetensors", "digit.json", "--backend", "wgpu"], "wgpu"),
    (["serve-backend", "--backend", "python", "--token", "secret-token", "--port", "0"], "remote"),
    (["train", "--dataset", "mnist", "--model", "mlp", "--train-limit", "64", "--out", "t.safetensors"], "numpy"),
])
def test_a_missing_extra_is_named(plain, env, tmp_path, argv, extra):
    shutil.copyfile(os.path.join(MODELS, "mnist-cnn.safetensors"), tmp_path / "mnist-cnn.safetensors")
    held_out_digit(tmp_path)
    line = one_line_error(inst.run(plain, ["cinders", *argv], tmp_path, env, check=False))
    assert "pip install 'cinders[%s]'" % extra in line, line


def test_a_missing_extra_is_named_in_python_too(plain, env, tmp_path):
    code = ("import cinders as cn\ntry:\n    cn.NumPy()\nexcept ImportError as e:\n    print(type(e).__name__, e)\n"
            "print(cn.default_backend().name)")
    out = inst.run(plain, ["python", "-c", code], tmp_path, env).stdout.splitlines()
    assert out == ["MissingExtraError this needs the optional package numpy: pip install 'cinders[numpy]'",
                   cn.Python().name]


def test_missing_browser_packages_say_run_setup_web(plain, tmp_path):
    empty = inst.user_env(str(tmp_path / "empty-cache"))
    user_model(tmp_path)
    for argv in (["export-web", "point.safetensors", "--model-source", "point_model.py", "--out", "site"],
                 ["train", "--dataset", "mnist", "--out", "x.safetensors"], ["demo", "--no-open"]):
        line = one_line_error(inst.run(plain, ["cinders", *argv], tmp_path, empty, check=False))
        assert "run `cinders setup-web` once" in line, line
    assert not (tmp_path / "site").exists()


def user_model(folder):
    """The user's model source and a saved, run record (input shape recorded); the desktop's
    outputs on four points."""
    (folder / "point_model.py").write_text(POINT_MODEL)
    sys.path.insert(0, str(folder))
    try:
        import point_model
        cn.manual_seed(3)
        model = point_model.PointNet(hidden=8).to(cn.NumPy())
        x = np.random.default_rng(1).normal(size=(4, 2)).astype(np.float32)
        want = model(cn.tensor(x, backend=cn.NumPy())).numpy()
        model.save(str(folder / "point.safetensors"))
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("point_model", None)
    return x, want


def test_setup_web_then_export_web_and_serve_run_in_chromium(plain, env, tmp_path):
    r = inst.run(plain, ["cinders", "setup-web"], tmp_path, env, timeout=600)
    assert "browser packages: " in r.stdout and "cn.Wasm() kernels: " + env["CINDERS_CACHE"] in r.stdout, r.stdout
    x, want = user_model(tmp_path)
    r = inst.run(plain, ["cinders", "export-web", "point.safetensors", "--model-source", "point_model.py",
                         "--out", "site"], tmp_path, env)
    assert r.stdout.startswith("wrote ") and "run: cinders serve site" in r.stdout
    server, url = inst.start_server(plain, ["cinders", "serve", "site", "--port", "0"], tmp_path, env)
    try:
        backend, got, failed = inst.chromium_page_output(url, x.tolist())
    finally:
        inst.stop(server)
    assert backend == "wasm"
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert failed == []


def test_demo_serves_the_pages_from_the_installed_package(plain, env, tmp_path):
    inst.run(plain, ["cinders", "setup-web"], tmp_path, env, timeout=600)
    server, url = inst.start_server(plain, ["cinders", "demo", "--port", "0", "--no-open"], tmp_path, env)
    try:
        for path, source in (("", "web_demos/mnist/index.html"), ("onnx/", "web_demos/onnx/index.html"),
                             ("mnist-micro/", "web_demos/mnist-micro/index.html"), ("wasm/cinders.js", "wasm/cinders.js"),
                             ("models/mnist-mlp.safetensors", "web_demos/models/mnist-mlp.safetensors")):
            with urllib.request.urlopen(url + path) as resp, open(os.path.join(REPO_ROOT, source), "rb") as f:
                assert resp.read() == f.read(), path
        with urllib.request.urlopen(url + "wheels/cinders-wheel.json") as resp:
            wheel = json.load(resp)["wheel"]
        with urllib.request.urlopen(url + "wheels/" + wheel) as resp:
            assert resp.status == 200
        with urllib.request.urlopen(url + "mnist-micro/bundle/pyscript.json") as resp:
            assert "./model.safetensors" in json.load(resp)["files"]
    finally:
        inst.stop(server)
    # The bundle was written into the user's cache: an installed package is only read (it may be
    # read-only: a system site-packages, a container image).
    site = subprocess.run([os.path.join(plain, "python"), "-c", "import cinders, os; print(os.path.dirname(cinders.__file__))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert os.path.isdir(os.path.join(site, "web", "assets", "web_demos", "mnist-micro"))
    assert not os.path.exists(os.path.join(site, "web", "assets", "web_demos", "mnist-micro", "bundle"))
    assert os.path.exists(os.path.join(env["CINDERS_CACHE"], "mnist-micro-bundle", "pyscript.json"))


def test_import_onnx_without_the_onnx_package(plain, env, tmp_path):
    x, want = inst.onnx_mlp(tmp_path / "mlp.onnx")
    r = inst.run(plain, ["cinders", "import-onnx", "mlp.onnx", "--out", "models"], tmp_path, env)
    assert "wrote models/mlp.py and models/mlp.safetensors" in r.stdout, r.stdout
    use = r.stdout.strip().splitlines()[-1]
    assert use.startswith("use it: cd models && python -c"), use
    code = ("import json, cinders as cn; from mlp import Model; m = Model.load('mlp.safetensors'); "
            "print(json.dumps(m(cn.tensor(%s)).tolist()))" % json.dumps(x.tolist()))
    got = json.loads(inst.run(plain, ["python", "-c", code], tmp_path / "models", env).stdout)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_unsupported_onnx_nodes_are_one_readable_line(plain, env, tmp_path):
    import onnx
    from onnx import TensorProto, helper
    nodes = [helper.make_node("StringNormalizer", ["x" if i == 0 else "t%d" % (i - 1)], ["t%d" % i]) for i in range(200)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.STRING, [4])],
                              [helper.make_tensor_value_info("t199", TensorProto.STRING, [4])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "bad.onnx"))
    line = one_line_error(inst.run(plain, ["cinders", "import-onnx", "bad.onnx", "--out", "m"], tmp_path, env, check=False))
    assert "200 node(s) unsupported" in line and "StringNormalizer \u00d7200" in line and "\\x" not in line, line


def test_export_micro_writes_a_bundle_the_unix_port_runs(plain, env, tmp_path):
    x, want = user_model(tmp_path)
    r = inst.run(plain, ["cinders", "export-micro", "point.safetensors", "--model-source", "point_model.py",
                         "--out", "bundle"], tmp_path, env)
    assert "cd bundle && micropython predict.py" in r.stdout, r.stdout
    micropython = shutil.which("micropython") or os.path.join(os.path.dirname(sys.executable), "micropython")
    if not os.path.exists(micropython):
        pytest.skip("no MicroPython unix port here (the board extra installs one)")
    (tmp_path / "point.json").write_text(json.dumps(x[0].tolist()))
    out = inst.run(os.path.dirname(micropython), ["micropython", "predict.py", "../point.json"], tmp_path / "bundle", env)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    np.testing.assert_allclose(got["logits"], want[0], rtol=1e-4, atol=1e-4)


def test_every_extra_is_declared_and_documented():
    with open(os.path.join(REPO_ROOT, "pyproject.toml"), "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    with open(os.path.join(REPO_ROOT, "docs", "install.md")) as f:
        doc = f.read()
    for module, extra in EXTRA_OF_MODULE.items():
        assert any(dep.startswith(module) for dep in extras[extra]), (module, extra)
    for extra in ("numpy", "wgpu", "train", "onnx", "board", "wasm", "remote"):
        assert extra in extras and "`cinders[%s]`" % extra in doc, extra
