"""Data types. Deliberately few: what every target (desktop, WebGPU, MicroPython) can hold.

float16 exists for storage in records only; tensors compute in float32.
"""

from .errors import DTypeError


class DType:
    __slots__ = ("name", "itemsize", "kind", "array_code", "wgsl", "word_code")

    def __init__(self, name, itemsize, kind, array_code, wgsl=None, word_code=""):
        self.name = name
        self.itemsize = itemsize
        self.kind = kind  # "f" float, "i" signed int, "b" bool
        self.array_code = array_code  # typecode for the `array` module ("" when none fits)
        # On WebGPU every compute dtype lives in one 32-bit word per element: `wgsl` is the
        # WGSL scalar type of that word (bool: a u32 holding 0/1), `word_code` its `array` /
        # `struct` / NumPy typecode (None / "": not a compute dtype there).
        self.wgsl = wgsl
        self.word_code = word_code

    @property
    def is_float(self):
        return self.kind == "f"

    def __repr__(self):
        return "cn." + self.name

    def __reduce__(self):
        return (from_name, (self.name,))


float32 = DType("float32", 4, "f", "f", "f32", "f")
float16 = DType("float16", 2, "f", "")
int32 = DType("int32", 4, "i", "i", "i32", "i")
bool_ = DType("bool", 1, "b", "b", "u32", "I")

_BY_NAME = {d.name: d for d in (float32, float16, int32, bool_)}
COMPUTE_DTYPES = (float32, int32, bool_)


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
    """Result dtype of arithmetic between two dtypes: bool < int32 < float32 (like PyTorch)."""
    order = {bool_: 0, int32: 1, float32: 2}
    return a if order[a] >= order[b] else b
