"""`cinders quantize MODEL.onnx`: q8 and q4 versions of an ONNX model's MatMul and Conv weights.

q8 (dynamic): every MatMul (or Gemm with alpha = beta = 1 and A not transposed; its bias becomes
an Add) whose B is a 2-D float initializer used only there becomes com.microsoft
DynamicQuantizeMatMul with int8 weights, symmetric per output column (scale = max|w| / 63: Q8_MAX);
the activations are quantized at run time. q4: com.microsoft MatMulNBits, 4-bit blocks of 32
along K per output column, symmetric (scale = max|w| / 7, value + 8 stored as uint4, two per
byte, low nibble first; no zero_points input, so the default 8 applies). Only float32 weights
are quantized (DynamicQuantizeMatMul computes in float32: a float16 model's products would
mix types onnxruntime refuses). In both modes a Conv
(1-D, 2-D or 3-D) whose W is a float32 initializer used only there reads it through
DequantizeLinear(int8 W, one scale per output channel, axis 0) (opset 13 and later; 4-bit
DequantizeLinear would need opset 21): cinders keeps W 8-bit (the QDQ weight path of
ops/quantization.py), onnxruntime dequantizes it and runs its float conv. Both run in onnxruntime
and in cinders. Writing ONNX needs the `onnx` package (the [onnx] extra): this is a desktop
command, the importer itself does not need it.
"""

import numpy as np

from ..errors import CindersError
from ..files import read_regular
from . import MAX_FILE_BYTES
from .proto import read_model

MODES = ("q8", "q4")
BLOCK = 32
_MS = "com.microsoft"


class QuantizeError(CindersError):
    """A model `cinders quantize` cannot quantize (no onnx package, nothing to quantize)."""


def _onnx():
    try:
        import onnx
        from onnx import numpy_helper
    except ImportError:
        raise QuantizeError("cinders quantize of an ONNX model needs the onnx package: "
                            "pip install 'cinders[onnx]'") from None
    return onnx, numpy_helper


# q8 weights use 7 bits (|q| <= 63), as onnxruntime's quantize_dynamic does per channel on x86
# (reduce_range): its uint8 x int8 kernels add pairs of products in int16, which saturates with
# full-range weights and would make onnxruntime's answer differ from the exact one cinders gives.
Q8_MAX = 63


def quantize_q8(w, q_max=Q8_MAX):
    """(int8 weights, float32 scales per column) of a float (K, N) matrix."""
    scale = np.abs(w).max(axis=0) / q_max
    scale = np.where(scale == 0, 1.0, scale).astype(np.float32)
    q = np.clip(np.rint(w / scale), -q_max, q_max).astype(np.int8)
    return q, scale


def quantize_conv_weight(w):
    """(int8 weights, float32 scales per output channel) of a float conv weight (O, C, ...):
    the full int8 range (no integer kernel of onnxruntime reads a weight-only DequantizeLinear)."""
    q, scale = quantize_q8(w.reshape(w.shape[0], -1).T, 127)
    return np.ascontiguousarray(q.T).reshape(w.shape), scale


def quantize_q4(w):
    """(uint8 packed blocks (N, K/32, 16), float32 scales (N * K/32,)) of a float (K, N) matrix,
    K padded with zeros to a multiple of 32 (MatMulNBits' layout)."""
    k, n = w.shape
    blocks = -(-k // BLOCK)
    padded = np.zeros((blocks * BLOCK, n), np.float32)
    padded[:k] = w
    by_block = padded.T.reshape(n, blocks, BLOCK)
    scale = np.abs(by_block).max(axis=2) / 7.0
    scale = np.where(scale == 0, 1.0, scale).astype(np.float32)
    q = (np.clip(np.rint(by_block / scale[:, :, None]), -8, 7) + 8).astype(np.uint8)
    packed = q[:, :, 0::2] | (q[:, :, 1::2] << 4)
    return packed, scale.reshape(-1)


def quantize_model(src, dst, mode):
    """Write `dst`, the `mode` ("q8"/"q4") version of the ONNX model at `src`; returns the
    numbers of MatMul (or Gemm) and Conv weights quantized."""
    if mode not in MODES:
        raise QuantizeError("quantize: mode must be one of %s, not %r" % (", ".join(MODES), mode))
    onnx, numpy_helper = _onnx()
    model = _load(src)
    graph = model.graph
    opset = max([o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] or [1])
    inits = {t.name: t for t in graph.initializer}
    used = {}
    for node in graph.node:
        for name in node.input:
            used[name] = used.get(name, 0) + 1
    nodes, count, convs, dropped = [], 0, 0, set()
    for node in graph.node:
        w_name = node.input[1] if node.op_type == "Conv" and node.domain in ("", "ai.onnx") and opset >= 13 \
            and len(node.input) > 1 else None
        t = inits.get(w_name)
        if t is not None and 3 <= len(t.dims) <= 5 and t.data_type == 1 and used[w_name] == 1:
            q, scale = quantize_conv_weight(numpy_helper.to_array(t))
            graph.initializer.extend([numpy_helper.from_array(q, w_name + "_q8"),
                                      numpy_helper.from_array(scale, w_name + "_scale")])
            nodes.append(onnx.helper.make_node("DequantizeLinear", [w_name + "_q8", w_name + "_scale"],
                                               [w_name + "_dequantized"], name=w_name + "_dequantize", axis=0))
            conv = onnx.NodeProto()
            conv.CopyFrom(node)
            conv.input[1] = w_name + "_dequantized"
            nodes.append(conv)
            dropped.add(w_name)
            convs += 1
            continue
        gemm = _plain_gemm(node, onnx)
        b = node.input[1] if (node.op_type == "MatMul" and node.domain in ("", "ai.onnx")) or gemm else None
        t = inits.get(b)
        if t is None or len(t.dims) != 2 or t.data_type != 1 or used[b] != 1:
            nodes.append(node)
            continue
        w = numpy_helper.to_array(t).astype(np.float32)
        if gemm and gemm["transB"]:
            w = np.ascontiguousarray(w.T)
        outputs = list(node.output)
        if gemm and len(node.input) > 2 and node.input[2]:  # Gemm's bias: an Add after the product
            product = node.output[0] + "_product"
            add = onnx.helper.make_node("Add", [product, node.input[2]], outputs, name=(node.name or node.output[0]) + "_bias")
            outputs = [product]
        k, n = w.shape
        if mode == "q8":
            q, scale = quantize_q8(w)
            extra = [numpy_helper.from_array(q, b + "_q8"), numpy_helper.from_array(scale, b + "_scale")]
            new = onnx.helper.make_node("DynamicQuantizeMatMul", [node.input[0], b + "_q8", b + "_scale"],
                                        outputs, name=node.name, domain=_MS)
        else:
            packed, scale = quantize_q4(w)
            extra = [numpy_helper.from_array(packed, b + "_q4"), numpy_helper.from_array(scale, b + "_scale")]
            new = onnx.helper.make_node("MatMulNBits", [node.input[0], b + "_q4", b + "_scale"],
                                        outputs, name=node.name, domain=_MS,
                                        K=k, N=n, bits=4, block_size=BLOCK)
        graph.initializer.extend(extra)
        dropped.add(b)
        nodes.append(new)
        if outputs != list(node.output):
            nodes.append(add)
        count += 1
    if not count and not convs:
        raise QuantizeError("quantize: %s has no MatMul, Gemm or Conv with a constant float32 weight to quantize "
                            "(quantize a float16 model's float32 original)" % (src,))
    kept = [t for t in graph.initializer if t.name not in dropped]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    del graph.node[:]
    graph.node.extend(nodes)
    if not any(o.domain == _MS for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid(_MS, 1))
    onnx.save(model, dst)
    return count, convs


def _load(path, load_external_data=True):
    """The onnx package's ModelProto of the file at `path`, read by cinders' own reader first: what
    is no ONNX model gets its one-line OnnxError, not protobuf's trace."""
    onnx, _ = _onnx()
    read_model(read_regular(path, QuantizeError, "ONNX file", MAX_FILE_BYTES))
    return onnx.load(path, load_external_data=load_external_data)


def _plain_gemm(node, onnx):
    """Gemm's attributes when it is a MatMul (+ bias): alpha = beta = 1, A not transposed."""
    if node.op_type != "Gemm" or node.domain not in ("", "ai.onnx"):
        return None
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    if attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0 or attrs.get("transA", 0):
        return None
    return {"transB": attrs.get("transB", 0)}


def random_inputs(path, seed=0, batch=1):
    """{input name: float32/int array} for every graph input (dynamic dims get `batch`)."""
    graph = _load(path, load_external_data=False).graph
    inits = {t.name for t in graph.initializer}
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in graph.input:
        if value.name in inits:
            continue
        tt = value.type.tensor_type
        shape = [d.dim_value if d.dim_value > 0 else batch for d in tt.shape.dim]
        if tt.elem_type in (6, 7):
            feeds[value.name] = rng.integers(0, 8, shape).astype(np.int64 if tt.elem_type == 7 else np.int32)
        else:
            feeds[value.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def read_inputs(path, names):
    """{input name: array} from the user's `--data` file: a .npz with one array per input name, or
    a .npy holding the one input (read as data: pickled objects are refused)."""
    try:
        data = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise QuantizeError("--data %s: %s (a .npz of the inputs by name, or a .npy of the one input)"
                            % (path, e)) from None
    if isinstance(data, np.ndarray):
        if len(names) != 1:
            raise QuantizeError("--data %s holds one array; the model's inputs are %s: give a .npz with one "
                                "array per name" % (path, ", ".join(names)))
        return {names[0]: data}
    with data:
        missing = [n for n in names if n not in data.files]
        if missing:
            raise QuantizeError("--data %s lacks the inputs %s (it holds %s)"
                                % (path, ", ".join(missing), ", ".join(data.files) or "nothing"))
        return {n: data[n] for n in names}


def outputs(original, quantized, feeds, backend=None):
    """The first outputs of the original and the quantized model, both run by cinders on `feeds`
    (for `cinders quantize`'s accuracy report)."""
    from . import load
    from ..creation import tensor
    from ..tensor import default_backend
    backend = backend or default_backend()
    outs = []
    for path in (original, quantized):
        model = load(path, backend=backend)
        out = model(*[tensor(v, backend=backend) for v in feeds.values()])
        outs.append(out[0] if isinstance(out, (tuple, list)) else out)
    return outs
