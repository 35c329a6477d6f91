"""ONNX operators: activations over an axis."""

import math

import cinders as cn
from ...backend import numel
from ...dtypes import bool_, float32
from ...functional import log_softmax, softmax
from .base import _axis, ints, op
from .shapes import _reverse


def _over_axis(fn, x, axis, opset):
    if opset >= 13:
        return fn(x, -1 if axis is None else axis)
    axis = _axis(1 if axis is None else axis, x.ndim)   # before 13: the input as a 2-D matrix
    flat = x.reshape(numel(x.shape[:axis]), numel(x.shape[axis:]))
    return fn(flat, 1).reshape(x.shape)


@op()
def Softmax(input, axis=None, opset=13):
    return _over_axis(softmax, input, axis, opset)


@op()
def LogSoftmax(input, axis=None, opset=13):
    return _over_axis(log_softmax, input, axis, opset)


@op()
def Hardmax(input, axis=None, opset=13):
    def hardmax(x, axis):
        n = x.shape[axis]
        first = x.argmax(axis, keepdim=True)
        positions = cn.arange(n, backend=x.backend).reshape([n if d == _axis(axis, x.ndim) else 1
                                                               for d in range(x.ndim)])
        return (positions == first).cast(x.dtype)
    return _over_axis(hardmax, input, axis, opset)


# -- reductions -----------------------------------------------------------------------------------

def _reduce_axes(data, axes, noop_with_empty_axes):
    axes = ints(axes)
    if not axes:
        return None if not noop_with_empty_axes else ()
    return tuple(_axis(a, data.ndim) for a in axes)


def _reducer(fn):
    def reduce(data, axes=None, keepdims=1, noop_with_empty_axes=0):
        axes = _reduce_axes(data, axes, noop_with_empty_axes)
        if axes == ():
            return fn(data, None, None, identity=True)
        keep = bool(keepdims)
        if axes is None:
            axes = tuple(range(data.ndim))
        if not data.ndim:
            return fn(data, None, keep, identity=True)
        return fn(data, axes, keep, identity=False)
    return reduce


def _define_reduce(name, body):
    fn = _reducer(body)
    fn.__name__ = name
    return op(host=("axes",))(fn)


def _sum(x, axes, keep, identity):
    return x if identity else x.sum(axes, keep)


def _empty_safe(op_name, x, axes, keep):
    if any(x.shape[a] == 0 for a in axes):
        shape = tuple(1 if a in axes else n for a, n in enumerate(x.shape)) if keep else \
            tuple(n for a, n in enumerate(x.shape) if a not in axes)
        value = -math.inf if op_name == "max" else math.inf
        if x.dtype is bool_:
            value = op_name == "min"
        elif x.dtype is not float32:
            value = -2 ** 31 if op_name == "max" else 2 ** 31 - 1
        return cn.full(shape, value, backend=x.backend, dtype=x.dtype)
    return getattr(x, op_name)(axes, keep)


ReduceSum = _define_reduce("ReduceSum", _sum)
ReduceMean = _define_reduce("ReduceMean", lambda x, a, k, identity: x if identity else x.mean(a, k))
ReduceMax = _define_reduce("ReduceMax", lambda x, a, k, identity: x if identity else _empty_safe("max", x, a, k))
ReduceMin = _define_reduce("ReduceMin", lambda x, a, k, identity: x if identity else _empty_safe("min", x, a, k))
ReduceProd = _define_reduce("ReduceProd", lambda x, a, k, identity: x if identity else x.prod(a, k))
ReduceL1 = _define_reduce("ReduceL1", lambda x, a, k, identity: x.abs() if identity else x.abs().sum(a, k))
ReduceL2 = _define_reduce("ReduceL2", lambda x, a, k, identity: (
    x.abs() if identity else (x * x).sum(a, k).cast(float32).sqrt().cast(x.dtype)))
ReduceSumSquare = _define_reduce("ReduceSumSquare", lambda x, a, k, identity: x * x if identity else (x * x).sum(a, k))
ReduceLogSum = _define_reduce("ReduceLogSum", lambda x, a, k, identity: x.log() if identity else x.sum(a, k).log())


def _log_sum_exp(x, a, k, identity):
    if identity:
        return x
    x = x.cast(float32)
    if any(x.shape[i] == 0 for i in a):
        return x.sum(a, k).log()
    m = x.max(a, keepdim=True)
    m = cn.where(m.abs() == math.inf, 0.0, m)
    out = (x - m).exp().sum(a, keepdim=True).log() + m
    return out if k else out.squeeze(a)


ReduceLogSumExp = _define_reduce("ReduceLogSumExp", _log_sum_exp)


def _arg(name):
    def arg(data, axis=0, keepdims=1, select_last_index=0):
        a = _axis(axis, data.ndim)
        if select_last_index:
            n = data.shape[a]
            rev = _reverse(data, a)
            idx = getattr(rev, name)(a, keepdim=bool(keepdims))
            return (n - 1) - idx
        return getattr(data, name)(a, keepdim=bool(keepdims))
    arg.__name__ = "ArgMax" if name == "argmax" else "ArgMin"
    return op()(arg)


ArgMax = _arg("argmax")
ArgMin = _arg("argmin")
