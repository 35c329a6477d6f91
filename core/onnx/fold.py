"""Graph rewrites at import that make fewer, bigger kernels without changing a result.

fold_conv_activations: a Relu or Clip(0, 6) that alone reads a 2-D Conv's output becomes the
Conv's `activation` (functional.conv2d's epilogue), so conv + ReLU is one kernel.

fold_batch_norms: a BatchNormalization at inference (constant statistics) whose input is a Conv
with a constant weight, read by nothing else, folds into that Conv: per output channel o,
    s[o] = scale[o] / sqrt(var[o] + eps)
    W'[o] = W[o] * s[o];   B'[o] = (B[o] - mean[o]) * s[o] + beta[o]
so the batch norm costs nothing at run time: the conv kernel's epilogue already adds the bias.
Folding here rather than in cn.Fusion (a per-channel affine epilogue) because the statistics are
constants: the arithmetic is done once, in float64 then rounded to float32 (within ~1 ulp of the
unfused float32 result, which onnxruntime computes), every backend and the board gain, and the
weights the generated source stores are the folded ones. A batch norm over data (training
mode, non-constant statistics, a conv output read elsewhere) is left as it is.
"""

import math
from array import array

from .proto import MESSAGE_CLASSES

_NODE = MESSAGE_CLASSES["NodeProto"]
_ATTRIBUTE = MESSAGE_CLASSES["AttributeProto"]


def _readers(nodes, outputs, count=None):
    """{value name: how many node inputs (and graph outputs) read it}, the nodes of subgraphs
    (If branches, Loop and Scan bodies, which may read outer values) included."""
    count = {} if count is None else count
    for node in nodes:
        for name in node.input:
            count[name] = count.get(name, 0) + 1
        for a in node.attribute:
            for graph in ([a.g] if a.g is not None else []) + list(a.graphs):
                _readers(graph.node, [vi.name for vi in graph.output], count)
    for name in outputs:
        count[name] = count.get(name, 0) + 1
    return count


def _epsilon(node):
    for a in node.attribute:
        if a.name == "epsilon":
            return a.f
    return 1e-5


def _inference_only(node):
    """True for a BatchNormalization with one output and no training_mode."""
    if len([o for o in node.output if o]) != 1:
        return False
    return not any(a.name == "training_mode" and a.i for a in node.attribute)


def _namer(nodes, constants):
    """fresh(base): a value name no node, constant or earlier fresh() uses."""
    taken = set(constants)
    for node in nodes:
        taken.update(node.input)
        taken.update(node.output)

    def fresh(base):
        k = 0
        while "%s_%d" % (base, k) in taken:
            k += 1
        taken.add("%s_%d" % (base, k))
        return "%s_%d" % (base, k)
    return fresh


def fold_batch_norms(nodes, constants, graph_outputs):
    """The node list with every foldable Conv -> BatchNormalization pair made one Conv (see the
    module docstring); the folded weights and biases are added to `constants` under new names.
    nodes are not modified (a folded Conv is a new node)."""
    from .codegen import Constant   # (codegen imports this module)
    readers = _readers(nodes, graph_outputs)
    fresh_name = _namer(nodes, constants)
    producer = {node.output[0]: i for i, node in enumerate(nodes) if node.output}
    out = list(nodes)
    for i, bn in enumerate(nodes):
        if bn.op_type != "BatchNormalization" or bn.domain not in ("", "ai.onnx") or len(bn.input) != 5 \
                or not _inference_only(bn):
            continue
        j = producer.get(bn.input[0])
        conv = out[j] if j is not None else None
        if conv is None or conv.op_type != "Conv" or conv.domain not in ("", "ai.onnx") \
                or readers.get(bn.input[0]) != 1 or len(conv.output) != 1:
            continue
        w = constants.get(conv.input[1]) if len(conv.input) > 1 else None
        b = constants.get(conv.input[2]) if len(conv.input) > 2 and conv.input[2] else None
        stats = [constants.get(name) for name in bn.input[1:]]
        if w is None or None in stats or len(w.shape) < 3 or (len(conv.input) > 2 and conv.input[2] and b is None):
            continue
        channels = stats + ([b] if b is not None else [])
        if w.onnx_type != "float32" or any(c.onnx_type != "float32" or c.shape != (w.shape[0],) for c in channels):
            continue
        scale, beta, mean, var = (c.python_values() for c in stats)
        eps = _epsilon(bn)
        if not all(v + eps > 0 for v in var):   # (a NaN or negative variance: left to run time)
            continue
        s = [sc / math.sqrt(v + eps) for sc, v in zip(scale, var)]
        bias = b.python_values() if b is not None else [0.0] * len(s)
        per = len(w.values) // w.shape[0]
        weights = array("f")
        for o, so in enumerate(s):
            weights.extend(v * so for v in w.values[o * per:(o + 1) * per])
        shift = array("f", ((bo - m) * so + be for bo, m, so, be in zip(bias, mean, s, beta)))
        w_name, b_name = fresh_name(conv.input[1] + "_bn"), fresh_name(bn.input[2] + "_bn")
        constants[w_name] = Constant("float32", w.shape, weights)
        constants[b_name] = Constant("float32", (w.shape[0],), shift)
        folded = _NODE()
        folded.input = [conv.input[0], w_name, b_name]
        folded.output = list(bn.output)
        folded.name = conv.name or bn.name
        folded.op_type, folded.domain = "Conv", conv.domain
        folded.attribute = list(conv.attribute)
        out[j], out[i] = None, folded
    return [node for node in out if node is not None]


def _clip_bounds(node, constants):
    """(min, max) of a Clip whose bounds are known at import (attributes before opset 11,
    constant inputs after), None where one is absent; None when a bound is data."""
    bounds = {a.name: a.f for a in node.attribute if a.name in ("min", "max")}
    for name, value in zip(("min", "max"), node.input[1:]):
        if value:
            const = constants.get(value)
            if const is None or len(const.values) != 1:
                return None
            bounds[name] = float(const.values[0])
    return bounds.get("min"), bounds.get("max")


def _activation(node, constants):
    """"relu" / "relu6" when `node` is that activation of its first input, else None."""
    if node.domain not in ("", "ai.onnx") or len([o for o in node.output if o]) != 1:
        return None
    if node.op_type == "Relu":
        return "relu"
    if node.op_type == "Clip" and _clip_bounds(node, constants) == (0.0, 6.0):
        return "relu6"
    return None


def fold_conv_activations(nodes, constants, graph_outputs):
    """The node list with each Relu (or Clip(0, 6)) that is the only reader of a 2-D Conv's
    output made that Conv's `activation` (the conv kernel applies it at its store: one kernel
    and one full-size tensor less). Not for the layer-style source (the board's Conv2d layer has
    no activation); the folded node's attribute is one only cinders' Conv op reads."""
    readers = _readers(nodes, graph_outputs)
    producer = {node.output[0]: i for i, node in enumerate(nodes) if node.output}
    out = list(nodes)
    for i, node in enumerate(nodes):
        activation = _activation(node, constants)
        j = producer.get(node.input[0]) if activation and node.input else None
        conv = out[j] if j is not None else None
        if conv is None or conv.op_type != "Conv" or conv.domain not in ("", "ai.onnx") \
                or readers.get(node.input[0]) != 1 or len(conv.output) != 1 \
                or any(a.name == "activation" for a in conv.attribute):
            continue
        w = constants.get(conv.input[1]) if len(conv.input) > 1 else None
        if w is None or len(w.shape) != 4:
            continue
        attr = _ATTRIBUTE()
        attr.name, attr.type, attr.s = "activation", 3, activation.encode()
        folded = _NODE()
        folded.input, folded.output = list(conv.input), list(node.output)
        folded.name, folded.op_type, folded.domain = conv.name or node.name, "Conv", conv.domain
        folded.attribute = list(conv.attribute) + [attr]
        out[j], out[i] = None, folded
    return [node for node in out if node is not None]
