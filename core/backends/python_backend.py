"""cn.Python(): the pure-Python backend on the `array` module.

The correctness reference that runs anywhere (CPython, Pyodide without NumPy), and the CPU
fallback in the browser, so its loops are written to stay inside C as much as CPython allows:
elementwise ops are list comprehensions generated from one expression per op (no per-element
function call on the fast path), movement ops are one `itemgetter` over a precomputed index
list, reductions and matmul run on C-level slices (`sum`, `max`, `sum(map(mul, row, col))`).

float32 data lives in array('f'), so every result is rounded to float32 when stored, like on
the other backends; Python computes each op in double first, which for + - * / sqrt gives the
correctly rounded float32 result. int32 lives in a 4-byte signed array and wraps around on
overflow like NumPy; bool lives in array('b') holding 0/1. The storage dtypes live at their size:
int8 in array('b'), uint8 in array('B'), float16 as its bit patterns in array('H') (the `array`
module has no half type; `struct`'s "e" converts), so movement ops copy them untouched.

Python raises where IEEE arithmetic returns inf/nan (1/0, log(0), exp(1000), sqrt(-1)...).
Each op therefore has a fast expression and, where it can raise, a safe one; the safe one runs
only when the fast one raised, so edge values cost nothing on ordinary data.
"""

import math
from array import array
from operator import itemgetter, mul

from .. import dtypes
from ..backend import Backend, _hash32, broadcast_shape, numel as _numel, row_major_strides, unfold2d_output_size
from ..errors import IndexingError
from ..ops import result_dtype

_INT_CODE = "i" if array("i").itemsize == 4 else "l"
_CODES = {dtypes.float32: "f", dtypes.int32: _INT_CODE, dtypes.bool_: "b",
          dtypes.int8: "b", dtypes.uint8: "B", dtypes.float16: "H"}
_INT_MIN = -2147483648
_INF = math.inf
_NAN = math.nan
# Python 3.12+ has a C dot product with extended-precision accumulation; older ones sum a map.
_sumprod = getattr(math, "sumprod", None)


class Buffer:
    """A Python-backend handle: contiguous row-major data, its shape and dtype.

    Handles are never mutated after creation, so reshape and same-dtype cast share `data`.
    Two caches make `x @ weight.T` (every Linear layer) cheap on a persistent weight:
    a transpose of the last two dims is lazy (`transpose_of` is its source; `data` is built
    only if something other than matmul reads it), and `rows()` keeps the data as lists
    of Python floats, which matmul's dot products read at C speed.
    """

    __slots__ = ("_data", "shape", "dtype", "transpose_of", "_rows")

    def __init__(self, data, shape, dtype, transpose_of=None):
        self._data = data
        self.shape = shape
        self.dtype = dtype
        self.transpose_of = transpose_of
        self._rows = None

    @property
    def data(self):
        if self._data is None:
            self._data = _permuted(self.transpose_of, _swap_last_two(len(self.shape)))
        return self._data

    def rows(self):
        """The data as a list of last-dim rows, each a list of Python numbers (cached)."""
        if self._rows is None:
            flat, width = self.data.tolist(), self.shape[-1]
            self._rows = [flat[r:r + width] for r in range(0, len(flat), width)] if width else \
                [[]] * _numel(self.shape[:-1])
        return self._rows

    def __repr__(self):
        return "Buffer(shape=%r, dtype=%r)" % (self.shape, self.dtype)


# ---------------------------------------------------------------------------------------------
# Index helpers: every movement op is "gather these flat indices".

def _strided_index(shape, strides, offset=0):
    """Flat source index of every element of `shape`, row-major, for the given source strides."""
    idx = [offset]
    for n, s in zip(shape, strides):
        if n == 1:
            continue
        steps = range(0, n * s, s) if s else (0,) * n
        idx = [i + t for i in idx for t in steps]
    return idx


def _take(data, idx):
    """data[idx] as a sequence (a tuple from one C-level itemgetter call)."""
    if len(idx) > 1:
        return itemgetter(*idx)(data)
    return [data[i] for i in idx]


def _swap_last_two(ndim):
    return tuple(range(ndim - 2)) + (ndim - 1, ndim - 2)


def _permuted(x, dims):
    """x's data with its dims permuted (a copy)."""
    strides = row_major_strides(x.shape)
    idx = _strided_index(tuple(x.shape[d] for d in dims), [strides[d] for d in dims])
    return array(x.data.typecode, _take(x.data, idx))


def _broadcast_data(h, shape):
    """h's elements laid out in `shape` (same ndim; h's dims are equal or 1)."""
    if h.shape == shape:
        return h.data
    if len(h.data) == 1:
        return h.data * _numel(shape)
    strides = [0 if n == 1 else s for n, s in zip(h.shape, row_major_strides(h.shape))]
    return _take(h.data, _strided_index(shape, strides))


def _wrap_int32(v):
    return ((v + 2147483648) & 0xFFFFFFFF) - 2147483648


def _store(values, dtype):
    """Pack computed Python values into dtype's array: float32 rounds, int32 wraps, bool is 0/1."""
    code = _CODES[dtype]
    if dtype is dtypes.bool_:
        return array(code, [1 if v else 0 for v in values])
    try:
        return array(code, values)
    except OverflowError:  # int32 only: array('f') itself turns overflow into inf
        return array(code, [_wrap_int32(v) for v in values])


def _half_bits(values):
    """Python floats -> array('H') of float16 bit patterns (dtypes.float16_bytes)."""
    data = array("H")
    data.frombytes(dtypes.float16_bytes(values))
    return data


def _half_values(data):
    """array('H') of float16 bit patterns -> list of Python floats."""
    return dtypes.float16_values(data.tobytes())


def _wrap_bits(values, dtype):
    """Ints -> dtype's 8-bit array, wrapping around (two's complement) like NumPy's astype."""
    if dtype is dtypes.uint8:
        return array("B", [v & 0xFF for v in values])
    return array("b", [((v + 128) & 0xFF) - 128 for v in values])


def _truncate_to_int32(values):
    # Truncate toward zero; nan, inf and out-of-range give INT_MIN, as NumPy does on x86.
    return array(_INT_CODE, [int(v) if -2147483649.0 < v < 2147483648.0 else _INT_MIN
                             for v in values])


# ---------------------------------------------------------------------------------------------
# Elementwise kernels: one expression per (dtype kind, op), compiled into comprehensions.

def _exp(x):
    try:
        return math.exp(x)
    except OverflowError:
        return _INF


def _log(x):
    if x > 0 or x != x:
        return math.log(x)
    return -_INF if x == 0 else _NAN


def _sqrt(x):
    return _NAN if x < 0 else math.sqrt(x)


def _finite_or_nan(fn, x):
    return fn(x) if x - x == 0 else _NAN  # x - x is nan exactly for inf and nan


def _in_domain(fn, x):
    return fn(x) if -1.0 <= x <= 1.0 else _NAN  # asin/acos outside [-1, 1] (and NaN): NaN


def _integral(fn, x):
    # copysign keeps NumPy's signed zeros: floor(-0.0) = ceil(-0.5) = round(-0.4) = -0.0.
    return math.copysign(fn(x), x) if x - x == 0 else x


def _div(x, y):
    if y:
        return x / y
    if x != x or not x:
        return _NAN
    return math.copysign(_INF, x) * math.copysign(1.0, y)


def _floordiv(x, y):
    return x // y if y else _div(x, y)


def _mod(x, y):
    return x % y if y else _NAN


def _is_odd_integer(y):
    return y % 2.0 == 1.0


def _pow(x, y):
    try:
        return math.pow(x, y)
    except OverflowError:
        return -_INF if x < 0 and _is_odd_integer(y) else _INF
    except ValueError:
        if x == 0:  # zero to a negative power
            return math.copysign(_INF, x) if _is_odd_integer(y) else _INF
        return _NAN  # negative base, non-integer exponent


def _ipow(x, y):
    if y >= 0:
        return pow(x, y, 4294967296)  # the low 32 bits; _store wraps them to signed
    if x == -1:
        return -1 if y & 1 else 1
    return 1 if x == 1 else 0  # 1 / x**|y| truncated toward zero


_KERNEL_NAMES = {
    "exp": math.exp, "log": math.log, "sqrt": math.sqrt, "sin": math.sin, "cos": math.cos,
    "tanh": math.tanh, "erf": math.erf, "asin": math.asin, "acos": math.acos, "atan": math.atan, "floor": math.floor, "ceil": math.ceil,
    "copysign": math.copysign, "pow": math.pow,
    "_exp": _exp, "_log": _log, "_sqrt": _sqrt, "_finite_or_nan": _finite_or_nan, "_in_domain": _in_domain,
    "_integral": _integral, "_div": _div, "_floordiv": _floordiv, "_mod": _mod, "_pow": _pow,
    "_ipow": _ipow,
}

# (fast expression, safe expression or None). Unary ops read x; binary ops read x and y.
_FLOAT_UNARY = {
    "neg": ("-x", None),
    "exp": ("exp(x)", "_exp(x)"),
    "log": ("log(x)", "_log(x)"),
    "sqrt": ("sqrt(x)", "_sqrt(x)"),
    "sin": ("sin(x)", "_finite_or_nan(sin, x)"),
    "cos": ("cos(x)", "_finite_or_nan(cos, x)"),
    "tanh": ("tanh(x)", None),
    "asin": ("asin(x)", "_in_domain(asin, x)"),
    "acos": ("acos(x)", "_in_domain(acos, x)"),
    "atan": ("atan(x)", None),
    "erf": ("erf(x)", None),
    "abs": ("abs(x)", None),
    "floor": ("copysign(floor(x), x)", "_integral(floor, x)"),
    "ceil": ("copysign(ceil(x), x)", "_integral(ceil, x)"),
    "round": ("copysign(round(x), x)", "_integral(round, x)"),  # round() is half to even
    "logical_not": ("0 if x else 1", None),
}
_INT_UNARY = {
    "neg": ("-x", None), "abs": ("abs(x)", None), "floor": ("x", None), "ceil": ("x", None),
    "round": ("x", None), "logical_not": ("0 if x else 1", None),
}
_COMPARE = {
    "eq": ("x == y", None), "ne": ("x != y", None), "lt": ("x < y", None),
    "le": ("x <= y", None), "gt": ("x > y", None), "ge": ("x >= y", None),
}
_FLOAT_BINARY = dict(_COMPARE, **{
    "add": ("x + y", None),
    "sub": ("x - y", None),
    "mul": ("x * y", None),
    "div": ("x / y", "_div(x, y)"),
    "pow": ("pow(x, y)", "_pow(x, y)"),
    "maximum": ("x if x > y or x != x else y", None),  # NaN in either operand wins
    "minimum": ("x if x < y or x != x else y", None),
    "floordiv": ("x // y", "_floordiv(x, y)"),
    "mod": ("x % y", "_mod(x, y)"),
    "logical_and": ("1.0 if x and y else 0.0", None),
    "logical_or": ("1.0 if x or y else 0.0", None),
})
_INT_BINARY = dict(_COMPARE, **{
    "add": ("x + y", None),
    "sub": ("x - y", None),
    "mul": ("x * y", None),
    "div": ("int(x / y) if y else 0", None),  # the tensor layer casts to float32 first
    "pow": ("_ipow(x, y)", None),
    "maximum": ("x if x > y else y", None),
    "minimum": ("x if x < y else y", None),
    "floordiv": ("x // y if y else 0", None),
    "mod": ("x % y if y else 0", None),
    "logical_and": ("1 if x and y else 0", None),
    "logical_or": ("1 if x or y else 0", None),
})

_LAYOUTS = {
    "unary": "lambda xs: [%s for x in xs]",
    "zip": "lambda xs, ys: [%s for x, y in zip(xs, ys)]",
    "x_scalar": "lambda x, ys: [%s for y in ys]",
    "y_scalar": "lambda xs, y: [%s for x in xs]",
}
_KERNELS = {}


def _kernel(expr, layout):
    key = (expr, layout)
    fn = _KERNELS.get(key)
    if fn is None:
        fn = _KERNELS[key] = eval(_LAYOUTS[layout] % expr, dict(_KERNEL_NAMES))  # noqa: S307
    return fn


def _run(exprs, layout, *args):
    fast, safe = exprs
    if safe is None:
        return _kernel(fast, layout)(*args)
    try:
        return _kernel(fast, layout)(*args)
    except (ArithmeticError, ValueError):
        return _kernel(safe, layout)(*args)


# Dot products of a short inner dim (a first conv layer: C*kh*kw = 9) are dominated by the
# per-call cost of sumprod/sum(map); for those, one generated comprehension per row of `a`
# computes every a_row . column with the row's entries bound as locals, twice as fast.
_UNROLL_MAX = 16
_DOT_KERNELS = {}


def _unrolled_dots(k):
    fn = _DOT_KERNELS.get(k)
    if fn is None:
        a = ", ".join("a%d" % i for i in range(k))
        c = ", ".join("c%d" % i for i in range(k))
        terms = " + ".join("a%d * c%d" % (i, i) for i in range(k))
        fn = _DOT_KERNELS[k] = eval("lambda %s, cols: [%s for %s, in cols]" % (a, terms, c))  # noqa: S307
    return fn


# ---------------------------------------------------------------------------------------------
# Reductions over rows (C-level slices of the reduced axis).

def _nan_in(row):
    # The sum is nan iff a nan is present or +inf and -inf both are; only then look closer.
    total = sum(row)
    return total != total and any(v != v for v in row)


def _max_row(row):
    return _NAN if _nan_in(row) else max(row)


def _min_row(row):
    return _NAN if _nan_in(row) else min(row)


def _argmax_row(row):
    if _nan_in(row):
        return next(i for i, v in enumerate(row) if v != v)
    return row.index(max(row))


def _argmin_row(row):
    if _nan_in(row):
        return next(i for i, v in enumerate(row) if v != v)
    return row.index(min(row))


# Reducing a middle axis: fold whole (inner,) slices together with the elementwise kernel,
# fewer Python-level steps than one row per output element.
_FOLD_OPS = {"sum": "add", "prod": "mul", "max": "maximum", "min": "minimum"}

_FLOAT_REDUCE = {"sum": sum, "prod": math.prod, "max": _max_row, "min": _min_row,
                 "argmax": _argmax_row, "argmin": _argmin_row}
_INT_REDUCE = {"sum": sum, "prod": math.prod, "max": max, "min": min,
               "argmax": lambda row: row.index(max(row)),
               "argmin": lambda row: row.index(min(row))}


# ---------------------------------------------------------------------------------------------
# unfold2d / fold2d index lists, per sample, cached: a CNN calls them with the same geometry
# at every layer and step.

_UNFOLD_CACHE = {}
_UNFOLD_CACHE_SIZE = 16


def _unfold_index(chw, kernel, stride, padding, dilation):
    """For one sample (C, H, W): the source index of every unfold2d output element, in
    (C*kh*kw, OH*OW) order; padding positions point at index C*H*W (one slot past the image)."""
    key = (chw, kernel, stride, padding, dilation)
    hit = _UNFOLD_CACHE.get(key)
    if hit is not None:
        return hit
    c, h, w = chw
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel, stride, padding, dilation
    hp, wp = h + 2 * ph, w + 2 * pw
    oh, ow = unfold2d_output_size(h, w, kernel, stride, padding, dilation)
    idx = _strided_index((c, kh, kw, oh, ow), (hp * wp, dh * wp, dw, sh * wp, sw))
    if ph or pw:
        outside = c * h * w
        blank = [outside] * wp
        padded = []  # padded flat index -> source flat index (or `outside`)
        for ci in range(c):
            padded += blank * ph
            for y in range(h):
                start = (ci * h + y) * w
                padded += blank[:pw] + list(range(start, start + w)) + blank[:pw]
            padded += blank * ph
        idx = [padded[i] for i in idx]
    if len(_UNFOLD_CACHE) >= _UNFOLD_CACHE_SIZE:
        del _UNFOLD_CACHE[next(iter(_UNFOLD_CACHE))]
    _UNFOLD_CACHE[key] = hit = (idx, itemgetter(*idx) if len(idx) > 1 else None)
    return hit


def _random_values(n, distribution, seed):
    """reference_random(n, distribution, seed), with the hash inlined (same doubles, faster)."""
    if distribution not in ("uniform", "normal"):
        raise ValueError("random: unknown distribution %r: use 'uniform' or 'normal'" % (distribution,))
    key = _hash32(seed)
    count = n if distribution == "uniform" else 2 * n
    scale = 1.0 / 16777216.0
    u = []
    append = u.append
    for i in range(count):
        x = (i & 0xFFFFFFFF) ^ key
        x ^= x >> 16
        x = (x * 0x7FEB352D) & 0xFFFFFFFF
        x ^= x >> 15
        x = (x * 0x846CA68B) & 0xFFFFFFFF
        x ^= x >> 16
        append((x >> 8) * scale)
    if distribution == "uniform":
        return u
    sqrt, log, cos, two_pi = math.sqrt, math.log, math.cos, 2.0 * math.pi
    return [sqrt(-2.0 * log(1.0 - u1)) * cos(two_pi * u2) for u1, u2 in zip(u[0::2], u[1::2])]


class Python(Backend):
    """Pure-Python CPU backend (float32 compute via array('f')); runs anywhere."""

    name = "python"
    storage_dtypes = dtypes.STORAGE_DTYPES
    element_bytes = 40  # peak bytes per element while a primitive builds a result (Python lists)

    def shape(self, h):
        return h.shape

    def dtype(self, h):
        return h.dtype

    # -- creation / reading -------------------------------------------------------------------

    def from_flat(self, values, shape, dtype):
        shape = tuple(shape)
        if dtype is dtypes.int32:
            if not isinstance(values, (list, tuple)):
                values = list(values)
            try:
                data = array(_INT_CODE, values)
            except TypeError:  # floats: truncate toward zero like cast
                data = _truncate_to_int32(values)
            except OverflowError:
                raise OverflowError("from_flat: value out of int32 range in %r" % (
                    [v for v in values if not -2147483648 <= v <= 2147483647][:3],)) from None
        elif dtype is dtypes.bool_:
            data = array("b", [1 if v else 0 for v in values])
        elif dtype is dtypes.float16:
            data = _half_bits([float(v) for v in values])
        else:
            data = array(_CODES[dtype], values)
        return Buffer(data, shape, dtype)

    def full(self, shape, value, dtype):
        shape = tuple(shape)
        return Buffer(self.from_flat([value], (), dtype).data * _numel(shape), shape, dtype)

    def random(self, shape, distribution, seed, dtype):
        shape = tuple(shape)
        h = Buffer(array("f", _random_values(_numel(shape), distribution, seed)), shape,
                   dtypes.float32)
        return h if dtype is dtypes.float32 else self.cast(h, dtype)

    def to_flat(self, h):
        if h.dtype is dtypes.bool_:
            return [v != 0 for v in h.data]
        if h.dtype is dtypes.float16:
            return _half_values(h.data)
        return h.data.tolist()

    # -- elementwise --------------------------------------------------------------------------

    def unary(self, op, x):
        if x.dtype is dtypes.float32:
            table = _FLOAT_UNARY
        else:
            table = _INT_UNARY
            if op not in table:  # float-only math on int/bool: compute in float32, cast back
                return self.cast(self.unary(op, self.cast(x, dtypes.float32)), x.dtype)
        values = _run(table[op], "unary", x.data)
        dtype = result_dtype(op, x.dtype)
        return Buffer(_store(values, dtype), x.shape, dtype)

    def binary(self, op, a, b):
        exprs = (_FLOAT_BINARY if a.dtype is dtypes.float32 else _INT_BINARY)[op]
        shape = a.shape if a.shape == b.shape else broadcast_shape(a.shape, b.shape)
        if a.shape == b.shape:
            values = _run(exprs, "zip", a.data, b.data)
        elif len(b.data) == 1 and a.shape == shape:
            values = _run(exprs, "y_scalar", a.data, b.data[0])
        elif len(a.data) == 1 and b.shape == shape:
            values = _run(exprs, "x_scalar", a.data[0], b.data)
        else:
            values = _run(exprs, "zip", _broadcast_data(a, shape), _broadcast_data(b, shape))
        dtype = result_dtype(op, a.dtype)
        return Buffer(_store(values, dtype), shape, dtype)

    def where(self, cond, a, b):
        shape = broadcast_shape(cond.shape, a.shape, b.shape)
        values = [x if c else y for c, x, y in zip(_broadcast_data(cond, shape),
                                                   _broadcast_data(a, shape),
                                                   _broadcast_data(b, shape))]
        return Buffer(array(_CODES[a.dtype], values), shape, a.dtype)

    def cast(self, x, dtype):
        if dtype is x.dtype:
            return Buffer(x.data, x.shape, dtype)
        if dtype is dtypes.int32 and x.dtype is dtypes.float32:
            return Buffer(_truncate_to_int32(x.data), x.shape, dtype)
        if x.dtype is dtypes.float16:  # widen the bit patterns first, then as from float32
            return self.cast(Buffer(array("f", _half_values(x.data)), x.shape, dtypes.float32), dtype)
        if dtype is dtypes.bool_:
            return Buffer(array("b", [1 if v else 0 for v in x.data]), x.shape, dtype)
        if dtype is dtypes.float16:
            return Buffer(_half_bits(x.data.tolist()), x.shape, dtype)
        if dtype in (dtypes.int8, dtypes.uint8):
            ints = _truncate_to_int32(x.data) if x.dtype is dtypes.float32 else x.data
            return Buffer(_wrap_bits(ints, dtype), x.shape, dtype)
        return Buffer(array(_CODES[dtype], x.data), x.shape, dtype)

    # -- reductions ---------------------------------------------------------------------------

    def reduce(self, op, x, axis, keepdim):
        shape, data = x.shape, x.data
        n = shape[axis]
        outer, inner = _numel(shape[:axis]), _numel(shape[axis + 1:])
        out_shape = shape[:axis] + ((1,) if keepdim else ()) + shape[axis + 1:]
        fn = (_FLOAT_REDUCE if x.dtype is dtypes.float32 else _INT_REDUCE)[op]
        span = n * inner
        if inner == 1:
            values = [fn(data[o * span:o * span + n]) for o in range(outer)]
        elif op in _FOLD_OPS and span:  # (span 0: an empty inner dim, nothing to fold)
            exprs = (_FLOAT_BINARY if x.dtype is dtypes.float32 else _INT_BINARY)[_FOLD_OPS[op]]
            values = []
            for o in range(0, outer * span, span):
                acc = data[o:o + inner]
                for s in range(o + inner, o + span, inner):
                    acc = _run(exprs, "zip", acc, data[s:s + inner])
                values += acc
        else:
            values = [fn(data[s:s + span:inner])
                      for o in range(outer) for s in range(o * span, o * span + inner)]
        dtype = result_dtype(op, x.dtype)
        return Buffer(_store(values, dtype), out_shape, dtype)

    # -- linear algebra -----------------------------------------------------------------------

    def matmul(self, a, b):
        m, k = a.shape[-2:]
        n = b.shape[-1]
        batch_a, batch_b = a.shape[:-2], b.shape[:-2]
        batch = broadcast_shape(batch_a, batch_b)
        a_offsets = _strided_index(batch, [0 if d == 1 else s * m * k
                                           for d, s in zip(batch_a, row_major_strides(batch_a))])
        b_offsets = _strided_index(batch, [0 if d == 1 else s * k * n
                                           for d, s in zip(batch_b, row_major_strides(batch_b))])
        a_rows = a.data.tolist()  # lists iterate faster than arrays
        source = b.transpose_of
        if source is None:
            b_flat = b.data.tolist()
        else:  # b = source^T: b's columns are the source's rows, no transpose needed
            b_rows = source.rows()
        out = array("f")
        for ao, bo in zip(a_offsets, b_offsets):
            rows = [a_rows[r:r + k] for r in range(ao, ao + m * k, k)] if k else [[]] * m
            if source is None:
                cols = [b_flat[c:bo + k * n:n] for c in range(bo, bo + n)]
            else:
                cols = b_rows[bo // k:bo // k + n] if k else b_rows[:n]
            if 0 < k <= _UNROLL_MAX:
                dots = _unrolled_dots(k)
                for r in rows:
                    out.extend(dots(*r, cols))
            elif _sumprod is not None:
                out.extend([_sumprod(r, c) for r in rows for c in cols])
            else:
                out.extend([sum(map(mul, r, c)) for r in rows for c in cols])
        return Buffer(out, batch + (m, n), dtypes.float32)

    # -- movement (copies; reshape shares the never-mutated data) ------------------------------

    def reshape(self, x, shape):
        return Buffer(x.data, tuple(shape), x.dtype)

    def permute(self, x, dims):
        dims = tuple(dims)
        shape = tuple(x.shape[d] for d in dims)
        if len(dims) >= 2 and dims == _swap_last_two(len(dims)):
            if x.transpose_of is not None:  # transposing back: the source itself
                return Buffer(x.transpose_of.data, shape, x.dtype)
            return Buffer(None, shape, x.dtype, transpose_of=x)  # lazy, see Buffer
        return Buffer(_permuted(x, dims), shape, x.dtype)

    def expand(self, x, shape):
        shape = tuple(shape)
        data = _broadcast_data(x, shape)
        return Buffer(data if isinstance(data, array) else array(x.data.typecode, data),
                      shape, x.dtype)

    def slice(self, x, starts, stops, steps):
        strides = row_major_strides(x.shape)
        shape = tuple(max(0, (b - a + s - 1) // s) for a, b, s in zip(starts, stops, steps))
        offset = sum(a * st for a, st in zip(starts, strides))
        idx = _strided_index(shape, [s * st for s, st in zip(steps, strides)], offset)
        return Buffer(array(x.data.typecode, _take(x.data, idx)), shape, x.dtype)

    def cat(self, xs, axis):
        first = xs[0]
        outer = _numel(first.shape[:axis])
        inner = _numel(first.shape[axis + 1:])
        out = array(first.data.typecode)
        chunks = [(x.data, x.shape[axis] * inner) for x in xs]
        for o in range(outer):
            for data, chunk in chunks:
                out += data[o * chunk:(o + 1) * chunk]
        shape = list(first.shape)
        shape[axis] = sum(x.shape[axis] for x in xs)
        return Buffer(out, tuple(shape), first.dtype)

    def pad(self, x, pads, value):
        if not x.shape:
            return Buffer(x.data, (), x.dtype)
        shape = tuple(n + p + q for n, (p, q) in zip(x.shape, pads))
        out = self.full(shape, value, x.dtype).data
        width = x.shape[-1]
        if width and len(x.data):
            strides = row_major_strides(shape)
            offset = sum(p * s for (p, _), s in zip(pads, strides))
            data = x.data
            # Copy row by row: each last-dim row is contiguous in both source and destination.
            for src, dst in zip(range(0, len(data), width),
                                _strided_index(x.shape[:-1], strides[:-1], offset)):
                out[dst:dst + width] = data[src:src + width]
        return Buffer(out, shape, x.dtype)

    # -- indexing -----------------------------------------------------------------------------

    def _index_positions(self, op, x, axis, index):
        """Flat positions in x addressed by gather/scatter_add's index tensor. Negative indices
        count from the end like NumPy; anything else outside the axis raises (a flat position
        would silently land in another row)."""
        size, indices = x.shape[axis], index.data
        if len(indices):
            low, high = min(indices), max(indices)
            if low < -size or high >= size:
                bad = low if low < -size else high
                raise IndexingError("%s: index %d is out of bounds for axis %d with size %d"
                                 % (op, bad, axis, size))
            if low < 0:
                indices = [i + size if i < 0 else i for i in indices]
        strides = list(row_major_strides(x.shape))
        along = strides[axis]
        strides[axis] = 0
        base = _strided_index(index.shape, strides)
        return [p + i * along for p, i in zip(base, indices)]

    def gather(self, x, axis, index):
        positions = self._index_positions("gather", x, axis, index)
        return Buffer(array(x.data.typecode, _take(x.data, positions)), index.shape, x.dtype)

    def scatter_add(self, x, axis, index, src):
        positions = self._index_positions("scatter_add", x, axis, index)
        values = src.data if src.shape == index.shape else \
            _take(src.data, _strided_index(index.shape, row_major_strides(src.shape)))
        if x.dtype is dtypes.float32:
            out = array("f", x.data)  # += on an array('f') rounds each partial sum like NumPy
            for p, v in zip(positions, values):
                out[p] += v
            return Buffer(out, x.shape, x.dtype)
        out = x.data.tolist()
        for p, v in zip(positions, values):
            out[p] += v
        return Buffer(_store(out, x.dtype), x.shape, x.dtype)

    # -- images -------------------------------------------------------------------------------

    def unfold2d(self, x, kernel, stride, padding, dilation, pad_value):
        n, c, h, w = x.shape
        idx, getter = _unfold_index((c, h, w), tuple(kernel), tuple(stride), tuple(padding),
                                    tuple(dilation))
        oh, ow = unfold2d_output_size(h, w, kernel, stride, padding, dilation)
        length, (kh, kw) = oh * ow, kernel
        code, data, chw = x.data.typecode, x.data, c * h * w
        fill = self.full((1,), pad_value, x.dtype).data
        out = array(code)
        for s in range(0, n * chw, chw) if chw else [0] * n:
            sample = data[s:s + chw] + fill  # the slot past the image holds the padding value
            out.extend(getter(sample) if getter is not None else [sample[i] for i in idx])
        return Buffer(out, (n, c * kh * kw, length), x.dtype)

    def fold2d(self, cols, size, kernel, stride, padding, dilation):
        n, ckk, length = cols.shape
        (h, w), (kh, kw) = size, kernel
        c = ckk // (kh * kw)
        idx, _ = _unfold_index((c, h, w), tuple(kernel), tuple(stride), tuple(padding),
                               tuple(dilation))
        code, data, chw, block = cols.data.typecode, cols.data, c * h * w, ckk * length
        zeros = array(code, [0]) * (chw + 1)
        out = array(code)
        for s in range(0, n * block, block) if block else [0] * n:
            # Entries are visited tap by tap, so each pixel sums its taps in the same order as
            # the NumPy backend, rounding to float32 after each add (array('f') +=).
            image = array(code, zeros)
            for p, v in zip(idx, data[s:s + block]):
                image[p] += v
            del image[chw]  # the padding slot
            out += image
        return Buffer(out, (n, c, h, w), cols.dtype)
