"""ONNX operators: losses."""

import cinders as cn
from ...dtypes import float32, int32
from ...functional import log_softmax
from ...indexing import _take
from .base import op


@op()
def NegativeLogLikelihoodLoss(input, target, weight=None, ignore_index=None, reduction="mean"):  # noqa: A002
    target = target.cast(int32)
    c = input.shape[1]
    valid = (target >= 0) & (target < c)
    if ignore_index is not None:
        valid = valid & (target != ignore_index)
    safe = cn.where(valid, target, 0)
    picked = input.gather(1, safe.unsqueeze(1)).squeeze(1)            # (N, d1, ...)
    w = valid.cast(float32)
    if weight is not None:
        w = w * _take(weight, 0, safe)
    loss = -picked * w
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / w.sum()


@op(multi=True)
def SoftmaxCrossEntropyLoss(scores, labels, weights=None, ignore_index=None, reduction="mean", outputs=1):
    log_prob = log_softmax(scores, 1)
    loss = NegativeLogLikelihoodLoss(log_prob, labels, weights, ignore_index=ignore_index, reduction=reduction)
    return (loss, log_prob) if outputs > 1 else loss
