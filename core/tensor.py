"""cinders.Tensor: shapes, broadcasting, dtype rules and errors, in pure Python.

A Tensor is (backend, handle, shape, dtype). Every method validates its arguments here, raising
ShapeError / DTypeError / DeviceError with the op's name, and only then calls one backend
primitive (see core/backend.py) with exactly what the protocol promises. Composite ops (softmax,
gelu, conv2d, ...) live in core/functional.py and are built from these methods only, so a
decorator backend such as Autodiff sees nothing but primitives.
"""

import math
import threading

from . import dtypes
from .dtypes import float32, int32, bool_
from .backend import numel as _numel, unfold2d_output_size
from .errors import (ShapeError, DTypeError, DeviceError, NotDifferentiableError, ArgumentError,
                     ArgumentTypeError)
from .limits import check_shape, element_bytes
from .profile import ACTIVE as _PROFILING, record as _profile_event

from . import ops

# The op table's dtype rules as lookups (core/ops.py): op -> {operand dtype: dtype the backend
# computes in (absent: not defined)} and op -> {computing dtype: result dtype}.
# Storage dtypes (int8, uint8, float16) are looked up as their compute dtype: an op widens them.
_INPUT_DTYPE = {name: {dt: c for dt in dtypes.COMPUTE_DTYPES + dtypes.STORAGE_DTYPES
                       if (c := ops.input_dtype(name, dt.compute)) is not None}
                for name in ops.OPS}
_RESULT_DTYPE = {name: {dt: ops.result_dtype(name, dt) for dt in dtypes.COMPUTE_DTYPES} for name in ops.OPS}
_WHOLE_ALREADY = frozenset(ops.names("unary", ops.ROUNDING))  # floor/ceil/round of an int: itself
# The Python number a backend receives for a value of each dtype (bool tensors hold 0/1).
_PY_TYPE = {float32: float, int32: int, bool_: lambda v: 1 if v else 0,
            dtypes.float16: float, dtypes.int8: int, dtypes.uint8: int}

# ---------------------------------------------------------------------------------------------
# default backend


_default_backend = None
_this_thread = threading.local()  # .backend: a default for this thread only (default_backend_here)


def default_backend():
    """The backend used wherever `backend=` is omitted: NumPy when it imports, else Python."""
    global _default_backend
    here = getattr(_this_thread, "backend", None)
    if here is not None:
        return here
    if _default_backend is None:
        try:
            from .backends.numpy_backend import NumPy
            _default_backend = NumPy()
        except ImportError:  # Pyodide without NumPy, MicroPython-like environments
            from .backends.python_backend import Python
            _default_backend = Python()
    return _default_backend


def set_default_backend(backend):
    """Make `backend` the default for every later creation call that omits `backend=`."""
    global _default_backend
    if not hasattr(backend, "from_flat"):
        raise ArgumentTypeError("set_default_backend: %r is not a backend" % (backend,))
    _default_backend = backend


class default_backend_here:
    """`with default_backend_here(b):` makes b the default in this thread only, for the block
    (records build a model on a shape-only backend this way while other threads go on)."""

    def __init__(self, backend):
        self.backend = backend

    def __enter__(self):
        self.previous = getattr(_this_thread, "backend", None)
        _this_thread.backend = self.backend
        return self.backend

    def __exit__(self, *exc):
        _this_thread.backend = self.previous


# ---------------------------------------------------------------------------------------------
# shape helpers (pure functions on tuples)


_broadcast_cache = {}  # (shape, shape) -> broadcast shape: a model broadcasts a few pairs only


def _broadcast_shapes(op, sa, sb):
    if sa == sb:
        return sa
    hit = _broadcast_cache.get((sa, sb))
    if hit is not None:
        return hit
    out = _broadcast_new(op, sa, sb)
    if len(_broadcast_cache) > 1024:
        _broadcast_cache.clear()
    _broadcast_cache[(sa, sb)] = out
    return out


def _broadcast_new(op, sa, sb):
    n = max(len(sa), len(sb))
    pa = (1,) * (n - len(sa)) + sa
    pb = (1,) * (n - len(sb)) + sb
    out = []
    for i, (x, y) in enumerate(zip(pa, pb)):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            raise ShapeError("%s: shapes %s and %s do not broadcast (dim %d: %d vs %d)"
                             % (op, sa, sb, i - n, x, y))
    return tuple(out)


def _axis(op, axis, ndim, shape):
    if type(axis) is not int:
        raise ArgumentTypeError("%s: axis must be an int, got %r" % (op, axis))
    a = axis + ndim if axis < 0 else axis
    if not 0 <= a < ndim:
        raise ShapeError("%s: axis %d out of range for shape %s" % (op, axis, shape))
    return a


def _axes(op, axis, shape):
    """An int or a tuple of axes, normalised, checked for repeats, in descending order."""
    if isinstance(axis, int):
        return (_axis(op, axis, len(shape), shape),)
    if not isinstance(axis, (tuple, list)):
        raise ArgumentTypeError("%s: axis must be an int, a tuple of ints or None, got %r" % (op, axis))
    axes = tuple(sorted({_axis(op, a, len(shape), shape) for a in axis}, reverse=True))
    if len(axes) != len(axis):
        raise ShapeError("%s: repeated axis in %r for shape %s" % (op, tuple(axis), shape))
    return axes


def _shape_arg(op, args):
    """zeros(2, 3), zeros((2, 3)) and zeros([2, 3]) all mean shape (2, 3)."""
    if not isinstance(args, (tuple, list)):
        raise ShapeError("%s: shape %r must be non-negative ints" % (op, args))
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        args = args[0]
    shape = tuple(args)
    for d in shape:
        if not isinstance(d, int) or isinstance(d, bool) or d < 0:
            raise ShapeError("%s: shape %r must be non-negative ints" % (op, shape))
    return shape


def _check_dtype(op, dtype, backend=None):
    """dtype (or its name) checked for `op`: a compute dtype, or a storage dtype where `backend`
    (creation from data, cast, to) holds it (`Backend.storage_dtypes`)."""
    if isinstance(dtype, str):
        dtype = dtypes.from_name(dtype)
    if dtype in dtypes.COMPUTE_DTYPES:
        return dtype
    if dtype in dtypes.STORAGE_DTYPES:
        if backend is None:
            raise DTypeError("%s: %r is a storage dtype; make it from data (cn.tensor(..., dtype=%r)) "
                             "or with .cast(%r)" % (op, dtype, dtype, dtype))
        if dtype not in backend.storage_dtypes:
            raise DTypeError("%s: %r does not hold %r tensors (it holds %s); keep them as %r"
                             % (op, backend, dtype, ", ".join(map(repr, backend.storage_dtypes)) or "none",
                                dtype.compute))
        return dtype
    raise DTypeError("%s: tensors compute in float32, int32 or bool, not %r" % (op, dtype))


_scalar_cache = {}


def _scalar(backend, value, dtype, ndim):
    """A handle holding `value` with shape (1,) * ndim, cached for backends whose constants are
    never mutated (`backend.shares_constants`, see core/backend.py), so one serves every op."""
    if dtype is int32 and not -2147483648 <= value <= 2147483647:
        raise ArgumentError("%r does not fit int32 (an int32 tensor meets it); use a float or a "
                            "float32 tensor" % (value,))
    if not backend.shares_constants:
        return backend.full((1,) * ndim, _PY_TYPE[dtype](value), dtype)
    key = (id(backend), value, type(value), dtype, ndim)
    if value == 0 and type(value) is float:  # -0.0 == 0.0 would share a key
        key += (math.copysign(1.0, value),)
    hit = _scalar_cache.get(key)
    if hit is not None and hit[0] is backend:
        return hit[1]
    if len(_scalar_cache) > 512:
        _scalar_cache.clear()
    handle = backend.full((1,) * ndim, _PY_TYPE[dtype](value), dtype)
    _scalar_cache[key] = (backend, handle)
    return handle


_valid_perms = {}  # permute's `dims` as given -> normalised, already checked to be a permutation


# ---------------------------------------------------------------------------------------------
# the Tensor


class Tensor:
    """An n-dimensional array on one backend. Immutable: every op returns a new Tensor."""

    __slots__ = ("backend", "handle", "shape", "dtype", "__weakref__")

    def __init__(self, backend, handle, shape, dtype):
        self.backend = backend
        self.handle = handle
        self.shape = shape
        self.dtype = dtype

    # Tensors are dict keys by identity (like torch); `==` is the elementwise comparison.
    __hash__ = object.__hash__
    # NumPy scalars and arrays on the left defer to our reflected operators (np.float32(2) * t).
    __array_priority__ = 1000

    # -- basic properties ---------------------------------------------------------------------

    @property
    def ndim(self):
        return len(self.shape)

    def numel(self):
        return _numel(self.shape)

    def __len__(self):
        if not self.shape:
            raise ArgumentTypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def _same_device(self, op, other):
        if other.backend is not self.backend and other.backend != self.backend:
            raise DeviceError("%s: tensors on different backends: %r and %r (move one with .to(backend))"
                              % (op, self.backend, other.backend))

    # -- reading ------------------------------------------------------------------------------

    def _reading(self, how):
        """Report a read of this tensor's values to cn.profile (a device read on a GPU)."""
        if _PROFILING:
            _profile_event(self.backend, {"kind": "read", "name": how, "bytes": 4 * _numel(self.shape)})

    def tolist(self):
        self._reading("tolist")
        flat = self.backend.to_flat(self.handle)
        if self.dtype is bool_:
            flat = [bool(v) for v in flat]
        return _nest(flat, self.shape)

    async def to_data_async(self):
        """tolist() that awaits the device instead of blocking (the browser's WebGPU cannot block)."""
        self._reading("to_data_async")
        reader = getattr(self.backend, "to_flat_async", None)
        flat = await reader(self.handle) if reader is not None else self.backend.to_flat(self.handle)
        if self.dtype is bool_:
            flat = [bool(v) for v in flat]
        return _nest(flat, self.shape)

    def item(self):
        if _numel(self.shape) != 1:
            raise ShapeError("item: needs a tensor with exactly one element, got shape %s" % (self.shape,))
        self._reading("item")
        value = self.backend.to_flat(self.handle)[0]
        return bool(value) if self.dtype is bool_ else value

    def __float__(self):
        return float(self.item())

    def __int__(self):
        value = self.item()
        if value != value or value in (math.inf, -math.inf):
            raise ArgumentError("int: cannot convert %r to an integer" % (value,))
        return int(value)

    def __bool__(self):
        if _numel(self.shape) != 1:
            raise ShapeError("bool: the truth value of a tensor of shape %s is ambiguous; "
                             "use .any()/.all() or compare an element" % (self.shape,))
        return bool(self.item())

    def numpy(self):
        """A NumPy array copy (needs NumPy installed)."""
        import numpy as np
        self._reading("numpy")
        to_numpy = getattr(self.backend, "to_numpy", None)
        if to_numpy is not None:
            return to_numpy(self.handle)
        np_dtype = np.bool_ if self.dtype is bool_ else self.dtype.name
        return np.asarray(self.backend.to_flat(self.handle), dtype=np_dtype).reshape(self.shape)

    def __array__(self, dtype=None, copy=None):
        out = self.numpy()
        return out if dtype is None else out.astype(dtype)

    def to(self, backend):
        """The same values on another backend (a copy through Python lists)."""
        if backend is self.backend:
            return self
        if self.dtype.is_storage:
            _check_dtype("to", self.dtype, backend)
        self._reading("to")
        return Tensor(backend, backend.from_flat(self.backend.to_flat(self.handle), self.shape, self.dtype),
                      self.shape, self.dtype)

    def __repr__(self):
        head = "cn.tensor("
        if _numel(self.shape) <= 64:
            body = repr(self.tolist())
        else:
            body = "<%d values, shape=%s>" % (_numel(self.shape), self.shape)
        return "%s%s, dtype=%r, backend=%r)" % (head, body, self.dtype, self.backend)

    # -- autodiff hooks: delegated to the backend, so this class knows nothing of tapes ---------

    def _autodiff(self, name):
        method = getattr(self.backend, name, None)
        if method is None:
            raise NotDifferentiableError(
                "%s: backend %r does not record gradients; create the tensors on "
                "cn.Autodiff(%r) to train" % (name, self.backend, self.backend))
        return method

    def backward(self):
        """Gradients of this (scalar) tensor w.r.t. every tensor that requires them."""
        return self._autodiff("backward")(self)

    def require_grad(self):
        return self._autodiff("require_grad")(self)

    def detach(self):
        return self._autodiff("detach")(self)

    def grad(self, grads):
        return self._autodiff("grad")(self, grads)

    # -- dtype --------------------------------------------------------------------------------

    def cast(self, dtype):
        dtype = _check_dtype("cast", dtype, self.backend)
        if dtype is self.dtype:
            return self
        return Tensor(self.backend, self.backend.cast(self.handle, dtype), self.shape, dtype)

    def float(self):
        return self.cast(float32)

    def int(self):
        return self.cast(int32)

    def bool(self):
        return self.cast(bool_)

    # -- elementwise: the ops of core/ops.py, installed as methods below the class -------------

    def _unary(self, op):
        x = self
        dtype = _INPUT_DTYPE[op].get(x.dtype)
        if dtype is None:
            raise DTypeError(_dtype_refusal(op, x.dtype))
        if dtype is not x.dtype:
            x = x.cast(dtype)
        elif op in _WHOLE_ALREADY and dtype is int32:
            return x
        return Tensor(x.backend, x.backend.unary(op, x.handle), x.shape, _RESULT_DTYPE[op][dtype])

    def _binary(self, op, other, reverse=False):
        """self <op> other (other <op> self when reverse); other is a Tensor or a Python number."""
        backend = self.backend
        if isinstance(other, Tensor):
            if other.backend is not backend:
                self._same_device(op, other)
            dtype = self.dtype
            ha, hb, sa, sb = self.handle, other.handle, self.shape, other.shape
            if other.dtype is not dtype:
                dtype = dtypes.promote(dtype, other.dtype)
                if self.dtype is not dtype:
                    ha = backend.cast(ha, dtype)
                if other.dtype is not dtype:
                    hb = backend.cast(hb, dtype)
            if sa == sb:
                shape = sa
            else:
                shape = _broadcast_shapes(op, sa, sb) if not reverse else _broadcast_shapes(op, sb, sa)
                check_shape(op, shape, element_bytes(backend))
                n = len(shape)
                if len(sa) < n:
                    ha = backend.reshape(ha, (1,) * (n - len(sa)) + sa)
                if len(sb) < n:
                    hb = backend.reshape(hb, (1,) * (n - len(sb)) + sb)
        elif isinstance(other, (int, float)):
            value_dtype = dtypes.of_python_value(other)
            dtype = self.dtype
            ha, shape = self.handle, self.shape
            if dtype is not float32 and value_dtype is not dtype:
                dtype = dtypes.promote(dtype, value_dtype)
                ha = backend.cast(ha, dtype)
            hb = _scalar(backend, other, dtype, len(shape))
        elif getattr(other, "shape", None) == () and hasattr(other, "item"):  # a NumPy scalar
            return self._binary(op, other.item(), reverse)
        else:
            return NotImplemented
        if reverse:
            ha, hb = hb, ha

        compute = _INPUT_DTYPE[op].get(dtype)  # the op's dtype rule (core/ops.py)
        if compute is None:
            raise DTypeError(_dtype_refusal(op, dtype))
        if compute is not dtype:
            ha, hb, dtype = backend.cast(ha, compute), backend.cast(hb, compute), compute
        out_dtype = _RESULT_DTYPE[op][dtype]
        return Tensor(backend, backend.binary(op, ha, hb), shape, out_dtype)

    def _binary_or_raise(self, op, other):
        out = self._binary(op, other)
        if out is NotImplemented:
            raise ArgumentTypeError("%s: expected a Tensor or a Python number, got %s" % (op, type(other).__name__))
        return out

    def matmul(self, other):
        return matmul(self, other)

    def __matmul__(self, other):
        return matmul(self, other)

    def __rmatmul__(self, other):
        return matmul(other, self)

    # -- composites (core/functional.py) --------------------------------------------------------

    def sigmoid(self):
        return functional.sigmoid(self)

    def relu(self):
        return functional.relu(self)

    def gelu(self):
        return functional.gelu(self)

    def softmax(self, axis=-1):
        return functional.softmax(self, axis)

    def log_softmax(self, axis=-1):
        return functional.log_softmax(self, axis)

    def clamp(self, min=None, max=None):  # noqa: A002  (torch's names)
        return functional.clamp(self, min, max)

    def mean(self, axis=None, keepdim=False):
        return functional.mean(self, axis, keepdim)

    # -- reductions ------------------------------------------------------------------------------

    def _reduce(self, op, axis, keepdim):
        if keepdim is not True and keepdim is not False:
            raise ArgumentTypeError("%s: keepdim must be True or False, got %r" % (op, keepdim))
        x = self
        dtype = _INPUT_DTYPE[op][x.dtype]
        if dtype is not x.dtype:
            x = x.cast(dtype)
        backend, shape = x.backend, x.shape
        out_dtype = _RESULT_DTYPE[op][dtype]
        if type(axis) is int and shape:  # the common case, one valid non-empty axis: no loop
            a = axis + len(shape) if axis < 0 else axis
            if 0 <= a < len(shape) and (shape[a] or op == "sum" or op == "prod"):
                out_shape = shape[:a] + (1,) + shape[a + 1:] if keepdim else shape[:a] + shape[a + 1:]
                return Tensor(backend, backend.reduce(op, x.handle, a, keepdim), out_shape, out_dtype)
        if axis is None or not shape:
            if op in ("max", "min", "argmax", "argmin") and _numel(shape) == 0:
                raise ShapeError("%s: cannot reduce an empty tensor of shape %s" % (op, shape))
            if axis is not None:  # a 0-d tensor reduced along axis 0 / -1
                _axis(op, axis, 1, shape)
            flat = backend.reshape(x.handle, (_numel(shape),))
            out = backend.reduce(op, flat, 0, False)
            out_shape = ()
            if keepdim:
                out_shape = (1,) * len(shape)
                out = backend.reshape(out, out_shape)
            return Tensor(backend, out, out_shape, out_dtype)
        if not isinstance(axis, int) and op in ("argmax", "argmin"):
            raise ArgumentTypeError("%s: axis must be an int or None, got %r" % (op, axis))
        axes = _axes(op, axis, shape)
        h = x.handle
        out_shape = list(shape)
        for a in axes:  # descending, so the remaining axis numbers stay valid when dims vanish
            if shape[a] == 0 and op in ("max", "min", "argmax", "argmin"):
                raise ShapeError("%s: cannot reduce over the empty axis %d of shape %s" % (op, a, shape))
            h = backend.reduce(op, h, a, keepdim)
            if keepdim:
                out_shape[a] = 1
            else:
                del out_shape[a]
        return Tensor(backend, h, tuple(out_shape), out_dtype)

    def any(self, axis=None, keepdim=False):
        return self.cast(bool_)._reduce("max", axis, keepdim)

    def all(self, axis=None, keepdim=False):
        return self.cast(bool_)._reduce("min", axis, keepdim)

    # -- movement --------------------------------------------------------------------------------

    def reshape(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = shape[0]
        shape = tuple(shape)
        if shape == self.shape and all(type(d) is int for d in shape):
            return self
        n = _numel(self.shape)
        known = 1
        for d in shape:  # the common case, explicit non-negative ints, in one pass
            if type(d) is not int or d < 0:
                break
            known *= d
        else:
            if known == n:
                return Tensor(self.backend, self.backend.reshape(self.handle, shape), shape, self.dtype)
        if any(type(d) is not int for d in shape):
            raise ShapeError("reshape: the new shape %r must be ints (one may be -1)" % (shape,))
        if -1 in shape:
            if shape.count(-1) > 1:
                raise ShapeError("reshape: only one -1 allowed in %s" % (shape,))
            known = _numel(d for d in shape if d != -1)
            if known == 0 or n % known:
                raise ShapeError("reshape: cannot infer -1 in %s for shape %s (%d elements)"
                                 % (shape, self.shape, n))
            shape = tuple(n // known if d == -1 else d for d in shape)
        if any(not isinstance(d, int) or d < 0 for d in shape) or _numel(shape) != n:
            raise ShapeError("reshape: cannot reshape shape %s (%d elements) to %s"
                             % (self.shape, n, shape))
        return Tensor(self.backend, self.backend.reshape(self.handle, shape), shape, self.dtype)

    view = reshape

    def flatten(self, start_dim=0, end_dim=-1):
        if not self.shape:
            return self.reshape(1)
        s = _axis("flatten", start_dim, self.ndim, self.shape)
        e = _axis("flatten", end_dim, self.ndim, self.shape)
        if s > e:
            raise ShapeError("flatten: start_dim %d after end_dim %d for shape %s" % (start_dim, end_dim, self.shape))
        return self.reshape(self.shape[:s] + (_numel(self.shape[s:e + 1]),) + self.shape[e + 1:])

    def permute(self, *dims):
        if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
            dims = dims[0]
        n = self.ndim
        dims = tuple(dims)
        try:
            checked = _valid_perms.get(dims)  # a model permutes with a handful of `dims` only
        except TypeError:  # unhashable entries: _axis below names them
            checked = None
        if checked is None or len(dims) != n:
            if len(dims) != n:
                raise ShapeError("permute: %d dims %s for shape %s" % (len(dims), dims, self.shape))
            checked = tuple(_axis("permute", d, n, self.shape) for d in dims)
            if len(set(checked)) != n:
                raise ShapeError("permute: %s is not a permutation for shape %s" % (checked, self.shape))
            if len(_valid_perms) > 256:
                _valid_perms.clear()
            _valid_perms[dims] = checked
        dims = checked
        if dims == tuple(range(n)):
            return self
        return Tensor(self.backend, self.backend.permute(self.handle, dims),
                      tuple(self.shape[d] for d in dims), self.dtype)

    def transpose(self, dim0=-2, dim1=-1):
        n = self.ndim
        if n == 2 and dim0 != dim1 and dim0 in (0, 1, -1, -2) and dim1 in (0, 1, -1, -2) \
                and (dim0 - dim1) % 2:  # a matrix transpose (linear layers: every forward)
            return self.permute((1, 0))
        a, b = _axis("transpose", dim0, n, self.shape), _axis("transpose", dim1, n, self.shape)
        dims = list(range(n))
        dims[a], dims[b] = b, a
        return self.permute(dims)

    @property
    def T(self):  # noqa: N802  (numpy/torch name)
        return self.permute(tuple(range(self.ndim - 1, -1, -1)))

    @property
    def mT(self):  # noqa: N802
        return self.transpose(-2, -1)

    def unsqueeze(self, dim):
        a = _axis("unsqueeze", dim, self.ndim + 1, self.shape)
        return self.reshape(self.shape[:a] + (1,) + self.shape[a:])

    def squeeze(self, dim=None):
        """Drop size-1 dims (all of them, or the given ones; a dim of another size is kept, like torch)."""
        if dim is None:
            dims = range(self.ndim)
        elif isinstance(dim, int):
            dims = (_axis("squeeze", dim, self.ndim, self.shape),)
        elif not isinstance(dim, (tuple, list)):
            raise ArgumentTypeError("squeeze: dim must be an int, a tuple of ints or None, got %r" % (dim,))
        else:
            dims = tuple(_axis("squeeze", d, self.ndim, self.shape) for d in dim)
        drop = {d for d in dims if self.shape[d] == 1}
        return self.reshape(tuple(n for d, n in enumerate(self.shape) if d not in drop))

    def expand(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = shape[0]
        shape = tuple(shape)
        if any(type(n) is not int for n in shape):
            raise ShapeError("expand: the new shape %r must be ints (-1 keeps a dim)" % (shape,))
        lead = len(shape) - self.ndim
        if lead < 0:
            raise ShapeError("expand: cannot expand shape %s to fewer dims %s" % (self.shape, shape))
        target = []
        for i, n in enumerate(shape):
            src = self.shape[i - lead] if i >= lead else None
            if n == -1:
                if src is None:
                    raise ShapeError("expand: -1 not allowed for the new leading dim %d in %s" % (i, shape))
                n = src
            if not isinstance(n, int) or n < 0 or (src is not None and src != n and src != 1):
                raise ShapeError("expand: cannot expand shape %s to %s" % (self.shape, shape))
            target.append(n)
        target = tuple(target)
        if target == self.shape:
            return self
        x = self.reshape((1,) * lead + self.shape) if lead else self
        check_shape("expand", target, element_bytes(self.backend))
        return Tensor(self.backend, self.backend.expand(x.handle, target), target, self.dtype)

    def expand_as(self, other):
        return self.expand(other.shape)

    # -- indexing --------------------------------------------------------------------------------

    def __getitem__(self, key):
        return indexing.getitem(self, key)

    def __setitem__(self, key, value):
        indexing.setitem(self, key, value)

    def gather(self, axis, index):
        """out[i][j][k] = self[index[i][j][k]][j][k] for axis 0 (torch.gather). Indices lie in
        [-n, n), negatives counting from the end; out of range raises IndexError on CPU backends
        and reads 0 on GPU backends, which cannot check without a device sync (core/backend.py)."""
        if not isinstance(index, Tensor):
            raise ArgumentTypeError("gather: index must be an int32 Tensor, got %s" % type(index).__name__)
        self._same_device("gather", index)
        if index.dtype is not int32:
            raise DTypeError("gather: index must be int32, got %r" % (index.dtype,))
        a = _axis("gather", axis, self.ndim, self.shape)
        if index.ndim != self.ndim or any(
                i > s for d, (i, s) in enumerate(zip(index.shape, self.shape)) if d != a):
            raise ShapeError("gather: index shape %s does not fit input shape %s along axis %d "
                             "(same ndim, no dim larger except the axis)" % (index.shape, self.shape, axis))
        return Tensor(self.backend, self.backend.gather(self.handle, a, index.handle), index.shape, self.dtype)

    def scatter_add(self, axis, index, src):
        """A copy of self with src[i][j][k] added at [index[i][j][k]][j][k] for axis 0. Index
        rule as for gather; an out-of-range src value is dropped where it cannot be checked."""
        for t in (index, src):
            if not isinstance(t, Tensor):
                raise ArgumentTypeError("scatter_add: index and src must be Tensors")
            self._same_device("scatter_add", t)
        if index.dtype is not int32:
            raise DTypeError("scatter_add: index must be int32, got %r" % (index.dtype,))
        if src.dtype is not self.dtype:
            raise DTypeError("scatter_add: src dtype %r differs from %r" % (src.dtype, self.dtype))
        a = _axis("scatter_add", axis, self.ndim, self.shape)
        if index.ndim != self.ndim or src.ndim != self.ndim or any(
                i > s or (i > x and d != a)
                for d, (i, s, x) in enumerate(zip(index.shape, src.shape, self.shape))):
            raise ShapeError("scatter_add: index shape %s, src shape %s and input shape %s do not fit"
                             % (index.shape, src.shape, self.shape))
        return Tensor(self.backend, self.backend.scatter_add(self.handle, a, index.handle, src.handle),
                      self.shape, self.dtype)


def _dtype_refusal(op, dtype):
    if ops.OPS[op].rule == ops.LOGICAL:
        return "%s: needs bool tensors, got %r (compare first, e.g. x != 0)" % (op, dtype)
    return "%s: not defined for %r tensors; cast first" % (op, dtype)


# ---------------------------------------------------------------------------------------------
# the op table's methods and operators: x.exp(), x + y, 2 ** x, x.sum(axis), ...

def _unary_method(op):
    def method(self):
        return self._unary(op)
    return method


def _binary_method(op, reverse):
    def method(self, other):
        return self._binary(op, other, reverse)
    return method


def _named_binary_method(op):
    def method(self, other):
        return self._binary_or_raise(op, other)
    return method


def _reduce_method(op):
    def method(self, axis=None, keepdim=False):
        return self._reduce(op, axis, keepdim)
    return method


def _install_ops():
    for name, op in ops.OPS.items():
        if op.kind == "unary":
            methods = {name: _unary_method(name)}
            methods.update((dunder, methods[name]) for dunder in op.operators)
        elif op.kind == "binary":
            methods = {name: _named_binary_method(name)}
            methods.update((dunder, _binary_method(name, i == 1)) for i, dunder in enumerate(op.operators))
        else:
            methods = {name: _reduce_method(name)}
        for attr, fn in methods.items():
            fn.__name__ = fn.__qualname__ = attr
            fn.__doc__ = "The %s op of the op table (core/ops.py: %s)." % (name, op.rule)
            setattr(Tensor, attr, fn)


_install_ops()


def _nest(flat, shape):
    if not shape:
        return flat[0]
    if 0 in shape:
        return _empty_nest(shape)
    for n in reversed(shape[1:]):
        flat = [flat[i:i + n] for i in range(0, len(flat), n)]
    return flat


def _empty_nest(shape):
    if not shape or shape[0] == 0:
        return []
    return [_empty_nest(shape[1:]) for _ in range(shape[0])]


# ---------------------------------------------------------------------------------------------
# ops on several tensors


def _as_tensors(op, values):
    """The Tensors among `values` fix the backend; Python numbers join as 0-d tensors there."""
    ref = next((v for v in values if isinstance(v, Tensor)), None)
    if ref is None:
        raise ArgumentTypeError("%s: needs at least one Tensor argument" % op)
    out = []
    for v in values:
        if isinstance(v, Tensor):
            ref._same_device(op, v)
            out.append(v)
        elif isinstance(v, (int, float)):
            dt = dtypes.of_python_value(v)
            out.append(Tensor(ref.backend, _scalar(ref.backend, v, dt, 0), (), dt))
        else:
            raise ArgumentTypeError("%s: expected Tensors or numbers, got %s" % (op, type(v).__name__))
    return out


def matmul(a, b):
    """Batched matrix product with torch's rules: 1-D operands become a row/column and that dim
    is dropped again; batch dims broadcast."""
    if not isinstance(a, Tensor) or not isinstance(b, Tensor):
        raise ArgumentTypeError("matmul: needs two Tensors")
    a._same_device("matmul", b)
    if a.dtype is not float32 or b.dtype is not float32:
        bad = a.dtype if a.dtype is not float32 else b.dtype
        raise DTypeError("matmul: needs float32 operands, got %r (use .cast(cn.float32))" % (bad,))
    sa, sb = a.shape, b.shape
    if len(sa) == len(sb) >= 2 and sa[-1] == sb[-2] and sa[:-2] == sb[:-2]:  # no broadcasting
        shape = sa[:-1] + sb[-1:]
        check_shape("matmul", shape, element_bytes(a.backend))
        return Tensor(a.backend, a.backend.matmul(a.handle, b.handle), shape, float32)
    if not sa or not sb:
        raise ShapeError("matmul: needs at least 1-D operands, got shapes %s and %s" % (sa, sb))
    ea = (1,) + sa if len(sa) == 1 else sa
    eb = sb + (1,) if len(sb) == 1 else sb
    if ea[-1] != eb[-2]:
        raise ShapeError("matmul: shapes %s and %s do not fit (inner dims %d vs %d)"
                         % (sa, sb, ea[-1], eb[-2]))
    try:
        batch = _broadcast_shapes("matmul", ea[:-2], eb[:-2])
    except ShapeError:
        raise ShapeError("matmul: batch dims of shapes %s and %s do not broadcast" % (sa, sb)) from None
    n = len(batch) + 2
    backend = a.backend
    check_shape("matmul", batch + (ea[-2], eb[-1]), element_bytes(backend))
    ha, hb = a.handle, b.handle
    if len(ea) < n or len(sa) == 1:
        ea = (1,) * (n - len(ea)) + ea
        ha = backend.reshape(ha, ea)
    if len(eb) < n or len(sb) == 1:
        eb = (1,) * (n - len(eb)) + eb
        hb = backend.reshape(hb, eb)
    h = backend.matmul(ha, hb)
    shape = batch + (ea[-2], eb[-1])
    if len(sa) == 1 or len(sb) == 1:
        final = batch + ((ea[-2],) if len(sa) > 1 else ()) + ((eb[-1],) if len(sb) > 1 else ())
        h = backend.reshape(h, final)
        shape = final
    return Tensor(backend, h, shape, float32)


def where(cond, a, b):
    """Elementwise `a if cond else b`; a and b may be Python numbers."""
    if not isinstance(cond, Tensor) or not all(isinstance(v, (Tensor, int, float)) for v in (a, b)):
        cond, a, b = _as_tensors("where", (cond, a, b))  # raises the right error
    for v in (a, b):
        if isinstance(v, Tensor):
            cond._same_device("where", v)
    if cond.dtype is not bool_:
        raise DTypeError("where: condition must be bool, got %r" % (cond.dtype,))
    # Python numbers become cached scalar handles, like the second operand of `x + 1.0`.
    da = a.dtype if isinstance(a, Tensor) else dtypes.of_python_value(a)
    db = b.dtype if isinstance(b, Tensor) else dtypes.of_python_value(b)
    dtype = (da if da is db else dtypes.promote(da, db)).compute
    shape = cond.shape
    for v in (a, b):
        if isinstance(v, Tensor) and v.shape != shape:
            shape = _broadcast_shapes("where", shape, v.shape)
    backend, n = cond.backend, len(shape)
    if shape != cond.shape:
        check_shape("where", shape, element_bytes(backend))
    handles = []
    for v in (cond, a, b):
        if not isinstance(v, Tensor):
            handles.append(_scalar(backend, v, dtype, n))
            continue
        if v.dtype is not dtype and v is not cond:
            v = v.cast(dtype)
        handles.append(v.handle if v.ndim == n else backend.reshape(v.handle, (1,) * (n - v.ndim) + v.shape))
    return Tensor(backend, backend.where(*handles), shape, dtype)


def maximum(a, b):
    a, b = _as_tensors("maximum", (a, b))
    return a.maximum(b)


def minimum(a, b):
    a, b = _as_tensors("minimum", (a, b))
    return a.minimum(b)


def cat(tensors, axis=0):
    """Join tensors along an existing axis (dtypes promote; other dims must match)."""
    tensors = list(tensors)
    if not tensors:
        raise ArgumentError("cat: needs at least one tensor")
    tensors = _as_tensors("cat", tensors)
    first = tensors[0]
    if first.ndim == 0:
        raise ShapeError("cat: cannot join 0-d tensors; use cn.stack")
    a = _axis("cat", axis, first.ndim, first.shape)
    dtype = first.dtype
    for t in tensors[1:]:
        dtype = dtype if t.dtype is dtype else dtypes.promote(dtype, t.dtype)  # int8 with int8: int8
        if t.ndim != first.ndim or any(x != y for d, (x, y) in enumerate(zip(t.shape, first.shape)) if d != a):
            raise ShapeError("cat: shapes %s and %s differ outside axis %d" % (first.shape, t.shape, axis))
    if len(tensors) == 1:
        return first.cast(dtype)
    shape = first.shape[:a] + (sum(t.shape[a] for t in tensors),) + first.shape[a + 1:]
    return Tensor(first.backend, first.backend.cat([t.cast(dtype).handle for t in tensors], a), shape, dtype)


def pad(x, pads, value=0):
    """Constant padding, torch.nn.functional.pad style: pads = (last_before, last_after,
    second_last_before, second_last_after, ...)."""
    if not isinstance(pads, (tuple, list)):
        raise ShapeError("pad: pads must be a tuple of non-negative ints, got %r" % (pads,))
    pads = tuple(pads)
    if len(pads) % 2 or len(pads) // 2 > x.ndim:
        raise ShapeError("pad: %d pad values for shape %s (need pairs, at most 2 per dim)" % (len(pads), x.shape))
    if any(type(p) is not int or p < 0 for p in pads):
        raise ShapeError("pad: pads must be non-negative ints, got %r for shape %s" % (pads, x.shape))
    pairs = [(0, 0)] * x.ndim
    for i in range(len(pads) // 2):
        pairs[x.ndim - 1 - i] = (pads[2 * i], pads[2 * i + 1])
    shape = tuple(n + b + e for n, (b, e) in zip(x.shape, pairs))
    if shape == x.shape:
        return x
    check_shape("pad", shape, element_bytes(x.backend))
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ArgumentTypeError("pad: value must be a number, got %r" % (value,))
    if not x.dtype.is_float and (value != value or value in (math.inf, -math.inf)):
        raise DTypeError("pad: value %r does not fit dtype %r" % (value, x.dtype))
    if x.dtype is int32 and not -2147483648 <= value <= 2147483647:
        raise ArgumentError("pad: value %r does not fit int32" % (value,))
    if not x.dtype.is_float and isinstance(value, float) and value != int(value):
        raise DTypeError("pad: value %r does not fit dtype %r" % (value, x.dtype))
    value = _PY_TYPE[x.dtype](value)
    return Tensor(x.backend, x.backend.pad(x.handle, tuple(pairs), value), shape, x.dtype)


def window_args(op, shape, kernel, stride=1, padding=0, dilation=1):
    """Validated ((kh, kw), stride, padding, dilation, (OH, OW)) of a sliding window over NCHW."""
    if len(shape) != 4:
        raise ShapeError("%s: needs an (N, C, H, W) input, got shape %s" % (op, shape))
    kernel, stride, padding, dilation = (_pair(op, v, name) for v, name in
                                         ((kernel, "kernel"), (stride, "stride"),
                                          (padding, "padding"), (dilation, "dilation")))
    if min(kernel + stride + dilation) < 1 or min(padding) < 0:
        raise ShapeError("%s: kernel/stride/dilation must be >= 1 and padding >= 0, got kernel=%s "
                         "stride=%s padding=%s dilation=%s" % (op, kernel, stride, padding, dilation))
    out = unfold2d_output_size(shape[2], shape[3], kernel, stride, padding, dilation)
    if min(out) < 1:
        raise ShapeError("%s: input shape %s too small for kernel %s (padding %s, dilation %s)"
                         % (op, shape, kernel, padding, dilation))
    return kernel, stride, padding, dilation, out


def _pair(op, v, name):
    if type(v) is int:
        return (v, v)
    if not isinstance(v, (tuple, list)) or len(v) != 2 or not all(type(i) is int for i in v):
        raise ShapeError("%s: %s must be an int or a pair of ints, got %r" % (op, name, v))
    return tuple(v)


def unfold2d(x, kernel, stride=1, padding=0, dilation=1, pad_value=0.0):
    """(N, C, H, W) -> (N, C*kh*kw, OH*OW) sliding windows (torch.nn.functional.unfold), the
    border filled with pad_value (-inf for max pooling)."""
    kernel, stride, padding, dilation, (oh, ow) = window_args("unfold2d", x.shape, kernel, stride,
                                                              padding, dilation)
    if x.dtype is not float32:
        raise DTypeError("unfold2d: needs a float32 input, got %r" % (x.dtype,))
    n, c = x.shape[0], x.shape[1]
    room = element_bytes(x.backend)  # backends may pad the image first, then gather the windows
    check_shape("unfold2d", (n, c, x.shape[2] + 2 * padding[0], x.shape[3] + 2 * padding[1]), room)
    check_shape("unfold2d", (n, c * kernel[0] * kernel[1], oh * ow), room)
    h = x.backend.unfold2d(x.handle, kernel, stride, padding, dilation, float(pad_value))
    return Tensor(x.backend, h, (n, c * kernel[0] * kernel[1], oh * ow), x.dtype)


from . import functional, indexing  # noqa: E402  (they call back into Tensor methods)
