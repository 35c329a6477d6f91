"""ONNX operators: normalisation."""

import cinders as cn
from ...nn.functional import batch_norm, layer_norm
from ..proto import OnnxError
from .base import _axis, op
from .conv import _pad_spatial


def _channel(t, ndim):
    return t.reshape((1, t.shape[0]) + (1,) * (ndim - 2))


@op(multi=True)
def BatchNormalization(X, scale, B, input_mean, input_var, epsilon=1e-5, momentum=0.9,
                       training_mode=0, spatial=1, is_test=None, consumed_inputs=None, outputs=1):
    if training_mode or outputs > 1:
        raise OnnxError("BatchNormalization: training mode (running statistics outputs) is not supported")
    return batch_norm(X, input_mean, input_var, scale, B, epsilon)


@op()
def InstanceNormalization(input, scale, B, epsilon=1e-5):
    axes = tuple(range(2, input.ndim))
    centred = input - input.mean(axes, keepdim=True)
    var = (centred * centred).mean(axes, keepdim=True)
    return centred / (var + epsilon).sqrt() * _channel(scale, input.ndim) + _channel(B, input.ndim)


@op(multi=True)
def LayerNormalization(X, Scale, B=None, axis=-1, epsilon=1e-5, stash_type=1, outputs=1):
    a = _axis(axis, X.ndim)
    if outputs == 1:
        return layer_norm(X, X.shape[a:], Scale, B, epsilon)
    axes = tuple(range(a, X.ndim))
    mean = X.mean(axes, keepdim=True)
    centred = X - mean
    inv = 1.0 / ((centred * centred).mean(axes, keepdim=True) + epsilon).sqrt()
    out = centred * inv * Scale
    if B is not None:
        out = out + B
    return (out, mean, inv)[:outputs] if outputs > 1 else out


@op()
def RMSNormalization(X, scale, axis=-1, epsilon=1e-5, stash_type=1):
    a = _axis(axis, X.ndim)
    axes = tuple(range(a, X.ndim))
    return X / ((X * X).mean(axes, keepdim=True) + epsilon).sqrt() * scale


@op()
def GroupNormalization(X, scale, bias, epsilon=1e-5, num_groups=1, stash_type=1):
    n, c = X.shape[:2]
    g = X.reshape((n, num_groups, -1))
    centred = g - g.mean(2, keepdim=True)
    out = (centred / ((centred * centred).mean(2, keepdim=True) + epsilon).sqrt()).reshape(X.shape)
    if scale.shape[0] != c:  # opset 18: one scale and bias per group
        per = c // num_groups
        scale = scale.reshape(num_groups, 1).expand(num_groups, per).reshape(c)
        bias = bias.reshape(num_groups, 1).expand(num_groups, per).reshape(c)
    return out * _channel(scale, X.ndim) + _channel(bias, X.ndim)


@op()
def LpNormalization(input, axis=-1, p=2):
    a = _axis(axis, input.ndim)
    norm = input.abs().sum(a, keepdim=True) if p == 1 else (input * input).sum(a, keepdim=True).sqrt()
    return cn.where(norm == 0, 0.0, input / norm)


@op()
def MeanVarianceNormalization(X, axes=(0, 2, 3)):
    axes = tuple(axes)
    centred = X - X.mean(axes, keepdim=True)
    return centred / ((centred * centred).mean(axes, keepdim=True).sqrt() + 1e-9)


@op()
def LRN(X, size, alpha=1e-4, beta=0.75, bias=1.0):
    c = X.shape[1]
    sq = X * X
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    padded = _pad_spatial(sq.transpose(1, -1), [lo], [hi], 0.0).transpose(1, -1)
    total = padded[:, 0:c]
    for i in range(1, size):
        total = total + padded[:, i:i + c]
    return X / (total * (alpha / size) + bias) ** beta
