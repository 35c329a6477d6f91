"""The board Tensor's methods and operators (`x.tanh()`, `a + b`, `a @ b`, `x.sum(axis)`,
`x.tolist()` nested, ...), with the desktop's names and NumPy broadcasting.

Loaded on the first method call (_tensor.py forwards to it), so a model that only chains layers
never holds this code in RAM. Every op here makes a new tensor (like the desktop; the layers'
in-place activations are the memory-saving exception, see _array.unary). Values are worked on
as flat row-major float lists of any engine (`flat`), so the same code serves both engines.
The less common methods (permute, indexing, matmul, reductions, softmax, layer norm, cat) are
in _ops_more.py, imported on their first call.
"""

import math
from array import array

from cinders import engine
from cinders._tensor import Tensor, live, empty

# Not math.inf/math.nan: frozen firmware (mpy-cross) folds those into C constants that do not
# compile; a call is left alone.
_INF = float("inf")
_NAN = float("nan")


def flat(t):
    """The values of t, flat row-major, as an indexable sequence of floats."""
    live(t)
    d = t.data
    if isinstance(d, (array, memoryview)):
        return d
    return engine.to_array(d)  # an engine whose data is not an array('f') (ulab) converts it


def make(values, shape):
    """A new tensor of the engine from flat values (an array('f') is taken as it is)."""
    shape = tuple(shape)
    if not isinstance(values, array):
        values = array("f", values)
    return Tensor(engine.from_flat(values, shape), shape)


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def shape_of(nested):
    shape = []
    v = nested
    while isinstance(v, (list, tuple)):
        shape.append(len(v))
        if not v:
            break
        v = v[0]
    return tuple(shape)


def from_nested(nested):
    """A tensor of nested lists of numbers (ragged lists are refused)."""
    shape = shape_of(nested)
    out = empty("f", numel(shape))
    k = [0]

    def fill(v, depth):
        if depth == len(shape):
            if isinstance(v, (list, tuple)):
                raise ValueError("cinders.tensor: ragged nested list (expected shape %s)" % (shape,))
            out[k[0]] = v
            k[0] += 1
            return
        if not isinstance(v, (list, tuple)) or len(v) != shape[depth]:
            raise ValueError("cinders.tensor: ragged nested list (expected shape %s)" % (shape,))
        for item in v:
            fill(item, depth + 1)

    fill(nested, 0)
    return make(out, shape)


def tolist(t):
    """Nested lists like the desktop's (floats; ints for argmax/argmin results)."""
    v = flat(t)
    shape = t.shape
    cast = int if t.dtype == "int32" else float
    if not shape:
        return cast(v[0])

    def build(start, depth):
        n = shape[depth]
        if depth == len(shape) - 1:
            return [cast(v[start + i]) for i in range(n)]
        step = numel(shape[depth + 1:])
        return [build(start + i * step, depth + 1) for i in range(n)]

    return build(0, 0)


def item(t):
    if numel(t.shape) != 1:
        raise ValueError("item(): tensor of shape %s has %d values, not one" % (t.shape, numel(t.shape)))
    return (int if t.dtype == "int32" else float)(flat(t)[0])


def clone(t):
    v = flat(t)
    return make(array("f", v), t.shape)


# ---- shape

def reshape(t, *shape):
    if len(shape) == 1 and isinstance(shape[0], (list, tuple)):
        shape = shape[0]
    shape = list(shape)
    n = numel(t.shape)
    if shape.count(-1) > 1:
        raise ValueError("reshape%s: at most one -1" % (tuple(shape),))
    if -1 in shape:
        known = -numel(shape)
        shape[shape.index(-1)] = n // known if known else 0
    shape = tuple(shape)
    if numel(shape) != n:
        raise ValueError("reshape: cannot make %s of %s (%d values)" % (shape, t.shape, n))
    live(t)
    return engine.reshape(t, shape)


def flatten(t, start_dim=0, end_dim=-1):
    s = t.shape
    if not s:
        return reshape(t, 1)
    a = start_dim % len(s)
    b = end_dim % len(s)
    return reshape(t, s[:a] + (numel(s[a:b + 1]),) + s[b + 1:])


def unsqueeze(t, dim):
    s = list(t.shape)
    s.insert(dim % (len(s) + 1), 1)
    return reshape(t, s)


def squeeze(t, dim=None):
    s = t.shape
    if dim is None:
        return reshape(t, [d for d in s if d != 1])
    dim %= len(s)
    return reshape(t, s[:dim] + s[dim + 1:]) if s[dim] == 1 else t


def _strides(shape):
    out = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        out[i] = out[i + 1] * shape[i + 1]
    return out


# NaN propagates through every op, like the desktop: the comparisons are written so that NaN,
# which fails every one, takes the branch that computes.

def _sigmoid(v):
    return 0.0 if v <= -80.0 else 1.0 / (1.0 + math.exp(-v))


def _relu(v):
    return 0.0 if v <= 0.0 else v


def _gelu(v):
    from cinders._array import _gelu as g  # one erf for both engines
    return g(v)


def _erf(v):
    from cinders._array import _ERF
    return _ERF(v)


def _log(v):  # IEEE like the desktop, where math raises "math domain error"
    return math.log(v) if v > 0.0 else (-_INF if v == 0.0 else _NAN)


def _sqrt(v):
    return math.sqrt(v) if v >= 0.0 else _NAN


def _exp(v):
    return _INF if v >= 88.7 else math.exp(v)  # float32 overflows past 88.72


def _whole(f):
    # floor/ceil/round of inf and NaN are themselves (math raises: they have no int)
    return lambda v: float(f(v)) if v - v == 0.0 else v


_round = _whole(round)  # half to even, like the desktop (and Python's round)


def _periodic(f):
    return lambda v: f(v) if v - v == 0.0 else _NAN  # sin(inf) is NaN (math raises)


# Keyed by the desktop op table's names (core/ops.py), so the methods are the same.
UNARY = {"relu": _relu, "sigmoid": _sigmoid, "tanh": math.tanh, "exp": _exp, "erf": _erf,
         "round": _round,
         "log": _log, "sqrt": _sqrt, "abs": abs, "neg": lambda v: -v,
         "gelu": _gelu, "sin": _periodic(math.sin), "cos": _periodic(math.cos),
         "floor": _whole(math.floor), "ceil": _whole(math.ceil)}


def unary(name, t):
    f = UNARY[name]
    v = flat(t)
    out = empty("f", len(v))
    for i in range(len(v)):
        out[i] = f(v[i])
    return make(out, t.shape)


def clamp(t, min=None, max=None):  # noqa: A002  (the desktop's names)
    v = flat(t)
    out = empty("f", len(v))
    for i in range(len(v)):
        x = v[i]
        if min is not None and x < min:
            x = min
        if max is not None and x > max:
            x = max
        out[i] = x
    return make(out, t.shape)


def broadcast_shape(a, b, op):
    n = max(len(a), len(b))
    a = (1,) * (n - len(a)) + tuple(a)
    b = (1,) * (n - len(b)) + tuple(b)
    out = []
    for x, y in zip(a, b):
        if x != y and x != 1 and y != 1:
            raise ValueError("%s: shapes %s and %s do not broadcast" % (op, a, b))
        out.append(max(x, y))
    return tuple(out), a, b


def _div(x, y):
    if y != 0.0:
        return x / y
    if x == 0.0 or x != x:
        return _NAN
    return _INF if (x > 0) == (math.copysign(1.0, y) > 0) else -_INF  # IEEE, like the desktop


def _pow(x, y):
    if x < 0.0 and x - x == 0.0 and y - y == 0.0 and y % 1.0 != 0.0:
        return _NAN  # a finite negative base to a finite fraction: NaN, not a complex number
    try:
        return math.pow(x, y)  # IEEE's cases of inf and NaN operands, unlike x ** y
    except (ValueError, OverflowError):  # an infinite result: 0 to a negative power, overflow
        negative = y % 2.0 == 1.0 and math.copysign(1.0, x) < 0.0  # odd powers keep the sign
        return -_INF if negative else _INF


def _maximum(x, y):
    return x if x > y or x != x else y  # a NaN on either side is the result


def _minimum(x, y):
    return x if x < y or x != x else y


BINARY = {"add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y,
          "div": _div, "pow": _pow, "maximum": _maximum, "minimum": _minimum}


def _operand(x):
    if isinstance(x, Tensor):
        return flat(x), x.shape
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return array("f", [x]), ()
    raise TypeError("board tensors combine with tensors and numbers, not %s" % type(x).__name__)


def binary(name, a, b):
    av, ashape = _operand(a)
    bv, bshape = _operand(b)
    f = BINARY[name]
    shape, sa, sb = broadcast_shape(ashape, bshape, name)
    n = numel(shape)
    out = empty("f", n)
    if len(av) == n and len(bv) == n:
        for i in range(n):
            out[i] = f(av[i], bv[i])
    elif len(bv) == 1 or len(av) == 1:
        for i in range(n):
            out[i] = f(av[i % len(av)], bv[i % len(bv)])
    elif len(av) == n and tuple(sb[len(sb) - len(bshape):]) == tuple(shape[len(shape) - len(bshape):]) \
            and numel(bshape) == numel(shape[len(shape) - len(bshape):]):
        m = len(bv)  # b is a trailing block of a's shape (a bias row): index modulo its size
        for i in range(n):
            out[i] = f(av[i], bv[i % m])
    else:
        ast = [0 if d == 1 else s for d, s in zip(sa, _strides(sa))]
        bst = [0 if d == 1 else s for d, s in zip(sb, _strides(sb))]
        idx = [0] * len(shape)
        for k in range(n):
            ia = ib = 0
            for i in range(len(shape)):
                ia += idx[i] * ast[i]
                ib += idx[i] * bst[i]
            out[k] = f(av[ia], bv[ib])
            i = len(shape) - 1
            while i >= 0:
                idx[i] += 1
                if idx[i] < shape[i]:
                    break
                idx[i] = 0
                i -= 1
    return make(out, shape)


def tensor(values, shape=None):
    """cinders.tensor: nested lists (like the desktop's), a number or a tensor (copied), or flat
    row-major `values` (any sequence of numbers; an array('f') is used as it is) and `shape`."""
    if shape is not None:
        shape = tuple(shape)
        if len(values) != numel(shape):
            raise ValueError("cinders.tensor: %d values for shape %s (%d)"
                             % (len(values), shape, numel(shape)))
        return Tensor(engine.from_flat(values, shape), shape)
    if isinstance(values, Tensor):
        return clone(values)
    if isinstance(values, (int, float)):
        return make([values], ())
    return from_nested(values)


def zeros(*shape, **desktop_only):  # backend=, dtype= of the desktop's signature: float32 here
    return full(shape, 0.0)


def ones(*shape, **desktop_only):
    return full(shape, 1.0)


def full(shape, value):
    if len(shape) == 1 and isinstance(shape[0], (list, tuple)):
        shape = shape[0]
    shape = tuple(shape)
    out = empty("f", numel(shape))
    for i in range(len(out)):
        out[i] = value
    return make(out, shape)


def _more(name, *bound):
    """A function of _ops_more, imported on its first call."""
    def call(*args, **kwargs):
        from cinders import _ops_more
        return getattr(_ops_more, name)(*(bound + args), **kwargs)
    return call


matmul = _more("matmul")
cat = _more("cat")
stack = _more("stack")
getitem = _more("getitem")
transpose = _more("transpose")

METHODS = {
    "tolist": tolist, "item": item, "reshape": reshape, "view": reshape,
    "flatten": flatten, "unsqueeze": unsqueeze, "squeeze": squeeze, "permute": _more("permute"),
    "transpose": transpose, "clamp": clamp, "matmul": matmul,
    "softmax": _more("softmax"), "log_softmax": _more("log_softmax"),
    "maximum": lambda t, o: binary("maximum", t, o),
    "minimum": lambda t, o: binary("minimum", t, o),
}
for _name in UNARY:
    METHODS[_name] = (lambda n: lambda t: unary(n, t))(_name)
for _name in ("sum", "prod", "mean", "max", "min", "argmax", "argmin"):
    METHODS[_name] = _more("reduce", _name)


def attribute(t, name):
    """t.name for the names tensor.py does not define: methods (bound to t), T and ndim."""
    if name == "T":
        return transpose(t, -2, -1)
    if name == "ndim":
        return len(t.shape)
    f = METHODS.get(name)
    if f is None:
        raise AttributeError("board tensors have no attribute %r" % (name,))
    return lambda *args, **kwargs: f(t, *args, **kwargs)


def _operator(name, swap=False):
    if swap:
        return lambda a, b: binary(name, b, a)
    return lambda a, b: binary(name, a, b)


# Tensor's operators, given to the class when this module loads (see tensor.py for why here).
for _name, _op in (("add", "add"), ("sub", "sub"), ("mul", "mul"), ("truediv", "div")):
    setattr(Tensor, "__%s__" % _name, _operator(_op))
    setattr(Tensor, "__r%s__" % _name, _operator(_op, True))
Tensor.__pow__ = _operator("pow")
Tensor.__neg__ = lambda t: unary("neg", t)
Tensor.__matmul__ = matmul
Tensor.__getitem__ = getitem
Tensor.__len__ = lambda t: t.shape[0]
# No __float__: MicroPython would convert the tensor with it in `1.5 - t` instead of calling
# __rsub__ (use t.item()).
