"""Writing safetensors files (the reading half, which boards also run, is safetensors.py).

Desktop and browser only, but kept to the same MicroPython-friendly subset as the reader.
"""

import json
import struct
from array import array

from .safetensors import (DTYPES, RecordError, _BULK, _STRUCT_CHAR, _STRUCT_F16, _known,
                          numel)


# ---------------------------------------------------------------- float32 -> float16 bits

def f32_bits_to_f16_bits(b):
    """Round a binary32 bit pattern to binary16, nearest-even (what struct's 'e' and NumPy do).

    Finite values too large for float16 come back as infinity (0x7C00 | sign); callers decide
    whether that is an error.
    """
    sign = (b >> 16) & 0x8000
    exp = (b >> 23) & 0xFF
    mant = b & 0x7FFFFF
    if exp == 0xFF:
        return sign | 0x7C00 | (0x200 if mant else 0)
    e = exp - 112  # rebias 127 -> 15
    if e >= 0x1F:
        return sign | 0x7C00
    if e <= 0:
        if e < -10:
            return sign
        full = mant | 0x800000
        shift = 14 - e
        r = full >> shift
        rem = full & ((1 << shift) - 1)
        half = 1 << (shift - 1)
    else:
        r = (e << 10) | (mant >> 13)
        rem = mant & 0x1FFF
        half = 0x1000
    if rem > half or (rem == half and (r & 1)):
        r += 1  # a carry into the exponent is the correct rounding, up to infinity
    return sign | r


def _check_f16_range(values, name):
    # Values from 65520 up round to infinity in float16; infinities themselves are kept.
    if not len(values) or (max(values) < 65520.0 and min(values) > -65520.0):
        return  # (a NaN first in the list makes max() NaN and sends us to the loop below)
    for v in values:
        if v == v and 65520.0 <= abs(v) < float("inf"):
            raise RecordError("tensor '%s': value %r does not fit float16 (largest 65504); "
                              "save it as float32" % (name, v))


def _encode_f16(values, name):
    _check_f16_range(values, name)
    n = len(values)
    if _STRUCT_F16:
        return struct.pack("<%de" % n, *values)
    out = bytearray(2 * n)
    for i in range(n):
        h = f32_bits_to_f16_bits(struct.unpack("<I", struct.pack("<f", values[i]))[0])
        out[2 * i] = h & 0xFF
        out[2 * i + 1] = h >> 8
    return bytes(out)


# ---------------------------------------------------------------- values -> bytes

def encode(values, dtype, name="tensor"):
    """Flat row-major numbers -> little-endian bytes of `dtype` ("F32", "F16", ...)."""
    if dtype not in DTYPES:
        raise RecordError("tensor '%s': unknown dtype %r; known: %s" % (name, dtype, _known()))
    if dtype == "F16":
        return _encode_f16(values, name)
    if dtype == "BOOL":
        values = [1 if v else 0 for v in values]
    tc = _BULK.get(dtype)
    if tc is not None:
        return bytes(array(tc, values))
    return struct.pack("<%d%s" % (len(values), _STRUCT_CHAR[dtype]), *values)


# ---------------------------------------------------------------- writing

def header_bytes(entries, metadata=None):
    """The 8-byte length and padded JSON header for entries [(name, dtype, shape), ...]."""
    header = {}
    if metadata:
        for k in metadata:
            if not isinstance(metadata[k], str):
                raise RecordError("metadata %r must be a string, not %s"
                                  % (k, type(metadata[k]).__name__))
        header["__metadata__"] = metadata
    pos = 0
    for name, dtype, shape in entries:
        if name == "__metadata__" or name in header:
            raise RecordError("tensor name %r is reserved or repeated" % (name,))
        if dtype not in DTYPES:
            raise RecordError("tensor %r: unknown dtype %r; known: %s" % (name, dtype, _known()))
        n = numel(shape) * DTYPES[dtype][0]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [pos, pos + n]}
        pos += n
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-(8 + len(text)) % 8)  # keep the buffer 8-byte aligned, like the reference
    return struct.pack("<Q", len(text)) + text


def write(f, entries, metadata=None):
    """Write [(name, dtype, shape, payload), ...] to file object f.

    payload is bytes-like, or a callable returning it, so a caller can encode one tensor at a
    time while writing. Each payload's length is checked against its dtype and shape.
    """
    f.write(header_bytes([(e[0], e[1], e[2]) for e in entries], metadata))
    for name, dtype, shape, payload in entries:
        data = payload() if callable(payload) else payload
        want = numel(shape) * DTYPES[dtype][0]
        if len(data) != want:
            raise RecordError("tensor %r: %d bytes given for shape %r of %s (needs %d)"
                              % (name, len(data), list(shape), dtype, want))
        f.write(data)


def write_file(path, tensors, metadata=None):
    """Write {name: (dtype, shape, flat values)} to path (not atomic; see cinders.record)."""
    entries = []
    for name in tensors:
        dtype, shape, values = tensors[name]
        entries.append((name, dtype, shape, encode(values, dtype, name)))
    with open(path, "wb") as f:
        write(f, entries, metadata)
