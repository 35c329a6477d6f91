"""PyScript example: cinders loads the MNIST record and classifies an uploaded picture.

index.html runs this in a worker (`<script type="py" worker>`): Pyodide, cinders and the model stay
off the page's thread, so the page answers input while they load; `document` and `window` are the
page's, reached from the worker. pyscript.json starts Pyodide from cinders' memory snapshot
(/wasm/pyscript-pyodide.mjs, cinders already imported), copies the model record next to this
file, and exposes the demos' shared preprocessing (preprocess.js) and the page's progress
(progress.js) to Python.
"""
import math

import js
from pyodide.ffi import jsnull
from pyscript import document, when, window
from pyscript.js_modules import page, preprocess

import cinders as cn
from cinders import record
from cinders.web import bridge


def show(selector, text):
    document.querySelector(selector).textContent = text


# WebGPU when the browser has it (cinders.wgpu's browser device), else WebAssembly SIMD kernels
# (cn.Wasm()), else Python; say which. ?backend=webgpu|wasm|python forces one.
page.step("starting the backend")  # progress.js: one call to the page instead of one per element
prefer = js.URLSearchParams.new(window.location.search).get("backend") or "auto"
# The kernels' URL made absolute against the page: PyScript's worker runs from a blob: URL.
kernels = js.URL.new("/wasm-kernels/cinders-kernels.wasm", window.location.href).href
chosen = await bridge.init(prefer, kernels=kernels)  # noqa: F704  (PyScript runs this script with top-level await)
page.step("loading the model")
model = record.load_model("mnist-cnn.safetensors")  # class and config come from the record
forward = cn.capture(model)  # from the third call on: one replay of the recorded GPU kernels


def draw_preview(pixels):
    canvas = document.querySelector("#preview")
    context = canvas.getContext("2d")
    image = context.createImageData(28, 28)
    rgba = bytearray(4 * 28 * 28)
    for i, v in enumerate(pixels):
        rgba[4 * i:4 * i + 4] = bytes((int(255 * v),) * 3 + (255,))
    image.data.set(js.Uint8Array.new(rgba))  # one call to the page, not one per pixel
    context.putImageData(image, 0, 0)


@when("change", "#upload")
async def classify(event):
    files = event.target.files
    if not files.length:
        return
    show("#status", "classifying")
    bitmap = await window.createImageBitmap(files.item(0))
    canvas = document.createElement("canvas")
    canvas.width, canvas.height = bitmap.width, bitmap.height
    context = canvas.getContext("2d")
    context.drawImage(bitmap, 0, 0)
    image = context.getImageData(0, 0, bitmap.width, bitmap.height)
    field = preprocess.imageToMnist(preprocess.imageDataToGray(image), bitmap.width, bitmap.height)
    if field is None or field is jsnull:  # JS null arrives as pyodide.ffi.jsnull
        show("#result", "")
        show("#status", "no ink found in that picture")
        return
    pixels = field.to_py().tolist()
    draw_preview(pixels)
    logits = forward(cn.tensor(pixels).reshape(1, 1, 28, 28))
    values = (await logits.to_data_async())[0]  # the browser reads GPU results asynchronously
    best = max(range(10), key=values.__getitem__)
    total = sum(math.exp(v - values[best]) for v in values)
    show("#result", str(best))
    show("#confidence", "(%.1f%%)" % (100 / total))
    show("#status", "ready")


# "ready" only once the upload handler above is registered: an upload the moment the page says
# ready would otherwise reach no handler (the worker registers it through the page's thread).
page.ready(chosen["backend"], chosen["note"])
