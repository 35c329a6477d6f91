"""Graph rewrites at import that make fewer, bigger kernels without changing a result.

fold_conv_activations: a Relu, Clip(0, 6), HardSwish, HardSigmoid (torch's) or x * Sigmoid(x)
(SiLU as exporters write it) that alone reads a 2-D Conv's output becomes the Conv's
`activation` (functional.conv2d's epilogue), so conv + activation is one kernel.

fold_conv_bias_adds: an Add of a per-channel constant after a Conv becomes the Conv's bias.

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


class _Fold:
    """What each fold reads of the graph, indexed once per pass: how many readers each value has,
    the values known at import, which node produces each value, fresh names; and the node list
    being rewritten (a replaced node becomes None until `nodes()`)."""

    def __init__(self, nodes, constants, graph_outputs):
        self.readers = _readers(nodes, graph_outputs)
        self.values = _known_values(nodes, constants)
        self.fresh_name = _namer(nodes, constants)
        self.producer = {node.output[0]: i for i, node in enumerate(nodes) if node.output}
        self.out = list(nodes)

    def conv_of(self, value):
        """(index, node) of the not yet folded plain Conv with one output that produces `value`,
        or (None, None)."""
        j = self.producer.get(value)
        conv = self.out[j] if j is not None else None
        if conv is None or conv.op_type != "Conv" or conv.domain not in ("", "ai.onnx") or len(conv.output) != 1:
            return None, None
        return j, conv

    def weight_and_bias(self, conv):
        """The Conv's constant weight and bias (None where absent), or None where either is data."""
        w = self.values.get(conv.input[1]) if len(conv.input) > 1 else None
        has_bias = len(conv.input) > 2 and conv.input[2]
        b = self.values.get(conv.input[2]) if has_bias else None
        return None if w is None or (has_bias and b is None) else (w, b)

    def fold(self, conv_index, node_index, conv, inputs, node, attributes=()):
        """Replace the Conv and the node after it by one Conv reading `inputs` and writing the
        node's outputs, the Conv's attributes plus `attributes`."""
        folded = _NODE()
        folded.input, folded.output = list(inputs), list(node.output)
        folded.name, folded.op_type, folded.domain = conv.name or node.name, "Conv", conv.domain
        folded.attribute = list(conv.attribute) + list(attributes)
        self.out[conv_index], self.out[node_index] = None, folded

    def nodes(self):
        return [node for node in self.out if node is not None]


def fold_batch_norms(nodes, constants, graph_outputs):
    """The node list with every foldable Conv -> BatchNormalization pair made one Conv (see the
    module docstring); the folded weights and biases are added to `constants` under new names.
    nodes are not modified (a folded Conv is a new node)."""
    from .codegen import Constant   # (codegen imports this module)
    graph = _Fold(nodes, constants, graph_outputs)
    for i, bn in enumerate(nodes):
        if bn.op_type != "BatchNormalization" or bn.domain not in ("", "ai.onnx") or len(bn.input) != 5 \
                or not _inference_only(bn):
            continue
        j, conv = graph.conv_of(bn.input[0])
        if conv is None or graph.readers.get(bn.input[0]) != 1:
            continue
        weights = graph.weight_and_bias(conv)
        stats = [graph.values.get(name) for name in bn.input[1:]]
        if weights is None or None in stats or len(weights[0].shape) < 3:
            continue
        w, b = weights
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
        folded_w = array("f")
        for o, so in enumerate(s):
            folded_w.extend(v * so for v in w.values[o * per:(o + 1) * per])
        shift = array("f", ((bo - m) * so + be for bo, m, so, be in zip(bias, mean, s, beta)))
        w_name, b_name = graph.fresh_name(conv.input[1] + "_bn"), graph.fresh_name(bn.input[2] + "_bn")
        constants[w_name] = Constant("float32", w.shape, folded_w)
        constants[b_name] = Constant("float32", (w.shape[0],), shift)
        graph.fold(j, i, conv, [conv.input[0], w_name, b_name], bn)
    return graph.nodes()


def _known_values(nodes, constants):
    """constants and the values of the graph's Constant nodes (which codegen adds to constants
    only as it emits them), for the folds' look-ups."""
    from .codegen import _constant_node   # (codegen imports this module)
    known = dict(constants)
    for node in nodes:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and len(node.output) == 1 \
                and any(a.name == "value" for a in node.attribute):
            known[node.output[0]] = _constant_node(node, None)
    return known


def fold_conv_bias_adds(nodes, constants, graph_outputs):
    """The node list with each Add of a per-output-channel constant ((C, 1, 1) or (1, C, 1, 1),
    either operand) to a 2-D Conv's output that nothing else reads made that Conv's bias (B' = B
    + c, in float64 rounded once; exactly c for a Conv without bias, as PaddlePaddle's exports
    write every conv): the conv kernel adds it at its store, and an activation after it can
    fold too. The Conv's constant weight tells C."""
    from .codegen import Constant   # (codegen imports this module)
    graph = _Fold(nodes, constants, graph_outputs)
    for i, add in enumerate(nodes):
        if add.op_type != "Add" or not _plain(add) or len(add.input) != 2:
            continue
        for k in (0, 1):
            (j, conv), c = graph.conv_of(add.input[k]), graph.values.get(add.input[1 - k])
            if conv is None or c is None or graph.readers.get(add.input[k]) != 1 \
                    or any(a.name == "activation" for a in conv.attribute):
                continue
            weights = graph.weight_and_bias(conv)
            if weights is None or len(weights[0].shape) != 4:
                continue
            w, b = weights
            channels = w.shape[0]
            if c.onnx_type != "float32" or w.onnx_type != "float32" or \
                    c.shape not in ((channels, 1, 1), (1, channels, 1, 1)) or (b is not None and b.onnx_type != "float32"):
                continue
            bias = b.python_values() if b is not None else [0.0] * channels
            b_name = graph.fresh_name((conv.input[2] if b is not None else conv.input[1]) + "_add")
            constants[b_name] = Constant("float32", (channels,),
                                         array("f", (bo + co for bo, co in zip(bias, c.python_values()))))
            graph.fold(j, i, conv, [conv.input[0], conv.input[1], b_name], add)
            break
    return graph.nodes()


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


def _plain(node):
    return node.domain in ("", "ai.onnx") and len([o for o in node.output if o]) == 1


def _torch_hardsigmoid(node):
    """True for a HardSigmoid of torch's slope and offset, clamp(x / 6 + 1/2, 0, 1) (what
    conv2d's "hardsigmoid" computes, as clamp(x + 3, 0, 6) / 6: the same to float32 rounding)."""
    attrs = {a.name: a.f for a in node.attribute if a.name in ("alpha", "beta")}
    return node.op_type == "HardSigmoid" and abs(attrs.get("alpha", 0.2) - 1 / 6) < 1e-6 \
        and attrs.get("beta", 0.5) == 0.5


def _activation(node, constants):
    """conv2d's activation that `node` applies to its first input ("relu", "relu6", "hardswish",
    "hardsigmoid"), else None."""
    if not _plain(node):
        return None
    if node.op_type == "Relu":
        return "relu"
    if node.op_type == "Clip" and _clip_bounds(node, constants) == (0.0, 6.0):
        return "relu6"
    if node.op_type == "HardSwish":
        return "hardswish"
    return "hardsigmoid" if _torch_hardsigmoid(node) else None


def _gated(node, nodes, producer, readers):
    """(activation, x, index of the gate) where `node` is Mul(x, gate(x)) (either order) and the
    gate, read by nothing else, is a Sigmoid (x * sigmoid(x): "silu", as exporters write SiLU)
    or torch's HardSigmoid ("hardswish"); else None."""
    if node.op_type != "Mul" or not _plain(node) or len(node.input) != 2:
        return None
    for k in (0, 1):
        g = producer.get(node.input[k])
        gate, x = (nodes[g] if g is not None else None), node.input[1 - k]
        if gate is None or not _plain(gate) or not gate.input or gate.input[0] != x \
                or readers.get(gate.output[0]) != 1:
            continue
        if gate.op_type == "Sigmoid":
            return "silu", x, g
        if _torch_hardsigmoid(gate):
            return "hardswish", x, g
    return None


def fold_conv_activations(nodes, constants, graph_outputs):
    """The node list with each activation that is the only reader of a 2-D Conv's output made
    that Conv's `activation` (functional.CONV_ACTIVATIONS: Relu, Clip(0, 6), HardSwish, torch's
    HardSigmoid, and x * Sigmoid(x) or x * HardSigmoid(x) where the Conv's output x has just
    those two readers), so the conv kernel applies it at its store: one kernel and one or two
    full-size tensors less (a backend whose kernel lacks it composes it after the kernel). Not
    for the layer-style source (the board's Conv2d layer has no activation); the folded node's
    attribute is one only cinders' Conv op reads."""
    graph = _Fold(nodes, constants, graph_outputs)
    readers, producer, out = graph.readers, graph.producer, graph.out
    for i, node in enumerate(nodes):
        found = _gated(node, nodes, producer, readers)
        if found is None and node.input and _activation(node, graph.values):
            found = _activation(node, graph.values), node.input[0], None
        if found is None:
            continue
        activation, x, gate = found
        if readers.get(x) != (1 if gate is None else 2):
            continue
        skipped, j = [], producer.get(x)
        while j is not None and out[j] is not None and out[j].op_type == "Identity" and _plain(out[j]) \
                and readers.get(out[j].input[0]) == 1:   # (PaddlePaddle's exports put them there)
            skipped.append(j)
            x = out[j].input[0]
            j = producer.get(x)
        j, conv = graph.conv_of(x)
        if conv is None or any(a.name == "activation" for a in conv.attribute):
            continue
        w = graph.values.get(conv.input[1]) if len(conv.input) > 1 else None
        if w is None or len(w.shape) != 4:
            continue
        attr = _ATTRIBUTE()
        attr.name, attr.type, attr.s = "activation", 3, activation.encode()
        graph.fold(j, i, conv, conv.input, node, [attr])
        for k in skipped + ([gate] if gate is not None else []):
            out[k] = None
    return graph.nodes()
