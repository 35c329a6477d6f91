"""Cinders on MicroPython: the inference half of `cinders.nn` over a streamed safetensors record.

The same model source that trains on the desktop (`from cinders import nn`) imports unchanged
here. Arrays come from one of the engines, chosen once, when first needed (`cinders.engine`):

    ENGINE == "ulab"    `from ulab import numpy` is importable (2-D arrays)
    ENGINE == "wasm"    MicroPython WebAssembly in a page that loaded cn.Wasm()'s kernels
                        (js.cindersKernels; chosen in _engine.py, which a board never compiles
                        past its `import js`)
    ENGINE == "array"   plain `array('f')` loops otherwise (every port has it)

The desktop API where the board has it: `cinders.tensor(nested lists)` or `(flat, shape)`,
tensors with the desktop's methods and operators (cinders/_ops.py), `cinders.zeros/ones/full`,
`cinders.cat/stack/matmul`; float32 only, inference only.

Everything here loads on first use (module __getattr__): `import cinders.safetensors`, the first
thing a bundle's predict.py does, then compiles the record reader on an empty heap, which is
what lets a .py bundle start in 64 KB.
"""

__version__ = "0.1.0"
OPS_FUNCTIONS = ("tensor", "zeros", "ones", "full", "cat", "stack", "matmul")


def tensor(values, shape=None):
    """A float32 tensor of nested lists (like the desktop's cinders.tensor), or of flat
    row-major `values` (any sequence of numbers; an array('f') is used as it is) and `shape`."""
    from cinders import _ops
    return _ops.tensor(values, shape)


def __getattr__(name):
    # Collect first: a module compiled from source needs its parse tree in one piece of the heap.
    import gc
    import sys
    gc.collect()
    if name in ("engine", "ENGINE"):
        g = globals()
        try:
            from ulab import numpy  # noqa: F401  (probe first: compiling _ulab.py for nothing costs RAM)
            __import__("cinders._ulab")
            g["engine"], g["ENGINE"] = sys.modules["cinders._ulab"], "ulab"
        except ImportError:  # wasm on a page with cn.Wasm()'s kernels, else array (_engine.py)
            __import__("cinders._engine")
            chosen = sys.modules["cinders._engine"]
            g["engine"], g["ENGINE"] = chosen.engine, chosen.ENGINE
    elif name == "Tensor":
        from cinders._tensor import Tensor
        return Tensor
    elif name in OPS_FUNCTIONS:
        from cinders import _ops
        return getattr(_ops, name)
    elif name[0] == "_":  # a private module (`from cinders import _wasm`): its ImportError stands
        __import__("cinders." + name)
    else:  # MicroPython asks here for submodules too (`from cinders import record`)
        try:
            __import__("cinders." + name)
        except ImportError:
            raise AttributeError("cinders on the board has no %r" % (name,))
    return globals()[name]
