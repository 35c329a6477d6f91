"""What the /ocr/ page (web_demos/ocr/) calls inside Pyodide: PP-OCR on the page's backend, on
the pixels of a canvas (an uploaded photo or a camera frame).

    info = load(det_bytes, cls_bytes, rec_bytes)    # the three .onnx files the page fetched
    result = await read(rgba, width, height)        # a canvas's getImageData().data
    result -> {"lines": [{"text", "score", "box"}] (as `cinders ocr` prints them),
               "timings": {"pixels", "detect", "boxes", "classify", "recognise"} (ms)}

The same TextReader as `cinders ocr` on the desktop, driven by read_async(): every tensor is read
with `await to_data_async()`, so WebGPU never blocks the page.
"""
import os
import tempfile
import time

from .. import vision
from .ocr import DET_LIMIT_SIDE, TextReader

_state = {"reader": None}


def _backend():
    from ..web import bridge
    return bridge.current_backend()


def _saved(data, folder, name):
    """The path of `data` written to a file (the reader loads files: the recogniser's dictionary is
    in its metadata)."""
    path = os.path.join(folder, name)
    with open(path, "wb") as f:
        f.write(bytes(data))
    return path


def load(det_bytes, cls_bytes, rec_bytes, det_limit_side=DET_LIMIT_SIDE):
    backend = _backend()
    started = time.perf_counter()
    folder = tempfile.mkdtemp(prefix="cinders-ocr-")
    paths = [_saved(data, folder, name + ".onnx")
             for data, name in ((det_bytes, "det"), (cls_bytes, "cls"), (rec_bytes, "rec"))]
    _state["reader"] = TextReader(*paths, backend=backend, det_limit_side=int(det_limit_side))
    return {"backend": repr(backend), "load_ms": (time.perf_counter() - started) * 1e3}


async def read(rgba, width, height):
    """The lines of a canvas's RGBA pixels, with the milliseconds of each stage."""
    if hasattr(rgba, "to_py"):          # a JS Uint8ClampedArray from the page
        rgba = rgba.to_py()
    reader = _state["reader"]
    started = time.perf_counter()
    image = vision.from_rgba(rgba, int(width), int(height), backend=reader.backend)
    timings = {"pixels": (time.perf_counter() - started) * 1e3}
    lines = await reader.read_async(image, timings)
    return {"lines": lines, "timings": timings}
