"""Creation: tensors from Python data or NumPy arrays, constants, ranges, identity, random.

Every function validates its arguments here and calls one backend primitive (`from_flat`,
`full` or `random`, core/backend.py).
"""

import math

from . import dtypes
from .dtypes import float32, int32, bool_
from .errors import ArgumentError, ArgumentTypeError, DTypeError, ShapeError
from .limits import LIST_ELEMENT_BYTES, check_elements, check_shape, element_bytes
from .tensor import Tensor, _PY_TYPE, _check_dtype, _shape_arg, default_backend



def _flatten_nested(data):
    shape = []
    probe = data
    while isinstance(probe, (list, tuple)):
        shape.append(len(probe))
        if not probe:
            break
        probe = probe[0]
    shape = tuple(shape)
    if len(shape) == 1:
        flat = list(data)
        for v in flat:
            if isinstance(v, (list, tuple)):
                raise ShapeError("tensor: ragged nested list (expected shape %s)" % (shape,))
        return flat, shape
    flat = []

    def walk(value, depth):
        if depth == len(shape):
            if isinstance(value, (list, tuple)):
                raise ShapeError("tensor: ragged nested list (expected shape %s)" % (shape,))
            flat.append(value)
            return
        if not isinstance(value, (list, tuple)) or len(value) != shape[depth]:
            raise ShapeError("tensor: ragged nested list (expected shape %s)" % (shape,))
        for v in value:
            walk(v, depth + 1)

    walk(data, 0)
    return flat, shape


def _infer_dtype(flat):
    if all(isinstance(v, bool) for v in flat):
        return bool_ if flat else float32
    if all(isinstance(v, int) for v in flat):
        return int32
    return float32


_NUMPY_KIND = {"b": bool_, "i": int32, "u": int32, "f": float32}


def tensor(data, backend=None, dtype=None, device=None):
    """A tensor from (nested lists of) Python numbers, a NumPy array, or another Tensor.
    device: the backend's device to place it on (`backend.device(device)`, e.g. a cn.Router's)."""
    backend = backend or default_backend()
    if device is not None:
        backend = backend.device(device)
    if isinstance(data, Tensor):
        out = data.to(backend)
        return out if dtype is None else out.cast(dtype)
    if hasattr(data, "__array_interface__") and hasattr(data, "astype"):  # a NumPy array/scalar
        if data.dtype.kind not in _NUMPY_KIND:
            raise DTypeError("tensor: cannot make a tensor from a NumPy array of dtype %s" % (data.dtype,))
        dtype = _NUMPY_KIND[data.dtype.kind] if dtype is None else _check_dtype("tensor", dtype, backend)
        # astype + tolist convert in C: already the Python numbers from_flat takes
        if dtype is bool_:
            data = data != 0
        values = data.astype("float32" if dtype.compute is float32 else "int32").reshape(-1).tolist()
        shape = tuple(data.shape)
        _check_bounds(values, dtype)
        return Tensor(backend, backend.from_flat(values, shape, dtype), shape, dtype)
    if isinstance(data, (list, tuple)):
        flat, shape = _flatten_nested(data)
        inferred = _infer_dtype(flat)
    elif isinstance(data, (int, float)):
        flat, shape = [data], ()
        inferred = dtypes.of_python_value(data)
    else:
        raise ArgumentTypeError("tensor: cannot make a tensor from %s" % type(data).__name__)
    dtype = inferred if dtype is None else _check_dtype("tensor", dtype, backend)
    py = _PY_TYPE[dtype]
    try:
        values = [py(v) for v in flat]
    except (TypeError, ValueError, OverflowError) as e:
        raise ArgumentTypeError("tensor: values must be numbers for dtype %r (%s)" % (dtype, e)) from None
    _check_bounds(values, dtype)
    return Tensor(backend, backend.from_flat(values, shape, dtype), shape, dtype)


def _check_bounds(values, dtype):
    """Data given for an integer dtype must fit it (a cast wraps around; creation refuses)."""
    if dtype.bounds is None or not values:
        return
    low, high = dtype.bounds
    if not (low <= min(values) and max(values) <= high):
        bad = min(values) if min(values) < low else max(values)
        hint = "give dtype=cn.float32 for large values" if dtype is int32 else "cast to wrap around"
        raise ArgumentError("tensor: %r does not fit %s; %s" % (bad, dtype.name, hint))


def full(shape, value, backend=None, dtype=None):
    shape = _shape_arg("full", (shape,) if isinstance(shape, int) else shape)
    if not isinstance(value, (int, float)):
        raise ArgumentTypeError("full: value must be a number or bool, not %r" % (value,))
    backend = backend or default_backend()
    check_shape("full", shape, element_bytes(backend))
    dtype = dtypes.of_python_value(value) if dtype is None else _check_dtype("full", dtype)
    if dtype is int32 and not -2147483648 <= value <= 2147483647:
        raise ArgumentError("full: %r does not fit int32; give dtype=cn.float32" % (value,))
    return Tensor(backend, backend.full(shape, _PY_TYPE[dtype](value), dtype), shape, dtype)


def zeros(*shape, backend=None, dtype=float32):
    return full(_shape_arg("zeros", shape), 0, backend=backend, dtype=dtype)


def ones(*shape, backend=None, dtype=float32):
    return full(_shape_arg("ones", shape), 1, backend=backend, dtype=dtype)


def zeros_like(x):
    return full(x.shape, 0, backend=x.backend, dtype=x.dtype)


def ones_like(x):
    return full(x.shape, 1, backend=x.backend, dtype=x.dtype)


def arange(start, stop=None, step=1, backend=None, dtype=None):
    if stop is None:
        start, stop = 0, start
    for name, v in (("start", start), ("stop", stop), ("step", step)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ArgumentTypeError("arange: %s must be a finite int or float, not %r" % (name, v))
    if step == 0:
        raise ArgumentError("arange: step must not be 0")
    n = check_elements("arange", max(0, math.ceil((stop - start) / step)), None, LIST_ELEMENT_BYTES)
    if dtype is None:
        dtype = int32 if all(isinstance(v, int) for v in (start, stop, step)) else float32
    return tensor([start + i * step for i in range(n)], backend=backend, dtype=dtype) if n else \
        full((0,), 0, backend=backend, dtype=dtype)


def eye(n, m=None, backend=None, dtype=float32):
    m = n if m is None else m
    n, m = _shape_arg("eye", (n, m))
    check_shape("eye", (n, m), LIST_ELEMENT_BYTES)
    dtype = _check_dtype("eye", dtype)
    values = [0] * (n * m)
    k = min(n, m)
    values[:k * (m + 1):m + 1] = [1] * k  # the diagonal: every (m + 1)-th element
    backend = backend or default_backend()
    return Tensor(backend, backend.from_flat(values, (n, m), dtype), (n, m), dtype)


_seed_counter = [0]


def manual_seed(seed):
    """Restart the sequence of seeds that cn.random uses when it is given none."""
    _seed_counter[0] = int(seed) * 1000003


def random(shape, backend=None, distribution="uniform", seed=None, dtype=float32):
    """Uniform [0, 1) or standard normal values from the counter-based generator of the backend
    protocol: the same seed gives the same numbers on every backend."""
    shape = _shape_arg("random", (shape,) if isinstance(shape, int) else shape)
    if distribution not in ("uniform", "normal"):
        raise ArgumentError("random: unknown distribution %r; use 'uniform' or 'normal'" % (distribution,))
    dtype = _check_dtype("random", dtype)
    if dtype is not float32:
        raise DTypeError("random: draws float32 values, not %r" % (dtype,))
    if seed is not None and type(seed) is not int:
        raise ArgumentTypeError("random: seed must be an int or None, got %r" % (seed,))
    if seed is None:
        seed = _seed_counter[0]
        _seed_counter[0] += 1
    backend = backend or default_backend()
    check_shape("random", shape, element_bytes(backend))
    return Tensor(backend, backend.random(shape, distribution, seed & 0xFFFFFFFF, dtype), shape, dtype)
