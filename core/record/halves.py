"""float16 and bfloat16 bytes widened to float32 (`array('f')`) without a Python float per value
held at once: the readers of safetensors records, ONNX initializers and PyTorch storages share
these. Not part of the board's runtime (MicroPython's struct has no half floats)."""

import struct
import sys
from array import array

_LITTLE = sys.byteorder == "little"
_CHUNK = 1 << 14  # elements widened at a time: a tuple of Python floats per chunk, not per tensor


def f16_to_float32(data):
    """Little-endian float16 bytes -> array('f') (CPython, Pyodide), widened a chunk at a time so
    the transient Python floats stay bounded: a half tensor costs 2x its bytes, not 20x."""
    n = len(data) // 2
    out = array("f")
    for start in range(0, n, _CHUNK):
        count = min(_CHUNK, n - start)
        out.extend(struct.unpack_from("<%de" % count, data, 2 * start))
    return out


def bf16_to_float32(data):
    """Little-endian bfloat16 bytes -> array('f'): each value is the high half of a float32, so
    the bytes are placed, not computed (no Python number per element)."""
    n = len(data) // 2
    data = data if isinstance(data, (bytes, bytearray)) else bytes(data)
    out = array("f", [0.0]) * n   # written in place: no second float32-sized buffer
    wide = memoryview(out).cast("B")
    wide[2::4] = data[0:2 * n:2]
    wide[3::4] = data[1:2 * n:2]
    wide.release()
    if not _LITTLE:
        out.byteswap()
    return out
