"""ONNX operators: quantisation."""

from ...dtypes import float32, int32
from .base import _axis, op


def _per_axis(t, x, axis):
    if t.ndim == 0 or t.numel() == 1:
        return t.reshape(())
    a = _axis(axis, x.ndim)
    return t.reshape([t.shape[0] if d == a else 1 for d in range(x.ndim)])


@op()
def DequantizeLinear(x, x_scale, x_zero_point=None, axis=1, block_size=0, output_dtype=0):
    zp = 0 if x_zero_point is None else _per_axis(x_zero_point, x, axis).cast(float32)
    return (x.cast(float32) - zp) * _per_axis(x_scale, x, axis)


@op()
def QuantizeLinear(x, y_scale, y_zero_point=None, axis=1, block_size=0, output_dtype=0, saturate=1, precision=0):
    q = (x / _per_axis(y_scale, x, axis)).round()
    lo, hi = 0, 255
    if y_zero_point is not None:
        q = q + _per_axis(y_zero_point, x, axis).cast(float32)
    return q.maximum(float(lo)).minimum(float(hi)).cast(int32)


@op(multi=True)
def DynamicQuantizeLinear(x, outputs=1):
    lo = x.min().minimum(0.0)
    hi = x.max().maximum(0.0)
    scale = (hi - lo) / 255.0
    zp = (-lo / scale).round().maximum(0.0).minimum(255.0)
    y = ((x / scale).round() + zp).maximum(0.0).minimum(255.0).cast(int32)
    results = (y, scale, zp.cast(int32))[:outputs]
    return results if outputs > 1 else y
