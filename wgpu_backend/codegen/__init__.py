"""WGSL generation: every kernel of cn.Wgpu comes from the modules of this package.

    prelude.py   the uniform parameter block (ParamLayout: one layout per kernel, packing and
                 naming its fields), bindings, entry points, index helpers
    mathlib.py   WGSL helper functions, included where a source calls them (dependencies found
                 in the helpers' own sources)
    optable.py   the op table's WGSL: one expression per (op, operand kind), reduction rules
    program.py   the one generator of elementwise and reduction kernels: WGSL from a fusion
                 Program (a plain op is a Program of one node; cn.Fusion's groups have many),
                 flat, per row, or as a matmul's epilogue
    packing.py   storage dtypes in kernels: loads and stores of int8/uint8 (four to a u32 word)
                 and float16 (two, or array<f16> on devices with shader-f16), the only code
                 that knows those layouts
    matmul.py    the matmul templates (their store of C may call a Program's epilogue), and
                 the quantized-B matmul that dequantizes packed weights as it stages them
    images.py    fill, random, gather, scatter_add, unfold2d, fold2d

WGSL types come from the dtypes themselves (`DType.wgsl`: float32 -> f32, int32 -> i32,
bool -> u32 holding 0/1; a storage dtype's values unpack to its compute dtype's type,
`DType.per_word` of them in a u32 word).
"""
