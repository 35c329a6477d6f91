"""The quantized arithmetic that the ONNX ops' compositions (core/onnx/ops/quantization.py) and a
backend's one-kernel abilities (wgpu_backend/quantize.py, core/backend.py "dynamic_quantize",
"quantize_dequantize") share, as custom elementwise ops: one WGSL text and one tensor-op
reference each, so a composition and a backend's kernel compute the same float32 steps.

    dynamic_scale(lo, hi), dynamic_zero_point(lo, hi)
        DynamicQuantizeLinear's scale (1 where the range is empty) and float zero point from
        x's min and max (ONNX's range [min(x, 0), max(x, 0)]; the callers' min and max skip
        NaN). A NaN zero point (-inf in x: inf / inf) is 0.
    quantize_dequantize_op(lo, hi)
        (saturate(round(x / y_scale) + y_zp) - x_zp) * x_scale: QuantizeLinear then
        DequantizeLinear (the differences of integers below 2**24 are exact), saturating to
        [lo, hi].
"""

from .fusion import custom_op
from .tensor import where


def _dynamic_range(lo, hi):
    """The scale and the float zero point from x's min and max, in tensor ops."""
    lo, hi = lo.minimum(0.0), hi.maximum(0.0)
    scale = where(hi == lo, 1.0, (hi - lo) / 255.0)
    zero_point = (-lo / scale).round().maximum(0.0).minimum(255.0)
    return scale, where(zero_point != zero_point, 0.0, zero_point)


_DYNAMIC_RANGE_WGSL = """fn {name}(mn: f32, mx: f32) -> f32 {{
  let lo = min(mn, 0.0);
  let hi = max(mx, 0.0);
  let scale = select((hi - lo) / 255.0, 1.0, hi == lo);
  {result}
}}"""
dynamic_scale = custom_op("cn_dynamic_scale", _DYNAMIC_RANGE_WGSL.format(
    name="cn_dynamic_scale", result="return scale;"), lambda lo, hi: _dynamic_range(lo, hi)[0])
dynamic_zero_point = custom_op("cn_dynamic_zero_point", _DYNAMIC_RANGE_WGSL.format(
    name="cn_dynamic_zero_point", result="let v = round(-lo / scale); "
    "return select(select(select(v, 0.0, v < 0.0), 255.0, v > 255.0), 0.0, (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u);"),
    lambda lo, hi: _dynamic_range(lo, hi)[1])

_QUANTIZE_DEQUANTIZE = {}   # (lo, hi) -> its elementwise op


def quantize_dequantize_op(lo, hi):
    """The round trip saturating to [lo, hi] as one elementwise op (one kernel on cn.Wgpu and
    under cn.Fusion instead of six; its reference, the same tensor ops, elsewhere)."""
    if (lo, hi) not in _QUANTIZE_DEQUANTIZE:
        name = "cn_quantize_dequantize_%s%d_%d" % ("m" if lo < 0 else "", abs(lo), hi)
        wgsl = ("fn %s(x: f32, ys: f32, yz: f32, xs: f32, xz: f32) -> f32 { let v = round(x / ys) + yz; "
                "return (select(select(v, %d.0, v < %d.0), %d.0, v > %d.0) - xz) * xs; }" % (name, lo, lo, hi, hi))

        def reference(x, ys, yz, xs, xz):
            return (((x / ys).round() + yz).maximum(float(lo)).minimum(float(hi)) - xz) * xs
        _QUANTIZE_DEQUANTIZE[(lo, hi)] = custom_op(name, wgsl, reference)
    return _QUANTIZE_DEQUANTIZE[(lo, hi)]
