"""ONNX operators of onnxruntime's com.microsoft domain: quantized kernels that its quantization
tools write (quantize_dynamic, quantize_static in QOperator form, MatMulNBitsQuantizer).

They follow quantization.py's rules: quantized values are int32 tensors whose range comes from
the ONNX element types the importer passes; integer products are exact (exact_matmul,
exact_conv); requantization multiplies in float32 and rounds half to even, as onnxruntime does.
They are registered in the com.microsoft domain; generated code calls them through that
domain's namespace, `ops.com_microsoft` (contrib.py, which re-exports them).
"""

from ...dtypes import float32
from ...tensor import cat
from ..proto import OnnxError
from .base import REGISTRY, _axis, op
from .conv import AveragePool
from .elementwise import LeakyRelu
from .reductions import Softmax
from .recurrent import _recurrent
from .quantization import (DequantizeLinear, DynamicQuantizeLinear, QuantizeLinear, QuantizedLayout, centered,
                           check_counts, column_param, exact_matmul, integer_matmul, packed_weight, quant_range,
                           quantize, quantized_product, requantize, type_at, unpack_nibbles)

MS = "com.microsoft"
# onnxruntime's com.microsoft QuantizeLinear/DequantizeLinear are the ai.onnx ones
REGISTRY[(MS, "QuantizeLinear")], REGISTRY[(MS, "DequantizeLinear")] = QuantizeLinear, DequantizeLinear


def output_type(input_types, *indices):
    """The quantized output's type: that of the first input at `indices` the graph types."""
    for i in indices:
        if type_at(input_types, i):
            return type_at(input_types, i)
    return None


def scalar_param(p):
    return None if p is None else p.reshape(())


@op(domain=MS)
def QLinearAdd(A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale, C_zero_point=None, input_types=None):
    # onnxruntime's reference form: round((A_s (A - A_z) + B_s (B - B_z)) / C_s) + C_z
    value = centered(A, scalar_param(A_zero_point)) * A_scale.reshape(()) + \
        centered(B, scalar_param(B_zero_point)) * B_scale.reshape(())
    lo, hi = quant_range(output_type(input_types, 7, 2, 5, 0), "QLinearAdd")
    return quantize(value, C_scale.reshape(()), scalar_param(C_zero_point), lo, hi)


@op(domain=MS)
def QLinearMul(A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale, C_zero_point=None, input_types=None):
    product = centered(A, scalar_param(A_zero_point)) * centered(B, scalar_param(B_zero_point))  # exact: < 2**17
    multiplier = A_scale.reshape(()) * B_scale.reshape(()) / C_scale.reshape(())
    return requantize(product, multiplier, scalar_param(C_zero_point), output_type(input_types, 7, 2, 5, 0),
                      "QLinearMul")


@op(domain=MS)
def QLinearSigmoid(X, X_scale, X_zero_point, Y_scale, Y_zero_point=None, input_types=None):
    lo, hi = quant_range(output_type(input_types, 4, 2, 0), "QLinearSigmoid")
    y = (centered(X, scalar_param(X_zero_point)) * X_scale.reshape(())).sigmoid()
    return quantize(y, Y_scale.reshape(()), scalar_param(Y_zero_point), lo, hi)


@op(domain=MS)
def QLinearLeakyRelu(X, X_scale, X_zero_point, Y_scale, Y_zero_point=None, alpha=0.01, input_types=None):
    lo, hi = quant_range(output_type(input_types, 4, 2, 0), "QLinearLeakyRelu")
    y = LeakyRelu(centered(X, scalar_param(X_zero_point)) * X_scale.reshape(()), alpha)
    return quantize(y, Y_scale.reshape(()), scalar_param(Y_zero_point), lo, hi)


@op(domain=MS)
def QLinearAveragePool(X, x_scale, x_zero_point, y_scale, y_zero_point=None, auto_pad="NOTSET", ceil_mode=0,
                       channels_last=0, count_include_pad=0, kernel_shape=None, pads=None, strides=None,
                       input_types=None):
    """AveragePool of the dequantized values (their integer window sums are exact), requantized."""
    lo, hi = quant_range(output_type(input_types, 4, 2, 0), "QLinearAveragePool")
    x = centered(X, scalar_param(x_zero_point))
    to_first = (0, X.ndim - 1) + tuple(range(1, X.ndim - 1))
    if channels_last:
        x = x.permute(*to_first)
    y = AveragePool(x, auto_pad=auto_pad, ceil_mode=ceil_mode, count_include_pad=count_include_pad,
                    kernel_shape=kernel_shape, pads=pads, strides=strides) * x_scale.reshape(())
    if channels_last:
        y = y.permute(0, *range(2, X.ndim), 1)
    return quantize(y, y_scale.reshape(()), scalar_param(y_zero_point), lo, hi)


@op(domain=MS)
def QLinearSoftmax(X, X_scale, x_zero_point, y_scale, y_zero_point, axis=-1, opset=13, input_types=None):
    """Softmax of the dequantized values (axis semantics of the ONNX opset it replaced), requantized.
    onnxruntime computes it from a lookup table of exponentials in fixed point: the two can differ
    by one quantization step where a value lies near a rounding boundary."""
    lo, hi = quant_range(output_type(input_types, 4, 2, 0), "QLinearSoftmax")
    y = Softmax(centered(X, scalar_param(x_zero_point)) * X_scale.reshape(()), axis=axis, opset=opset)
    return quantize(y, y_scale.reshape(()), scalar_param(y_zero_point), lo, hi)


@op(domain=MS)
def QLinearGlobalAveragePool(X, x_scale, x_zero_point, y_scale, y_zero_point, channels_last=0, input_types=None):
    """Integer sum over the spatial dims, requantized by x_scale / (y_scale * count)."""
    spatial = tuple(range(1, X.ndim - 1)) if channels_last else tuple(range(2, X.ndim))
    count = 1
    for d in spatial:
        count *= X.shape[d]
    acc = (X - x_zero_point.reshape(())).sum(axis=spatial, keepdim=True)
    multiplier = x_scale.reshape(()) / (y_scale.reshape(()) * float(count))
    return requantize(acc, multiplier, y_zero_point.reshape(()), output_type(input_types, 4, 2, 0),
                      "QLinearGlobalAveragePool")


@op(domain=MS)
def QLinearConcat(Y_scale, Y_zero_point, *inputs, axis, input_types=None):
    """Inputs come as (X, X_scale, X_zero_point) triples; each is requantized to Y's scale."""
    if len(inputs) % 3:
        raise OnnxError("QLinearConcat: inputs after Y_scale, Y_zero_point must come in (X, scale, zero point) "
                        "triples, got %d" % len(inputs))
    lo, hi = quant_range(output_type(input_types, 1, 4, 2), "QLinearConcat")
    parts = []
    for x, scale, zp in zip(inputs[0::3], inputs[1::3], inputs[2::3]):
        value = centered(x, scalar_param(zp)) * scale.reshape(())
        parts.append(quantize(value, Y_scale.reshape(()), Y_zero_point.reshape(()), lo, hi))
    return cat(parts, axis=_axis(axis, parts[0].ndim))


@op(domain=MS)
def QGemm(A, a_scale, a_zero_point, B, b_scale, b_zero_point, C=None, y_scale=None, y_zero_point=None, alpha=1.0,
          transA=0, transB=0, input_types=None):
    """alpha * (A - a_z)(B - b_z) + C in int32 (C is quantized with scale a_s * b_s); requantized
    to y when y_scale is given, else float32."""
    a = centered(A.mT if transA else A, scalar_param(a_zero_point))
    if b_zero_point is not None and b_zero_point.numel() > 1 and transB:   # one per row of the stored (N, K) B
        b = centered(B, b_zero_point.reshape((b_zero_point.numel(), 1))).mT
    else:
        b = centered(B.mT if transB else B, column_param(b_zero_point))
    acc = exact_matmul(a, b)
    if C is not None:
        acc = acc + C
    scale = alpha * a_scale.reshape(()) * column_param(b_scale)
    if y_scale is None:
        return acc.cast(float32) * scale
    return requantize(acc, scale / y_scale.reshape(()), scalar_param(y_zero_point),
                      output_type(input_types, 8, 2, 0), "QGemm")


@op(domain=MS)
def DynamicQuantizeMatMul(A, B, b_scale, b_zero_point=None, bias=None):
    """A quantized to uint8 at run time (DynamicQuantizeLinear), an exact integer product with B,
    scaled back by a_scale * b_scale."""
    check_counts("DynamicQuantizeMatMul", [("b_scale", b_scale, B.shape[-1]),
                                           ("b_zero_point", b_zero_point, B.shape[-1])])
    a_q, a_scale, a_zp = DynamicQuantizeLinear(A, outputs=3)
    acc = integer_matmul(a_q, a_zp, B, column_param(b_zero_point))
    y = acc.cast(float32) * (a_scale * column_param(b_scale))
    return y if bias is None else y + bias


@op(domain=MS)
def MatMulNBits(A, B, scales, zero_points=None, g_idx=None, bias=None, K=0, N=0, bits=4, block_size=0,
                accuracy_level=0):
    """Y = A @ dequantized(B)^T + bias. B is (N, blocks, block_size * bits / 8) bytes, values
    packed low bits first; scales (N * blocks); zero points packed the same way (default
    2**(bits-1)) or floats like the scales. The weight is dequantized to float32 and the matmul
    runs in float32, as onnxruntime does at accuracy_level 0 (4 and below give float32 too)."""
    if bits not in (4, 8):
        raise OnnxError("MatMulNBits: bits=%d is not supported (4 and 8 are)" % bits)
    if g_idx is not None:
        raise OnnxError("MatMulNBits: g_idx (act-order) is not supported")
    blocks = _check_nbits(A, B, scales, zero_points, K, N, bits, block_size)
    if packed_weight(B, A) and (zero_points is None or zero_points.dtype is not float32):
        # dequantized in the matmul kernel as it reads B's nibbles (quantization.py)
        zp_row = blocks if bits == 8 else 2 * -(-blocks // 2)   # (4-bit rows: whole bytes)
        layout = QuantizedLayout(K, N, bits, block_size, (0, 1, blocks * block_size), (0, 1, blocks),
                                 (0, 1, zp_row), zp_bits=bits, zp_default=2 ** (bits - 1))
        zp = None if zero_points is None else zero_points.reshape((-1,))
        y = quantized_product(A, B.reshape((-1,)), scales.reshape((-1,)), zp, layout)
        return y if bias is None else y + bias
    q = unpack_nibbles(B) if bits == 4 else B                                       # (N, blocks, block_size)
    q = q.reshape((N, blocks, block_size)).cast(float32)
    if zero_points is None:
        zp = float(2 ** (bits - 1))
    elif zero_points.dtype is float32:
        zp = zero_points.reshape((N, blocks, 1))
    else:
        zp = zero_points.reshape((N, -1))
        zp = unpack_nibbles(zp) if bits == 4 else zp
        zp = zp[:, :blocks].reshape((N, blocks, 1)).cast(float32)
    w = ((q - zp) * scales.reshape((N, blocks, 1))).reshape((N, blocks * block_size))[:, :K]
    y = A @ w.mT
    return y if bias is None else y + bias


def _check_nbits(A, B, scales, zero_points, K, N, bits, block_size):
    """MatMulNBits' blocks of K; its inputs' sizes checked against K, N and block_size as
    onnxruntime checks them (a short scale or weight would otherwise be read past its end)."""
    if K <= 0 or N <= 0 or block_size < 16 or block_size & (block_size - 1):
        raise OnnxError("MatMulNBits: K=%d, N=%d, block_size=%d: K and N must be positive, block_size a power "
                        "of 2 of at least 16" % (K, N, block_size))
    if A.shape[-1] != K:
        raise OnnxError("MatMulNBits: A's last dim is %d, K is %d" % (A.shape[-1], K))
    blocks = -(-K // block_size)
    zp_bytes = N * -(-blocks * bits // 8)
    sizes = [("B", B, (N * blocks * block_size * bits // 8,)), ("scales", scales, (N * blocks,)),
             ("zero_points", zero_points, (N * blocks if zero_points is not None and zero_points.dtype is float32
                                           else zp_bytes,))]
    for name, t, allowed in sizes:
        if t is not None and t.numel() not in allowed:
            raise OnnxError("MatMulNBits: %s has %d values; K=%d, N=%d in blocks of %d need %s" % (
                name, t.numel(), K, N, block_size, " or ".join(str(n) for n in allowed)))
    return blocks


@op(multi=True, domain=MS)
def DynamicQuantizeLSTM(X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None, P=None, W_scale=None,
                        W_zero_point=None, R_scale=None, R_zero_point=None, activation_alpha=None,
                        activation_beta=None, activations=None, clip=None, direction="forward", hidden_size=None,
                        input_forget=0, outputs=1):
    """ONNX LSTM whose W (dirs, input, 4*hidden) and R (dirs, hidden, 4*hidden) are int8/uint8 with
    per-direction (or per-column) scales and zero points. As in onnxruntime, the input sequence
    (all steps at once) and each step's hidden state are quantized to uint8 per tensor
    (DynamicQuantizeLinear), multiplied exactly in integers and scaled back."""
    if sequence_lens is not None:
        raise OnnxError("DynamicQuantizeLSTM: sequence_lens is not supported")

    def product(a, d, recurrent):
        m, scale, zp = (R, R_scale, R_zero_point) if recurrent else (W, W_scale, W_zero_point)
        a_q, a_scale, a_zp = DynamicQuantizeLinear(a, outputs=3)
        acc = exact_matmul(centered(a_q, a_zp), centered(m[d], column_param(zp[d])))
        return acc.cast(float32) * (a_scale * column_param(scale[d]))

    return _recurrent("LSTM", X, W, R, B, None, initial_h, initial_c, P, activations, activation_alpha,
                      activation_beta, clip, direction, hidden_size or R.shape[1], 0, 0, input_forget, outputs,
                      product)
