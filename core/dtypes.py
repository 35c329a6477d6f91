"""Data types. Deliberately few: what every target (desktop, WebGPU, MicroPython) can hold.

Compute dtypes (float32, int32, bool) are what every backend computes in. Storage dtypes (int8,
uint8, float16) hold quantized and half-precision data at their size on the backends that declare
them (`Backend.storage_dtypes`); every op of the op table widens them first to their `compute`
dtype (int8/uint8 -> int32, float16 -> float32; core/ops.py), so arithmetic rules stay those of
the compute dtypes. Casting to int8/uint8 wraps around (two's complement, like NumPy and ONNX
Cast; floats truncate toward zero first); casting to float16 rounds to nearest even (overflow:
infinity).

Packed 4-bit weights (records and `cinders quantize`'s q4 files) are uint8 tensors holding two
values per byte, the first value in the low nibble (ONNX's int4/uint4 and MatMulNBits layout).
"""

import math
import struct

from .errors import DTypeError


class DType:
    __slots__ = ("name", "itemsize", "kind", "array_code", "wgsl", "word_code", "per_word",
                 "compute", "bounds")

    def __init__(self, name, itemsize, kind, array_code, wgsl=None, word_code="", compute=None,
                 bounds=None, per_word=1):
        self.name = name
        self.itemsize = itemsize
        self.kind = kind  # "f" float, "i" signed int, "u" unsigned int, "b" bool
        self.array_code = array_code  # typecode for the `array` module ("" when none fits)
        # On WebGPU every compute dtype lives in one 32-bit word per element: `wgsl` is the
        # WGSL scalar type of that word (bool: a u32 holding 0/1), `word_code` its `array` /
        # `struct` / NumPy typecode. A storage dtype is packed `per_word` elements to a u32
        # word (WGSL has no 8-bit type; float16 is `array<f16>` instead on devices with
        # shader-f16, the same bytes): `word_code` is then the typecode of one element in
        # those bytes, and `wgsl` the type of its value once a kernel has unpacked it (its
        # compute dtype's; wgpu_backend/codegen/packing.py).
        self.wgsl = wgsl
        self.word_code = word_code
        self.per_word = per_word
        self.compute = compute or self  # the dtype ops compute a storage dtype's values in
        self.bounds = bounds  # (min, max) of an integer dtype

    @property
    def is_storage(self):
        return self.compute is not self

    @property
    def is_float(self):
        return self.kind == "f"

    def __repr__(self):
        return "cn." + self.name

    def __reduce__(self):
        return (from_name, (self.name,))


float32 = DType("float32", 4, "f", "f", "f32", "f")
int32 = DType("int32", 4, "i", "i", "i32", "i", bounds=(-2 ** 31, 2 ** 31 - 1))
bool_ = DType("bool", 1, "b", "b", "u32", "I")
# Storage dtypes. float16's array code is the `struct` one ("e"): the `array` module has none,
# so cn.Python keeps float16 as its 16-bit patterns in array("H").
float16 = DType("float16", 2, "f", "e", "f32", "e", compute=float32, per_word=2)
int8 = DType("int8", 1, "i", "b", "i32", "b", compute=int32, bounds=(-128, 127), per_word=4)
uint8 = DType("uint8", 1, "u", "B", "i32", "B", compute=int32, bounds=(0, 255), per_word=4)



def float16_bytes(values):
    """Python floats -> their float16 bit patterns (little-endian bytes), rounded to nearest
    even from the float itself (as NumPy's astype: no float32 step); values beyond float16's
    range become infinity (struct refuses them). Backends that hold float16 as bits use it."""
    try:
        return struct.pack("<%de" % len(values), *values)
    except OverflowError:
        return struct.pack("<%de" % len(values), *[v if abs(v) < 65520.0 else math.copysign(math.inf, v)
                                                   for v in values])


def float16_values(data):
    """Little-endian float16 bit patterns (bytes) -> list of Python floats."""
    return list(struct.unpack("<%de" % (len(data) // 2), data))


_BY_NAME = {d.name: d for d in (float32, float16, int32, bool_, int8, uint8)}
COMPUTE_DTYPES = (float32, int32, bool_)
STORAGE_DTYPES = (int8, uint8, float16)


def from_name(name):
    try:
        return _BY_NAME[name]
    except KeyError:
        raise DTypeError("unknown dtype %r; known: %s" % (name, ", ".join(sorted(_BY_NAME)))) from None


def of_python_value(value):
    """The dtype a Python scalar gets when it enters a tensor op (bool before int: bool is an int)."""
    if isinstance(value, bool):
        return bool_
    if isinstance(value, int):
        return int32
    return float32


def promote(a, b):
    """Result dtype of arithmetic between two dtypes: bool < int32 < float32 (like PyTorch);
    storage dtypes take part as their compute dtype (int8 + int8 computes in int32)."""
    a, b = a.compute, b.compute
    order = {bool_: 0, int32: 1, float32: 2}
    return a if order[a] >= order[b] else b
