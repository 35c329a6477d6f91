"""The op table: every elementwise and reduction op of Cinders, one entry each.

An entry names the op, its dtype rule (what it accepts, what it returns) and its gradient: a
one-line rule written beside the op (micrograd's habit), or NOT_DIFFERENTIABLE said out loud.
From this one table come
  * the Tensor methods and operators (core/tensor.py installs them),
  * the casts the tensor layer makes before a backend call, and every result dtype,
  * Autodiff's backward rules (core/autodiff.py),
  * the op lists of the backend protocol (core/backend.py UNARY_OPS, BINARY_OPS, REDUCE_OPS).
A backend keeps only its kernel table (Python expressions, NumPy ufuncs, WGSL expressions, the
board's engines); tests/test_op_table.py fails when one lacks a kernel for an op here, unless
the backend lists it in `unsupported_ops` with the reason.

An entry also says what its tests need, and the suites are generated from it (tests/op_cases.py):
conformance rows on every backend, gradient checks against PyTorch autograd and central
differences, the op-table checks. So adding an op is one entry below and one kernel per backend.
    domain     where its operands are sampled (each operand's, for a binary op); edge values
               (inf, NaN, signed zeros, halves) are checked besides, wherever they fall
                   ANY       any real                POSITIVE  > 0 (log, sqrt, a base of pow)
                   UNIT      inside (-1, 1)          NONZERO   away from 0 (a divisor)
    exactness  how close every backend must come to the float64 result rounded to float32
                   EXACT        equal (IEEE-exact ops: + - * / sqrt, rounding, comparisons, ...)
                   ULP          within a few float32 ulps (transcendentals: libm and GPUs differ)
                   ACCUMULATED  float32 accumulation in the backend's order (sum, prod)
    torch      the PyTorch function that computes the op (the tests' oracle): the op's own name
               unless it says otherwise, with keyword arguments as (name, {arg: value})

Dtype rules: what the tensor layer does before calling the backend, which then sees operands
of one dtype and returns `result_dtype(op, that dtype)`.
    FLOAT     ints and bools are cast to float32; the result is float32
    NUMERIC   float32 and int32 as they are; bool computes as int32
    SIGNED    float32 and int32; bool is an error
    ROUNDING  float32; int32 is returned unchanged (already whole); bool is an error
    LOGICAL   bool only; the result is bool
    COMPARE   operands promoted to one dtype; the result is bool
    ORDERED   any dtype; the result has it (maximum, minimum, max, min)
    INDEX     any dtype in; int32 positions out (argmax, argmin)
A storage dtype (int8, uint8, float16: core/dtypes.py) follows the rule of its compute dtype
(int32, int32, float32): the tensor layer casts it to that first, so backends never compute in it.

Gradient rules read the values they name, and Autodiff keeps exactly those alive:
    unary      x (input), y (output), g (dL/dy)                        -> dL/dx
    binary     a, b (operands, broadcast), out, g; one rule per operand -> dL/da, dL/db
    reduction  x, y and g (reduced axis kept as 1), axis, shape (x's)  -> dL/dx
Binary rules return the gradient in the broadcast shape; Autodiff sums it back to the operand.
"""

import math

from .dtypes import bool_, float32, int32

FLOAT, NUMERIC, SIGNED, ROUNDING, LOGICAL, COMPARE, ORDERED, INDEX = (
    "float", "numeric", "signed", "rounding", "logical", "compare", "ordered", "index")
ANY, POSITIVE, UNIT, NONZERO = "any", "positive", "unit", "nonzero"  # domains
EXACT, ULP, ACCUMULATED = "exact", "ulp", "accumulated"  # exactness classes
NOT_DIFFERENTIABLE = "not differentiable"  # said explicitly: a float result with no gradient
_FLOAT_RESULT = (FLOAT, NUMERIC, SIGNED, ROUNDING, ORDERED)  # rules whose result can be float32


class Op:
    __slots__ = ("name", "kind", "rule", "grad", "not_differentiable", "params", "saves", "operators",
                 "domain", "exactness", "torch")

    def __init__(self, name, kind, rule, grad, operators, domain=ANY, exactness=EXACT, torch=None):
        if rule in _FLOAT_RESULT and grad is None:
            raise TypeError("op %r returns floats: give it a gradient rule or NOT_DIFFERENTIABLE" % name)
        self.name, self.kind, self.rule, self.operators = name, kind, rule, operators
        arity = 2 if kind == "binary" else 1
        self.domain = domain if isinstance(domain, tuple) else (domain,) * arity  # one per operand
        self.exactness, self.torch = exactness, torch or name
        self.not_differentiable = grad is NOT_DIFFERENTIABLE
        self.grad = None if self.not_differentiable else grad
        rules = () if self.grad is None else self.grad if isinstance(self.grad, tuple) else (self.grad,)
        self.params = tuple(_params(r) for r in rules)  # what each rule reads, in its order
        self.saves = frozenset(p for names in self.params for p in names) - {"g"}

    def __repr__(self):
        return "<op %s (%s, %s)>" % (self.name, self.kind, self.rule)


def _params(fn):
    return fn.__code__.co_varnames[:fn.__code__.co_argcount]


OPS = {}


def _add(kind, name, rule, grad=None, operators=(), **tests):
    if name in OPS:
        raise ValueError("op %r is defined twice in the op table" % name)
    OPS[name] = Op(name, kind, rule, grad, operators, **tests)


def result_dtype(op, dtype):
    """The dtype a backend returns for `op` on operands of `dtype` (after the tensor layer's casts)."""
    rule = OPS[op].rule
    return bool_ if rule in (LOGICAL, COMPARE) else int32 if rule == INDEX else dtype


def input_dtype(op, dtype):
    """The dtype the operands of `op` are cast to before the backend call, from the (promoted)
    dtype of the operands; None when the op is not defined for that dtype."""
    rule = OPS[op].rule
    if rule == FLOAT:
        return float32
    if rule == LOGICAL:
        return dtype if dtype is bool_ else None
    if dtype is bool_:
        return int32 if rule == NUMERIC else None if rule in (SIGNED, ROUNDING) else dtype
    return dtype


def float_result(op):
    """True when the op can return floats, so that Autodiff must know its gradient."""
    return OPS[op].rule in _FLOAT_RESULT


def names(kind, rule=None):
    return tuple(n for n, op in OPS.items() if op.kind == kind and (rule is None or op.rule == rule))


# ---- helpers the rules are written with (Tensor ops, imported late: the tensor layer imports us)

def _where(cond, a, b):
    from .tensor import where
    return where(cond, a, b)


def _sign(x):
    return (x > 0).cast(float32) - (x < 0).cast(float32)


def _zero(g):
    return g * 0.0


def _side_that_won(side, other, out, g):
    # maximum/minimum: the operand equal to `out` won; a tie gives each side half (PyTorch).
    return _where(side == out, _where(side == other, g * 0.5, g), 0.0)


def _prod_grad(x, y, g, axis):
    # d prod / d x_i = product of the other entries. Without zeros that is prod / x_i; with one
    # zero only that entry gets the product of the rest; with two or more every gradient is 0.
    is_zero = x == 0.0
    zeros = is_zero.cast(float32).sum(axis, keepdim=True)
    x_safe = _where(is_zero, 1.0, x)
    rest = x_safe.prod(axis, keepdim=True)  # product of the non-zero entries
    other = _where(zeros == 0.0, rest / x_safe, _where(is_zero, rest, 0.0))
    return _where(zeros <= 1.0, g * other, 0.0)


def _extreme_grad(x, y, g, axis):
    # Ties share the gradient evenly (torch.amax/amin semantics).
    hit = (x == y).cast(float32)
    return hit * (g / hit.sum(axis, keepdim=True))


_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)

# ---- unary ------------------------------------------------------------------------------------
#     name           dtype rule  gradient                                        operators / tests
_add("unary", "neg", SIGNED, lambda g: -g, ("__neg__",))
_add("unary", "exp", FLOAT, lambda y, g: g * y, exactness=ULP)
_add("unary", "log", FLOAT, lambda x, g: g / x, domain=POSITIVE, exactness=ULP)
_add("unary", "sqrt", FLOAT, lambda y, g: g / (y * 2.0), domain=POSITIVE)
_add("unary", "sin", FLOAT, lambda x, g: g * x.cos(), exactness=ULP)
_add("unary", "cos", FLOAT, lambda x, g: -(g * x.sin()), exactness=ULP)
_add("unary", "tanh", FLOAT, lambda y, g: g * (1.0 - y * y), exactness=ULP)
_add("unary", "asin", FLOAT, lambda x, g: g / (1.0 - x * x).sqrt(), domain=UNIT, exactness=ULP)  # NaN outside
_add("unary", "acos", FLOAT, lambda x, g: -(g / (1.0 - x * x).sqrt()), domain=UNIT, exactness=ULP)
_add("unary", "atan", FLOAT, lambda x, g: g / (x * x + 1.0), exactness=ULP)
_add("unary", "erf", FLOAT, lambda x, g: g * (-(x * x)).exp() * _TWO_OVER_SQRT_PI, exactness=ULP)
_add("unary", "abs", SIGNED, lambda x, g: g * _sign(x), ("__abs__",))
# Piecewise constant: zero gradient (PyTorch's convention), not "no gradient".
_add("unary", "floor", ROUNDING, _zero)
_add("unary", "ceil", ROUNDING, _zero)
_add("unary", "round", ROUNDING, _zero)  # half to even, like NumPy and PyTorch
_add("unary", "logical_not", LOGICAL, operators=("__invert__",))

# ---- binary: one rule per operand ---------------------------------------------------------------
_add("binary", "add", NUMERIC, (lambda g: g, lambda g: g), ("__add__", "__radd__"))
_add("binary", "sub", NUMERIC, (lambda g: g, lambda g: -g), ("__sub__", "__rsub__"))
_add("binary", "mul", NUMERIC, (lambda b, g: g * b, lambda a, g: g * a), ("__mul__", "__rmul__"))
_add("binary", "div", FLOAT, (lambda b, g: g / b, lambda b, out, g: -(g * out / b)),
     ("__truediv__", "__rtruediv__"), domain=(ANY, NONZERO))
# PyTorch masks the 0 * inf cases: d/da is 0 where b == 0, d/db is 0 where a == 0 and b >= 0.
_add("binary", "pow", FLOAT, (lambda a, b, g: _where(b == 0.0, 0.0, g * b * a ** (b - 1.0)),
                              lambda a, b, out, g: _where((a == 0.0) & (b >= 0.0), 0.0, g * out * a.log())),
     ("__pow__", "__rpow__"), domain=(POSITIVE, ANY), exactness=ULP)
_add("binary", "maximum", ORDERED, (lambda a, b, out, g: _side_that_won(a, b, out, g),
                                    lambda a, b, out, g: _side_that_won(b, a, out, g)))
_add("binary", "minimum", ORDERED, (lambda a, b, out, g: _side_that_won(a, b, out, g),
                                    lambda a, b, out, g: _side_that_won(b, a, out, g)))
_add("binary", "floordiv", NUMERIC, (_zero, _zero), ("__floordiv__", "__rfloordiv__"),  # floor(a / b)
     domain=(ANY, NONZERO), torch=("div", {"rounding_mode": "floor"}))  # torch.floor_divide has no gradient
_add("binary", "mod", NUMERIC, (lambda g: g, lambda a, b, g: -(g * (a / b).floor())),  # sign of b
     ("__mod__", "__rmod__"), domain=(ANY, NONZERO), torch="remainder")
_add("binary", "logical_and", LOGICAL, operators=("__and__", "__rand__"))
_add("binary", "logical_or", LOGICAL, operators=("__or__", "__ror__"))
_add("binary", "eq", COMPARE, operators=("__eq__",))
_add("binary", "ne", COMPARE, operators=("__ne__",))
_add("binary", "lt", COMPARE, operators=("__lt__",))
_add("binary", "le", COMPARE, operators=("__le__",))
_add("binary", "gt", COMPARE, operators=("__gt__",))
_add("binary", "ge", COMPARE, operators=("__ge__",))

# ---- reductions along one axis (the tensor layer loops for several) ---------------------------
_add("reduce", "sum", NUMERIC, lambda shape, g: g.expand(shape), exactness=ACCUMULATED)
_add("reduce", "prod", NUMERIC, _prod_grad, exactness=ACCUMULATED)
_add("reduce", "max", ORDERED, _extreme_grad, torch="amax")   # NaN propagates
_add("reduce", "min", ORDERED, _extreme_grad, torch="amin")
_add("reduce", "argmax", INDEX)                  # first occurrence
_add("reduce", "argmin", INDEX)
