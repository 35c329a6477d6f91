"""ONNX operators: quantisation (ai.onnx). The com.microsoft ones are in quantization_contrib.

Quantized values (int8, uint8, int4, ...) compute as int32 tensors; what makes them int8 or
uint8 is the range they saturate to, which the importer passes as the ONNX element types of the
op's inputs (`input_types`, None where the graph does not say). Rounding is half to even, as
ONNX and onnxruntime round.

Integer products (MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv and the contrib ops
built on exact_matmul/exact_conv) run on the float32
matmul/conv of every backend, which is exact here: operands are differences of 8-bit values
(|v| <= 255), so a product is < 2**16 and any sum of EXACT_TERMS of them stays below 2**24,
where float32 holds every integer. Longer sums are cut into chunks of EXACT_TERMS along the
reduced axis; each chunk is cast to int32 and the chunks are added in int32.

Weights stay quantized where the backend declares `quantized_matmul` (core/backend.py; cn.Wgpu,
cn.Wasm, cn.NumPy): an int8/uint8 weight initializer is kept at its storage dtype there
(cinders.onnx), and MatMulInteger, DynamicQuantizeMatMul and MatMulNBits hand it to
`matmul_quantized`, which dequantizes it inside the matmul kernel (`quantized_product`): no
float32 or int32 copy of B. ConvInteger and QLinearConv (group 1, 2-D) do the same on the
unfolded image (`quantized_conv`), QLinearMatMul through `integer_matmul`, and a QDQ graph's
weights too: the importer joins `DequantizeLinear(constant int8 W)` with the Conv/MatMul/Gemm
that reads it into DequantizedConv/DequantizedMatMul/DequantizedGemm (cinders.onnx codegen),
which keep W 8-bit (an int4/uint4 W 4-bit: the importer packs it two values a byte, and the
products read it with `bits` 4, as MatMulNBits does); it joins an activation's
QuantizeLinear -> DequantizeLinear into QuantizeDequantize (one kernel, the
`quantize_dequantize` ability where declared), and where that activation is a joined
product's input it hands the product the activation's scale (x_scale): its integers then
multiply W's 8-bit values in exact int32 sums (matmul_quantized's a_scale), as onnxruntime's
QLinear kernels.

A backend that declares `quantized_conv2d` (cn.Wasm, cn.NumPy, cn.Wgpu) has a convolution kernel
of its own whose products are integers (`kernel_conv`, any group): ConvInteger and QLinearConv hand it
the 8-bit x and its zero point; DequantizedConv, where its X is a QuantizeDequantize of 8-bit
values (the importer then gives it that round trip's scale, x_scale), hands it float32 X, whose
integers are X / x_scale (exactly: |q - zp| <= 255, a few float32 roundings off), and gets
float32 sums * x_scale * w_scale + B.
"""

import math

import cinders as cn
from ...backend import QuantizedLayout
from ...dtypes import float32, int32, int8, uint8
from ...quantization import dynamic_scale, dynamic_zero_point, quantize_dequantize_op
from ...fusion import custom_op
from ...functional import stack
from ...tensor import Tensor, cat, unfold2d
from ..proto import DATA_TYPES, OnnxError
from .base import JOINED, _axis, _slice_axis, op
from .conv import Conv, _pad_spatial, _spatial_pads
from .linalg import Gemm, MatMul

# Saturation range of each integer type a quantized value may have.
QUANT_RANGES = {"uint8": (0, 255), "int8": (-128, 127), "uint16": (0, 65535), "int16": (-32768, 32767),
                "uint4": (0, 15), "int4": (-8, 7)}
EXACT_TERMS = 2 ** 24 // (255 * 255)   # 258 products of 8-bit differences sum exactly in float32


def quant_range(type_name, op_name):
    """(lo, hi) of a quantized type, or a clear refusal (float8 and other types cinders does not
    emulate, or a type the graph does not state)."""
    if type_name is None:
        raise OnnxError("%s: the graph does not say whether the quantized type is int8 or uint8 "
                        "(give the zero point as an initializer or a typed graph input)" % op_name)
    if type_name not in QUANT_RANGES:
        raise OnnxError("%s: quantized type %s is not supported (int4/uint4/int8/uint8/int16/uint16 are)"
                        % (op_name, type_name))
    return QUANT_RANGES[type_name]


def type_at(input_types, index):
    """The ONNX element type of input `index`, or None where the graph does not say."""
    return input_types[index] if input_types and index < len(input_types) else None


def check_params(op_name, shape, scale, zero_point, axis=1, block_size=0):
    """Refuse a scale or zero point that does not fit a quantized value of `shape` as ONNX says
    (onnxruntime refuses these too; a looser reading would answer a silently wrong number):
    one value (per tensor), a 1-D tensor of shape[axis] values (per axis), or with block_size
    x's shape with ceil(shape[axis] / block_size) along axis (opset 21 blocked); a zero point
    has its scale's shape."""
    if block_size < 0:
        raise OnnxError("%s: block_size must be >= 0, not %d" % (op_name, block_size))
    if block_size or scale.numel() != 1:
        if not -len(shape) <= axis < max(len(shape), 1):
            raise OnnxError("%s: axis %d is outside a value of shape %s" % (op_name, axis, tuple(shape)))
        a = _axis(axis, len(shape))
        fits = [-(-d // block_size) if i == a else d for i, d in enumerate(shape)] if block_size else [shape[a]]
        if list(scale.shape) != fits:
            raise OnnxError("%s: scale of shape %s does not fit a value of shape %s %s along axis %d (it needs %s)"
                            % (op_name, tuple(scale.shape), tuple(shape),
                               "in blocks of %d" % block_size if block_size else "per axis", a, tuple(fits)))
    if zero_point is not None and (tuple(zero_point.shape) != tuple(scale.shape) and
                                   not (zero_point.numel() == 1 and scale.numel() == 1)):
        raise OnnxError("%s: zero point of shape %s, scale of shape %s: they must have one shape"
                        % (op_name, tuple(zero_point.shape), tuple(scale.shape)))


def check_counts(op_name, params):
    """params: (name, scale or zero point or None, count). Refuse one that is neither one value
    nor `count` values along its last dim (one per row of A, column of B, output channel of W),
    as onnxruntime refuses it: broadcasting it would answer a wrong number or fail far away."""
    for name, p, count in params:
        if p is not None and p.numel() != 1 and (p.ndim == 0 or p.shape[-1] != count):
            raise OnnxError("%s: %s of shape %s: it needs one value or %d" % (op_name, name, tuple(p.shape), count))


def per_axis(t, x, axis=1, block_size=0):
    """A scale or zero point shaped to broadcast against x: one value (per tensor), a 1-D tensor
    along `axis` (per axis), or blocks of `block_size` along `axis` (opset 21 blocked); its shape
    checked (`check_params`) by the op."""
    if block_size:
        a = _axis(axis, x.ndim)
        shape = list(t.shape)
        wide = t.unsqueeze(a + 1).expand(shape[:a + 1] + [block_size] + shape[a + 1:])
        return _slice_axis(wide.reshape(shape[:a] + [shape[a] * block_size] + shape[a + 1:]), a, 0, x.shape[a])
    if t.ndim == 0 or t.numel() == 1:
        return t.reshape(())
    a = _axis(axis, x.ndim)
    return t.reshape([t.shape[0] if d == a else 1 for d in range(x.ndim)])


_ROUND_SATURATE = {}   # (lo, hi, with a zero point) -> its elementwise op


def _round_saturate_op(lo, hi, with_zero_point):
    """round(q) (+ zp) clamped to [lo, hi] as one elementwise op (one kernel on cn.Wgpu instead
    of four; its `reference`, the same tensor ops, elsewhere)."""
    key = (lo, hi, with_zero_point)
    if key not in _ROUND_SATURATE:
        name = "cn_round_saturate_%s%d_%d%s" % ("m" if lo < 0 else "", abs(lo), hi, "_zp" if with_zero_point else "")
        args, zp = ("q: f32, zp: f32", " + zp") if with_zero_point else ("q: f32", "")
        wgsl = ("fn %s(%s) -> f32 { let v = round(q)%s; "
                "return select(select(v, %d.0, v < %d.0), %d.0, v > %d.0); }" % (name, args, zp, lo, lo, hi, hi))

        def reference(q, zp=None):
            q = q.round() if zp is None else q.round() + zp
            return q.maximum(float(lo)).minimum(float(hi))
        _ROUND_SATURATE[key] = custom_op(name, wgsl, reference)
    return _ROUND_SATURATE[key]


def round_saturate(q, zero_point, lo, hi):
    """round(q) + zero_point clamped to [lo, hi], as int32 (q float32)."""
    if zero_point is None:
        return _round_saturate_op(lo, hi, False)(q).cast(int32)
    return _round_saturate_op(lo, hi, True)(q, zero_point.cast(float32)).cast(int32)


def quantize(x, scale, zero_point, lo, hi):
    """saturate(round(x / scale) + zero_point): ONNX QuantizeLinear on broadcastable parameters."""
    return round_saturate(x.cast(float32) / scale, zero_point, lo, hi)


def centered(x, zero_point):
    """x - zero_point in int32 (exact), as float32 (exact: |x - zp| < 2**24)."""
    return (x if zero_point is None else x - zero_point).cast(float32)


@op()
def DequantizeLinear(x, x_scale, x_zero_point=None, axis=1, block_size=0, output_dtype=0, input_types=None):
    check_params("DequantizeLinear", x.shape, x_scale, x_zero_point, axis, block_size)
    zp = None if x_zero_point is None else per_axis(x_zero_point, x, axis, block_size)
    return centered(x, zp) * per_axis(x_scale, x, axis, block_size)


@op()
def QuantizeLinear(x, y_scale, y_zero_point=None, axis=1, block_size=0, output_dtype=0, saturate=1, precision=0,
                   input_types=None):
    if y_zero_point is not None:
        out_type = type_at(input_types, 2)
    else:
        out_type = "uint8" if output_dtype == 0 else DATA_TYPES.get(output_dtype, ("type %d" % output_dtype,))[0]
    lo, hi = quant_range(out_type, "QuantizeLinear")
    check_params("QuantizeLinear", x.shape, y_scale, y_zero_point, axis, block_size)
    zp = None if y_zero_point is None else per_axis(y_zero_point, x, axis, block_size)
    return quantize(x, per_axis(y_scale, x, axis, block_size), zp, lo, hi)


@op(domain=JOINED)
def QuantizeDequantize(x, y_scale, y_zero_point, x_scale, x_zero_point=None, input_types=None):
    """DequantizeLinear(QuantizeLinear(x)) with per-tensor parameters (the importer joins the
    pair: codegen `requantized_activations`)."""
    lo, hi = quant_range(type_at(input_types, 2), "QuantizeLinear")
    if x.backend.quantize_dequantize:   # one kernel (core/backend.py)
        scales = [s.reshape(()).cast(float32).handle for s in (y_scale, x_scale)]
        zps = [None if z is None else (z if z.dtype in (int8, uint8, int32) else z.cast(int32)).reshape(()).handle
               for z in (y_zero_point, x_zero_point)]
        return Tensor(x.backend, x.backend.quantize_dequantize(x.cast(float32).handle, scales[0], zps[0], scales[1],
                                                               zps[1], lo, hi), x.shape, float32)
    params = [p.reshape(()).cast(float32) for p in (y_scale, y_zero_point, x_scale)]
    xz = 0.0 if x_zero_point is None else x_zero_point.reshape(()).cast(float32)
    return quantize_dequantize_op(lo, hi)(x.cast(float32), params[0], params[1], params[2], xz)


@op(multi=True)
def DynamicQuantizeLinear(x, outputs=1):
    """uint8 with the range [min(x, 0), max(x, 0)] (ONNX's formula, as onnxruntime computes it;
    an all-zero or empty x gets scale 1 and zero point 0, as in onnxruntime, where the formula
    would divide by 0). The range skips NaN and a NaN quotient (a NaN x; inf / inf, also in the
    zero point where x holds -inf) saturates to 0: one rule on every backend. (onnxruntime's own
    answer there depends on where a NaN falls in its vector lanes.)"""
    if x.backend.dynamic_quantize:   # the same arithmetic in one kernel (core/backend.py)
        handles = x.backend.dynamic_quantize(x.handle)
        results = tuple(Tensor(x.backend, h, shape, dtype) for h, shape, dtype in
                        zip(handles, (x.shape, (), ()), (int32, float32, int32)))[:outputs]
        return results if outputs > 1 else results[0]
    if x.numel() == 0:
        scale, zp = cn.full((), 1.0, backend=x.backend), cn.full((), 0, backend=x.backend, dtype=int32)
        results = (x.cast(int32), scale, zp)[:outputs]
        return results if outputs > 1 else results[0]
    values = cn.where(x != x, 0.0, x.cast(float32))   # (0 is inside the range anyway)
    lo, hi = values.min(), values.max()
    scale, zp = dynamic_scale(lo, hi), dynamic_zero_point(lo, hi)
    q = x.cast(float32) / scale
    y = round_saturate(cn.where(q != q, -math.inf, q), zp, 0, 255)
    results = (y, scale, zp.cast(int32))[:outputs]
    return results if outputs > 1 else y


def unpack_nibbles(packed):
    """uint8 bytes (as int32) -> twice as many 4-bit values along the last dim, low nibble first."""
    low = packed % 16
    high = (packed - low) // 16
    return stack([low, high], axis=packed.ndim).reshape(packed.shape[:-1] + (packed.shape[-1] * 2,))


def unpacked(w, packed_shape):
    """A packed 4-bit weight's values (codegen `packed_four_bit`: bytes holding two uint4 a byte)
    as int32 of its own shape: the composition's copy, where no kernel reads the nibbles."""
    count = 1
    for d in packed_shape:
        count *= d
    return unpack_nibbles(w.cast(int32).reshape((-1,)))[:count].reshape(tuple(packed_shape))


def exact_matmul(a, b):
    """int32 product of float32 matrices holding integer differences of 8-bit values (see the
    module's note), in chunks of EXACT_TERMS along K."""
    k = a.shape[-1]
    parts = [(a[..., i:i + EXACT_TERMS] @ b[..., i:i + EXACT_TERMS, :]).cast(int32) for i in range(0, k, EXACT_TERMS)]
    total = parts[0]
    for p in parts[1:]:
        total = total + p
    return total


def row_param(p):
    """A's zero point or scale: scalar, or one per row of A (shape (M,) -> (M, 1))."""
    if p is None or p.ndim == 0 or p.numel() == 1:
        return None if p is None else p.reshape(())
    return p.reshape((p.numel(), 1))


def column_param(p):
    """B's zero point or scale: scalar, or one per column of B (broadcasts along the last dim)."""
    if p is None or p.ndim == 0 or p.numel() == 1:
        return None if p is None else p.reshape(())
    return p.reshape((p.numel(),)) if p.ndim == 1 else p


def packed_weight(b, a):
    """True where b is a quantized weight that a's backend multiplies without widening it."""
    return b.dtype in (int8, uint8) and b.backend is a.backend and a.backend.quantized_matmul


def quantized_product(a, q, scale, zero_point, layout, a_scale=None):
    """a (..., K) @ dequantize(B) through the backend's matmul_quantized (core/backend.py):
    float32 a and a scale give float32; int32 a and no scale the exact int32 product; a_scale
    says float32 a is a QDQ activation (integers times a_scale), which the backend may sum
    exactly in int32."""
    backend = a.backend
    k, n = layout.k, layout.n
    rows = a.reshape((-1, k))
    # flat (a reshape copies a strided view): the layout's strides count from each one's start
    handles = [None if t is None else t.reshape((-1,)).handle for t in (q, scale, zero_point)]
    out = backend.matmul_quantized(rows.handle, *handles, layout,
                                   a_scale=None if a_scale is None else a_scale.reshape(()).cast(float32).handle)
    return Tensor(backend, out, (rows.shape[0], n), int32 if scale is None else float32).reshape(
        a.shape[:-1] + (n,))


def integer_matmul(a, a_zero_point, b, b_zero_point):
    """The exact int32 product (a - a_zp) @ (b - b_zp) of 8-bit operands (a_zp per row or
    scalar, b_zp per column or scalar): in the kernel where b is a packed weight, else
    exact_matmul."""
    if b.ndim == 2 and packed_weight(b, a):
        a = a if a_zero_point is None else a - a_zero_point
        k, n = b.shape
        zp = None if b_zero_point is None else b_zero_point.reshape((-1,))
        layout = QuantizedLayout(k, n, 8, k, (0, n, 1), zp=(0, 0, 0 if zp is None or zp.numel() == 1 else 1))
        return quantized_product(a.cast(int32), b, None, zp, layout)
    return exact_matmul(centered(a, a_zero_point), centered(b, b_zero_point))


def _per_channel(p):
    """0 where p is one value for every channel (or absent), 1 where it has one per channel."""
    return 0 if p is None or p.numel() == 1 else 1


def weight_layout(k, n, q, scale, zero_point, along_n=True, bits=8, zp_default=0):
    """QuantizedLayout of an 8-bit (or packed 4-bit) (K, N) weight at strides q = (0, sk, sn)
    whose scale and zero point are one value, or one per column (along_n) or per row of K."""
    if along_n:
        return QuantizedLayout(k, n, bits, k, q, scale=(0, 0, _per_channel(scale)),
                               zp=(0, 0, _per_channel(zero_point)), zp_default=zp_default)
    return QuantizedLayout(k, n, bits, 1, q, scale=(0, _per_channel(scale), 0),
                           zp=(0, _per_channel(zero_point), 0), zp_default=zp_default)


def conv_weight_layouts(shape, bits, scale, zero_point, block_size, axis, zp_default=0):
    """[(tap, QuantizedLayout)] of a conv weight of `shape` (O, C, kh, kw) read by the unfolded
    image's rows (k = (c, i, j)), or None where its parameters do not fit. One scale per tensor,
    per output channel (axis 0) or per input channel (axis 1: blocks of kh*kw along k): all of k
    at once (tap None). Opset 21 blocks along C (axis 1, scale (O, C blocks, kh, kw)): one kernel
    tap r = (i, j) at a time, the rows' columns r::kh*kw times W's values at k = c (in blocks,
    as the kernels' `block` counts them), the taps' products summed."""
    o, c = shape[:2]
    taps = shape[2] * shape[3]
    q = (0, 1, c * taps)
    if not block_size:
        if not (_per_channel(scale) or _per_channel(zero_point)) or _axis(axis, 4) == 0:
            return [(None, weight_layout(c * taps, o, q, scale, zero_point, bits=bits, zp_default=zp_default))]
        if _axis(axis, 4) != 1:
            return None
        # per input channel: k // (kh * kw) is c
        return [(None, QuantizedLayout(c * taps, o, bits, taps, q, scale=(0, _per_channel(scale), 0),
                                       zp=(0, _per_channel(zero_point), 0), zp_default=zp_default))]
    blocks = -(-c // block_size)
    grid = (o, blocks) + tuple(shape[2:])
    if _axis(axis, 4) != 1 or tuple(scale.shape) != grid or \
            (zero_point is not None and tuple(zero_point.shape) != grid):
        return None
    out = []
    for r in range(taps):
        params = (r, taps, blocks * taps)
        out.append((r if taps > 1 else None,
                    QuantizedLayout(c, o, bits, block_size, (r, taps, c * taps), scale=params,
                                    zp=(0, 0, 0) if zero_point is None else params, zp_default=zp_default)))
    return out


def quantized_conv(x, w, scale, zero_point, auto_pad, dilations, kernel_shape, pads, strides, shape=None,
                   layouts=None):
    """2-D convolution (group 1) of x (N, C, H, W) with an 8-bit weight W (O, C, kh, kw) whose
    scale and zero point are one value or one per output channel (or as `layouts` say:
    conv_weight_layouts; a packed 4-bit W's bytes, whose own shape is `shape`): the unfolded
    image's rows times W read k-contiguous inside matmul_quantized. Float32 x and a scale give
    float32; integer values in float32 x and no scale the exact int32 sums (ConvInteger: 8-bit
    differences)."""
    shape = tuple(shape or w.shape)
    kernel = list(shape[2:])
    strides, dilations = strides or [1, 1], dilations or [1, 1]
    begins, ends = _spatial_pads(x.shape, kernel, strides, dilations, pads, auto_pad)
    if begins != ends:   # unfold2d pads both sides alike: pad x itself first
        x, begins = _pad_spatial(x, begins, ends, 0.0), [0, 0]
    cols = unfold2d(x, tuple(kernel), tuple(strides), tuple(begins), tuple(dilations))
    n, ckk, length = cols.shape
    rows = cols.permute(0, 2, 1)
    rows = (rows if scale is not None else rows.cast(int32)).reshape((n * length, ckk))  # one copy
    o = shape[0]
    out = None
    taps = kernel[0] * kernel[1]
    for tap, layout in layouts or [(None, weight_layout(ckk, o, (0, 1, ckk), scale, zero_point))]:
        part = quantized_product(rows if tap is None else rows[:, tap::taps], w, scale, zero_point, layout)
        out = part if out is None else out + part
    oh = (x.shape[2] + 2 * begins[0] - dilations[0] * (kernel[0] - 1) - 1) // strides[0] + 1
    return out.reshape((n, length, o)).permute(0, 2, 1).reshape((n, o, oh, length // oh))


def quantized_conv_applies(x, w, group):
    """True where quantized_conv computes this integer Conv: a 2-D, group-1 convolution of an
    8-bit weight held on x's backend."""
    return w.ndim == 4 and group == 1 and packed_weight(w, x)


def conv_kernel_applies(x, w, zero_point=None, scale=None, block_size=0, axis=0):
    """True where the backend's conv2d_quantized computes this convolution (core/backend.py
    "quantized_conv2d"; any group): a 2-D convolution of an 8-bit weight held on x's backend
    whose scale and zero point are one value or one per output channel (axis 0)."""
    per_channel = _per_channel(scale) or _per_channel(zero_point)
    return x.backend.quantized_conv2d and w.ndim == 4 and w.dtype in (int8, uint8) and w.backend is x.backend \
        and not block_size and (not per_channel or _axis(axis, 4) == 0)


def kernel_conv(x, x_param, w, scale, zero_point, bias, group, auto_pad, dilations, kernel_shape, pads, strides):
    """The backend's conv2d_quantized (core/backend.py): int32 x minus x_param (its zero point)
    and no scale give the exact int32 sums; float32 x whose integers are x / x_param (its
    scale) and W's scale give the float32 convolution (+ bias)."""
    kernel = list(w.shape[2:])
    strides, dilations = strides or [1, 1], dilations or [1, 1]
    begins, ends = _spatial_pads(x.shape, kernel, strides, dilations, pads, auto_pad)
    handles = [None if t is None else t.handle for t in
               (x_param, w, scale if scale is None else scale.cast(float32).reshape((-1,)),
                zero_point if zero_point is None else zero_point.reshape((-1,)),
                bias if bias is None else bias.cast(float32).reshape((-1,)))]
    out = x.backend.conv2d_quantized(x.handle, *handles, tuple(strides), tuple(zip(begins, ends)), tuple(dilations),
                                     group)
    return Tensor(x.backend, out, x.backend.shape(out), int32 if scale is None else float32)


def conv1d_as_2d(auto_pad, dilations, kernel_shape, pads, strides):
    """A 1-D convolution's attributes as those of the same 2-D convolution of height 1: the
    integer kernels and the packed-weight path are 2-D, and an 8-bit (O, C, k) weight viewed as
    (O, C, 1, k) stays 8-bit."""
    return dict(auto_pad=auto_pad, dilations=None if dilations is None else [1] + list(dilations),
                kernel_shape=None if kernel_shape is None else [1] + list(kernel_shape),
                pads=None if pads is None else [0, pads[0], 0, pads[1]],
                strides=None if strides is None else [1] + list(strides))


def integer_conv(x, x_zero_point, w, w_zero_point, group, **conv_args):
    """The exact int32 convolution of 8-bit x minus its zero point (one value) with 8-bit w minus
    its zero point (one or one per output channel): in the backend's integer conv kernel, else
    on the packed weight through matmul_quantized, else exact_conv."""
    if w.ndim == 3 and w.dtype in (int8, uint8):
        return integer_conv(x.unsqueeze(2), x_zero_point, w.unsqueeze(2), w_zero_point, group,
                            **conv1d_as_2d(**conv_args)).squeeze(2)
    xzp = None if x_zero_point is None else x_zero_point.reshape(())
    if conv_kernel_applies(x, w, w_zero_point):
        return kernel_conv(x.cast(int32), None if xzp is None else xzp.cast(int32), w, None, w_zero_point, None,
                           group, **conv_args)
    # x - x_zero_point is padded with 0: the same as padding x with its zero point, as ONNX says
    x = centered(x, xzp)
    if quantized_conv_applies(x, w, group):
        zp = None if w_zero_point is None else w_zero_point.reshape((-1,))
        return quantized_conv(x, w, None, zp, **conv_args)
    return exact_conv(x, centered(w, _channel_param(w_zero_point, w.ndim)), group, **conv_args)


@op()
def MatMulInteger(A, B, a_zero_point=None, b_zero_point=None):
    check_counts("MatMulInteger", [("a_zero_point", a_zero_point, A.shape[-2] if A.ndim > 1 else 1),
                                   ("b_zero_point", b_zero_point, B.shape[-1])])
    return integer_matmul(A, row_param(a_zero_point), B, column_param(b_zero_point))


def exact_conv(x, w, group, **conv_args):
    """int32 convolution of float32 tensors holding integer differences of 8-bit values: Conv in
    float32 over channel chunks whose products per output are at most EXACT_TERMS."""
    per_channel = 1
    for k in w.shape[2:]:
        per_channel *= k
    c = w.shape[1]
    if c * per_channel <= EXACT_TERMS:
        return Conv(x, w, group=group, **conv_args).cast(int32)
    if per_channel > EXACT_TERMS:
        raise OnnxError("ConvInteger/QLinearConv: a %s kernel sums more than %d products per channel, which "
                        "float32 does not hold exactly" % ("x".join(map(str, w.shape[2:])), EXACT_TERMS))
    if group > 1:
        o, xc = w.shape[0] // group, x.shape[1] // group
        return cat([exact_conv(x[:, g * xc:(g + 1) * xc], w[g * o:(g + 1) * o], 1, **conv_args)
                    for g in range(group)], axis=1)
    step = EXACT_TERMS // per_channel
    total = None
    for i in range(0, c, step):
        part = Conv(x[:, i:i + step], w[:, i:i + step], **conv_args).cast(int32)
        total = part if total is None else total + part
    return total


def _conv_args(auto_pad, dilations, kernel_shape, pads, strides):
    return dict(auto_pad=auto_pad, dilations=dilations, kernel_shape=kernel_shape, pads=pads, strides=strides)


def _channel_param(p, ndim):
    """W's zero point or scale: scalar, or one per output channel (shape (O, 1, ...) for W)."""
    if p is None or p.ndim == 0 or p.numel() == 1:
        return None if p is None else p.reshape(())
    return p.reshape((p.numel(),) + (1,) * (ndim - 1))


@op()
def ConvInteger(x, w, x_zero_point=None, w_zero_point=None, auto_pad="NOTSET", dilations=None, group=1,
                kernel_shape=None, pads=None, strides=None):
    check_counts("ConvInteger", [("x_zero_point", x_zero_point, 1), ("w_zero_point", w_zero_point, w.shape[0])])
    return integer_conv(x, x_zero_point, w, w_zero_point, group, **_conv_args(auto_pad, dilations, kernel_shape,
                                                                                pads, strides))


def requantize(acc, multiplier, zero_point, out_type, op_name):
    """int32 accumulator -> the output's quantized type: saturate(round(acc * multiplier) + zp),
    multiplier = a_scale * b_scale / y_scale in float32, as onnxruntime's requantization does."""
    lo, hi = quant_range(out_type, op_name)
    return round_saturate(acc.cast(float32) * multiplier, zero_point, lo, hi)


@op()
def QLinearMatMul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point, input_types=None):
    rows = a.shape[-2] if a.ndim > 1 else 1
    check_counts("QLinearMatMul", [("a_scale", a_scale, rows), ("a_zero_point", a_zero_point, rows),
                                   ("b_scale", b_scale, b.shape[-1]), ("b_zero_point", b_zero_point, b.shape[-1]),
                                   ("y_scale", y_scale, 1), ("y_zero_point", y_zero_point, 1)])
    acc = integer_matmul(a, row_param(a_zero_point), b, column_param(b_zero_point))
    multiplier = row_param(a_scale) * column_param(b_scale) / y_scale.reshape(())
    return requantize(acc, multiplier, y_zero_point.reshape(()), type_at(input_types, 7), "QLinearMatMul")


@op()
def QLinearConv(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, B=None,
                auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None,
                input_types=None):
    check_counts("QLinearConv", [("x_scale", x_scale, 1), ("x_zero_point", x_zero_point, 1),
                                 ("w_scale", w_scale, w.shape[0]), ("w_zero_point", w_zero_point, w.shape[0]),
                                 ("y_scale", y_scale, 1), ("y_zero_point", y_zero_point, 1)])
    acc = integer_conv(x, x_zero_point, w, w_zero_point, group,
                       **_conv_args(auto_pad, dilations, kernel_shape, pads, strides))
    if B is not None:
        acc = acc + _channel_param(B, x.ndim - 1)
    multiplier = x_scale.reshape(()) * _channel_param(w_scale, x.ndim - 1)
    return requantize(acc, multiplier / y_scale.reshape(()), y_zero_point.reshape(()), type_at(input_types, 7),
                      "QLinearConv")


# ---- QDQ weights: DequantizeLinear(constant 8-bit or 4-bit W) joined with its Conv/MatMul/Gemm --
# The importer (codegen, `dequantized_weights`) emits these for the pattern; where the backend
# cannot read W quantized (no quantized_matmul, a layout it cannot express) they compute what
# the two nodes did. packed_shape: W is a 4-bit weight of that shape, packed two values a byte
# (codegen `packed_four_bit`: uint4 values, the graph's plus packed_offset, 8 for int4, its zero
# point too, and packed_offset where the graph gives none).

def _weight(w, w_zero_point, packed_shape, packed_offset):
    """W as DequantizeLinear reads it with w_zero_point: its values, unpacked where they are
    packed 4-bit (less the offset where no zero point takes it off)."""
    if packed_shape is None:
        return w
    values = unpacked(w, packed_shape)
    return values - packed_offset if w_zero_point is None and packed_offset else values


def _as_2d_conv(X, W, w_scale, w_zero_point, axis, packed_shape, auto_pad, dilations, kernel_shape, pads, strides):
    """A 1-D or 3-D convolution as a 2-D one of the same weight bytes, or None where W's
    parameters would not follow (blocks; per-axis along a dim the view moves). 1-D: height 1,
    W (O, C, k) read as (O, C, 1, k). 3-D: the image's depth taps become channels, (c, kd) pairs,
    and its output depths batch rows: W (O, C, KD, kh, kw) is the (O, C*KD, kh, kw) weight
    (no copy; the image is copied KD times, as an unfold copies it). Returns (x, W, packed_shape,
    axis, 2-D conv attributes, rebuild(y))."""
    shape = tuple(packed_shape or W.shape)
    if len(shape) == 3:
        a = _axis(axis, 3)
        two_d = shape[:2] + (1,) + shape[2:]
        return (X.unsqueeze(2), W if packed_shape else W.unsqueeze(2), packed_shape and two_d, a + (a == 2),
                conv1d_as_2d(auto_pad, dilations, kernel_shape, pads, strides), lambda y: y.squeeze(2))
    if (_per_channel(w_scale) or _per_channel(w_zero_point)) and _axis(axis, 5) != 0:
        return None
    o, c, kd = shape[:3]
    strides, dilations = list(strides or [1, 1, 1]), list(dilations or [1, 1, 1])
    begins, ends = _spatial_pads(X.shape, list(shape[2:]), strides, dilations, pads, auto_pad)
    x = _pad_spatial(X, [begins[0], 0, 0], [ends[0], 0, 0], 0.0)
    n, depth = x.shape[0], x.shape[2]
    sd, dd = strides[0], dilations[0]
    od = (depth - (kd - 1) * dd - 1) // sd + 1
    taps = stack([x[:, :, k * dd:k * dd + (od - 1) * sd + 1:sd] for k in range(kd)], axis=2)  # (N, C, KD, OD, H, W)
    x = taps.permute(0, 3, 1, 2, 4, 5).reshape((n * od, x.shape[1] * kd) + tuple(x.shape[3:]))
    two_d = (o, c * kd) + shape[3:]
    args = dict(auto_pad="NOTSET", dilations=dilations[1:], kernel_shape=list(shape[3:]),
                pads=[begins[1], begins[2], ends[1], ends[2]], strides=strides[1:])

    def rebuild(y):
        return y.reshape((n, od) + tuple(y.shape[1:])).permute(0, 2, 1, 3, 4)
    return x, W.reshape(two_d) if packed_shape is None else W, packed_shape and two_d, 0, args, rebuild


@op(domain=JOINED)
def DequantizedConv(X, W, w_scale, w_zero_point=None, B=None, x_scale=None, axis=1, block_size=0, output_dtype=0,
                    auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None,
                    packed_shape=None, packed_offset=0):
    """x_scale: where X is a QDQ activation (codegen `quantized_activation_inputs`: X = (q - zp) *
    x_scale with q 8-bit), its scale: X / x_scale are then integers and the backend's integer
    conv kernel computes the convolution."""
    conv_args = _conv_args(auto_pad, dilations, kernel_shape, pads, strides)
    shape = tuple(packed_shape or W.shape)
    check_params("DequantizeLinear", shape, w_scale, w_zero_point, axis, block_size)
    quantized = packed_shape is not None or W.dtype in (int8, uint8)
    if len(shape) in (3, 5) and quantized and not block_size:   # 1-D, 3-D: as 2-D, W's bytes kept
        view = _as_2d_conv(X, W, w_scale, w_zero_point, axis, packed_shape, **conv_args)
        if view is not None:
            x, w, two_d, a, args, rebuild = view
            return rebuild(DequantizedConv(x, w, w_scale, w_zero_point, B, x_scale, a, block_size, output_dtype,
                                           group=group, packed_shape=two_d, packed_offset=packed_offset, **args))
    if packed_shape is None and x_scale is not None and X.dtype is float32 and \
            conv_kernel_applies(X, W, w_zero_point, w_scale, block_size, axis):
        return kernel_conv(X, x_scale.reshape(()).cast(float32), W, w_scale, w_zero_point, B, group, **conv_args)
    layouts = None
    if X.dtype is float32 and group == 1 and len(shape) == 4 and packed_weight(W, X):
        layouts = conv_weight_layouts(shape, 8 if packed_shape is None else 4, w_scale, w_zero_point, block_size,
                                      axis, packed_offset)
    if layouts is None:
        return Conv(X, DequantizeLinear(_weight(W, w_zero_point, packed_shape, packed_offset), w_scale, w_zero_point,
                                        axis, block_size), B, group=group, **conv_args)
    out = quantized_conv(X, W, w_scale.reshape((-1,)), None if w_zero_point is None else w_zero_point.reshape((-1,)),
                         shape=shape, layouts=layouts, **conv_args)
    return out if B is None else out + B.reshape((1, -1, 1, 1))


def _dequantized_product(a, w, w_scale, w_zero_point, axis, block_size, transposed, x_scale=None,
                         packed_shape=None, zp_default=0):
    """a @ dequantize(W) (W^T where transposed) read 8-bit (or 4-bit: packed_shape; zero point
    zp_default where none is given) inside the kernel, or None where the backend cannot (then the
    caller dequantizes). x_scale: where a is a QDQ activation (codegen
    `quantized_activation_inputs`), its scale: a / x_scale are then integers, which the kernel
    multiplies by W's 8-bit values in exact int32 sums, scaled once (what onnxruntime's
    QLinearMatMul and MatMulIntegerToFloat do); without the ability, the same exact sums in
    exact_matmul."""
    shape = tuple(packed_shape or w.shape)
    if a.dtype is not float32 or len(shape) != 2:
        return None
    bits = 8 if packed_shape is None else 4
    rows, cols = shape
    k, n = (cols, rows) if transposed else (rows, cols)
    along_n = _axis(axis, 2) == (0 if transposed else 1)
    q = (0, 1, k) if transposed else (0, n, 1)
    zp = None if w_zero_point is None else w_zero_point.reshape((-1,))
    if block_size and along_n:   # opset 21 blocks along N: one product per block of columns
        return _column_blocks(a, w, w_scale, zp, block_size, transposed, k, n, bits, zp_default)
    if block_size:   # opset 21 blocks along K: the kernel reads them (one scale per block and column)
        blocks = -(-k // block_size)
        grid = (n, blocks) if transposed else (blocks, n)
        if tuple(w_scale.shape) != grid or not packed_weight(w, a) or \
                (zp is not None and tuple(w_zero_point.shape) != grid):
            return None
        params = (0, 1, blocks) if transposed else (0, n, 1)
        layout = QuantizedLayout(k, n, bits, block_size, q, scale=params, zp=(0, 0, 0) if zp is None else params,
                                 zp_default=zp_default)
        return quantized_product(a, w, w_scale.reshape((-1,)), zp, layout)
    if packed_weight(w, a):
        layout = weight_layout(k, n, q, w_scale, zp, along_n, bits, zp_default)
        return quantized_product(a, w, w_scale.reshape((-1,)), zp, layout, x_scale if bits == 8 else None)
    if packed_shape is not None or x_scale is None or \
            not (along_n or w_scale.numel() == 1 and (zp is None or zp.numel() == 1)):
        return None
    x_scale = x_scale.reshape(()).cast(float32)
    b = centered(w, None if zp is None else column_param(zp) if not transposed else _channel_param(zp, 2))
    b = b.permute(1, 0) if transposed else b
    acc = exact_matmul((a / x_scale).round(), b)
    return acc.cast(float32) * (x_scale * column_param(w_scale).cast(float32))


def _column_blocks(a, w, w_scale, zp, block_size, transposed, k, n, bits, zp_default):
    """a @ dequantize(W) whose opset 21 blocks run along N (scale (K, N blocks), or (N blocks,
    K) for a transposed W): QuantizedLayout's scales are per (block of K, column), so each block
    of columns is its own product, with a scale per row of K; the products are concatenated.
    None where the backend does not read W quantized."""
    blocks = -(-n // block_size)
    grid = (blocks, k) if transposed else (k, blocks)
    if tuple(w_scale.shape) != grid or not packed_weight(w, a) or (zp is not None and zp.numel() != k * blocks):
        return None
    scale, parts = w_scale.reshape((-1,)), []
    for j in range(blocks):
        width = min(block_size, n - j * block_size)
        first = j * block_size * (k if transposed else 1)
        q = (first, 1, k) if transposed else (first, n, 1)
        params = (j * k, 1, 0) if transposed else (j, blocks, 0)
        layout = QuantizedLayout(k, width, bits, 1, q, scale=params, zp=(0, 0, 0) if zp is None else params,
                                 zp_default=zp_default)
        parts.append(quantized_product(a, w, scale, zp, layout))
    return parts[0] if blocks == 1 else cat(parts, axis=-1)


@op(domain=JOINED)
def DequantizedMatMul(A, W, w_scale, w_zero_point=None, x_scale=None, axis=1, block_size=0, output_dtype=0,
                      packed_shape=None, packed_offset=0):
    check_params("DequantizeLinear", tuple(packed_shape or W.shape), w_scale, w_zero_point, axis, block_size)
    out = _dequantized_product(A, W, w_scale, w_zero_point, axis, block_size, False, x_scale, packed_shape,
                               packed_offset) if A.ndim >= 2 else None
    if out is None:
        return MatMul(A, DequantizeLinear(_weight(W, w_zero_point, packed_shape, packed_offset), w_scale, w_zero_point,
                                          axis, block_size))
    return out


@op(domain=JOINED)
def DequantizedGemm(A, W, w_scale, w_zero_point=None, C=None, x_scale=None, axis=1, block_size=0, output_dtype=0,
                    alpha=1.0, beta=1.0, transA=0, transB=0, packed_shape=None, packed_offset=0):
    check_params("DequantizeLinear", tuple(packed_shape or W.shape), w_scale, w_zero_point, axis, block_size)
    out = None if transA else _dequantized_product(A, W, w_scale, w_zero_point, axis, block_size, transB, x_scale,
                                                   packed_shape, packed_offset)
    if out is None:
        return Gemm(A, DequantizeLinear(_weight(W, w_zero_point, packed_shape, packed_offset), w_scale, w_zero_point,
                                        axis, block_size), C, alpha, beta, transA, transB)
    if alpha != 1.0:
        out = out * alpha
    return out if C is None else out + (C * beta if beta != 1.0 else C)
