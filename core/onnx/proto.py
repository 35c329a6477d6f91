"""A pure-Python reader of the ONNX protobuf messages (no `onnx`, no `protobuf`: runs in Pyodide).

The protobuf wire format is a sequence of (field number, wire type, value) records; a message
is read by walking its records and keeping the fields the schema below names (unknown fields are
skipped, as protobuf requires). Every length is checked against the bytes actually present
before anything is sliced or allocated, nesting is bounded, and every fault raises OnnxError
with the byte offset: a file is data and is never trusted.

Messages become `Message` objects whose attributes are the ONNX field names (repeated fields
are lists, absent scalars take protobuf's defaults), e.g. model.graph.node[0].op_type.
"""

import struct
import sys
from array import array

from .. import limits
from ..errors import CindersError
from ..record.halves import bf16_to_float32, f16_to_float32


class OnnxError(CindersError, ValueError):
    """An ONNX file that cannot be read (truncated, corrupt, absurd) or a graph that cannot be
    imported (unsupported ops, bad attributes). The message says what and where."""


MAX_DEPTH = 64            # nested messages (graphs inside attributes inside graphs ...)
MAX_DIMS = 64             # a tensor's rank
MAX_ELEMENTS = 1 << 40    # a tensor's element count; its bytes must be present anyway

_VARINT, _FIXED64, _LENGTH, _GROUP_START, _GROUP_END, _FIXED32 = 0, 1, 2, 3, 4, 5


class Message:
    """A decoded message: the schema's field names as attributes. Each kind is a subclass whose
    class attributes are the defaults (() for repeated fields), so an instance holds only the
    fields its bytes set: a file of a million empty nodes costs a million small objects, not a
    million objects with a dict and three empty lists each."""

    kind = "Message"

    def __repr__(self):
        shown = {k: v for k, v in vars(self).items() if v not in ((), [], "", b"", 0, None)}
        return "%s(%s)" % (self.kind, ", ".join("%s=%r" % kv for kv in list(shown.items())[:6]))


# Field kinds: "int" (varint, int64 two's complement), "float" (fixed32), "str", "bytes",
# "ints"/"floats"/"doubles"/"uint64s" (repeated scalars, packed or not), or a message name.
# A trailing "*" marks a repeated field.
SCHEMA = {
    "ModelProto": {1: ("ir_version", "int"), 8: ("opset_import", "OperatorSetIdProto*"),
                   2: ("producer_name", "str"), 3: ("producer_version", "str"), 4: ("domain", "str"),
                   5: ("model_version", "int"), 6: ("doc_string", "str"), 7: ("graph", "GraphProto"),
                   14: ("metadata_props", "StringStringEntryProto*"),
                   25: ("functions", "FunctionProto*")},
    "OperatorSetIdProto": {1: ("domain", "str"), 2: ("version", "int")},
    "StringStringEntryProto": {1: ("key", "str"), 2: ("value", "str")},
    "GraphProto": {1: ("node", "NodeProto*"), 2: ("name", "str"), 5: ("initializer", "TensorProto*"),
                   15: ("sparse_initializer", "SparseTensorProto*"), 10: ("doc_string", "str"),
                   11: ("input", "ValueInfoProto*"), 12: ("output", "ValueInfoProto*"),
                   13: ("value_info", "ValueInfoProto*")},
    "NodeProto": {1: ("input", "str*"), 2: ("output", "str*"), 3: ("name", "str"), 4: ("op_type", "str"),
                  7: ("domain", "str"), 5: ("attribute", "AttributeProto*"), 6: ("doc_string", "str")},
    "AttributeProto": {1: ("name", "str"), 21: ("ref_attr_name", "str"), 13: ("doc_string", "str"),
                       20: ("type", "int"), 2: ("f", "float"), 3: ("i", "int"), 4: ("s", "bytes"),
                       5: ("t", "TensorProto"), 6: ("g", "GraphProto"), 22: ("sparse_tensor", "SparseTensorProto"),
                       14: ("tp", "TypeProto"), 7: ("floats", "floats"), 8: ("ints", "ints"),
                       9: ("strings", "bytes*"), 10: ("tensors", "TensorProto*"), 11: ("graphs", "GraphProto*"),
                       23: ("sparse_tensors", "SparseTensorProto*"), 15: ("type_protos", "TypeProto*")},
    "TensorProto": {1: ("dims", "ints"), 2: ("data_type", "int"), 4: ("float_data", "floats"),
                    5: ("int32_data", "ints"), 6: ("string_data", "bytes*"), 7: ("int64_data", "ints"),
                    8: ("name", "str"), 12: ("doc_string", "str"), 9: ("raw_data", "bytes"),
                    13: ("external_data", "StringStringEntryProto*"), 14: ("data_location", "int"),
                    10: ("double_data", "doubles"), 11: ("uint64_data", "uint64s")},
    "SparseTensorProto": {1: ("values", "TensorProto"), 2: ("indices", "TensorProto"), 3: ("dims", "ints")},
    "ValueInfoProto": {1: ("name", "str"), 2: ("type", "TypeProto"), 3: ("doc_string", "str")},
    "TypeProto": {1: ("tensor_type", "TypeProtoTensor"), 4: ("sequence_type", "TypeProtoSequence"),
                  9: ("optional_type", "TypeProtoSequence"), 8: ("sparse_tensor_type", "TypeProtoTensor"),
                  6: ("denotation", "str")},
    "TypeProtoTensor": {1: ("elem_type", "int"), 2: ("shape", "TensorShapeProto")},
    "TypeProtoSequence": {1: ("elem_type", "TypeProto")},
    "TensorShapeProto": {1: ("dim", "Dimension*")},
    "Dimension": {1: ("dim_value", "int"), 2: ("dim_param", "str"), 3: ("denotation", "str")},
    "FunctionProto": {1: ("name", "str"), 10: ("domain", "str")},
}

# Fields ONNX requires, checked as each message ends: a node of zero bytes (a million of them
# fit in 2 MB) is refused at the first, before it costs a Python object per two bytes of file.
_REQUIRED = {"NodeProto": "op_type", "AttributeProto": "name"}
_DEFAULTS = {"int": 0, "float": 0.0, "str": "", "bytes": b""}
_PACKED = {"ints": (_VARINT, None), "uint64s": (_VARINT, None), "floats": (_FIXED32, "f"), "doubles": (_FIXED64, "d")}
_ARRAY_CODES = {"ints": "q", "uint64s": "Q", "floats": "f", "doubles": "d"}  # repeated numbers: 8 bytes or less each


def _message_class(kind, schema):
    defaults = {name: () if ftype.endswith("*") or ftype in _PACKED else _DEFAULTS.get(ftype)
                for name, ftype in schema.values()}
    return type(kind, (Message,), dict(defaults, kind=kind))


MESSAGE_CLASSES = {kind: _message_class(kind, schema) for kind, schema in SCHEMA.items()}
# kind -> {field number: (name, field kind, its base without "*", repeated?)}
_FIELDS = {kind: {number: (name, ftype, ftype.rstrip("*"), ftype.endswith("*"))
                  for number, (name, ftype) in schema.items()} for kind, schema in SCHEMA.items()}


class _Reader:
    def __init__(self, data):
        self.data = data
        self.end = len(data)

    def fail(self, pos, what):
        raise OnnxError("ONNX file corrupt at byte %d: %s" % (pos, what))

    def refuse(self, pos, what):
        raise OnnxError("ONNX graph refused at byte %d: %s" % (pos, what))

    def varint(self, pos, end):
        result = shift = 0
        data = self.data
        while True:
            if pos >= end:
                self.fail(pos, "truncated varint")
            b = data[pos]
            pos += 1
            result |= (b & 0x7F) << shift
            if b < 0x80:
                return result, pos
            shift += 7
            if shift >= 70:
                self.fail(pos, "varint longer than 10 bytes")

    def record(self, pos, end):
        """(field, wire type, value, value position, next position) of the record at pos; one-byte
        varints (keys, short lengths) are read inline: they are most of a graph's bytes."""
        data, start = self.data, pos
        key = data[pos]
        if key < 0x80:
            pos += 1
        else:
            key, pos = self.varint(pos, end)
        field, wire = key >> 3, key & 7
        if field == 0:
            self.fail(start, "field number 0")
        if wire == _LENGTH:
            if pos < end and data[pos] < 0x80:
                length, pos = data[pos], pos + 1
            else:
                length, pos = self.varint(pos, end)
            if length > end - pos:
                self.fail(pos, "field %d claims %d bytes, only %d are left" % (field, length, end - pos))
            return field, wire, (pos, pos + length), start, pos + length
        if wire == _VARINT:
            value, pos = self.varint(pos, end)
            return field, wire, value, start, pos
        size = 8 if wire == _FIXED64 else 4 if wire == _FIXED32 else None
        if size is None:
            self.fail(start, "unsupported wire type %d (field %d)" % (wire, field))
        if pos + size > end:
            self.fail(pos, "truncated %d-bit field %d" % (8 * size, field))
        return field, wire, (pos, pos + size), start, pos + size

    def message(self, kind, pos, end, depth):
        if depth > MAX_DEPTH:
            self.fail(pos, "messages nested deeper than %d" % MAX_DEPTH)
        fields = _FIELDS[kind]
        message = MESSAGE_CLASSES[kind]()
        values = message.__dict__
        data, first = self.data, pos
        while pos < end:
            field, wire, value, at, pos = self.record(pos, end)
            entry = fields.get(field)
            if entry is None:
                continue  # unknown field: skipped, as protobuf readers do
            name, ftype, base, repeated = entry
            if ftype in _PACKED:
                if name not in values:
                    values[name] = array(_ARRAY_CODES[ftype])
                self.repeated_scalar(values[name], ftype, wire, value, at, name)
                continue
            if base == "int":
                self.expect(wire, _VARINT, at, name)
                v = _signed64(value)
            elif base == "float":
                self.expect(wire, _FIXED32, at, name)
                v = struct.unpack_from("<f", data, value[0])[0]
            elif base == "str" or base == "bytes":
                self.expect(wire, _LENGTH, at, name)
                v = bytes(data[value[0]:value[1]])
                if base == "str":
                    try:
                        v = v.decode("utf-8")
                    except UnicodeDecodeError:
                        self.fail(at, "field %s is not UTF-8" % name)
            else:
                self.expect(wire, _LENGTH, at, name)
                v = self.message(base, value[0], value[1], depth + 1)
            if repeated:
                if name not in values:
                    values[name] = []
                values[name].append(v)
            else:
                values[name] = v
        required = _REQUIRED.get(kind)
        if required is not None and not values.get(required):
            self.fail(first, "%s without %s" % (kind, required))
        return message

    def count_graph(self, pos, end, depth, counts):
        """Count the nodes and attributes of the GraphProto at pos..end and of its subgraphs from
        the bytes alone, refusing past cn.limits' caps before any node object is built: a node
        can be 5 bytes of file and costs a few KB once imported."""
        if depth > MAX_DEPTH:
            self.fail(pos, "messages nested deeper than %d" % MAX_DEPTH)
        record = self.record
        while pos < end:
            field, wire, value, at, pos = record(pos, end)
            if field != 1 or wire != _LENGTH:   # GraphProto.node
                continue
            counts[0] += 1
            if counts[0] > self.max_nodes:
                self.refuse(at, "more than %d nodes (cn.limits.max_graph_nodes(); cn.limits.set_max_graph_nodes(n) "
                              "or CINDERS_MAX_GRAPH_NODES raises it)" % self.max_nodes)
            node_pos, node_end = value
            while node_pos < node_end:
                field, wire, value, at, node_pos = record(node_pos, node_end)
                if field != 5 or wire != _LENGTH:   # NodeProto.attribute
                    continue
                counts[1] += 1
                if counts[1] > self.max_attributes:
                    self.refuse(at, "more than %d attributes (%d per node of cn.limits.max_graph_nodes(); "
                                  "cn.limits.set_max_graph_nodes(n) raises it)"
                              % (self.max_attributes, limits.ATTRIBUTES_PER_NODE))
                attr_pos, attr_end = value
                while attr_pos < attr_end:
                    field, wire, value, at, attr_pos = record(attr_pos, attr_end)
                    if field in (6, 11) and wire == _LENGTH:   # AttributeProto.g, .graphs
                        self.count_graph(value[0], value[1], depth + 3, counts)

    def check_graph_size(self, kind):
        """count_graph over the graph(s) of a ModelProto or GraphProto message."""
        self.max_nodes = limits.max_graph_nodes()
        self.max_attributes = self.max_nodes * limits.ATTRIBUTES_PER_NODE
        counts = [0, 0]
        if kind == "GraphProto":
            self.count_graph(0, self.end, 0, counts)
        elif kind == "ModelProto":
            pos = 0
            while pos < self.end:
                field, wire, value, at, pos = self.record(pos, self.end)
                if field == 7 and wire == _LENGTH:   # ModelProto.graph
                    self.count_graph(value[0], value[1], 1, counts)

    def expect(self, wire, wanted, at, name):
        if wire != wanted:
            self.fail(at, "field %s has wire type %d, expected %d" % (name, wire, wanted))

    def repeated_scalar(self, out, ftype, wire, value, at, name):
        element_wire, code = _PACKED[ftype]
        if wire == _LENGTH:  # packed: one run of values
            start, stop = value
            if code is not None:
                size = struct.calcsize(code)
                if (stop - start) % size:
                    self.fail(at, "packed field %s is %d bytes, not a multiple of %d" % (name, stop - start, size))
                out.extend(_unpack(code, self.data, start, stop))
            else:
                pos = start
                while pos < stop:
                    v, pos = self.varint(pos, stop)
                    out.append(v if ftype == "uint64s" else _signed64(v))
        elif wire == element_wire:
            if code is not None:
                out.extend(_unpack(code, self.data, value[0], value[1]))
            else:
                out.append(value if ftype == "uint64s" else _signed64(value))
        else:
            self.fail(at, "field %s has wire type %d" % (name, wire))


def _signed64(v):
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >= 1 << 63 else v


def _unpack(code, data, start, stop):
    if code == "e":  # float16: the array module has no half type; widen to float32
        return f16_to_float32(memoryview(data)[start:stop])
    values = array(code)
    values.frombytes(memoryview(data)[start:stop])   # no copy of the bytes on the way
    if sys.byteorder == "big":
        values.byteswap()
    return values


def parse(data, kind="ModelProto"):
    """The message `kind` decoded from bytes (or a bytearray/memoryview)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError("parse: expected bytes, got %s" % type(data).__name__)
    data = memoryview(data).cast("B") if isinstance(data, memoryview) else data
    reader = _Reader(data)
    reader.check_graph_size(kind)
    return reader.message(kind, 0, len(data), 0)


def read_model(data):
    """A ModelProto with the checks every importer needs: it has a graph, and every node's
    attributes hold what their type says (check_graph)."""
    model = parse(data, "ModelProto")
    if model.graph is None:
        raise OnnxError("not an ONNX model: no graph (is this an ONNX file?)")
    check_graph(model.graph, "graph")
    return model


# AttributeProto.type -> the field holding its value (messages are None when absent)
ATTRIBUTE_FIELDS = {1: "f", 2: "i", 3: "s", 4: "t", 5: "g", 6: "floats", 7: "ints", 8: "strings", 9: "tensors",
                    10: "graphs", 11: "sparse_tensor", 12: "sparse_tensors", 13: "tp", 14: "type_protos"}
_TYPE_NAMES = {1: "FLOAT", 2: "INT", 3: "STRING", 4: "TENSOR", 5: "GRAPH", 6: "FLOATS", 7: "INTS", 8: "STRINGS",
               9: "TENSORS", 10: "GRAPHS", 11: "SPARSE_TENSOR", 12: "SPARSE_TENSORS", 13: "TYPE_PROTO",
               14: "TYPE_PROTOS"}
# Attributes of the default domain whose type is the same in every operator that has them: a
# file that gives `strides` as a float or `then_branch` as an int is refused here, not deep in
# the importer with a TypeError.
ATTRIBUTE_TYPES = dict([(n, 7) for n in ("strides", "pads", "kernel_shape", "dilations", "perm", "axes",
                                          "output_padding", "output_shape")]
                       + [(n, 2) for n in ("axis", "group", "keepdims", "transA", "transB", "to", "ceil_mode",
                                           "count_include_pad", "storage_order", "select_last_index")]
                       + [(n, 1) for n in ("alpha", "beta", "epsilon", "momentum")]
                       + [(n, 3) for n in ("mode", "auto_pad")]
                       + [(n, 5) for n in ("then_branch", "else_branch", "body")])
MIN_INPUTS = {"If": 1, "Loop": 2, "Scan": 1}  # inputs the control-flow ops read by position


def check_graph(graph, where):
    """OnnxError naming the node and attribute where an attribute's value is missing or of
    another type than its name requires, or a control-flow node lacks its inputs; subgraphs too."""
    for i, node in enumerate(graph.node):
        at = "%s node %d (%s %s)" % (where, i, ascii(node.op_type), ascii(node.name))
        if len(node.input) < MIN_INPUTS.get(node.op_type, 0) and node.domain in ("", "ai.onnx"):
            raise OnnxError("%s: %d inputs, %s needs at least %d"
                            % (at, len(node.input), node.op_type, MIN_INPUTS[node.op_type]))
        names = [attr.name for attr in node.attribute]
        if len(set(names)) != len(names):
            raise OnnxError("%s: attribute %s given twice" % (at, ascii(next(n for n in names if names.count(n) > 1))))
        for attr in node.attribute:
            kind = attr.type
            what = "%s attribute %s" % (at, ascii(attr.name))
            if kind not in ATTRIBUTE_FIELDS and kind != 0:
                raise OnnxError("%s: unknown attribute type %d" % (what, kind))
            if kind in (4, 5, 11, 13) and getattr(attr, ATTRIBUTE_FIELDS[kind]) is None:
                raise OnnxError("%s: of type %s but holds none" % (what, _TYPE_NAMES[kind]))
            expected = ATTRIBUTE_TYPES.get(attr.name) if node.domain in ("", "ai.onnx") else None
            if expected is not None and kind != expected and not (kind == 0 and _untyped_holds(attr, expected)):
                raise OnnxError("%s: must be %s, the file gives %s"
                                % (what, _TYPE_NAMES[expected], _TYPE_NAMES.get(kind, "no type")))
            for sub in ([attr.g] if kind == 5 else attr.graphs if kind == 10 else ()):
                check_graph(sub, "%s subgraph %s" % (at, ascii(attr.name)))


def _untyped_holds(attr, expected):
    """Whether an attribute without a type (old exporters) holds a value of the expected type,
    the way the importer infers it: lists first, then a string, a tensor, then a number."""
    if expected == 7:
        return bool(attr.ints)
    others = attr.ints or attr.floats or attr.s or attr.t is not None
    if expected == 2:  # an untyped 0 reads as the float 0.0
        return bool(attr.i) and not others
    if expected == 1:
        return not others
    if expected == 3:
        return bool(attr.s) and not (attr.ints or attr.floats)
    return False


# ---------------------------------------------------------------- tensors

# ONNX TensorProto.DataType -> (name, struct code of raw_data elements or None, typed field)
DATA_TYPES = {
    1: ("float32", "f", "float_data"), 2: ("uint8", "B", "int32_data"), 3: ("int8", "b", "int32_data"),
    4: ("uint16", "H", "int32_data"), 5: ("int16", "h", "int32_data"), 6: ("int32", "i", "int32_data"),
    7: ("int64", "q", "int64_data"), 8: ("string", None, "string_data"), 9: ("bool", "B", "int32_data"),
    10: ("float16", "e", "int32_data"), 11: ("float64", "d", "double_data"), 12: ("uint32", "I", "uint64_data"),
    13: ("uint64", "Q", "uint64_data"), 16: ("bfloat16", "H", "int32_data"),
    21: ("uint4", "B", "int32_data"), 22: ("int4", "B", "int32_data"),
}
FOUR_BIT = (21, 22)   # two values a byte, the first in the low nibble (raw_data and int32_data alike)


def dims_of(tensor, where):
    dims = list(tensor.dims)
    if len(dims) > MAX_DIMS:
        raise OnnxError("%s: %d dims (at most %d)" % (where, len(dims), MAX_DIMS))
    n = 1
    for d in dims:
        if d < 0:
            raise OnnxError("%s: negative dim %d in %s" % (where, d, dims))
        n *= d
        if n > MAX_ELEMENTS:
            raise OnnxError("%s: dims %s give more than %d elements" % (where, dims, MAX_ELEMENTS))
    return tuple(dims), n


def tensor_values(tensor, external=None):
    """(type name, shape, flat values) of a TensorProto. Values are an `array` (numbers) or a list
    (strings). `external(location, offset, length)` returns bytes of external data files.

    The element count the dims claim is checked against the bytes present before decoding."""
    where = "tensor %r" % (tensor.name,)
    if tensor.data_type not in DATA_TYPES:
        raise OnnxError("%s: data type %d is not supported" % (where, tensor.data_type))
    type_name, code, typed_field = DATA_TYPES[tensor.data_type]
    shape, n = dims_of(tensor, where)
    if tensor.data_location == 1:
        if external is None:
            raise OnnxError("%s: data is in an external file, but the model was given as bytes "
                            "(load it from a path so the file next to it can be read)" % where)
        info = {e.key: e.value for e in tensor.external_data}
        if "location" not in info:
            raise OnnxError("%s: external data without a location" % where)
        try:
            offset = int(info.get("offset", 0))
            length = int(info["length"]) if "length" in info else None
        except ValueError:
            raise OnnxError("%s: external data offset/length are not integers" % where) from None
        if offset < 0 or (length is not None and length < 0):
            raise OnnxError("%s: negative external data offset/length" % where)
        need = (n + 1) // 2 if tensor.data_type in FOUR_BIT else n * struct.calcsize(code or "B")
        if length is not None and length != need:  # checked before a byte is read
            raise OnnxError("%s: %d elements need %d bytes, its external data length says %d"
                            % (where, n, need, length))
        raw = external(info["location"], offset, need)
        return type_name, shape, _from_raw(raw, code, n, where, tensor.data_type)
    if tensor.raw_data:
        return type_name, shape, _from_raw(tensor.raw_data, code, n, where, tensor.data_type)
    typed = getattr(tensor, typed_field)
    if tensor.data_type in FOUR_BIT:
        return type_name, shape, _from_raw(bytes(v & 0xFF for v in typed), code, n, where, tensor.data_type)
    if len(typed) != n:
        raise OnnxError("%s: dims %s need %d values, %s has %d" % (where, list(shape), n, typed_field, len(typed)))
    if code is None:
        return type_name, shape, list(typed)
    if tensor.data_type in (10, 16):  # float16/bfloat16 bit patterns held in int32_data
        bits = _little(array("H", (v & 0xFFFF for v in typed))).tobytes()
        return type_name, shape, f16_to_float32(bits) if tensor.data_type == 10 else bf16_to_float32(bits)
    if tensor.data_type == 9:
        return type_name, shape, array("B", (1 if v else 0 for v in typed))
    return type_name, shape, typed


def _from_raw(raw, code, n, where, data_type):
    if code is None:
        raise OnnxError("%s: string tensors cannot be stored as raw data" % where)
    if data_type in FOUR_BIT:
        return _nibbles(raw, n, where, data_type == 22)
    size = struct.calcsize(code)
    if len(raw) != n * size:
        raise OnnxError("%s: %d elements need %d bytes, the file has %d" % (where, n, n * size, len(raw)))
    if data_type == 16:
        return bf16_to_float32(raw)
    return _unpack(code, raw, 0, len(raw))


def _little(values):
    if sys.byteorder == "big":
        values.byteswap()
    return values


def _nibble_table(shift, signed):
    """bytes.translate table: byte -> its nibble at `shift`, as a (two's complement) byte."""
    return bytes(((b >> shift) & 15) | (0xF0 if signed and (b >> shift) & 8 else 0) for b in range(256))


_NIBBLES = {signed: (_nibble_table(0, signed), _nibble_table(4, signed)) for signed in (False, True)}


def _nibbles(packed, n, where, signed):
    if len(packed) != (n + 1) // 2:
        raise OnnxError("%s: %d 4-bit elements need %d bytes, the file has %d" % (where, n, (n + 1) // 2, len(packed)))
    low, high = _NIBBLES[signed]
    out = bytearray(2 * len(packed))
    out[0::2] = bytes(packed).translate(low)
    out[1::2] = bytes(packed).translate(high)
    return array("b" if signed else "B", bytes(out[:n]))


def element_type(type_proto):
    """(type name or None, dims) of a ValueInfo's tensor type; dims hold ints or symbolic names
    (None where unknown)."""
    if type_proto is None or type_proto.tensor_type is None:
        return None, None
    tt = type_proto.tensor_type
    name = DATA_TYPES.get(tt.elem_type, ("unsupported %d" % tt.elem_type,))[0]
    if tt.shape is None:
        return name, None
    dims = []
    for d in tt.shape.dim:
        dims.append(d.dim_value if d.dim_param == "" and d.dim_value > 0 else (d.dim_param or None))
    return name, tuple(dims)
