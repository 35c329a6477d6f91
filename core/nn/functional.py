"""cn.nn.functional: the stateless forms of the layers, and the losses (PyTorch's names and
semantics). Everything is composed from Tensor operations, so Autodiff differentiates it."""

import math

from ..dtypes import float32, int32
from ..errors import DTypeError, ShapeError
from ..functional import (  # noqa: F401  (re-exported: nn.functional is the one place to look)
    avg_pool2d, conv2d, gelu, hardsigmoid, hardswish, log_softmax, max_pool2d, relu, relu6, sigmoid, silu,
    softmax)
from ..creation import random
from ..tensor import Tensor, _numel, cat, where


def tanh(x):
    return x.tanh()


def linear(x, weight, bias=None):
    """x @ weight.T + bias, weight (out_features, in_features) like torch."""
    if x.shape[-1] != weight.shape[1]:
        raise ShapeError("linear: input shape %s does not fit weight shape %s (in_features %d)"
                         % (x.shape, weight.shape, weight.shape[1]))
    out = x @ weight.transpose(0, 1)
    return out if bias is None else out + bias


def embedding(indices, weight):
    """Rows of `weight` (num_embeddings, dim) picked by int32 `indices` of any shape."""
    if not isinstance(indices, Tensor) or indices.dtype is not int32:
        raise DTypeError("embedding: indices must be an int32 Tensor, got %r" % (getattr(indices, "dtype", indices),))
    flat = indices.reshape(-1, 1).expand(-1, weight.shape[1])
    return weight.gather(0, flat).reshape(indices.shape + (weight.shape[1],))


def dropout(x, p=0.5, training=True, seed=None):
    """Zero each element with probability p and scale the rest by 1/(1-p) (training only).
    The mask comes from cn.random, so a given seed drops the same elements on every backend."""
    if not 0.0 <= p <= 1.0:
        raise ValueError("dropout: p must be in [0, 1], got %r" % (p,))
    if not training or p == 0.0:
        return x
    if p == 1.0:
        return x * 0.0
    keep = random(x.shape, backend=x.backend, seed=seed) >= p
    return where(keep, x * (1.0 / (1.0 - p)), 0.0)


def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """Normalise over the last len(normalized_shape) dims (biased variance, like torch)."""
    normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    k = len(normalized_shape)
    if tuple(x.shape[x.ndim - k:]) != normalized_shape:
        raise ShapeError("layer_norm: input shape %s does not end with normalized_shape %s"
                         % (x.shape, normalized_shape))
    if k == 1 and x.backend.normalization_kernels and x.dtype is float32 and normalized_shape[0] and \
            all(p is None or (p.shape == normalized_shape and p.dtype is float32) for p in (weight, bias)):
        for p in (weight, bias):
            if p is not None:
                x._same_device("layer_norm", p)
        handles = [None if p is None else p.handle for p in (weight, bias)]
        return Tensor(x.backend, x.backend.layer_norm(x.handle, *handles, eps), x.shape, float32)
    axes = tuple(range(x.ndim - k, x.ndim))
    centred = x - x.mean(axes, keepdim=True)
    out = centred / ((centred * centred).mean(axes, keepdim=True) + eps).sqrt()
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out


def _adaptive_windows(size, out):
    """torch's adaptive pooling windows along one dim: [floor(i*size/out), ceil((i+1)*size/out))."""
    return [(i * size // out, -(-(i + 1) * size // out)) for i in range(out)]


def adaptive_avg_pool2d(x, output_size):
    """Mean over the windows that split H and W into output_size cells, like torch. Equal
    windows are one avg_pool2d; otherwise each axis is averaged window by window (separable)."""
    if x.ndim != 4:
        raise ShapeError("adaptive_avg_pool2d: needs input (N, C, H, W), got shape %s" % (x.shape,))
    h, w = x.shape[2], x.shape[3]
    oh, ow = (output_size, output_size) if isinstance(output_size, int) else output_size
    oh, ow = h if oh is None else oh, w if ow is None else ow
    if not (isinstance(oh, int) and isinstance(ow, int) and oh >= 1 and ow >= 1):
        raise ShapeError("adaptive_avg_pool2d: output_size must be positive ints, got %r" % (output_size,))
    if (oh, ow) == (1, 1):
        return x.mean((2, 3), keepdim=True)
    if h % oh == 0 and w % ow == 0:
        return avg_pool2d(x, (h // oh, w // ow))
    for axis, size, out in ((2, h, oh), (3, w, ow)):
        if out != size:
            index = [slice(None)] * 4
            parts = []
            for start, stop in _adaptive_windows(size, out):
                index[axis] = slice(start, stop)
                parts.append(x[tuple(index)].mean(axis, keepdim=True))
            x = cat(parts, axis)
    return x


def batch_norm(x, mean, var, weight=None, bias=None, eps=1e-5):
    """(x - mean) / sqrt(var + eps) * weight + bias with per-channel (dim 1) statistics."""
    shape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    out = (x - mean.reshape(shape)) / (var.reshape(shape) + eps).sqrt()
    if weight is not None:
        out = out * weight.reshape(shape)
    if bias is not None:
        out = out + bias.reshape(shape)
    return out


# -- losses ------------------------------------------------------------------------------------

def _reduce(loss, reduction, op):
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    if reduction == "none":
        return loss
    raise ValueError("%s: reduction must be 'mean', 'sum' or 'none', got %r" % (op, reduction))


def cross_entropy(logits, target, reduction="mean", label_smoothing=0.0):
    """Softmax cross-entropy like torch: logits (N, C) or (N, C, d1, ...) with class indices
    (N,) / (N, d1, ...) of dtype int32, or class probabilities of the logits' shape."""
    if logits.ndim < 1:
        raise ShapeError("cross_entropy: logits must have a class dim, got shape %s" % (logits.shape,))
    axis = 0 if logits.ndim == 1 else 1
    logp = log_softmax(logits, axis)
    if target.dtype is float32:
        if target.shape != logits.shape:
            raise ShapeError("cross_entropy: probability targets of shape %s do not match logits %s"
                             % (target.shape, logits.shape))
        classes = logits.shape[axis]
        if label_smoothing:
            target = target * (1.0 - label_smoothing) + label_smoothing / classes
        return _reduce(-(target * logp).sum(axis), reduction, "cross_entropy")
    if target.dtype is not int32:
        raise DTypeError("cross_entropy: targets must be int32 class indices or float32 probabilities, "
                         "got %r" % (target.dtype,))
    expected = logits.shape[:axis] + logits.shape[axis + 1:]
    if target.shape != expected:
        raise ShapeError("cross_entropy: logits of shape %s need targets of shape %s, got %s"
                         % (logits.shape, expected, target.shape))
    picked = logp.gather(axis, target.unsqueeze(axis))
    if not label_smoothing and reduction in ("mean", "sum"):  # two tape entries fewer per step
        total = picked.sum()
        return total / -float(_numel(expected)) if reduction == "mean" else -total
    nll = -picked.squeeze(axis)
    if label_smoothing:
        nll = nll * (1.0 - label_smoothing) - logp.mean(axis) * label_smoothing
    return _reduce(nll, reduction, "cross_entropy")


def nll_loss(log_probs, target, reduction="mean"):
    axis = 0 if log_probs.ndim == 1 else 1
    return _reduce(-log_probs.gather(axis, target.unsqueeze(axis)).squeeze(axis), reduction, "nll_loss")


def mse_loss(input, target, reduction="mean"):  # noqa: A002  (torch's names)
    if input.shape != target.shape:
        raise ShapeError("mse_loss: input shape %s and target shape %s differ" % (input.shape, target.shape))
    diff = input - target
    return _reduce(diff * diff, reduction, "mse_loss")


def binary_cross_entropy(input, target, reduction="mean"):  # noqa: A002
    """-(t log p + (1 - t) log(1 - p)) on probabilities, each log clamped at -100 like torch."""
    if input.shape != target.shape:
        raise ShapeError("binary_cross_entropy: input shape %s and target shape %s differ"
                         % (input.shape, target.shape))
    log_p = input.log().maximum(-100.0)
    log_q = (1.0 - input).log().maximum(-100.0)
    return _reduce(-(target * log_p + (1.0 - target) * log_q), reduction, "binary_cross_entropy")


def binary_cross_entropy_with_logits(input, target, reduction="mean"):  # noqa: A002
    """BCE on logits, stable: max(x, 0) - x t + log(1 + exp(-|x|))."""
    if input.shape != target.shape:
        raise ShapeError("binary_cross_entropy_with_logits: input shape %s and target shape %s differ"
                         % (input.shape, target.shape))
    loss = input.maximum(0.0) - input * target + ((-input.abs()).exp() + 1.0).log()
    return _reduce(loss, reduction, "binary_cross_entropy_with_logits")


def scaled_dot_product_attention(q, k, v, mask=None):
    """softmax(q k^T / sqrt(d) + mask) v; mask is additive (float) or boolean (True = keep)."""
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    if mask is not None:
        scores = where(mask, scores, -math.inf) if mask.dtype is not float32 else scores + mask
    return softmax(scores, -1) @ v
