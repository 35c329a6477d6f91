"""Where Cinders keeps what it downloads: the npm packages served to browsers (Pyodide,
MicroPython-wasm, PyScript, ONNX Runtime Web) and the MNIST digits. Nothing here is committed.

cache_dir()      $CINDERS_CACHE, else <repo>/.cache in a checkout, else ~/.cache/cinders
web_deps_dir()   cache_dir()/web/node_modules, installed from wasm/package.json by npm on demand
"""
import json
import os
import shutil
import subprocess
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PACKAGE_JSON = os.path.join(REPO_ROOT, "wasm", "package.json")


def in_checkout():
    return os.path.exists(os.path.join(REPO_ROOT, "pyproject.toml")) and os.path.isdir(
        os.path.join(REPO_ROOT, "wasm"))


def cache_dir():
    path = os.environ.get("CINDERS_CACHE")
    if not path:
        path = os.path.join(REPO_ROOT, ".cache") if in_checkout() else os.path.join(
            os.path.expanduser("~"), ".cache", "cinders")
    os.makedirs(path, exist_ok=True)
    return path


def _wanted_packages():
    with open(_PACKAGE_JSON) as f:
        return json.load(f)["dependencies"]


def _installed_version(node_modules, name):
    try:
        with open(os.path.join(node_modules, name, "package.json")) as f:
            return json.load(f).get("version")
    except OSError:
        return None


def web_deps_dir(install=True):
    """node_modules holding the pinned browser packages; runs `npm install` when any is missing."""
    web = os.path.join(cache_dir(), "web")
    node_modules = os.path.join(web, "node_modules")
    wanted = _wanted_packages()
    missing = [n for n, v in wanted.items() if _installed_version(node_modules, n) != v]
    if missing and install:
        if shutil.which("npm") is None:
            raise RuntimeError("npm is needed to fetch %s (install Node.js 20 and npm)" % ", ".join(missing))
        os.makedirs(web, exist_ok=True)
        shutil.copyfile(_PACKAGE_JSON, os.path.join(web, "package.json"))
        print("cinders: installing browser packages into %s: %s" % (web, ", ".join(missing)),
              file=sys.stderr, flush=True)
        subprocess.run(["npm", "install", "--no-fund", "--no-audit", "--loglevel=error"],
                       cwd=web, check=True)
    elif missing:
        raise FileNotFoundError("browser packages missing from %s: %s" % (node_modules, ", ".join(missing)))
    return node_modules
