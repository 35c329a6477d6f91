"""cn.Wgpu's activation quantization abilities (core/backend.py "dynamic_quantize",
"quantize_dequantize") as Programs of a few nodes, run by the backend's ProgramRunner: the one
generator of elementwise and reduction kernels (codegen/program.py) writes their kernels.

    dynamic_quantize     a reduction Program over the flattened x: its min and max (two-stage
                         when x is long: one pass over x for both), then per row (once) the
                         scale and the zero point; then a flat Program: y. Three launches.
    quantize_dequantize  a flat Program: the zero points widened where they are read, and the
                         round trip. One launch.

cn.profile calls their kernels dynamic_quantize_range (and _partial, its first stage),
dynamic_quantize, and quantize_dequantize.

The arithmetic is the composition's of core/onnx/ops/quantization.py, step for step in float32
(x / scale, round half to even, + zero point, clamp; ONNX's and onnxruntime's), so the results
are the same bits as cn.NumPy's and the composed kernels'.
"""

from cinders import dtypes
from cinders.fusion import custom_op
from cinders.fusion.graph import CONST, PENDING, Expr, Program
from cinders.quantization import dynamic_scale, dynamic_zero_point, quantize_dequantize_op

from .programs import leaf

# DynamicQuantizeLinear reads x with NaN as 0 (the range skips NaN: core/onnx/ops/quantization.py),
# and a NaN quotient (NaN x, inf / inf) saturates to 0; the scale, the zero point and the round
# trip are core/quantization.py's ops, the compositions' own.
_NAN = "(bitcast<u32>(%s) & 0x7fffffffu) > 0x7f800000u"   # (x != x may be folded away)
_NAN_AS_ZERO = custom_op("cn_dq_nan_as_zero", "fn cn_dq_nan_as_zero(x: f32) -> f32 {\n  return select(x, 0.0, %s);\n}"
                         % (_NAN % "x"))
_QUANTIZE_U8 = custom_op("cn_dq_quantize", "fn cn_dq_quantize(x: f32, s: f32, z: f32) -> f32 {\n"
                         "  let v = round(x / s) + z;\n  let c = select(select(v, 0.0, v < 0.0), 255.0, v > 255.0);\n"
                         "  return select(c, 0.0, %s);\n}" % (_NAN % "c"))


def _node(op, arg, inputs, shape, fshape, dtype, frame):
    return Expr(PENDING, op, arg, tuple(inputs), shape, fshape, dtype, frame=frame)


def dynamic_quantize(backend, runner, x):
    """(y int32 shaped like x, scale float32 (), zero point int32 ()): ONNX DynamicQuantizeLinear."""
    n = x.size
    flat = backend.reshape(x, (n,))
    frame = ((n,), 0)
    row = lambda op, arg, inputs, dtype: _node(op, arg, inputs, (), (1,), dtype, frame)  # noqa: E731
    values = leaf(flat)
    finite = _node("custom", _NAN_AS_ZERO, [values], (n,), (n,), dtypes.float32, frame)
    lo = row("reduce_min", None, [finite], dtypes.float32)
    hi = row("reduce_max", None, [finite], dtypes.float32)
    scale = row("custom", dynamic_scale, [lo, hi], dtypes.float32)
    zero_point = row("custom", dynamic_zero_point, [lo, hi], dtypes.float32)
    zero_int = row("cast_i", None, [zero_point], dtypes.int32)
    scale_h, zero_h = runner.run(Program([finite, lo, hi, scale, zero_point, zero_int], [scale, zero_int], frame),
                                 name="dynamic_quantize_range")
    flat_frame = ((n,), None)
    zero_f = _node("cast_f", None, [leaf(backend.reshape(zero_h, (1,)))], (1,), (1,), dtypes.float32,
                   flat_frame)
    q = _node("custom", _QUANTIZE_U8, [values, leaf(backend.reshape(scale_h, (1,))), zero_f], (n,), (n,),
              dtypes.float32, flat_frame)
    y = _node("cast_i", None, [q], (n,), (n,), dtypes.int32, flat_frame)
    (y_h,) = runner.run(Program([zero_f, q, y], [y], flat_frame), name="dynamic_quantize")
    return backend.reshape(y_h, x.shape), scale_h, zero_h


def quantize_dequantize(backend, runner, x, y_scale, y_zero_point, x_scale, x_zero_point, lo, hi):
    """(min(max(round(x / y_scale) + y_zero_point, lo), hi) - x_zero_point) * x_scale, per tensor."""
    shape = tuple(x.shape)
    frame = (shape, None)
    one = (1,) * len(shape)
    nodes, inputs = [], [leaf(x)]
    for p, is_zero_point in ((y_scale, False), (y_zero_point, True), (x_scale, False), (x_zero_point, True)):
        if p is None:  # (no zero point: 0)
            inputs.append(Expr(CONST, None, 0.0, (), one, one, dtypes.float32))
            continue
        value = leaf(backend.reshape(p, one))
        if is_zero_point:  # int8/uint8/int32, exact in float32
            value = _node("cast_f", None, [value], one, one, dtypes.float32, frame)
            nodes.append(value)
        inputs.append(value)
    out = _node("custom", quantize_dequantize_op(lo, hi), inputs, shape, shape, dtypes.float32, frame)
    return runner.run(Program(nodes + [out], [out], frame), name="quantize_dequantize")[0]
