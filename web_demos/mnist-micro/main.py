# The page's Python, run by MicroPython WebAssembly (through PyScript's <script type="mpy">,
# or loaded directly by app.js with ?loader=direct): the exported bundle's files are in /bundle
# (see bundle/pyscript.json); the model is the same cinders.nn source as on the desktop and on
# boards. Hands predict(pixels as base64 float32) -> result JSON to app.js.
import json
import sys
from array import array

try:
    import ubinascii as binascii  # the C module (this build's `binascii` is pure Python)
except ImportError:
    import binascii

import js

sys.path.insert(0, "/bundle/lib")
sys.path.insert(0, "/bundle")

import model  # noqa: E402
from cinders import ENGINE, record, run  # noqa: E402

# Weights stream from the in-memory filesystem as on a board: reading all 400 KB into arrays
# up front costs ~100 ms of start-up and makes inference no faster.
net = record.load_model("/bundle/model.safetensors", model)


def predict(pixels_b64):
    """784 float32 pixels as base64 (app.js) -> result JSON."""
    k, logits = run.predict(net, array("f", binascii.a2b_base64(pixels_b64)))
    top = max(logits)
    exps = [2.718281828459045 ** (v - top) for v in logits]
    total = sum(exps)
    return json.dumps({"class": k, "logits": logits, "probabilities": [e / total for e in exps],
                       "engine": ENGINE})


js.window.cindersMicroReady(predict, ENGINE)  # "wasm" when the page loaded cn.Wasm()'s kernels
