"""The wire format of cn.Remote and `cinders serve-backend`: data only, never code or pickles.

Every WebSocket message is one binary frame:
    u32 little-endian  n = length of the header
    n bytes            the header: UTF-8 JSON (an object)
    the rest           raw little-endian buffers, back to back, as the header's "nbytes" say

Client -> server
    {"hello": 1, "token": T}                      first frame; anything else closes the socket
    {"ops": [op, ...]}                            a batch of primitive ops, run in order
        op = {"op": PRIMITIVE, "out": ID, "in": [ID, ...], "args": [...], "nbytes": N}
        PRIMITIVE is a name of core/backend.py's PRIMITIVES (to_flat excepted), "read",
        "free" ({"op": "free", "in": [ID, ...]}: handles the client dropped), or for cn.capture
        "program" ({"program": P, "ops": [op with references for ids], "outputs": [ref]}, see
        remote_server.Session._define) and "replay" ({"program": P, "in": [ID], "outs": [ID]});
        "args" are that primitive's non-handle arguments as JSON (dtypes by name, see ARGS);
        "nbytes" only for from_flat, whose values come as a buffer (float32 '<f4', int32 '<i4',
        bool one byte each). A read {"op": "read", "in": [ID]} asks for a reply.
        Between servers (core/remote_peers.py): {"op": "send", "in": [ID], "key": K, "peer": URL,
        "token": T} has this server deliver the tensors to the server at URL, and
        {"op": "take", "key": K, "outs": [ID], "metas": [[shape, dtype]]} makes them this
        client's there; a server delivers on a client connection of its own (hello with the
        peer's token), one {"deliver": K, "tensors": [{"shape", "dtype", "nbytes"}]} frame
        + buffers per send. Neither is answered.
Server -> client
    {"hello": 1, "limits": {"max_elements": E, "max_bytes": B}}   accepted
    {"read": ID, "shape": [...], "dtype": NAME, "nbytes": N} + buffer    one per read, in order
    {"read": ID, "error": MESSAGE, "type": NAME}  the value could not be computed (see below)
    {"fatal": MESSAGE}                            then the server closes the connection

Handles are ints the client picks, so ops never wait for a reply: the client knows every
result's shape and dtype from `result_meta` below (the same rules the server checks
arguments with). An op that fails on the server (an index out of range, a size over the
limits) makes its output an error value; ops reading it fail the same way, and reading it
raises the error on the client, as a cinders error of the type named (ERRORS) when known.
"""

import json
import struct
import sys

from .. import dtypes, ops
from ..backend import HANDLE_KINDS, SIGNATURES, broadcast_shape, unfold2d_output_size
from ..errors import ArgumentError, IndexingError, ShapeError, DTypeError, SizeLimitError, WireError

VERSION = 1
MAX_HEADER_BYTES = 1 << 20
_CODES = {dtypes.float32: "<f4", dtypes.int32: "<i4", dtypes.bool_: "u1"}
# The errors a server may name; anything else arrives as a RemoteError.
ERRORS = {cls.__name__: cls for cls in (ArgumentError, IndexingError, ShapeError, DTypeError, SizeLimitError)}


def pack(header, buffers=()):
    """One frame: the header as JSON and the raw buffers."""
    head = json.dumps(header, separators=(",", ":")).encode()
    return b"".join([struct.pack("<I", len(head)), head, *buffers])


def unpack(frame):
    """(header dict, memoryview of the buffers) of a frame; WireError when it is not one."""
    if not isinstance(frame, (bytes, bytearray)) or len(frame) < 4:
        raise WireError("a frame is binary: u32 header length, JSON header, buffers")
    (n,) = struct.unpack_from("<I", frame)
    if n > MAX_HEADER_BYTES or 4 + n > len(frame):
        raise WireError("header length %d does not fit the frame of %d bytes" % (n, len(frame)))
    try:
        header = json.loads(bytes(frame[4:4 + n]).decode())
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise WireError("the header is not UTF-8 JSON: %s" % (type(e).__name__,)) from None
    if not isinstance(header, dict):
        raise WireError("the header is a JSON object, got %s" % type(header).__name__)
    return header, memoryview(frame)[4 + n:]


def encode_values(values, dtype):
    """Raw little-endian bytes of a flat list of Python numbers."""
    import array
    code = dtype.array_code if dtype is not dtypes.bool_ else "B"
    data = array.array(code, [int(bool(v)) for v in values] if dtype is dtypes.bool_ else values)
    if sys.byteorder == "big" and data.itemsize > 1:
        data.byteswap()
    return data.tobytes()


def decode_values(raw, dtype):
    """The flat list of Python numbers in raw little-endian bytes."""
    import array
    code = dtype.array_code if dtype is not dtypes.bool_ else "B"
    data = array.array(code)
    if len(raw) % data.itemsize:
        raise WireError("%d bytes are not a whole number of %s values" % (len(raw), dtype.name))
    data.frombytes(raw)
    if sys.byteorder == "big" and data.itemsize > 1:
        data.byteswap()
    return data.tolist()


def nbytes(shape, dtype):
    n = dtype.itemsize
    for d in shape:
        n *= d
    return n


# ---------------------------------------------------------------------------- argument rules
# The kinds of core/backend.py's SIGNATURES travel as JSON values, checked by `_check`
# (dtypes by name).

_DTYPE = "dtype"
ARGS = {name: tuple(k for k in sig if k not in HANDLE_KINDS) for name, sig in SIGNATURES.items()
        if name != "to_flat"}


def to_json(primitive, args):
    """A primitive's non-handle arguments as JSON values."""
    return [a.name if kind == _DTYPE else a for kind, a in zip(ARGS[primitive], args)]


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _check(kind, v):
    ok = {
        "shape": lambda: isinstance(v, list) and all(_is_int(d) and d >= 0 for d in v) and len(v) <= 16,
        "ints": lambda: isinstance(v, list) and all(_is_int(d) for d in v) and len(v) <= 16,
        "int": lambda: _is_int(v),
        "bool": lambda: isinstance(v, bool),
        "number": lambda: isinstance(v, (int, float)),
        "op": lambda: isinstance(v, str) and v in ops.OPS,
        "distribution": lambda: v in ("uniform", "normal"),
        "pair": lambda: isinstance(v, list) and len(v) == 2 and all(_is_int(d) and d >= 0 for d in v),
        "pairs": lambda: isinstance(v, list) and len(v) <= 16 and all(
            isinstance(p, list) and len(p) == 2 and all(_is_int(d) and d >= 0 for d in p) for p in v),
        _DTYPE: lambda: v in ("float32", "int32", "bool"),
    }[kind]()
    if not ok:
        raise ArgumentError("remote: argument %r is not a valid %s" % (v, kind))


def from_json(primitive, args):
    """A primitive's arguments from JSON, checked (the server's only trust boundary besides
    result_meta): ArgumentError when one is not what the primitive takes."""
    kinds = ARGS.get(primitive)
    if kinds is None or not isinstance(args, list) or len(args) != len(kinds):
        raise ArgumentError("remote: %r takes %d arguments" % (primitive, len(kinds or ())))
    out = []
    for kind, v in zip(kinds, args):
        _check(kind, v)
        out.append(dtypes.from_name(v) if kind == _DTYPE else
                   tuple(tuple(p) for p in v) if kind == "pairs" else
                   tuple(v) if isinstance(v, list) else v)
    return out


def result_meta(primitive, args, metas):
    """(shape, dtype) of a primitive's result from its arguments and its handle inputs'
    (shape, dtype): what the client tracks without asking, and what the server checks a
    message against before running it (ShapeError/DTypeError/ArgumentError if it does not fit)."""
    def need(cond, what):
        if not cond:
            raise ShapeError("remote %s: %s (inputs %s)" % (primitive, what, [m[0] for m in metas]))

    expected = {"unary": 1, "binary": 2, "where": 3, "cast": 1, "reduce": 1, "matmul": 2,
                "reshape": 1, "permute": 1, "expand": 1, "slice": 1, "pad": 1, "gather": 2,
                "scatter_add": 3, "unfold2d": 1, "fold2d": 1}.get(primitive, 0)
    need(len(metas) == expected or (primitive == "cat" and metas), "wrong number of tensors")
    shapes = [tuple(m[0]) for m in metas]
    if primitive in ("from_flat", "full", "random"):
        return tuple(args[0]), args[-1]
    x, dtype = (shapes[0], metas[0][1]) if metas else (None, None)
    if primitive in ("unary", "binary", "reduce"):  # operands come cast as the tensor layer casts them
        need(ops.input_dtype(args[0], dtype) is dtype, "%s does not take %s operands" % (args[0], dtype.name))
    if primitive == "unary":
        need(ops.OPS[args[0]].kind == "unary", "not a unary op")
        return x, ops.result_dtype(args[0], dtype)
    if primitive in ("binary", "where"):
        need(all(len(s) == len(x) for s in shapes), "operands of different ndim")
        for dims in zip(*shapes):
            need(len(set(d for d in dims if d != 1)) <= 1, "shapes do not broadcast")
        if primitive == "binary":
            need(ops.OPS[args[0]].kind == "binary" and metas[1][1] is dtype, "not a binary op of one dtype")
            return broadcast_shape(*shapes), ops.result_dtype(args[0], dtype)
        need(dtype is dtypes.bool_ and metas[2][1] is metas[1][1], "where(bool, a, b) with a, b of one dtype")
        return broadcast_shape(*shapes), metas[1][1]
    if primitive == "cast":
        return x, args[0]
    if primitive == "reduce":
        op, axis, keepdim = args
        need(ops.OPS[op].kind == "reduce" and 0 <= axis < len(x), "not a reduction over an axis of x")
        need(x[axis] > 0 or op in ("sum", "prod", "any", "all"), "reduction over an empty axis")
        return (x[:axis] + ((1,) if keepdim else ()) + x[axis + 1:]), ops.result_dtype(op, dtype)
    if primitive == "matmul":
        a, b = shapes
        need(len(a) == len(b) >= 2 and a[-1] == b[-2] and dtype is metas[1][1] is dtypes.float32,
             "not a float32 matmul")
        batch = broadcast_shape(a[:-2], b[:-2]) if len(a) > 2 else ()
        return tuple(batch) + (a[-2], b[-1]), dtype
    if primitive == "reshape":
        need(_numel(args[0]) == _numel(x), "reshape changes the number of elements")
        return args[0], dtype
    if primitive == "permute":
        need(sorted(args[0]) == list(range(len(x))), "not a permutation of the dims")
        return tuple(x[d] for d in args[0]), dtype
    if primitive == "expand":
        need(len(args[0]) == len(x) and all(n == m or n == 1 for n, m in zip(x, args[0])), "cannot expand")
        return args[0], dtype
    if primitive == "slice":
        starts, stops, steps = args
        need(len(starts) == len(stops) == len(steps) == len(x) and all(
            0 <= a <= b <= n and s >= 1 for a, b, s, n in zip(starts, stops, steps, x)), "bad slice bounds")
        return tuple(len(range(a, b, s)) for a, b, s in zip(starts, stops, steps)), dtype
    if primitive == "cat":
        axis = args[0]
        need(0 <= axis < len(x) and all(len(s) == len(x) and s[:axis] + s[axis + 1:] == x[:axis] + x[axis + 1:]
                                        for s in shapes) and all(m[1] is dtype for m in metas), "cannot cat")
        return x[:axis] + (sum(s[axis] for s in shapes),) + x[axis + 1:], dtype
    if primitive == "pad":
        need(len(args[0]) == len(x), "one (before, after) pair per dim")
        return tuple(n + a + b for n, (a, b) in zip(x, args[0])), dtype
    if primitive in ("gather", "scatter_add"):
        axis, index = args[0], shapes[1]
        need(0 <= axis < len(x) and len(index) == len(x) and metas[1][1] is dtypes.int32, "bad index")
        need(all(i <= n for d, (i, n) in enumerate(zip(index, x)) if d != axis), "index larger than x")
        if primitive == "gather":
            return index, dtype
        need(len(shapes[2]) == len(x) and all(i <= s for i, s in zip(index, shapes[2])) and metas[2][1] is dtype,
             "src smaller than index")
        return x, dtype
    kernel, stride, padding, dilation = args[:4] if primitive == "unfold2d" else args[1:5]
    need(all(v >= 1 for v in tuple(kernel) + tuple(stride) + tuple(dilation)), "kernel, stride, dilation >= 1")
    if primitive == "unfold2d":
        need(len(x) == 4, "unfold2d takes (N, C, H, W)")
        oh, ow = unfold2d_output_size(x[2], x[3], kernel, stride, padding, dilation)
        need(oh >= 0 and ow >= 0, "kernel larger than the padded image")
        return (x[0], x[1] * kernel[0] * kernel[1], oh * ow), dtype
    size = args[0]
    oh, ow = unfold2d_output_size(size[0], size[1], kernel, stride, padding, dilation)
    need(len(x) == 3 and x[1] % (kernel[0] * kernel[1]) == 0 and x[2] == oh * ow, "cols do not fit the image")
    return (x[0], x[1] // (kernel[0] * kernel[1])) + tuple(size), dtype


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n
