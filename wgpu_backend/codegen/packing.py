"""Storage dtypes in kernels: int8/uint8 packed four to a u32 word, float16 two (WGSL has no
8-bit type, and `shader-f16` is not on every adapter: SwiftShader lacks it), described by
`DType.per_word` (core/dtypes.py). Element e of a packed buffer is field e % per_word of word
e / per_word, the first element in the low bits (little-endian, so the buffer's bytes are the
NumPy array's bytes).

A kernel reads a packed element as its compute value (int8/uint8 -> i32, float16 -> f32: the
`*_at` helpers of mathlib.py), computes in the compute dtype, and writes a packed element with
two atomics on its word (clear its field, then set it): neighbouring elements in one word may be
written by other invocations, and a destination may be any strided view (a region of a cat).
float16 is rounded to nearest even in integer arithmetic (`f16_bits`), not by pack2x16float,
whose rounding WGSL leaves to the implementation. These three functions are the only places
that know the layout; every generator reads and writes buffers through them.
"""

_AT = {"int8": "i8_at", "uint8": "u8_at", "float16": "f16_at"}
_FIELD = {"int8": "(u32({v}) & 0xFFu)", "uint8": "(u32({v}) & 0xFFu)", "float16": "f16_bits({v})"}


def binding_type(dtype, writable=False):
    """WGSL element type of a storage binding holding `dtype` (written: atomics when packed)."""
    if dtype.per_word == 1:
        return dtype.wgsl
    return "atomic<u32>" if writable else "u32"


def load(dtype, buf, index):
    """WGSL expression: element `index` of `buf` (a read-only binding) as its compute value."""
    if dtype.per_word == 1:
        return "%s[%s]" % (buf, index)
    return "%s(%s[(%s) / %du], %s)" % (_AT[dtype.name], buf, index, dtype.per_word, index)


def store(dtype, buf, index, value):
    """WGSL statement writing compute value `value` as element `index` of `buf`."""
    if dtype.per_word == 1:
        return "%s[%s] = %s;" % (buf, index, value)
    bits = 32 // dtype.per_word
    return ("{ let pe = %s; let pw = pe / %du; let ps = (pe %% %du) * %du; "
            "atomicAnd(&%s[pw], ~(%su << ps)); atomicOr(&%s[pw], %s << ps); }"
            % (index, dtype.per_word, dtype.per_word, bits, buf, hex((1 << bits) - 1), buf,
               _FIELD[dtype.name].format(v=value)))


def word_count(dtype, n):
    """u32 words holding n elements of dtype."""
    return -(-n // dtype.per_word)


def fill_word(dtype, word):
    """The u32 word of `per_word` copies of one element whose own bits are `word`."""
    if dtype.per_word == 1:
        return word
    bits = 32 // dtype.per_word
    field = word & ((1 << bits) - 1)
    return sum(field << (bits * q) for q in range(dtype.per_word))
