"""Cinders on MicroPython: the inference half of `cinders.nn` over a streamed safetensors record.

The same model source that trains on the desktop (`from cinders import nn`) imports unchanged
here. Arrays come from one of three engines, chosen once at import:

    ENGINE == "ulab"    `from ulab import numpy` is importable (2-D arrays, batch of one)
    ENGINE == "wasm"    MicroPython WebAssembly with cn.Wasm()'s kernels on the page (js.cindersKernels)
    ENGINE == "array"   plain `array('f')` loops otherwise (every port has it)
"""

try:
    from ulab import numpy as _np  # noqa: F401  (only probing the firmware)
    from cinders import _ulab as engine
    ENGINE = "ulab"
except ImportError:
    from cinders._engine import engine, ENGINE  # wasm on a page with cn.Wasm()'s kernels, else array

from cinders.tensor import Tensor  # noqa: E402

__version__ = "0.1.0"


def tensor(values, shape):
    """A float32 tensor of flat row-major `values` (any sequence of numbers) and `shape`."""
    shape = tuple(shape)
    return Tensor(engine.from_flat(values, shape), shape)
