"""Cinders on MicroPython: the inference half of `cinders.nn` over a streamed safetensors record.

The same model source that trains on the desktop (`from cinders import nn`) imports unchanged
here. Arrays come from one of two engines, chosen once at import:

    ENGINE == "ulab"    `from ulab import numpy` is importable (2-D arrays)
    ENGINE == "array"   plain `array('f')` loops otherwise (every port has it)

The desktop API where the board has it: `cinders.tensor(nested lists)` or `(flat, shape)`,
tensors with the desktop's methods and operators (cinders/_ops.py), `cinders.zeros/ones/full`,
`cinders.cat`, `cinders.matmul`; float32 only, inference only.
"""

try:
    from ulab import numpy as _np  # noqa: F401  (only probing the firmware)
    from cinders import _ulab as engine
    ENGINE = "ulab"
except ImportError:
    from cinders import _array as engine
    ENGINE = "array"

from cinders.tensor import Tensor  # noqa: E402

__version__ = "0.1.0"


def tensor(values, shape=None):
    """A float32 tensor of nested lists (like the desktop's cinders.tensor), or of flat
    row-major `values` (any sequence of numbers, an array('f') is used as it is) and `shape`."""
    from cinders import _ops  # gives tensors their operators (see tensor.py)
    if shape is None:
        return _ops.tensor(values)
    shape = tuple(shape)
    n = 1
    for d in shape:
        n *= d
    if len(values) != n:
        raise ValueError("cinders.tensor: %d values for shape %s (%d)" % (len(values), shape, n))
    return Tensor(engine.from_flat(values, shape), shape)


def __getattr__(name):
    """cinders.zeros/ones/full/cat/stack/matmul load with _ops on first use. MicroPython asks
    this for submodules too (`from cinders import record`): those are imported."""
    if name in ("zeros", "ones", "full", "cat", "stack", "matmul"):
        from cinders import _ops
        return getattr(_ops, name)
    try:
        __import__("cinders." + name)
    except ImportError:
        raise AttributeError("cinders on the board has no %r" % (name,))
    return globals()[name]
