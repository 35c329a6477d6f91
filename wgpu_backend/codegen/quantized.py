"""Reading quantized and half weights inside product kernels: the one place that knows how a
packed 8-bit or 4-bit value, or a float16 one, becomes the value a matmul or conv multiplies.
Both the quantized matmul (matmul.py, matmul_quantized_wgsl) and the convolutions (conv.py,
conv2d_quantized) generate their weight reads from a PackedReader.
"""

from .packing import load


class PackedReader:
    """WGSL reading the values of a weight of storage dtype `dtype` (int8/uint8: i32 values;
    `bits` 4: nibbles of uint8 bytes, low first; float16: f32 values) from a device whose storage
    layout is `storage` (packing.py), as products accumulating in `acc` ("f32" or "i32") use them."""

    def __init__(self, dtype, bits, storage, acc):
        self.dtype, self.bits, self.storage, self.acc = dtype, bits, storage, acc

    @property
    def is_float(self):
        """A half model's weight: widened as read, no scale or zero point."""
        return self.dtype.is_float

    @property
    def per_word(self):
        """Values in one u32 word of the packed storage (nibbles when bits == 4)."""
        return 8 if self.bits == 4 else self.dtype.per_word

    def at(self, buf, index, dtype=None, bits=None):
        """Element `index` of `buf` (of this reader's dtype and bits, or of `dtype` and `bits`:
        a zero point's or scale's buffer) as its compute value."""
        dtype, bits = dtype or self.dtype, bits or self.bits
        if bits == 4:  # two values a byte, low nibble first: nibble e of the packed uint8 data
            return "i32(extractBits(%s[(%s) / 8u], ((%s) %% 8u) * 4u, 4u))" % (buf, index, index)
        return load(dtype, self.storage, buf, index)

    def field(self, word, j):
        """Value j of a packed u32 word of the weight, as i32."""
        if self.bits == 4:
            return "i32(extractBits(%s, %du, 4u))" % (word, 4 * j)
        if self.dtype.name == "int8":
            return "extractBits(bitcast<i32>(%s), %du, 8u)" % (word, 8 * j)
        return "i32(extractBits(%s, %du, 8u))" % (word, 8 * j)

    def dequantized(self, raw, zp=None, scale=None):
        """The multiplied value of packed value `raw` (i32; a float16 weight's f32): raw - zp
        (WGSL i32, None: 0), times `scale` (WGSL f32, None: none), in the accumulator type."""
        if self.is_float:
            return raw
        value = raw if zp is None else "(%s - %s)" % (raw, zp)
        if scale is not None:
            value = "f32(%s) * %s" % (value, scale)
        return "%s(%s)" % (self.acc, value)
