"""The bundle behind the MicroPython-wasm MNIST page (web_demos/mnist-micro/).

`ensure_web_bundle()` exports the MLP record into the cache (<cache>/mnist-micro-bundle/,
rebuilt when the record or the runtime is newer; .mpy when mpy-cross is installed) and writes
pyscript.json there: PyScript's config naming the local MicroPython interpreter and every bundle
file to fetch into its filesystem under /bundle/. The demo server serves the page's files at
/mnist-micro/ and this folder at /mnist-micro/bundle/. The bundle lives in the cache, not beside
the page, because an installed package may be read-only.
"""
import json
import os

from ..assets import REPO_ROOT, cache_dir
from . import RUNTIME_DIR
from .export import export_micro, find_mpy_cross, runtime_sources

DEMO_DIR = os.path.join(REPO_ROOT, "web_demos", "mnist-micro")
DEFAULT_RECORD = os.path.join(REPO_ROOT, "web_demos", "models", "mnist-mlp.safetensors")
INTERPRETER_URL = "/node_modules/@micropython/micropython-webassembly-pyscript/micropython.mjs"
# PyScript plugins the page does not use; "!name" keeps PyScript from fetching them at start-up.
UNUSED_PLUGINS = ["!py-editor", "!py-game", "!py-terminal", "!donkey", "!deprecations-manager"]


def _newest(paths):
    return max(os.path.getmtime(p) for p in paths)


def web_bundle_dir():
    """Where the page's bundle is written and served from (/mnist-micro/bundle/)."""
    return os.path.join(cache_dir(), "mnist-micro-bundle")


def ensure_web_bundle(record=DEFAULT_RECORD, out=None):
    """Path of the page's bundle folder, (re)built when missing or stale."""
    out = out or web_bundle_dir()
    if not os.path.exists(record):
        raise FileNotFoundError("%s is missing: train it with `cinders train --dataset mnist` (the "
                                "MicroPython page runs the MLP)" % record)
    config_path = os.path.join(out, "pyscript.json")
    stamp_path = os.path.join(out, "source.json")
    runtime = [os.path.join(RUNTIME_DIR, "predict.py")] + [s for s, _ in runtime_sources()]
    stamp = {"record": os.path.abspath(record), "record_mtime": os.path.getmtime(record),
             "runtime_mtime": _newest(runtime)}
    try:
        with open(stamp_path) as f:
            if json.load(f) == stamp and os.path.exists(config_path):
                return out
    except (OSError, ValueError):
        pass
    try:  # precompiled runtime: the page skips compiling ~50 KB of source at start-up
        find_mpy_cross()
        mpy = True
    except FileNotFoundError:
        mpy = False
    files = export_micro(record, out, mpy=mpy)
    fetch = {}
    for path in files:
        rel = os.path.relpath(path, out).replace(os.sep, "/")
        if rel != "predict.py":  # the page runs its own entry, main.py
            fetch["./" + rel] = "/bundle/" + rel  # URLs relative to this config file
    with open(config_path, "w") as f:
        json.dump({"interpreter": INTERPRETER_URL, "files": fetch, "plugins": UNUSED_PLUGINS},
                  f, indent=1, sort_keys=True)
    with open(stamp_path, "w") as f:
        json.dump(stamp, f)
    return out
