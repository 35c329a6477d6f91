"""The wasm engine: MicroPython WebAssembly in a page that loaded cn.Wasm()'s kernels
(wasm/micro_kernels.js sets `js.cindersKernels`). Same data layout as the array engine, whose
functions it reuses; `linear` (the bulk of an MLP) runs as one SIMD matmul in the module, with
the layer's weights uploaded once (int8 rows scaled first). Bytes cross as base64 strings (see
wasm/micro_kernels.mjs: MicroPython hands buffers to JS only as proxies). Importing it anywhere else (a
board: no `js`; a page without the kernels) raises ImportError, and the array engine is used.
"""
from array import array

try:  # the C module: this build's `binascii` is micropython-lib's pure-Python one
    import ubinascii as binascii
except ImportError:
    import binascii

try:
    import js
    _K = js.cindersKernels
    _K.upload  # noqa: B018  (undefined on a page that did not load the kernels)
except (ImportError, AttributeError):
    raise ImportError("cinders._wasm: no cn.Wasm() kernels on this page")

from cinders._array import (  # noqa: E402,F401  (the engine interface, as the array engine has it)
    channel_affine, conv2d, from_flat, pool2d, reshape, softmax_last, to_list, unary, _buffer)
from cinders._tensor import Tensor  # noqa: E402

_uploaded = {}  # id(weight) -> (weight, address of its float32 rows, address of the bias or 0)


def _upload(values):
    return _K.upload(binascii.b2a_base64(values).decode(), 4 * len(values))


def _weights(weight, bias):
    entry = _uploaded.get(id(weight))
    if entry is None or entry[0] is not weight:
        rows = array("f")
        scale = weight.scale
        for j, n, chunk in weight.chunks(1):
            if weight.typecode == "f" and scale is None:
                rows.extend(chunk)
            else:
                s = 1.0 if scale is None else scale[j]
                rows.extend(array("f", [v * s for v in chunk]))
        b = _upload(array("f", bias.data)) if bias is not None else 0
        entry = _uploaded[id(weight)] = (weight, _upload(rows), b)
    return entry[1], entry[2]


def linear(x, weight, bias, n_out):
    w, b = _weights(weight, bias)
    n_in = len(x.data)
    y = _K.linear(binascii.b2a_base64(x.data).decode(), w, b, n_in, n_out)
    out, slot = _buffer(x, n_out)
    out[:] = array("f", binascii.a2b_base64(y))
    return Tensor(out, (1, n_out), slot)
