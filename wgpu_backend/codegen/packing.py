"""Storage dtypes in kernels: how int8/uint8 and float16 elements sit in a storage buffer. Two
layouts, both the NumPy array's bytes (little-endian), so uploads, readbacks and records are
the same whichever a device uses:

    PACKED  every storage dtype in u32 words: int8/uint8 four to a word, float16 two
            (`DType.per_word`, core/dtypes.py). WGSL has no 8-bit type, and `shader-f16` is not
            on every adapter (SwiftShader lacks it). Element e is field e % per_word of word
            e / per_word, the first element in the low bits. A kernel writes a packed element
            with two atomics on its word (clear its field, then set it): neighbouring elements
            in one word may be written by other invocations, and a destination may be any
            strided view (a region of a cat).
    HALF    float16 as `array<f16>` (adapters with `shader-f16`, cn.Wgpu(shader_f16=True), the
            default): plain 2-byte loads and stores, no atomics. int8/uint8 stay packed.

A kernel reads an element as its compute value (int8/uint8 -> i32, float16 -> f32: the `*_at`
helpers of mathlib.py, or f32() of an f16), computes in the compute dtype (float16 computes in
float32 in both layouts, so results do not depend on the adapter), and writes an element rounded
from it. float16 is rounded to nearest even in integer arithmetic (`f16_bits`), not by
pack2x16float or an f32 -> f16 conversion, whose rounding and overflow WGSL leaves to the
implementation; in HALF the rounded bits go through unpack2x16float, whose result an f16 holds
exactly (infinities and NaN included on the adapters tested: lavapipe; the exact bitcast to
vec2<f16> is not accepted by this wgpu's shader compiler). `binding_type`, `load` and `store`, asked with the device's layout, are the only places
that know it; every generator reads and writes buffers through them.
"""

import re

PACKED = "packed"
HALF = "f16"

_AT = {"int8": "i8_at", "uint8": "u8_at", "float16": "f16_at"}
_FIELD = {"int8": "(u32({v}) & 0xFFu)", "uint8": "(u32({v}) & 0xFFu)", "float16": "f16_bits({v})"}
# The compute value a storage dtype holds of compute value {v}: what a store then a load gives.
_NARROW = {"int8": "extractBits({v}, 0u, 8u)", "uint8": "(({v}) & 0xFFi)",
           "float16": "f16_at(f16_bits({v}), 0u)"}


def _native(dtype, layout):
    return layout == HALF and dtype.name == "float16"


def binding_type(dtype, layout, writable=False):
    """WGSL element type of a storage binding holding `dtype` (written: atomics when packed)."""
    if dtype.per_word == 1:
        return dtype.wgsl
    if _native(dtype, layout):
        return "f16"
    return "atomic<u32>" if writable else "u32"


def load(dtype, layout, buf, index):
    """WGSL expression: element `index` of `buf` (a read-only binding) as its compute value."""
    if dtype.per_word == 1:
        return "%s[%s]" % (buf, index)
    if _native(dtype, layout):
        return "f32(%s[%s])" % (buf, index)
    return "%s(%s[(%s) / %du], %s)" % (_AT[dtype.name], buf, index, dtype.per_word, index)


def store(dtype, layout, buf, index, value):
    """WGSL statement writing compute value `value` as element `index` of `buf`."""
    if dtype.per_word == 1:
        return "%s[%s] = %s;" % (buf, index, value)
    if _native(dtype, layout):
        return "%s[%s] = f16(unpack2x16float(f16_bits(%s)).x);" % (buf, index, value)
    bits = 32 // dtype.per_word
    return ("{ let pe = %s; let pw = pe / %du; let ps = (pe %% %du) * %du; "
            "atomicAnd(&%s[pw], ~(%su << ps)); atomicOr(&%s[pw], %s << ps); }"
            % (index, dtype.per_word, dtype.per_word, bits, buf, hex((1 << bits) - 1), buf,
               _FIELD[dtype.name].format(v=value)))


def narrow(dtype, value):
    """WGSL expression: compute value `value` as a `dtype` element would hold it (an int8 result
    wraps, a float16 one rounds), for values a fused kernel keeps in registers (same in both
    layouts)."""
    if not dtype.is_storage:
        return value
    return _NARROW[dtype.name].format(v=value)


def directives(source, layout):
    """The `enable` directives a kernel source needs in front: f16 on a HALF device whose
    source names the type (a packed-layout device may lack the feature: a user kernel that
    mentions f16 there is compiled as written)."""
    if layout == HALF and re.search(r"\bf16\b", source) and \
            not re.search(r"^\s*enable\s+f16\s*;", source, re.M):
        return "enable f16;\n"
    return ""


def word_count(dtype, n):
    """u32 words holding n elements of dtype (a buffer is whole words in either layout)."""
    return -(-n // dtype.per_word)


def fill_word(dtype, word):
    """The u32 word of `per_word` copies of one element whose own bits are `word`."""
    if dtype.per_word == 1:
        return word
    bits = 32 // dtype.per_word
    field = word & ((1 << bits) - 1)
    return sum(field << (bits * q) for q in range(dtype.per_word))
