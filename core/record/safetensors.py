"""The safetensors file format, read and written in plain Python.

This one file serves CPython, Pyodide and MicroPython (the micro runtime imports it as is), so
it keeps to what MicroPython has: `json`, `struct`, `array`, no f-strings, no dataclasses, no
typing, no pathlib, no `raise ... from`.

Layout (https://github.com/huggingface/safetensors, "Format"):
    8 bytes        N, unsigned little-endian 64-bit: size of the header
    N bytes        JSON object, UTF-8, may be padded at the end with spaces:
                   {"__metadata__": {str: str}, name: {"dtype": "F32", "shape": [..],
                    "data_offsets": [begin, end]}, ...}
    rest           the byte buffer; offsets are relative to its start, tensors are little-endian,
                   row-major, and together cover the buffer exactly (no holes, no overlap).

Reading validates the whole header before any tensor byte is used, and reads one tensor at a
time from a file object, so a board never holds more than the tensor it is filling. Writing
lives in safetensors_write.py: a board only reads, and a 64 KB heap cannot compile both halves.
"""

import json
import struct
import sys
from array import array

try:
    from ..errors import RecordError
except Exception:  # MicroPython or a standalone copy of this file: no cinders.errors around
    class RecordError(ValueError):
        pass

MAX_HEADER_BYTES = 100000000  # the reference implementation's limit

# dtype code -> (itemsize, array typecode usable for bulk conversion or None)
DTYPES = {
    "F32": (4, "f"),
    "F16": (2, None),
    "I32": (4, "i"),
    "I8": (1, "b"),
    "U8": (1, "B"),
    "BOOL": (1, "B"),
}

_LITTLE = sys.byteorder == "little"


def _array_ok(code, itemsize):
    # `array` is native byte order and native size; use it only where both match the file's.
    if not _LITTLE:
        return False
    try:
        return len(bytes(array(code, [0]))) == itemsize  # MicroPython arrays have no .itemsize
    except Exception:
        return False


_BULK = {}
for _code in DTYPES:
    _size, _tc = DTYPES[_code]
    if _tc is not None and _array_ok(_tc, _size):
        _BULK[_code] = _tc

try:
    struct.calcsize("<e")
    _STRUCT_F16 = True
except Exception:  # MicroPython's struct has no half floats
    _STRUCT_F16 = False

_STRUCT_CHAR = {"F32": "f", "I32": "i", "I8": "b", "U8": "B", "BOOL": "B"}


# ---------------------------------------------------------------- float16 bits -> float

def f16_bits_to_float(h):
    """The value of an IEEE binary16 bit pattern."""
    e = (h >> 10) & 0x1F
    m = h & 0x3FF
    if e == 0x1F:
        v = float("nan") if m else float("inf")
    elif e == 0:
        v = m * 5.9604644775390625e-08  # subnormal: m * 2**-24
    else:
        v = (1024 + m) * (2.0 ** (e - 25))
    return -v if h & 0x8000 else v


def _decode_f16(data):
    n = len(data) // 2
    if _STRUCT_F16:  # CPython, Pyodide: widened in chunks (halves.py is not on the board)
        from .halves import f16_to_float32
        return f16_to_float32(data)
    out = [0.0] * n
    for i in range(n):
        out[i] = f16_bits_to_float(data[2 * i] | (data[2 * i + 1] << 8))
    return out


# ---------------------------------------------------------------- bytes -> values

def decode(data, dtype):
    """Little-endian bytes of `dtype` -> flat sequence of Python numbers (an array or a list).

    F16 decodes to float values (tensors compute in float32), BOOL to 0/1.
    """
    if dtype == "F16":
        return _decode_f16(data)
    tc = _BULK.get(dtype)
    if tc is not None:
        return array(tc, bytes(data))
    itemsize = DTYPES[dtype][0]
    return list(struct.unpack("<%d%s" % (len(data) // itemsize, _STRUCT_CHAR[dtype]), data))


def _known():
    return ", ".join(sorted(DTYPES))


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


# ---------------------------------------------------------------- header

class TensorInfo:
    """Where one tensor lives in the byte buffer."""

    __slots__ = ("name", "dtype", "shape", "begin", "end")

    def __init__(self, name, dtype, shape, begin, end):
        self.name = name
        self.dtype = dtype
        self.shape = shape
        self.begin = begin
        self.end = end

    @property
    def nbytes(self):
        return self.end - self.begin

    def __repr__(self):
        return "TensorInfo(%r, %s, %r, [%d, %d))" % (self.name, self.dtype, self.shape,
                                                     self.begin, self.end)


def _is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


def _no_duplicates(pairs):
    seen = {}
    for k, v in pairs:
        if k in seen:
            raise RecordError("corrupt header: key %r appears twice" % (k,))
        seen[k] = v
    return seen


def _parse_json(text):
    try:
        try:
            return json.loads(text, object_pairs_hook=_no_duplicates)
        except TypeError:  # MicroPython's json has no hooks: duplicates go undetected there
            return json.loads(text)
    except RecordError:
        raise
    except Exception as exc:
        raise RecordError("corrupt header: not valid JSON (%s)" % (exc,))


def parse_header(header_bytes, buffer_size):
    """Validate a header against the size of the byte buffer that follows it.

    Returns (metadata dict, list of TensorInfo in buffer order). Raises RecordError naming the
    first problem found.
    """
    try:
        text = bytes(header_bytes).decode("utf-8")
    except Exception:
        raise RecordError("corrupt header: not UTF-8")
    if not text.startswith("{"):
        raise RecordError("corrupt header: does not start with '{'")
    obj = _parse_json(text)
    if not isinstance(obj, dict):
        raise RecordError("corrupt header: not a JSON object")
    metadata = obj.pop("__metadata__", None)
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise RecordError("corrupt header: __metadata__ is not an object")
    for k in metadata:
        if not isinstance(metadata[k], str):
            raise RecordError("corrupt header: __metadata__[%r] is not a string" % (k,))
    infos = []
    for name in obj:
        entry = obj[name]
        if not isinstance(entry, dict):
            raise RecordError("corrupt header: entry %r is not an object" % (name,))
        if sorted(entry.keys()) != ["data_offsets", "dtype", "shape"]:
            raise RecordError("corrupt header: entry %r must have exactly dtype, shape, "
                              "data_offsets (has %s)" % (name, ", ".join(sorted(entry.keys()))))
        dtype = entry["dtype"]
        if not isinstance(dtype, str) or dtype not in DTYPES:
            raise RecordError("tensor %r: dtype %r is not supported (supported: %s)"
                              % (name, dtype, _known()))
        shape = entry["shape"]
        if isinstance(shape, list) and len(shape) > 64:  # quoting it would make a message the header's size
            raise RecordError("tensor %r: shape of %d dims (at most 64)" % (name[:80], len(shape)))
        if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
            raise RecordError("tensor %r: shape %r is not a list of non-negative integers"
                              % (name, shape))
        offsets = entry["data_offsets"]
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(_is_int(o) and o >= 0 for o in offsets)):
            raise RecordError("tensor %r: data_offsets %r is not [begin, end]" % (name, offsets))
        begin, end = offsets
        if end < begin:
            raise RecordError("tensor %r: data_offsets [%d, %d] end before begin"
                              % (name, begin, end))
        want = numel(shape) * DTYPES[dtype][0]
        if end - begin != want:
            raise RecordError("tensor %r: shape %r of %s needs %d bytes but data_offsets "
                              "[%d, %d] span %d" % (name, shape, dtype, want, begin, end,
                                                    end - begin))
        if end > buffer_size:
            raise RecordError("tensor %r: data_offsets [%d, %d] run past the end of the data "
                              "(%d bytes; file truncated?)" % (name, begin, end, buffer_size))
        infos.append(TensorInfo(name, dtype, tuple(shape), begin, end))
    infos.sort(key=lambda t: (t.begin, t.end))
    pos = 0
    for t in infos:
        if t.begin < pos:
            raise RecordError("tensor %r: data_offsets [%d, %d] overlap the previous tensor "
                              "(which ends at %d)" % (t.name, t.begin, t.end, pos))
        if t.begin > pos:
            raise RecordError("tensor %r: data_offsets [%d, %d] leave a hole at [%d, %d)"
                              % (t.name, t.begin, t.end, pos, t.begin))
        pos = t.end
    if pos != buffer_size:
        raise RecordError("the tensors cover %d bytes of data but the file holds %d after the "
                          "header" % (pos, buffer_size))
    return metadata, infos


# ---------------------------------------------------------------- reading

class Reader:
    """A validated safetensors file, read one tensor at a time from a seekable file object.

        with open(path, "rb") as f:
            r = Reader(f)
            r.metadata, r.names(), r.info(name), r.read(name) -> flat values, r.read_bytes(name)
    """

    def __init__(self, f, size=None):
        self.f = f
        if size is None:
            f.seek(0, 2)
            size = f.tell()
        f.seek(0)
        if size < 8:
            raise RecordError("file too short for a safetensors header (%d bytes; truncated?)"
                              % size)
        head = f.read(8)
        if len(head) != 8:
            raise RecordError("could not read the 8-byte header length (truncated?)")
        n = struct.unpack("<Q", head)[0]
        if n > MAX_HEADER_BYTES:
            raise RecordError("corrupt header: declared header size %d is larger than the "
                              "limit %d" % (n, MAX_HEADER_BYTES))
        if n < 2 or 8 + n > size:
            raise RecordError("corrupt or truncated file: header size %d does not fit the "
                              "file of %d bytes" % (n, size))
        header = f.read(n)
        if len(header) != n:
            raise RecordError("truncated file: header cut short")
        self.data_start = 8 + n
        self.metadata, infos = parse_header(header, size - self.data_start)
        self.infos = {}
        self.order = []
        for t in infos:
            self.infos[t.name] = t
            self.order.append(t.name)

    def names(self):
        """Tensor names in buffer order."""
        return list(self.order)

    def info(self, name):
        try:
            return self.infos[name]
        except KeyError:
            raise RecordError("no tensor %r in the record (it has: %s)"
                              % (name, ", ".join(self.order)))

    def read_bytes(self, name):
        t = self.info(name)
        self.f.seek(self.data_start + t.begin)
        data = self.f.read(t.nbytes)
        if len(data) != t.nbytes:
            raise RecordError("tensor %r: file truncated while reading" % (name,))
        return data

    def read_into(self, name, buf):
        """Fill a preallocated writable buffer (e.g. array('f', ...)) with the raw bytes."""
        t = self.info(name)
        self.f.seek(self.data_start + t.begin)
        got = self.f.readinto(buf)
        if got != t.nbytes:
            raise RecordError("tensor %r: read %s of %d bytes" % (name, got, t.nbytes))
        return buf

    def read(self, name):
        """Flat row-major values of one tensor (floats for F32/F16, ints otherwise)."""
        return decode(self.read_bytes(name), self.info(name).dtype)


def read_file(path):
    """(metadata, {name: (dtype, shape, values)}) of a whole file."""
    with open(path, "rb") as f:
        r = Reader(f)
        tensors = {}
        for name in r.order:
            t = r.infos[name]
            tensors[name] = (t.dtype, t.shape, r.read(name))
        return r.metadata, tensors
