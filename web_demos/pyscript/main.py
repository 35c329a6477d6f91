"""PyScript example: cinders loads the MNIST record and classifies an uploaded picture.

pyscript.json unpacks the cinders wheel into the working folder (on sys.path), copies the model
record next to it, and exposes the demos' shared preprocessing (preprocess.js) to Python.
"""
import math

import js
from pyodide.ffi import jsnull
from pyscript import document, when
from pyscript.js_modules import preprocess

import cinders as cn
from cinders import record
from cinders.web import bridge


def show(selector, text):
    document.querySelector(selector).textContent = text


# WebGPU when the browser has it (cinders.wgpu's browser device), else WebAssembly SIMD kernels
# (cn.Wasm()), else Python; say which. ?backend=webgpu|wasm|python forces one.
prefer = js.URLSearchParams.new(js.location.search).get("backend") or "auto"
chosen = await bridge.init(prefer)  # noqa: F704  (PyScript runs this script with top-level await)
show("#backend", chosen["backend"])
show("#backend-note", "(%s)" % chosen["note"] if chosen["note"] else "")
model = record.load_model("mnist-cnn.safetensors")  # class and config come from the record
forward = cn.capture(model)  # from the third call on: one replay of the recorded GPU kernels
show("#status", "ready")


def draw_preview(pixels):
    canvas = document.querySelector("#preview")
    image = canvas.getContext("2d").createImageData(28, 28)
    for i, v in enumerate(pixels):
        g = int(255 * v)
        image.data[4 * i], image.data[4 * i + 1], image.data[4 * i + 2], image.data[4 * i + 3] = g, g, g, 255
    canvas.getContext("2d").putImageData(image, 0, 0)


@when("change", "#upload")
async def classify(event):
    files = event.target.files
    if not files.length:
        return
    show("#status", "classifying")
    bitmap = await js.createImageBitmap(files.item(0))
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
