"""ONNX graph -> Python source of a cinders.nn.Module (the one way in: `load` executes this source,
`cinders import-onnx` writes it to a file).

The source is built by us from the validated graph; nothing the file says is ever pasted into
code. Identifiers are sanitised to [A-Za-z0-9_], and every string from the file (value names,
node names, producer) appears only as an ascii() literal: in comments (ascii() has no line
breaks) or as string constants. Numbers are emitted by repr() of Python ints/floats we decoded.
"""

import ast
import builtins
import collections
import copy
import keyword
import math
import re
from array import array

from ..nn.module import Module
from . import infer
from . import ops as onnx_ops
from .fold import fold_batch_norms, fold_conv_activations, fold_conv_bias_adds
from .ops import cinders_dtype_name
from .proto import DATA_TYPES, MESSAGE_CLASSES, OnnxError, element_type, tensor_values

# Inputs smaller than this that are constants and land on a parameter an op reads as Python
# numbers (shapes, axes, pads ...) are written into the code as literals.
LITERAL_LIMIT = 4096
# Nodes whose inputs are all constants are computed at import (on the host backend, pure Python)
# when their inputs and output hold at most this many elements; bigger ones run with the model.
# Products (a MatMul of two weights) cost far more per element: they fold up to LITERAL_LIMIT.
FOLD_LIMIT = 1 << 16
# Ops that only move values cost little more than reading their inputs: a slice of a weight (an
# LSTM's gates reordered) folds when its output is within FOLD_LIMIT and its inputs within MOVE_LIMIT.
MOVES = {"Slice", "Concat", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Identity", "Transpose", "Gather"}
MOVE_LIMIT = 1 << 18
PRODUCTS = {"MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum", "MatMulInteger", "ConvInteger", "QLinearMatMul",
            "QLinearConv", "LSTM", "GRU", "RNN", "Attention"}
SUPPORTED_DOMAINS = ("", "ai.onnx")
DOCS = "docs/onnx-ops.md"

# Identifiers an ONNX name never becomes: keywords, builtins (the code calls range, float ...) and
# the names the generated module itself uses.
_RESERVED = set(keyword.kwlist) | set(dir(builtins)) | {"self", "cn", "nn", "ops", "backend", "Model", "_"}
# Attribute names of the generated Module: nn.Module's own, those the generated class and `load`
# set, and those a layer-style module reads.
_MODULE_NAMES = set(dir(Module)) | {"training", "input_names", "output_names", "input_shapes", "input_types",
                                    "input_shape", "device_reads", "opset", "source"}

# Ops written as plain Tensor expressions (same semantics as ONNX for the dtypes ONNX allows).
_INLINE = {
    "Add": "{0} + {1}", "Sub": "{0} - {1}", "Mul": "{0} * {1}", "MatMul": "{0} @ {1}",
    "Relu": "{0}.relu()", "Sigmoid": "{0}.sigmoid()", "Tanh": "{0}.tanh()", "Exp": "{0}.exp()",
    "Log": "{0}.log()", "Sqrt": "{0}.sqrt()", "Neg": "-{0}", "Abs": "{0}.abs()", "Erf": "{0}.erf()",
    "Identity": "{0}",
}


class _Names:
    """ONNX names -> Python identifiers: the one place names are made. An identifier is derived
    from the ONNX name where safe and never equals a reserved name (keywords, builtins the
    generated code calls, the generator's own names) or an identifier given before. A subgraph
    gets a child scope: its names shadow the enclosing ones and reads fall back to them (ONNX
    scoping), while all scopes share one set of identifiers in use, because the generated
    forward() is one Python namespace."""

    def __init__(self, reserved, parent=None):
        self.taken = parent.taken if parent is not None else set(reserved)
        self.of = parent.of.new_child() if parent is not None else collections.ChainMap()

    def child(self):
        return _Names((), self)

    def fresh(self, text, prefix="v"):
        """A new identifier made from `text` (for the generator's own variables and attributes)."""
        # PyTorch names values "/layer1/conv1/Conv_output_0": the suffix says nothing
        base = re.sub(r"[^0-9A-Za-z_]", "_", re.sub(r"_output_0$", "", text)).strip("_")
        base = re.sub(r"_+", "_", base)[:60] or prefix
        if base[0].isdigit():
            base = prefix + "_" + base
        name, i = base, 1
        while name in self.taken or keyword.iskeyword(name):
            i += 1
            name = "%s_%d" % (base, i)
        self.taken.add(name)
        return name

    def define(self, onnx_name, prefix="v"):
        """A new identifier for onnx_name in this scope (shadowing an enclosing one)."""
        self.of[onnx_name] = self.fresh(onnx_name, prefix)
        return self.of[onnx_name]

    def add(self, onnx_name, prefix="v"):
        """The identifier of onnx_name defined in this scope, defined now if new here."""
        if onnx_name in self.of.maps[0]:
            return self.of.maps[0][onnx_name]
        return self.define(onnx_name, prefix)


class _Known(set):
    """ONNX names defined in one scope; `in` also sees the enclosing scopes."""

    def __init__(self, names=(), parent=None):
        super().__init__(names)
        self.parent = parent

    def __contains__(self, name):
        return set.__contains__(self, name) or (self.parent is not None and name in self.parent)

    def here(self, name):
        return set.__contains__(self, name)


def _sample_shape(declared):
    """`input_shape = (...)`: one sample's shape, for a single input whose dims past the batch are
    fixed (what cinders export-micro and the board's predict.py read); none otherwise."""
    if len(declared) != 1:
        return []
    sample = declared[0][1:]
    if not sample or not all(isinstance(d, int) and d > 0 for d in sample):
        return []
    return ["input_shape = %s   # one sample (the batch dim left out)" % literal(tuple(sample))]


def literal(value):
    """Python source of a number / string / nested list that we decoded (never file text)."""
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, int):
        return repr(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "float('nan')"
        if math.isinf(value):
            return "float('inf')" if value > 0 else "float('-inf')"
        return repr(value)
    if isinstance(value, (str, bytes)):
        return ascii(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(literal(v) for v in value) + "]"
    raise OnnxError("internal: cannot write %r as a literal" % (type(value).__name__,))


def nest(flat, shape):
    """Flat values -> nested lists of `shape` (a scalar for shape ()). A shape with a 0 nests as
    lists that do not say it (both (0, 3) and (0,) give []): tensors made from them are reshaped."""
    flat = list(flat)
    if not shape:
        return flat[0]
    if len(shape) == 1:
        return flat
    step = len(flat) // shape[0] if shape[0] else 0
    return [nest(flat[i * step:(i + 1) * step], shape[1:]) for i in range(shape[0])]


class Constant:
    """A value known at import: an initializer or a Constant node's output."""

    def __init__(self, onnx_type, shape, values):
        self.onnx_type, self.shape, self.values = onnx_type, tuple(shape), values
        self.dtype = cinders_dtype_name(onnx_type)
        self.attr = None  # the Model attribute holding it, once something reads it as a tensor
        self.half = False  # a float16 weight that may stay float16 in memory (`half_weights`)

    def python_values(self):
        """Flat Python numbers in the cinders dtype (int64 beyond int32 saturates)."""
        if self.dtype == "float32":
            return [float(v) for v in self.values]
        if self.dtype == "bool":
            return [bool(v) for v in self.values]
        return [int(v) for v in self.values]

    def storable_values(self):
        """The values as the backend stores them (int64 beyond int32 saturates), as an array of
        4 bytes a value: a list of Python ints would cost 36."""
        if self.dtype == "int32" and self.onnx_type in ("int64", "uint32", "uint64"):
            low, high = -2 ** 31, 2 ** 31 - 1
            if self.values and low <= min(self.values) and max(self.values) <= high:
                return array("i", self.values)
            return array("i", (min(max(int(v), low), high) for v in self.values))
        return self.values


def _attribute_value(attr, where):
    t = attr.type
    if t == 1:
        return attr.f
    if t == 2:
        return attr.i
    if t == 3:
        return attr.s.decode("utf-8", "replace")
    if t == 6:
        return list(attr.floats)
    if t == 7:
        return list(attr.ints)
    if t == 8:
        return [s.decode("utf-8", "replace") for s in attr.strings]
    if t == 4:
        return attr.t
    if t == 0:  # old exporters leave the type out: infer from what is set
        for field, conv in (("ints", list), ("floats", list)):
            if getattr(attr, field):
                return conv(getattr(attr, field))
        if attr.s:
            return attr.s.decode("utf-8", "replace")
        if attr.t is not None:
            return attr.t
        return attr.i if attr.i else attr.f
    raise _Unsupported("attribute %r of type %d (graphs, sparse tensors, type protos) is not supported"
                       % (attr.name, t))


class _Unsupported(Exception):
    pass


class UnsupportedOps(OnnxError):
    """Nodes the importer cannot reproduce. The message counts them by op type and reason (one
    screen even for hundreds of nodes); `nodes` names each one (`cinders import-onnx --verbose`)."""

    def __init__(self, source_name, problems):
        """problems: [(op label, reason, line naming the node)] in graph order."""
        self.nodes = [line for _, _, line in problems]
        by_reason = collections.OrderedDict()
        for label, reason, _ in problems:
            by_reason.setdefault(reason, collections.Counter())[label] += 1
        kinds = ["  %s: %s" % (reason, ", ".join("%s \u00d7%d" % kv for kv in counts.most_common()))
                 for reason, counts in sorted(by_reason.items(), key=lambda rc: -sum(rc[1].values()))]
        super().__init__("cannot import %s: %d node(s) unsupported (supported ops are listed in %s; the "
                         "error's .nodes or `cinders import-onnx --verbose` name each node):\n%s"
                         % (ascii(source_name), len(problems), DOCS, "\n".join(kinds)))


def _constant_node(node, opset):
    """The Constant node's value as a Constant."""
    attrs = {a.name: a for a in node.attribute}
    if "value" in attrs:
        type_name, shape, values = tensor_values(attrs["value"].t)
        return Constant(type_name, shape, values)
    for name, type_name, listed in (("value_float", "float32", False), ("value_floats", "float32", True),
                                    ("value_int", "int64", False), ("value_ints", "int64", True)):
        if name in attrs:
            v = _attribute_value(attrs[name], node.name)
            values = list(v) if listed else [v]
            return Constant(type_name, (len(values),) if listed else (), values)
    raise _Unsupported("Constant with attributes %s" % sorted(attrs))


def opset_of(model):
    for o in model.opset_import:
        if o.domain in SUPPORTED_DOMAINS:
            return o.version
    return 1


class _Scope:
    """Writes the statements of a graph's nodes; If / Loop / Scan recurse into their subgraphs,
    each in a child scope (child()): its values, initializers and constants are its own and shadow
    the enclosing graph's, which it reads (ONNX scoping)."""

    def __init__(self, opset, values, attrs, constants, known, problems, external):
        self.opset, self.values, self.attrs, self.constants = opset, values, attrs, constants
        self.known, self.problems, self.external = known, problems, external
        self.host_values = set()
        self.infos = collections.ChainMap()   # value name -> infer.Info (what is known at import)
        self.device_reads = []  # nodes that read a device value: their result depends on data
        self.types = collections.ChainMap()   # ONNX element type of each typed value (int8 vs uint8)
        self.every_constants = [constants]     # the constants of every scope (their stored weights)

    def child(self, graph):
        """The scope of subgraph `graph`, holding its initializers."""
        sub = copy.copy(self)
        sub.values = self.values.child()
        sub.constants = self.constants.new_child()
        sub.known = _Known(parent=self.known)
        sub.host_values = set(self.host_values)
        sub.infos, sub.types = self.infos.new_child(), self.types.new_child()
        self.every_constants.append(sub.constants.maps[0])
        for init in graph.initializer:
            type_name, shape, data = tensor_values(init, self.external)
            sub.define(init.name)
            sub.constants[init.name] = Constant(type_name, shape, data)
        return sub

    def define(self, name, python_name=False):
        """Note ONNX value `name` as defined in this scope (shadowing an enclosing one); with
        python_name, give it a new identifier here and return it."""
        self.known.add(name)
        self.host_values.discard(name)
        self.constants.maps[0].pop(name, None)
        for facts, unknown in ((self.infos, infer.UNKNOWN), (self.types, None)):
            if name in facts.parents:   # what the enclosing graph knew of its own value of that name
                facts[name] = unknown
        return self.values.define(name) if python_name else None

    def info(self, name):
        if not name:
            return None
        const = self.constants.get(name)
        if const is not None:
            small = const.dtype == "int32" and len(const.values) <= LITERAL_LIMIT
            return infer.Info(const.shape, const.python_values() if small else None)
        return self.infos.get(name, infer.UNKNOWN)

    def emit(self, nodes):
        lines = []
        registry = onnx_ops.REGISTRY
        for index, node in enumerate(nodes):
            where = "node %d %s (%s)" % (index, ascii(node.name), node.op_type)
            try:
                domain = "" if node.domain in SUPPORTED_DOMAINS else node.domain
                if domain not in onnx_ops.NAMESPACES:
                    raise _Unsupported("domain %s" % ascii(node.domain))
                if not any(node.output):
                    raise OnnxError("%s has no outputs (not a valid ONNX node)" % where)
                for o in node.output:
                    if o and self.known.here(o):
                        raise OnnxError("%s writes %s, which is already defined (ONNX values are "
                                        "assigned once)" % (where, ascii(o)))
                if node.op_type == "Constant" and not domain:
                    if len(node.output) != 1:
                        raise _Unsupported("Constant with %d outputs" % len(node.output))
                    self.define(node.output[0])
                    self.constants[node.output[0]] = _constant_node(node, self.opset)
                    continue
                fn = registry.get((domain, node.op_type))
                if fn is None and (domain or node.op_type not in ("If", "Loop", "Scan")):
                    raise _Unsupported("op not supported")
                for name in node.input:
                    if name and name not in self.known:
                        raise OnnxError("%s reads %s, which no earlier node produces (the graph is "
                                        "not in topological order or is incomplete)" % (where, ascii(name)))
                for o in node.output:
                    if o:
                        self.define(o)
                if node.op_type == "If":
                    lines += self.emit_if(node)
                elif node.op_type == "Loop":
                    lines += self.emit_loop(node)
                elif node.op_type == "Scan":
                    lines += self.emit_scan(node)
                else:
                    lines += self.emit_node(node, fn)
                self.known.update(o for o in node.output if o)
            except _Unsupported as e:
                label = node.op_type if node.domain in SUPPORTED_DOMAINS else "%s::%s" % (node.domain, node.op_type)
                self.problems.append((label, str(e), "%s %s at opset %d: %s" % (label, ascii(node.name), self.opset, e)))
                for o in node.output:   # known, so that later nodes report only their own problems
                    if o:
                        self.known.add(o)
                        self.values.add(o)
        return lines

    def emit_node(self, node, fn):
        """The statement of one node, or none when its outputs are known at import (folded).
        Its outputs live on the host when they depend only on input shapes (see HOST_OPS)."""
        attributes = _node_attributes(node, fn)
        outs = [o for o in node.output if o]
        infos = infer.infer(node.op_type, [self.info(i) for i in node.input], attributes, len(node.output))
        if node.op_type == "Identity" and node.input[0] in self.constants:
            folded = {node.output[0]: self.constants[node.input[0]]}   # the same constant, its type kept
        else:
            folded = _known_outputs(node, infos) or _fold(node, fn, attributes, self.opset, self.constants, infos)
        if folded:
            self.constants.update(folded)
            return []
        self.infos.update((o, i) for o, i in zip(node.output, infos) if o)
        on_host = _on_host(node, self.host_values, self.constants, infos)
        if on_host:
            self.host_values.update(outs)
        elif fn.reads or any(name and fn.inputs[i] in fn.host and name not in self.constants
                             and name not in self.host_values for i, name in enumerate(node.input)):
            self.device_reads.append("%s %s" % (node.op_type, ascii(node.name)))
        return [_node_statement(node, fn, attributes, self.opset, self.values, self.attrs, self.constants,
                                self.host_values, on_host, self.types)]

    def read_unless_host(self, node, names):
        """Note node as a device read when one of names (an If condition, a Loop count) is data."""
        if any(n and n not in self.constants and n not in self.host_values for n in names):
            self.device_reads.append("%s %s" % (node.op_type, ascii(node.name)))

    def outputs(self, graph, where):
        """The operands of subgraph `graph`'s outputs, read in this (its) scope."""
        for vi in graph.output:
            if vi.name not in self.known:
                raise _Unsupported("%s output %s is produced by no node" % (where, ascii(vi.name)))
        return [_operand(vi.name, self.values, self.attrs, self.constants, False, self.host_values)
                for vi in graph.output]

    def emit_loop(self, node):
        """Loop as a Python while loop: the body graph's inputs (iteration number, condition,
        loop-carried values) are assigned before each pass, its outputs carried to the next;
        scan outputs are stacked at the end."""
        body = {a.name: a.g for a in node.attribute if a.type == 5}.get("body")
        if body is None:
            raise _Unsupported("Loop without a body graph")
        carried = list(node.input[2:])
        n_scan = len(body.output) - 1 - len(carried)
        if len(body.input) != 2 + len(carried) or n_scan < 0 or len(node.output) > len(carried) + n_scan:
            raise _Unsupported("Loop body with %d inputs / %d outputs for %d carried values"
                               % (len(body.input), len(body.output), len(carried)))
        comment = "  # %s" % ascii(node.name) if node.name else ""
        self.read_unless_host(node, node.input[:2])
        trips = _operand(node.input[0], self.values, self.attrs, self.constants, True) if node.input[0] else "None"
        cond = _operand(node.input[1], self.values, self.attrs, self.constants, True) \
            if len(node.input) > 1 and node.input[1] else "True"
        sources = [_operand(i, self.values, self.attrs, self.constants, False, self.host_values) for i in carried]
        scans = [self.values.fresh("%s_scan_%d" % (node.name or "loop", k)) for k in range(n_scan)]
        inside = self.child(body)
        step, cond_in = (inside.define(vi.name, True) for vi in body.input[:2])
        state = [inside.define(vi.name, True) for vi in body.input[2:]]
        inside.host_values.add(body.input[0].name)
        lines = ["%s = %s%s" % (v, src, comment) for v, src in zip(state, sources)]
        lines += ["%s = []" % v for v in scans]
        lines += ["%s = ops.truth(%s)" % (cond_in, cond) if cond != "True" else "%s = True" % cond_in,
                  "for %s in ops.trips(%s):" % (step, trips),
                  "    if not ops.truth(%s):" % cond_in, "        break"]
        inner = inside.emit(body.node)
        outs = inside.outputs(body, "body")
        inner.append("%s = %s" % (cond_in, outs[0]))
        if state:
            inner.append("%s = %s" % (", ".join(state), ", ".join(outs[1:1 + len(state)])))
        inner += ["%s.append(%s)" % (v, o) for v, o in zip(scans, outs[1 + len(state):])]
        lines += ["    " + line for line in inner]
        results = state + ["ops.stack_scan(%s)" % v for v in scans]
        for o, r in zip(node.output, results):
            if o:
                lines.append("%s = %s" % (self.values.add(o), r))
        return lines

    def emit_scan(self, node):
        """Scan (opset 9+) as a Python for loop over the scan axis of its scan inputs."""
        if self.opset < 9:
            raise _Unsupported("Scan before opset 9 (with sequence_lens)")
        a = {x.name: x for x in node.attribute}
        body = a["body"].g if "body" in a else None
        if body is None or "num_scan_inputs" not in a:
            raise _Unsupported("Scan without body / num_scan_inputs")
        n_scan_in = a["num_scan_inputs"].i
        n_state = len(node.input) - n_scan_in
        n_scan_out = len(body.output) - n_state
        in_axes = list(a["scan_input_axes"].ints) if "scan_input_axes" in a else [0] * n_scan_in
        in_dirs = list(a["scan_input_directions"].ints) if "scan_input_directions" in a else [0] * n_scan_in
        out_axes = list(a["scan_output_axes"].ints) if "scan_output_axes" in a else [0] * n_scan_out
        out_dirs = list(a["scan_output_directions"].ints) if "scan_output_directions" in a else [0] * n_scan_out
        if n_state < 0 or n_scan_out < 0 or len(body.input) != len(node.input):
            raise _Unsupported("Scan body does not fit its inputs")
        comment = "  # %s" % ascii(node.name) if node.name else ""
        sources = [_operand(i, self.values, self.attrs, self.constants, False, self.host_values) for i in node.input]
        step = self.values.fresh("%s_step" % (node.name or "scan"))
        scans = [self.values.fresh("%s_scan_%d" % (node.name or "scan", k)) for k in range(n_scan_out)]
        inside = self.child(body)
        state = [inside.define(vi.name, True) for vi in body.input[:n_state]]
        elems = [inside.define(vi.name, True) for vi in body.input[n_state:]]
        lines = ["%s = %s%s" % (v, src, comment) for v, src in zip(state, sources[:n_state])]
        lines += ["%s = []" % v for v in scans]
        lines.append("for %s in range(%s.shape[%d]):" % (step, sources[n_state], in_axes[0]))
        inner = ["%s = ops.scan_slice(%s, %d, %s, %d)" % (e, src, ax, step, d)
                 for e, src, ax, d in zip(elems, sources[n_state:], in_axes, in_dirs)]
        inner += inside.emit(body.node)
        outs = inside.outputs(body, "body")
        if state:
            inner.append("%s = %s" % (", ".join(state), ", ".join(outs[:n_state])))
        inner += ["%s.append(%s)" % (v, o) for v, o in zip(scans, outs[n_state:])]
        lines += ["    " + line for line in inner]
        results = state + ["ops.stack_scan(%s, %d, %d)" % (v, ax, d) for v, ax, d in zip(scans, out_axes, out_dirs)]
        for o, r in zip(node.output, results):
            if o:
                lines.append("%s = %s" % (self.values.add(o), r))
        return lines

    def emit_if(self, node):
        branches = {a.name: a.g for a in node.attribute if a.type == 5}
        if set(branches) != {"then_branch", "else_branch"}:
            raise _Unsupported("If needs then_branch and else_branch graphs")
        outs = [self.values.add(o) if o else "_" for o in node.output]
        comment = "  # %s" % ascii(node.name) if node.name else ""
        known = self.constants.get(node.input[0])
        if known is not None:   # decided at import: only the branch taken is written
            keys = ("then_branch" if any(known.python_values()) else "else_branch",)
            lines = ["# %s: %s taken (its condition is a constant)" % (ascii(node.name or "If"), keys[0])]
        else:
            keys = ("then_branch", "else_branch")
            cond = _operand(node.input[0], self.values, self.attrs, self.constants, True)
            self.read_unless_host(node, node.input[:1])
            lines = ["if ops.truth(%s):%s" % (cond, comment)]
        for key in keys:
            graph = branches[key]
            if key == "else_branch" and len(keys) == 2:
                lines.append("else:")
            inside = self.child(graph)
            body = inside.emit(graph.node)
            if len(graph.output) != len(outs):
                raise _Unsupported("%s has %d outputs, the If %d" % (key, len(graph.output), len(outs)))
            body += ["%s = %s" % (target, out) for target, out in zip(outs, inside.outputs(graph, key))]
            lines += ["    " + line for line in body] if len(keys) == 2 else body
            if len(keys) == 1:   # decided: its outputs are the branch's, with what is known of them
                self.infos.update((o, inside.info(vi.name)) for o, vi in zip(node.output, graph.output) if o)
        return lines


def generate(model, external=None, class_name="Model", source_name="model.onnx", fixed_inputs=None,
             input_shapes=None):
    """(source, {attribute: Constant}, device_reads) for the ModelProto `model`; device_reads
    names the nodes whose results depend on data, which read device values at run time.
    fixed_inputs: {input name: value (a number or nested lists)} given now for every call: those
    inputs become constants, so what depends only on them is decided at import. input_shapes:
    {input name: dims} that replace the graph's declared (symbolic) dims, so shape arithmetic
    on them folds at import too (the model then refuses other shapes). Raises OnnxError
    listing every unsupported node at once."""
    graph = model.graph
    opset = opset_of(model)
    values = _Names(_RESERVED)
    attrs = _Names(_RESERVED | _MODULE_NAMES)
    constants = collections.ChainMap()
    for init in graph.initializer:
        type_name, shape, data = tensor_values(init, external)
        if type_name == "string":
            raise OnnxError("initializer %s holds strings, which cinders tensors cannot" % ascii(init.name))
        constants[init.name] = Constant(type_name, shape, data)
    constants.update(_fixed_constants(graph, fixed_inputs or {}, constants))
    if graph.sparse_initializer:
        raise OnnxError("sparse initializers are not supported (see %s)" % DOCS)
    # Batch norms and per-channel constant adds after constant-weight convs become the convs'
    # weights and biases (fold.py).
    model, graph = copy.copy(model), copy.copy(graph)
    model.graph = graph
    graph.node = topological(graph.node)
    graph.node = fold_conv_bias_adds(fold_batch_norms(graph.node, constants, [vi.name for vi in graph.output]),
                                     constants, [vi.name for vi in graph.output])

    if not graph.output:
        raise OnnxError("the graph has no outputs")
    inputs = [vi for vi in graph.input if vi.name not in constants]
    if len({vi.name for vi in inputs}) != len(inputs) or not all(vi.name for vi in inputs):
        raise OnnxError("graph inputs %s are not distinct non-empty names" % [ascii(vi.name) for vi in inputs])
    input_vars = [values.add(vi.name, "x") for vi in inputs]
    known = _Known(set(vi.name for vi in inputs) | set(constants))

    problems = []
    scope = _Scope(opset, values, attrs, constants, known, problems, external)
    scope.types.update(_value_types(graph, constants))
    declared = _declared_shapes(inputs, input_shapes or {})
    for vi, dims in zip(inputs, declared):
        if element_type(vi.type)[1] is not None:
            scope.infos[vi.name] = infer.Info(dims)
    # Shapes decided at import assume the declared dims: an input of other dims is refused.
    lines = ["ops.expect_shape(%s, %s, %s)" % (var, literal(dims), ascii(vi.name))
             for var, vi, dims in zip(input_vars, inputs, declared) if any(isinstance(d, int) for d in dims)]
    lines += ["%s = ops.half_input(%s)" % (var, var) for var, vi in zip(input_vars, inputs)
              if element_type(vi.type)[0] == "float16"]
    # Quantized weights stay 8-bit and Q -> DQ pairs join (the op's kernels read them); activations
    # fold into convs in this source only: the layer-style one keeps its ReLU layers.
    nodes = check_quantized_types(graph.node, constants, scope.types)
    nodes = quantized_activation_inputs(requantized_activations(dequantized_weights(nodes, constants, graph.output),
                                                          constants, graph.output), constants)
    known.update(constants)   # (packed 4-bit weights are new constants)
    lines += scope.emit(fold_conv_activations(nodes, constants, [vi.name for vi in graph.output]))
    if problems:
        raise UnsupportedOps(source_name, problems)
    layered = _layer_source(model, class_name, source_name, opset, inputs, input_vars, constants, values,
                            declared)
    if layered is not None:
        return layered + ([],)
    outputs = []
    for vi in graph.output:
        if vi.name not in known:
            raise OnnxError("graph output %s is produced by no node" % ascii(vi.name))
        out = _operand(vi.name, values, attrs, constants, False, scope.host_values)
        outputs.append("ops.half_output(%s)" % out if element_type(vi.type)[0] == "float16" else out)
    half_weights(nodes, constants)
    stored = list({c.attr: c for every in scope.every_constants for c in every.values() if c.attr}.values())
    return _module_source(model, class_name, source_name, opset, inputs, input_vars, outputs, lines,
                          stored, scope.device_reads, declared), {c.attr: c for c in stored}, scope.device_reads


def _declared_shapes(inputs, given):
    """The dims of each graph input: the graph's, or those `given` for it (checked against them)."""
    names = [vi.name for vi in inputs]
    for name in given:
        if name not in names:
            raise OnnxError("input shape for %s, which is not an input of the graph (its inputs: %s)"
                            % (ascii(name), ", ".join(ascii(n) for n in names)))
    out = []
    for vi in inputs:
        dims = list(element_type(vi.type)[1] or [])
        shape = given.get(vi.name)
        if shape is not None:
            shape = list(shape)
            if element_type(vi.type)[1] is not None and (len(shape) != len(dims) or any(
                    isinstance(d, int) and d != n for d, n in zip(dims, shape))):
                raise OnnxError("input shape %s for %s does not fit the graph's %s" % (shape, ascii(vi.name), dims))
            if not all(isinstance(n, int) and n > 0 for n in shape):
                raise OnnxError("input shape %s for %s is not positive integers" % (shape, ascii(vi.name)))
            dims = shape
        out.append(dims)
    return out


def topological(nodes):
    """The nodes in an order where each comes after the nodes whose outputs it reads (subgraphs'
    reads included), the file's order kept where it already is one. onnxruntime runs graphs
    whose nodes are out of order, and its float16 converter writes them so (the input Casts
    last); what cannot be ordered (a cycle, a missing value) keeps its place, for emit to name."""
    made = {o for node in nodes for o in node.output if o}

    def reads(node):
        names = set(node.input)
        for attr in node.attribute:
            for sub in ([attr.g] if attr.g is not None else []) + list(attr.graphs):
                for inner in sub.node:
                    names |= reads(inner)
        return names

    waiting = [(node, (reads(node) & made) - set(node.output)) for node in nodes]
    done, out = set(), []
    while waiting:   # passes in the file's order, each taking every node whose inputs are made
        left = []
        for node, needs in waiting:
            if needs <= done:
                out.append(node)
                done.update(node.output)
            else:
                left.append((node, needs))
        if len(left) == len(waiting):   # a cycle or a value nothing makes: the file's order
            return out + [node for node, _ in left]
        waiting = left
    return out


# A half model's float16 weights that stay float16 in memory (cinders.onnx `_tensors`, where the
# backend declares quantized_matmul): those whose every reader is one of these ops' weight input,
# op -> (input index, most dims): the products widen them inside matmul_quantized
# (ops/linalg.py half_product, ops/conv.py), Gather widens the rows it takes (an embedding
# table). Every other float16 constant computes as float32 from import on.
HALF_WEIGHT_READERS = {"MatMul": (1, 2), "Gemm": (1, 2), "Conv": (1, 4), "Gather": (0, 8)}


def half_weights(nodes, constants):
    """Mark (Constant.half) the float16 constants that only the nodes of HALF_WEIGHT_READERS
    read as their weight (MatMul's B at 2-D, Gemm's B without transA, a 1-D/2-D Conv's W of any
    group, Gather's data); a read anywhere else, subgraphs included, keeps the constant float32.
    (A grouped Conv's weight is read at 2 bytes where the backend declares half_conv2d, and
    widened per call elsewhere: ops/conv.py.) Only the float16 constants' reads are indexed: a
    graph's other values cost nothing here."""
    halves = {name for name, c in constants.items() if c.onnx_type == "float16"}
    if not halves:
        return
    readers = collections.defaultdict(list)

    def walk(graph_nodes, top):
        for node in graph_nodes:
            for i, name in enumerate(node.input):
                if name in halves:
                    readers[name].append((node, i) if top else None)
            for attr in node.attribute:
                for sub in ([attr.g] if attr.g is not None else []) + list(attr.graphs):
                    walk(sub.node, False)

    def weight_slot(read, c):
        if read is None or read[0].domain or read[0].op_type not in HALF_WEIGHT_READERS:
            return False
        node, dims = read[0], len(c.shape)
        slot, most = HALF_WEIGHT_READERS[node.op_type]
        attrs = {a.name: a.i for a in node.attribute if a.type == 2}
        shaped = dims >= 3 if node.op_type == "Conv" else dims == 2 or node.op_type == "Gather"
        return read[1] == slot and shaped and dims <= most and not attrs.get("transA")

    walk(nodes, True)
    for name, reads in readers.items():
        c = constants.get(name)
        if c is not None and c.onnx_type == "float16" and all(weight_slot(r, c) for r in reads):
            c.half = True


# The products whose constant 8-bit weight a QDQ graph dequantizes first, and the op
# (ops/quantization.py) that reads the weight quantized instead.
DEQUANTIZED_WEIGHT_OPS = {"Conv": "DequantizedConv", "MatMul": "DequantizedMatMul", "Gemm": "DequantizedGemm"}


def dequantized_weights(nodes, constants, graph_outputs):
    """The nodes with each DequantizeLinear of a constant int8/uint8/int4/uint4 weight whose one
    reader is a Conv/MatMul/Gemm (as its weight, input 1) joined into that reader as
    Dequantized<op> (inputs: x, W, its scale, its zero point, then the reader's others; both
    nodes' attributes, whose names differ): the weight then stays 8-bit where the backend
    multiplies it so. A 4-bit weight is packed (`packed_four_bit`) and stays 4-bit there."""
    readers = _readers(nodes)
    outputs = {vi.name for vi in graph_outputs}
    joined, dropped = {}, set()
    for node in nodes:
        params = list(node.input)
        if node.op_type != "DequantizeLinear" or node.domain not in SUPPORTED_DOMAINS or not params or \
                not all(name in constants for name in params if name) or \
                constants[params[0]].onnx_type not in ("int8", "uint8") + FOUR_BIT_TYPES:
            continue
        users = readers.get(node.output[0], [])
        if node.output[0] in outputs or len(users) != 1:
            continue
        user, slot = users[0]
        if slot != 1 or user.op_type not in DEQUANTIZED_WEIGHT_OPS or user.domain not in SUPPORTED_DOMAINS:
            continue
        fused = MESSAGE_CLASSES["NodeProto"]()
        fused.op_type, fused.name, fused.domain = DEQUANTIZED_WEIGHT_OPS[user.op_type], user.name, onnx_ops.JOINED
        params = (params + ["", ""])[:3]
        fused.attribute = list(user.attribute) + list(node.attribute)
        if constants[params[0]].onnx_type in FOUR_BIT_TYPES:
            offset = 8 if constants[params[0]].onnx_type == "int4" else 0
            fused.attribute += [_attribute("packed_shape", 7, list(constants[params[0]].shape)),
                                _attribute("packed_offset", 2, offset)]
            params = packed_four_bit(params, constants, offset)
        inputs = [user.input[0]] + params + list(user.input[2:])
        while inputs and not inputs[-1]:
            inputs.pop()
        fused.input, fused.output = inputs, list(user.output)
        joined[id(user)] = fused
        dropped.add(id(node))
    if not joined:
        return nodes
    return [joined.get(id(n), n) for n in nodes if id(n) not in dropped]


# ONNX's type constraints of the quantized ops, as onnxruntime enforces them at load: (pairs of
# inputs of one type: a value and its zero point, inputs that are scales). A zero point of
# another type than its value would saturate to the wrong range, a scale that is no float
# would scale by its bits: refused at import instead.
QUANTIZED_TYPE_RULES = {
    ("", "DequantizeLinear"): (((0, 2),), (1,)),
    ("", "QuantizeLinear"): ((), (1,)),
    ("", "MatMulInteger"): (((0, 2), (1, 3)), ()),
    ("", "ConvInteger"): (((0, 2), (1, 3)), ()),
    ("", "QLinearMatMul"): (((0, 2), (3, 5)), (1, 4, 6)),
    ("", "QLinearConv"): (((0, 2), (3, 5)), (1, 4, 6)),
    ("com.microsoft", "DynamicQuantizeMatMul"): (((1, 3),), (2,)),
}
SCALE_TYPES = ("float32", "float16", "bfloat16")


def check_quantized_types(nodes, constants, types):
    """The nodes, once every quantized op among them has inputs of the types ONNX allows
    (`QUANTIZED_TYPE_RULES`) where the graph states them."""
    for node in nodes:
        rule = QUANTIZED_TYPE_RULES.get(("" if node.domain == "ai.onnx" else node.domain, node.op_type))
        if rule is None:
            continue
        names = onnx_ops.REGISTRY[("" if node.domain == "ai.onnx" else node.domain, node.op_type)].inputs

        def type_of(i):
            name = node.input[i] if i < len(node.input) else ""
            return (constants[name].onnx_type if name in constants else types.get(name)) if name else None
        pairs, scales = rule
        for i, j in pairs:
            if type_of(i) and type_of(j) and type_of(i) != type_of(j):
                raise OnnxError("node %s (%s): %s is %s but %s is %s; ONNX requires one type"
                                % (ascii(node.name), node.op_type, names[j], type_of(j), names[i], type_of(i)))
        for i in scales:
            if type_of(i) and type_of(i) not in SCALE_TYPES:
                raise OnnxError("node %s (%s): %s is %s; a scale is float32, float16 or bfloat16"
                                % (ascii(node.name), node.op_type, names[i], type_of(i)))
    return nodes


FOUR_BIT_TYPES = ("int4", "uint4")
_UINT4 = {offset: bytes(((b & 15) ^ offset) for b in range(256)) for offset in (0, 8)}   # byte -> v + offset


def packed_four_bit(params, constants, offset):
    """[W, scale, zero point] of a DequantizeLinear of 4-bit W as the names of new constants: W
    packed two values a byte, low nibble first (core/dtypes.py), as uint4 (MatMulNBits' layout:
    the kernels read unsigned nibbles), its zero point as uint8 values. Both are the graph's
    values plus `offset` (int4: 8, its two's complement nibble with the top bit flipped; the
    zero point is then `offset` where the graph gives none), so q - zp is the same integer."""
    w_name, scale, zp_name = params
    nibbles = array("b" if offset else "B", constants[w_name].values).tobytes().translate(_UINT4[offset])
    # two nibbles a byte in one pass: each byte of `high` shifted by 4 stays inside its own byte
    length = (len(nibbles) + 1) // 2
    packed = int.from_bytes(nibbles[0::2], "little") | int.from_bytes(nibbles[1::2], "little") << 4
    names = [w_name + "/uint4", scale, zp_name and zp_name + "/uint4"]
    constants[names[0]] = Constant("uint8", (length,), array("B", packed.to_bytes(length, "little")))
    if zp_name:
        zp = constants[zp_name]
        constants[names[2]] = Constant("uint8", zp.shape, array("B", (v + offset for v in zp.values)))
    return names


def _attribute(name, kind, value):
    """An AttributeProto: kind 2 an int, 7 a list of ints."""
    attr = MESSAGE_CLASSES["AttributeProto"]()
    attr.name, attr.type = name, kind
    if kind == 2:
        attr.i = value
    else:
        attr.ints = value
    return attr


def _readers(nodes):
    """{value name: [(node, input slot)]} of the nodes that read it."""
    readers = collections.defaultdict(list)
    for node in nodes:
        for slot, name in enumerate(node.input):
            if name:
                readers[name].append((node, slot))
    return readers


def requantized_activations(nodes, constants, graph_outputs):
    """The nodes with each QuantizeLinear whose one reader is a DequantizeLinear (a QDQ graph's
    activation round trip) joined into QuantizeDequantize (ops/quantization.py: one elementwise
    kernel): where both have constant per-tensor parameters, Q's zero point included, and no
    attribute but axis (which per-tensor parameters ignore)."""
    readers = _readers(nodes)
    outputs = {vi.name for vi in graph_outputs}

    def plain(node):
        params = node.input[1:]
        return node.domain in SUPPORTED_DOMAINS and all(a.name == "axis" for a in node.attribute) and \
            all(name in constants and len(constants[name].values) == 1 for name in params if name)
    joined, dropped = {}, set()
    for node in nodes:
        if node.op_type != "QuantizeLinear" or len(node.input) != 3 or not plain(node):
            continue
        users = readers.get(node.output[0], [])
        if node.output[0] in outputs or len(users) != 1:
            continue
        user, slot = users[0]
        if user.op_type != "DequantizeLinear" or slot != 0 or not plain(user):
            continue
        fused = MESSAGE_CLASSES["NodeProto"]()
        fused.op_type, fused.name, fused.domain = "QuantizeDequantize", user.name, onnx_ops.JOINED
        fused.input, fused.output = list(node.input) + list(user.input[1:]), list(user.output)
        joined[id(user)] = fused
        dropped.add(id(node))
    if not joined:
        return nodes
    return [joined.get(id(n), n) for n in nodes if id(n) not in dropped]


# The joined products whose X may be a QDQ activation, and the input slot of its scale (x_scale).
ACTIVATION_SCALE_SLOTS = {"DequantizedConv": 5, "DequantizedMatMul": 4, "DequantizedGemm": 5}


def quantized_activation_inputs(nodes, constants):
    """The nodes with each DequantizedConv/MatMul/Gemm whose X is a QuantizeDequantize of 8-bit
    values given that round trip's scale as its x_scale: X / x_scale are then the integers an
    integer kernel multiplies by W's (ops/quantization.py), as onnxruntime's QLinearConv,
    QLinearMatMul and MatMulIntegerToFloat do."""
    makers = {node.output[0]: node for node in nodes if node.op_type == "QuantizeDequantize" and
              node.domain == onnx_ops.JOINED and constants[node.input[2]].onnx_type in ("int8", "uint8")}
    out = []
    for node in nodes:
        slot = ACTIVATION_SCALE_SLOTS.get(node.op_type) if node.domain == onnx_ops.JOINED else None
        maker = makers.get(node.input[0]) if slot is not None else None
        if maker is not None:
            fused = MESSAGE_CLASSES["NodeProto"]()
            fused.op_type, fused.name, fused.domain = node.op_type, node.name, node.domain
            fused.input = (list(node.input) + [""] * slot)[:slot] + [maker.input[3]]
            fused.output, fused.attribute = list(node.output), list(node.attribute)
            node = fused
        out.append(node)
    return out


def _fixed_constants(graph, fixed, constants):
    """{input name: Constant} of the inputs `fixed` gives values for, checked against the graph."""
    declared = {vi.name: vi for vi in graph.input if vi.name not in constants}
    out = {}
    for name, value in fixed.items():
        if name not in declared:
            raise OnnxError("fixed input %s is not an input of the graph (its inputs: %s)"
                            % (ascii(name), ", ".join(ascii(n) for n in declared)))
        type_name, dims = element_type(declared[name].type)
        shape, flat = [], value
        while isinstance(flat, (list, tuple)):
            shape.append(len(flat))
            flat = flat[0] if flat else None
        flat = _flat(value)
        if not all(isinstance(v, (int, float, bool)) for v in flat):
            raise OnnxError("fixed input %s: %r is not a number or nested lists of numbers" % (ascii(name), value))
        if dims is not None and (len(dims) != len(shape) or any(isinstance(d, int) and d != n
                                                                for d, n in zip(dims, shape))):
            raise OnnxError("fixed input %s has shape %s, the graph declares %s" % (ascii(name), shape, dims))
        out[name] = Constant(type_name or "float32", shape, flat)
    return out


def _value_types(graph, constants):
    """{value name: ONNX element type} where the graph says it (inputs, value_info) or a node
    fixes it (Cast's `to`, the quantizers' outputs): what tells int8 from uint8 in quantized ops."""
    types = {vi.name: element_type(vi.type)[0] for vi in list(graph.input) + list(graph.value_info)}
    for node in graph.node:
        if not node.output:   # not a valid node: emit() refuses it with its reason
            continue
        attrs = {a.name: a.i for a in node.attribute if a.type == 2}
        if node.op_type == "Cast" and attrs.get("to") in DATA_TYPES:
            types[node.output[0]] = DATA_TYPES[attrs["to"]][0]
        elif node.op_type == "DynamicQuantizeLinear":
            types.update(zip(node.output, ("uint8", "float32", "uint8")))
        elif node.op_type == "QuantizeLinear" and len(node.input) > 2 and node.input[2] in constants:
            types[node.output[0]] = constants[node.input[2]].onnx_type
    return types


def _operand(name, values, attrs, constants, host, host_values=(), host_node=False):
    """Source of one input. host: the op reads it as Python numbers. host_values: values that
    live on the host (shape arithmetic, see HOST_OPS); host_node: the op computes on the host."""
    if not name:
        return "None"
    const = constants.get(name)
    if const is None:
        var = values.of[name]
        if name in host_values and not host and not host_node:
            return "ops.to_device(%s, backend)" % var    # a shape value entering device math
        return var
    n = len(const.values)
    if host and n <= LITERAL_LIMIT:
        return literal(nest(const.python_values(), const.shape))
    if host_node:
        source = "ops.host_tensor(%s, %s)" % (literal(nest(const.python_values(), const.shape)), ascii(const.dtype))
        return source + (".reshape(%s)" % literal(const.shape) if 0 in const.shape else "")
    if const.attr is None:
        const.attr = attrs.fresh(name, "w")
    return "self." + const.attr


# Shape arithmetic runs on the host: what is known at import is folded into constants (see
# infer.py and _fold); what depends on the input shapes is computed per call on cn.Python(): Shape
# and Size give small int tensors there, and these ops keep computing there while every input is
# such a value or a small constant. Reshape, Expand, Slice ... then read their shapes without
# waiting for a GPU (or, in the browser, without a blocking read), and cn.capture can replay them.
HOST_OPS = {"Gather", "Slice", "Concat", "Unsqueeze", "Squeeze", "Reshape", "Cast", "Add", "Sub", "Mul",
            "Div", "Mod", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Where", "Not",
            "Identity", "Max", "Min", "Neg", "Abs", "ReduceProd", "ReduceSum", "Floor", "Ceil", "And", "Or",
            "Sign", "ConstantOfShape", "Range", "Expand", "Tile"}
# Ops whose output size is a value: they stay on the host (or fold) only when it is known and small.
SIZED_BY_VALUE = {"ConstantOfShape", "Range", "Expand", "Tile", "Pad", "Resize", "Upsample", "OneHot",
                  "CenterCropPad"}


def _small(info):
    n = info.numel()
    return n is not None and n <= LITERAL_LIMIT


def _on_host(node, host_values, constants, infos):
    if node.op_type in ("Shape", "Size"):
        return True
    if node.op_type not in HOST_OPS or not any(i in host_values for i in node.input):
        return False
    if node.op_type in SIZED_BY_VALUE and not all(_small(i) for i in infos):
        return False
    return all(not i or i in host_values or (i in constants and len(constants[i].values) <= LITERAL_LIMIT)
               for i in node.input)


def _known_outputs(node, infos):
    """{name: Constant} when shape inference knows every output (e.g. Shape of static dims)."""
    out = {}
    for name, info in zip(node.output, infos):
        if not name:
            continue
        value = info.known()
        if value is None or info.numel() != len(value):
            return None
        out[name] = Constant("int64", info.shape, value)
    return out


def _fold(node, fn, attributes, opset, constants, infos):
    """{name: Constant} of a node whose inputs are all small constants, computed now by its op
    function on the host backend (constant folding); None when it cannot be (it then runs with
    the model, which raises any error it has where the user sees it)."""
    if not any(node.input) or not all(not i or i in constants for i in node.input):
        return None
    if "input_types" in fn.params:   # quantized ops: a folded value would lose its int8/uint8 type
        return None
    if sum(len(constants[i].values) for i in node.input if i) > \
            (LITERAL_LIMIT if node.op_type in PRODUCTS else MOVE_LIMIT if node.op_type in MOVES else FOLD_LIMIT):
        return None
    sizes = [i.numel() for o, i in zip(node.output, infos) if o]
    if any(n is None and node.op_type in SIZED_BY_VALUE or n is not None and n > FOLD_LIMIT for n in sizes):
        return None
    args = []
    for i, name in enumerate(node.input):
        const = constants.get(name)
        value = None if const is None else nest(const.python_values(), const.shape)
        if const is not None and fn.inputs[i] not in fn.host:
            value = onnx_ops.host_tensor(value, const.dtype)
            value = value.reshape(const.shape) if 0 in const.shape else value
        args.append(value)
    keywords = dict(attributes)
    if "opset" in fn.params:
        keywords["opset"] = opset
    if "backend" in fn.params:
        keywords["backend"] = onnx_ops.host_backend()
    if fn.multi:
        keywords["outputs"] = len(node.output)
    try:
        result = fn(*args, **keywords)
    except Exception:   # noqa: BLE001 - not folded: the same call at run time reports it
        return None
    results = result if isinstance(result, tuple) else (result,)
    folded = {}
    for name, t in zip(node.output, results):
        if name:
            flat = _flat(t.tolist())
            if len(flat) > FOLD_LIMIT:
                return None
            folded[name] = Constant("int64" if t.dtype.name == "int32" else t.dtype.name, t.shape, flat)
    return folded


def _flat(nested):
    if not isinstance(nested, list):
        return [nested]
    return [v for item in nested for v in _flat(item)]


def _node_attributes(node, fn):
    """{name: Python value} of a node's attributes; the node's attributes and inputs are checked
    against its op function."""
    params = fn.params
    attributes = {}
    # keywords the importer passes itself; com.microsoft ops (QLinearSoftmax) state their opset
    reserved = ("outputs", "backend", "input_types") + (() if node.domain == "com.microsoft" else ("opset",))
    for a in node.attribute:
        if a.name not in params or a.name in reserved:
            raise _Unsupported("attribute %s" % ascii(a.name))
        value = _attribute_value(a, node.name)
        if a.name == "to" or a.name == "dtype":
            if value not in DATA_TYPES or value in (8, 16, 21, 22):
                raise _Unsupported("%s=%d: cinders computes in float32, int32 and bool; this type "
                                   "(8-bit/4-bit floats, strings, ...) is not emulated" % (a.name, value))
            value = DATA_TYPES[value][0]
        elif not isinstance(value, (int, float, str, list)):  # a tensor attribute
            type_name, shape, data = tensor_values(value)
            value = [type_name, list(shape), list(data)] if len(data) <= LITERAL_LIMIT else None
            if value is None:
                raise _Unsupported("tensor attribute %s larger than %d elements" % (ascii(a.name), LITERAL_LIMIT))
        attributes[a.name] = value
    if len(node.input) > len(fn.inputs):
        raise _Unsupported("%d inputs (at most %d)" % (len(node.input), len(fn.inputs)))
    required = [n for n in fn.inputs[:fn.required] if n not in attributes]
    if len(node.input) < len(required) or not all(node.input[:len(required)]):
        raise OnnxError("node %s (%s) lacks required inputs: it has %s, %s needs %s"
                        % (ascii(node.name), node.op_type, [ascii(n) for n in node.input], node.op_type,
                           ", ".join(required)))
    return attributes


def _node_statement(node, fn, attributes, opset, values, attrs, constants, host_values=(), host_node=False,
                    types=None):
    params = fn.params
    args = [_operand(name, values, attrs, constants, fn.inputs[i] in fn.host, host_values, host_node)
            for i, name in enumerate(node.input)]
    while args and args[-1] == "None":
        args.pop()
    outs = [values.add(o) if o else "_" for o in node.output]
    while len(outs) > 1 and outs[-1] == "_":
        outs.pop()
    inline = _INLINE.get(node.op_type) if not fn.domain else None
    if node.op_type == "MatMul" and len(node.input) > 1 and node.input[1] in constants and \
            constants[node.input[1]].onnx_type == "float16":
        inline = None   # a half model's weight: ops.MatMul reads it float16 (ops/linalg.py)
    exponent = _small_constant_exponent(node, constants) if node.op_type == "Pow" and not fn.domain else None
    if exponent is not None and not attributes:
        expr = "ops.power_by_constant(%s, %d)" % (args[0], exponent)
    elif inline is not None and not attributes and len(args) == inline.count("{") and "None" not in args \
            and not any(a.startswith("[") or a[:1].isdigit() or a[:1] == "-" for a in args):
        expr = inline.format(*args)
    else:
        # attributes equal to the op's default say nothing: left out, like ONNX exporters do
        keywords = ["%s=%s" % (k, literal(v)) for k, v in attributes.items()
                    if not (k in fn.defaults and type(v) is type(fn.defaults[k]) and v == fn.defaults[k])]
        if "opset" in params and "opset" not in attributes:
            keywords.append("opset=%d" % opset)
        if "backend" in params:
            keywords.append("backend=ops.host_backend()" if host_node else "backend=backend")
        if "input_types" in params:
            keywords.append("input_types=%s" % literal([constants[i].onnx_type if i in constants else
                                                        (types or {}).get(i) for i in node.input]))
        if fn.multi and len(outs) > 1:
            keywords.append("outputs=%d" % len(outs))
        expr = "%s(%s)" % (fn.call, ", ".join(args + keywords))
    if fn.multi and len(outs) > 1:
        target = ", ".join(outs)
    else:
        target = outs[0] if outs else "_"
    comment = "  # %s" % ascii(node.name) if node.name else ""
    return "%s = %s%s" % (target, expr, comment)


def _small_constant_exponent(node, constants):
    """2 or 3 when Pow's exponent is a float scalar constant of that value (a scalar: the result
    has x's shape), else None."""
    const = constants.get(node.input[1]) if len(node.input) > 1 else None
    if const is None or const.dtype != "float32" or const.shape != ():
        return None
    value = float(const.values[0])
    return int(value) if value in (2.0, 3.0) else None


def _module_source(model, class_name, source_name, opset, inputs, input_vars, outputs, lines, stored,
                   device_reads, declared):
    header = [
        "# Generated by cinders from %s: do not expect it to match the file byte for byte," % ascii(source_name),
        "# but feel free to edit, fine-tune (cn.Autodiff) or export it (cinders export-micro).",
        "# Producer: %s %s, opset %d." % (ascii(model.producer_name), ascii(model.producer_version), opset),
        "import cinders as cn",
        "from cinders.onnx import ops",
        "",
        "",
        "class %s(cn.nn.Module):" % class_name,
    ]
    buffers = [c.attr for c in stored if c.dtype != "float32"]
    body = [
        "input_names = %s" % literal([vi.name for vi in inputs]),
        "output_names = %s" % literal([o.name for o in model.graph.output]),
        "input_shapes = %s" % literal(declared),
        "input_types = %s" % literal([element_type(vi.type)[0] or "float32" for vi in inputs]),
        "opset = %d" % opset,
    ] + _sample_shape(declared) + [
        "buffers = %s" % literal(buffers),
        "# nodes whose result depends on data: they read device values (a GPU waits for them)",
        "device_reads = %s" % literal(device_reads),
        "",
        "def __init__(self, backend=None):",
        "    super().__init__()",
    ]
    for c in stored:
        dtype = "" if c.dtype == "float32" else ", dtype=cn.%s" % c.dtype
        body.append("    self.%s = cn.zeros(%s, backend=backend%s)" % (c.attr, literal(list(c.shape)), dtype))
    body += ["", "def forward(self, %s):" % ", ".join(input_vars)]
    if any("backend=backend" in line or "ops.to_device(" in line for line in lines + outputs):
        # ops that make tensors from nothing, and shape values moving onto the device
        body.append("    backend = ops.backend_of(%s)" % ", ".join(input_vars + ["self"]))
    body += ["    " + line for line in _free_dead_values(lines, outputs)]
    body.append("    return " + (outputs[0] if len(outputs) == 1 else "(%s,)" % ", ".join(outputs)))
    body = ["    " + line if line else "" for line in body]
    return "\n".join(header + body) + "\n"


def _free_dead_values(lines, outputs):
    """The forward's lines with a `del` after the last statement that reads each value a
    top-level assignment made. Without them every intermediate lives until the forward returns:
    on cn.NumPy() each op then writes into freshly mapped memory (BERT at batch 16: 60,000 page
    faults, a third of its time), and a GPU pool cannot reuse a buffer. Values assigned only
    inside a loop or a branch are left alone (they may not exist)."""
    statements = []   # top-level statements: an unindented line and the indented lines after it
    for line in lines:
        if statements and line.startswith((" ", "else:", "elif ")):
            statements[-1].append(line)
        else:
            statements.append([line])
    assigned, last_read = set(), {}
    for index, statement in enumerate(statements):
        tree = ast.parse("\n".join(statement))
        for node in tree.body:
            if isinstance(node, ast.Assign):
                assigned.update(n.id for target in node.targets for n in ast.walk(target) if isinstance(n, ast.Name))
        for n in ast.walk(tree):
            if isinstance(n, ast.Name):
                last_read[n.id] = index
    for n in ast.walk(ast.parse("(%s,)" % ", ".join(outputs))):
        if isinstance(n, ast.Name):
            last_read[n.id] = len(statements)   # returned: kept
    dead = collections.defaultdict(list)
    for name, index in last_read.items():
        if name in assigned and index < len(statements) - 1:   # (the forward returns after the last)
            dead[index].append(name)
    out = []
    for index, statement in enumerate(statements):
        out += statement
        if dead[index]:
            out.append("del " + ", ".join(sorted(dead[index])))
    return out


def module_name(text):
    """A Python module name made from a file name."""
    name = re.sub(r"[^0-9A-Za-z_]", "_", text).strip("_") or "model"
    return "m_" + name if name[0].isdigit() or keyword.iskeyword(name) else name


# -- layer style: graphs made only of layer-shaped nodes become a module of cinders.nn layers ------
#
# A chain of Conv / Gemm / pooling / activations (an MNIST CNN, an MLP) is written with the
# layers the board runtime also has, so `cinders export-micro` can take it to MicroPython:
#     self.conv1 = nn.Conv2d(1, 8, (3, 3), stride=(1, 1), padding=(1, 1))  # '/conv1/Conv'
#     conv1 = self.conv1(image)  # '/conv1/Conv'

def _attrs(node):
    return {a.name: _attribute_value(a, node.name) for a in node.attribute}


def _pads_symmetric(attrs, nd=2):
    if attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        return None
    pads = list(attrs.get("pads") or [0] * 2 * nd)
    return tuple(pads[:nd]) if pads[:nd] == pads[nd:] else None


def _layer_for(node, constants):
    """(constructor source, {state suffix: Constant}) for one node, or None when it is not a
    plain layer. Identity-like nodes give ("", {})."""
    if any(a.type in (5, 10) for a in node.attribute):   # subgraphs (If, Loop, Scan) are no layer
        return None
    a = _attrs(node)
    op_type = node.op_type
    const = [constants.get(n) for n in node.input]
    if op_type in ("Identity", "Dropout") and len([o for o in node.output if o]) == 1:
        return "", {}
    if op_type in ("Relu", "Sigmoid", "Tanh") and not a:
        return "nn.%s()" % {"Relu": "ReLU"}.get(op_type, op_type), {}
    if op_type == "Softmax" and a.get("axis", -1) in (-1, 1):
        return "nn.Softmax(dim=%d)" % a.get("axis", -1), {}
    if op_type == "Flatten" and a.get("axis", 1) == 1:
        return "nn.Flatten()", {}
    if op_type == "Reshape" and const[1] is not None and len(const[1].values) == 2 and not a.get("allowzero"):
        first, second = (int(v) for v in const[1].values)
        if first == 0 and second == -1:
            return "nn.Flatten()", {}   # (N, C, H, W) -> (N, C*H*W): how a CNN feeds its classifier
        return None
    if op_type == "Conv" and len(node.input) >= 2 and const[1] is not None and len(const[1].shape) == 4:
        pads = _pads_symmetric(a)
        if pads is None or a.get("group", 1) != 1 or (len(node.input) > 2 and const[2] is None):
            return None
        w = const[1]
        o, c, kh, kw = w.shape
        bias = len(node.input) > 2 and bool(node.input[2])
        state = {"weight": w}
        if bias:
            state["bias"] = const[2]
        return ("nn.Conv2d(%d, %d, (%d, %d), stride=%s, padding=%s, dilation=%s%s, backend=backend)"
                % (c, o, kh, kw, tuple(a.get("strides", [1, 1])), pads, tuple(a.get("dilations", [1, 1])),
                   "" if bias else ", bias=False")), state
    if op_type in ("MaxPool", "AveragePool") and len(a.get("kernel_shape", [])) == 2 and not a.get("ceil_mode"):
        pads = _pads_symmetric(a)
        if pads is None or any(d != 1 for d in a.get("dilations", [1, 1])):
            return None
        if op_type == "AveragePool" and any(pads) and not a.get("count_include_pad"):
            return None
        kernel = tuple(a["kernel_shape"])
        if any(2 * p > k for p, k in zip(pads, kernel)):   # the layers' (and torch's) limit
            return None
        return "nn.%s(%s, stride=%s, padding=%s)" % ("MaxPool2d" if op_type == "MaxPool" else "AvgPool2d", kernel,
                                                     tuple(a.get("strides", [1, 1])), pads), {}
    if op_type == "Gemm" and const[1] is not None and len(const[1].shape) == 2 and a.get("alpha", 1.0) == 1.0 \
            and a.get("beta", 1.0) == 1.0 and not a.get("transA"):
        w = const[1]
        if not a.get("transB"):   # stored (in, out): the layer keeps (out, in)
            rows, cols = w.shape
            flat = w.python_values()
            w = Constant(w.onnx_type, (cols, rows), [flat[r * cols + c] for c in range(cols) for r in range(rows)])
        out_features, in_features = w.shape
        state = {"weight": w}
        if len(node.input) > 2 and node.input[2]:
            if const[2] is None or const[2].shape != (out_features,):
                return None
            state["bias"] = const[2]
        return ("nn.Linear(%d, %d%s, backend=backend)"
                % (in_features, out_features, "" if "bias" in state else ", bias=False")), state
    return None


def _layer_source(model, class_name, source_name, opset, inputs, input_vars, constants, values, declared):
    graph = model.graph
    type_name, dims = element_type(inputs[0].type) if len(inputs) == 1 else (None, None)
    if len(inputs) != 1 or len(graph.output) != 1 or type_name not in ("float32", None) or len(dims or ()) < 2:
        return None   # the layers take a float batch (N, ...)
    plan, names = [], _Names(_RESERVED | _MODULE_NAMES)
    for node in graph.node:
        if node.op_type == "Constant":
            continue
        layer = _layer_for(node, constants)
        if layer is None or not node.input or node.input[0] in constants:
            return None
        plan.append((node, layer))
    if not any(ctor for _, (ctor, _) in plan):
        return None
    init_lines, forward, state = [], [], {}
    for node, (ctor, params) in plan:
        comment = "  # %s" % ascii(node.name) if node.name else ""
        source = values.of[node.input[0]]
        target = values.add(node.output[0])
        if not ctor:
            forward.append("%s = %s%s" % (target, source, comment))
            continue
        attr = names.fresh(node.name or node.output[0], "layer")
        init_lines.append("    self.%s = %s%s" % (attr, ctor, comment))
        forward.append("%s = self.%s(%s)%s" % (target, attr, source, comment))
        for suffix, const in params.items():
            state["%s.%s" % (attr, suffix)] = const
    out = graph.output[0].name
    if out not in values.of:
        return None
    header = [
        "# Generated by cinders from %s: a chain of cinders.nn layers (runs on MicroPython too:" % ascii(source_name),
        "# cinders export-micro). Producer: %s %s, opset %d." % (ascii(model.producer_name),
                                                                 ascii(model.producer_version), opset),
        "from cinders import nn",
        "",
        "",
        "class %s(nn.Module):" % class_name,
    ]
    body = [
        "input_names = %s" % literal([vi.name for vi in inputs]),
        "output_names = %s" % literal([o.name for o in graph.output]),
        "input_shapes = %s" % literal(declared),
        "input_types = %s" % literal([element_type(vi.type)[0] or "float32" for vi in inputs]),
        "opset = %d" % opset,
    ] + _sample_shape(declared) + [
        "",
        "def __init__(self, backend=None):   # backend: the desktop's; the board's layers ignore it",
        "    super().__init__()",
    ] + init_lines + ["", "def forward(self, %s):" % input_vars[0]]
    body += ["    " + line for line in forward]
    body.append("    return " + values.of[out])
    body = ["    " + line if line else "" for line in body]
    return "\n".join(header + body) + "\n", state
