"""ONNX operators: elementwise."""

import math

import cinders as cn
from ...dtypes import float32, int32
from ...nn.functional import hardswish
from .base import _axis, dtype_of, half_input, op, scalar
from .normalization import _channel


@op()
def Div(a, b, broadcast=0, axis=None):
    b = _legacy_broadcast(a, b, broadcast, axis)
    if a.dtype is float32 or b.dtype is float32:
        return a / b
    return (a.cast(float32) / b.cast(float32)).cast(a.dtype)   # C division: truncates toward 0


@op()
def Mod(a, b, fmod=0):
    if not fmod:
        return a % b
    q = (a.cast(float32) / b.cast(float32))
    q = cn.where(q < 0, q.ceil(), q.floor())
    return a - (q * b.cast(float32)).cast(a.dtype) if a.dtype is not float32 else a - q * b


@op()
def Pow(x, y, broadcast=0, axis=None):
    y = _legacy_broadcast(x, y, broadcast, axis)
    if x.dtype is float32:
        return x ** y.cast(float32)
    return (x.cast(float32) ** y.cast(float32)).round().cast(x.dtype)


def power_by_constant(x, n):
    """Pow(x, n) for a constant exponent n of 2 or 3 (the codegen decides it at import: GELU's
    tanh form cubes, RMS norms square): float x as products, as onnxruntime computes these
    exponents (and far faster than a general power)."""
    if x.dtype is not float32:
        return Pow(x, cn.tensor(float(n), backend=x.backend))
    return x * x if n == 2 else x * x * x


@op()
def Reciprocal(x):
    return 1.0 / x


@op()
def Floor(x):
    return x.floor()


@op()
def Ceil(x):
    return x.ceil()


@op()
def Round(x):
    return x.round()


@op()
def Sign(x):
    return (x > 0).cast(x.dtype) - (x < 0).cast(x.dtype)


@op()
def Sin(x):
    return x.sin()


@op()
def Cos(x):
    return x.cos()


@op()
def Tan(x):
    return x.sin() / x.cos()


@op()
def Sinh(x):
    return (x.exp() - (-x).exp()) * 0.5


@op()
def Cosh(x):
    return (x.exp() + (-x).exp()) * 0.5


@op()
def Asin(x):
    return x.asin()


@op()
def Acos(x):
    return x.acos()


@op()
def Atan(x):
    return x.atan()


@op()
def Asinh(x):
    return (x + (x * x + 1.0).sqrt()).log()


@op()
def Acosh(x):
    return (x + (x * x - 1.0).sqrt()).log()


@op()
def Atanh(x):
    return ((1.0 + x) / (1.0 - x)).log() * 0.5


@op()
def Sigmoid(x):
    return x.sigmoid()


@op()
def HardSigmoid(x, alpha=0.2, beta=0.5):
    return (x * alpha + beta).maximum(0.0).minimum(1.0)


@op()
def HardSwish(x):
    return hardswish(x)


@op()
def LeakyRelu(x, alpha=0.01):
    return cn.where(x < 0, x * alpha, x)


@op()
def PRelu(x, slope):
    if slope.ndim == 1 and x.ndim > 2 and slope.shape[0] == x.shape[1] != x.shape[-1]:
        slope = _channel(slope, x.ndim)   # opsets before 7: one slope per channel
    return cn.where(x < 0, x * slope, x)


@op()
def Elu(x, alpha=1.0):
    return cn.where(x < 0, (x.exp() - 1.0) * alpha, x)


@op()
def Selu(x, alpha=1.67326319217681884765625, gamma=1.05070102214813232421875):
    return cn.where(x <= 0, (x.exp() - 1.0) * alpha, x) * gamma


@op()
def Celu(x, alpha=1.0):
    return x.maximum(0.0) + ((x / alpha).exp() - 1.0).minimum(0.0) * alpha


@op()
def ThresholdedRelu(x, alpha=1.0):
    return cn.where(x > alpha, x, 0.0)


@op()
def Softplus(x):
    # log(1 + e^x) without overflow: max(x, 0) + log(1 + e^-|x|)
    return x.maximum(0.0) + ((-x.abs()).exp() + 1.0).log()


@op()
def Softsign(x):
    return x / (x.abs() + 1.0)


@op()
def Mish(x):
    return x * Softplus(x).tanh()


@op()
def Swish(x, alpha=1.0):
    return x * (x * alpha).sigmoid()


@op()
def Gelu(x, approximate="none"):
    if approximate == "tanh":
        return x * 0.5 * (1.0 + ((x + x * x * x * 0.044715) * math.sqrt(2.0 / math.pi)).tanh())
    return x.gelu()


@op()
def Shrink(x, bias=0.0, lambd=0.5):
    return cn.where(x < -lambd, x + bias, cn.where(x > lambd, x - bias, 0.0)).cast(x.dtype)


@op()
def IsNaN(x):
    return x != x


@op()
def IsInf(x, detect_negative=1, detect_positive=1):
    pos = (x == math.inf) if detect_positive else (x != x) & (x == x)
    neg = (x == -math.inf) if detect_negative else (x != x) & (x == x)
    return pos | neg


@op()
def Not(x):
    return x.logical_not()


@op()
def And(a, b):
    return a & b


@op()
def Or(a, b):
    return a | b


@op()
def Xor(a, b):
    return a != b


@op()
def Equal(a, b):
    return a == b


@op()
def Less(a, b):
    return a < b


@op()
def LessOrEqual(a, b):
    return a <= b


@op()
def Greater(a, b):
    return a > b


@op()
def GreaterOrEqual(a, b):
    return a >= b


@op()
def BitShift(x, y, direction="LEFT"):
    factor = (2 ** y.cast(float32)).round().cast(int32)
    return x * factor if direction == "LEFT" else x // factor


@op()
def Where(condition, x, y):
    return cn.where(condition, x, y)


def _fold(fn, inputs):
    out = inputs[0]
    for t in inputs[1:]:
        out = fn(out, t)
    return out


@op()
def Max(*data_0):
    return _fold(lambda a, b: a.maximum(b), data_0)


@op()
def Min(*data_0):
    return _fold(lambda a, b: a.minimum(b), data_0)


@op()
def Sum(*data_0):
    return _fold(lambda a, b: a + b, data_0)


@op()
def Mean(*data_0):
    return Sum(*data_0) / float(len(data_0))


@op(host=("min", "max"))
def Clip(input, min=None, max=None):  # noqa: A002  (ONNX names)
    out = input
    if min is not None:
        out = out.maximum(scalar(min))
    if max is not None:
        out = out.minimum(scalar(max))
    return out


@op()
def Cast(input, to, saturate=1, round_mode="up"):
    if to == "float16":   # computes in float32, but holds float16's values: ONNX rounds here
        return half_input(input)
    dtype = dtype_of(to)
    if input.dtype is float32 and dtype is int32:
        # ONNX casts float to int like C (toward zero); the protocol's cast does the same.
        return input.cast(int32)
    return input.cast(dtype)


@op()
def CastLike(input, target_type, saturate=1, round_mode="up"):
    return input.cast(target_type.dtype)


# -- ops the generated code usually writes inline (`a + b`), here for the other cases --------------

def _legacy_broadcast(A, B, broadcast, axis):
    """Opsets before 7: with broadcast=1, B's dims line up with A's starting at `axis`."""
    if broadcast and axis is not None and B.ndim and B.ndim < A.ndim:
        a = _axis(axis, A.ndim)
        return B.reshape(B.shape + (1,) * (A.ndim - a - B.ndim))
    return B


@op()
def Add(A, B, broadcast=0, axis=None):
    return A + _legacy_broadcast(A, B, broadcast, axis)


@op()
def Sub(A, B, broadcast=0, axis=None):
    return A - _legacy_broadcast(A, B, broadcast, axis)


@op()
def Mul(A, B, broadcast=0, axis=None):
    return A * _legacy_broadcast(A, B, broadcast, axis)


@op()
def Relu(X):
    return X.relu()


@op()
def Tanh(input):
    return input.tanh()


@op()
def Exp(input):
    return input.exp()


@op()
def Log(input):
    return input.log()


@op()
def Sqrt(X):
    return X.sqrt()


@op()
def Neg(X):
    return -X


@op()
def Abs(X):
    return X.abs()


@op()
def Erf(input):
    return input.erf()


@op()
def Identity(input):
    return input
