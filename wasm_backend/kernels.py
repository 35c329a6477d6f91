"""The C source of cn.Wasm()'s WebAssembly module, generated from one table of ops.

Each elementwise op, reduction and cast is one entry below: a C expression per dtype. The
generator instantiates the shared strided loops of `runtime.h` (N-d iteration, broadcasting by
stride 0, contiguous rows that clang vectorises to SIMD128) once per (op, dtype); only the
kernels that are not elementwise (matmul, unfold2d/fold2d, conv2d and its gradients, gather/scatter_add, random, fill) are
written by hand, in runtime.h. build.py compiles the result with clang --target=wasm32 -msimd128.

Kernel names are what backend.py calls: unary_<op>_<dtype>, binary_<op>_<dtype>, where_<dtype>,
cast_<from>_<to>, reduce_<op>_<dtype>. Dtypes in names: f32, i32, u8 (bool, 0/1), and the
storage dtypes i8 (int8) and ui8 (uint8), one byte each, and f16 (float16, its bit patterns in
two bytes): they have copies, casts and gathers only (every other op widens them first,
core/dtypes.py), and matmul_quantized reads the 8-bit ones as B.
"""

C_TYPE = {"f32": "float", "i32": "int", "u8": "u8"}
STORAGE_C_TYPE = {"i8": "signed char", "ui8": "u8", "f16": "uint16_t"}  # f16: its bit patterns

# op -> {dtype: C expression of x}. The result has the operand's dtype (logical_not: bool).
# Integer arithmetic goes through unsigned so that overflow wraps (as in NumPy) instead of being
# undefined behaviour in C.
UNARY = {
    "neg": {"f32": "-x", "i32": "(int)(0u - (unsigned)x)"},
    "exp": {"f32": "expf(x)"},
    "log": {"f32": "logf(x)"},
    "sqrt": {"f32": "sqrtf(x)"},
    "sin": {"f32": "sinf(x)"},
    "cos": {"f32": "cosf(x)"},
    "tanh": {"f32": "tanhf(x)"},
    "erf": {"f32": "erf_f32(x)"},  # runtime.h: vectorised, within 2 ulp (erff is a call per element)
    "asin": {"f32": "asinf(x)"},
    "acos": {"f32": "acosf(x)"},
    "atan": {"f32": "atanf(x)"},
    "abs": {"f32": "fabsf(x)", "i32": "(int)(x < 0 ? 0u - (unsigned)x : (unsigned)x)"},
    "floor": {"f32": "floorf(x)", "i32": "x"},
    "ceil": {"f32": "ceilf(x)", "i32": "x"},
    "round": {"f32": "__builtin_rintf(x)", "i32": "x"},  # rint: half to even
    "logical_not": {"u8": "(u8)!x", "f32": "(u8)(x == 0)", "i32": "(u8)(x == 0)"},
}
UNARY_RESULT = {"logical_not": "u8"}

_COMPARE = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
BINARY = {
    "add": {"f32": "a + b", "i32": "(int)((unsigned)a + (unsigned)b)", "u8": "(u8)(a | b)"},
    "sub": {"f32": "a - b", "i32": "(int)((unsigned)a - (unsigned)b)"},
    "mul": {"f32": "a * b", "i32": "(int)((unsigned)a * (unsigned)b)", "u8": "(u8)(a & b)"},
    "div": {"f32": "a / b"},
    "pow": {"f32": "powf(a, b)"},
    # NaN in either operand gives NaN (NumPy's maximum/minimum), -0 < +0
    "maximum": {"f32": "max_f32(a, b)", "i32": "(a > b ? a : b)", "u8": "(u8)(a | b)"},
    "minimum": {"f32": "min_f32(a, b)", "i32": "(a < b ? a : b)", "u8": "(u8)(a & b)"},
    "floordiv": {"f32": "floordiv_f32(a, b)", "i32": "floordiv_i32(a, b)"},
    "mod": {"f32": "mod_f32(a, b)", "i32": "mod_i32(a, b)"},
    "logical_and": {t: "(u8)(a != 0 && b != 0)" for t in C_TYPE},
    "logical_or": {t: "(u8)(a != 0 || b != 0)" for t in C_TYPE},
}
BINARY.update({op: {t: "(u8)(a %s b)" % sym for t in C_TYPE} for op, sym in _COMPARE.items()})
BINARY_BOOL_RESULT = ("logical_and", "logical_or") + tuple(_COMPARE)

# (from, to) -> C expression of x; same-dtype casts are copies ("copy_<dtype>").
CAST = {
    ("f32", "i32"): "trunc_f32_i32(x)", ("f32", "u8"): "(u8)(x != 0)",
    ("i32", "f32"): "(float)x", ("i32", "u8"): "(u8)(x != 0)",
    ("u8", "f32"): "(float)x", ("u8", "i32"): "(int)x",
}
# 8-bit storage: narrowing wraps around (two's complement, like NumPy); floats truncate first.
# Casts between bool or 8-bit dtypes have no kernel (the module's size budget): backend.py
# casts through int32.
_WRAP = {"i8": "(signed char)(u8)(unsigned)(%s)", "ui8": "(u8)(unsigned)(%s)"}
for _t in _WRAP:
    CAST.update({("f32", _t): _WRAP[_t] % "trunc_f32_i32(x)", ("i32", _t): _WRAP[_t] % "x",
                 (_t, "f32"): "(float)x", (_t, "i32"): "(int)x"})
# float16 converts to and from float32 only (runtime.h: round to nearest even); backend.py casts
# it to anything else through float32.
CAST.update({("f32", "f16"): "f32_to_f16(x)", ("f16", "f32"): "f16_to_f32(x)"})

# op -> {dtype: (initial value, C expression combining acc and x)}; an empty axis gives the
# initial value (sum 0, prod 1). max/min propagate NaN: once acc is NaN nothing replaces it.
REDUCE = {
    "sum": {"f32": ("0.0f", "acc + x"), "i32": ("0", "(int)((unsigned)acc + (unsigned)x)")},
    "prod": {"f32": ("1.0f", "acc * x"), "i32": ("1", "(int)((unsigned)acc * (unsigned)x)")},
    "max": {"f32": ("-INFINITY", "((x > acc || x != x) && acc == acc ? x : acc)"),
            "i32": ("INT_MIN", "(x > acc ? x : acc)"), "u8": ("0", "(u8)(acc | x)")},
    "min": {"f32": ("INFINITY", "((x < acc || x != x) && acc == acc ? x : acc)"),
            "i32": ("INT_MAX", "(x < acc ? x : acc)"), "u8": ("1", "(u8)(acc & x)")},
}
# op -> C condition for "x replaces the best so far" (first occurrence wins; the first NaN wins)
ARG_REDUCE = {"argmax": "x > best", "argmin": "x < best"}
ARG_DTYPES = ("f32", "i32", "u8")
# written by hand in runtime.h
HAND_WRITTEN = ["heap_base", "memory_grow", "memory_pages", "run_commands", "fill_32", "fill_8",
                "random_f32", "matmul_f32", "unfold2d_f32", "fold2d_f32", "conv2d_f32",
                "conv2d_grad_input_f32", "conv2d_grad_weight_f32", "conv2d_grad_bias_f32",
                "matmul_quantized", "conv2d_quantized", "dynamic_quantize_f32", "lstm_cell_f32", "gru_cell_f32",
                "quantize_dequantize_f32"]
GATHER_DTYPES = ("f32", "i32", "u8", "i8", "ui8", "f16")
SCATTER_ADD_DTYPES = ("f32", "i32")  # the add is BINARY["add"]


# Parameter kinds of the kernels that return nothing (p: pointer, i: int), by macro or name. These
# can be queued: the host appends (id, args...) to a command list in linear memory and one call
# of the generated run_commands() runs them all, so a model's forward pass is one host call.
_MACRO_PARAMS = {"MAP1": "ppp", "MAP2": "pppp", "MAP3": "ppppp", "REDUCE": "ppiii", "ARG_REDUCE": "ppiii"}
HAND_WRITTEN_PARAMS = {"fill_32": "pii", "fill_8": "pii", "random_f32": "piii",
                       "matmul_f32": "pppiiiiiii", "unfold2d_f32": "pppi", "fold2d_f32": "ppp",
                       "conv2d_f32": "pppppp", "matmul_quantized": "pppppppp", "conv2d_quantized": "ppppppppp",
                       "dynamic_quantize_f32": "ppppi", "lstm_cell_f32": "pppii",
                       "gru_cell_f32": "ppppii", "conv2d_grad_input_f32": "ppppp",
                       "conv2d_grad_weight_f32": "ppppp", "conv2d_grad_bias_f32": "ppiii",
                       "quantize_dequantize_f32": "ppppppp"}


def queued_kernels():
    """[(name, parameter kinds)] in command-id order (the id is the index)."""
    out = []
    for macro, name in _instances():
        if macro in _MACRO_PARAMS:
            out.append((name, _MACRO_PARAMS[macro]))
    return out + sorted(HAND_WRITTEN_PARAMS.items())


def _instances():
    """(macro, kernel name) of every generated kernel, in source order."""
    return [(line.split("(", 1)[0], line.split("(", 1)[1].split(",", 1)[0]) for line in _macro_lines()]


def kernel_names():
    """Every exported kernel name, for the coverage test and for error messages."""
    names = ["unary_%s_%s" % (op, t) for op, e in UNARY.items() for t in e]
    names += ["binary_%s_%s" % (op, t) for op, e in BINARY.items() for t in e]
    names += ["where_%s" % t for t in C_TYPE] + ["copy_%s" % t for t in {**C_TYPE, **STORAGE_C_TYPE}]
    names += ["cast_%s_%s" % pair for pair in CAST]
    names += ["reduce_%s_%s" % (op, t) for op, e in REDUCE.items() for t in e]
    names += ["reduce_%s_%s" % (op, t) for op in ARG_REDUCE for t in ARG_DTYPES]
    names += ["gather_%s" % t for t in GATHER_DTYPES] + ["scatter_add_%s" % t for t in SCATTER_ADD_DTYPES]
    names += HAND_WRITTEN
    return names


def source(runtime_h):
    """The whole C translation unit: runtime.h, one macro instance per table entry, and the
    command interpreter over the queued kernels."""
    lines = [runtime_h, "/* ---- generated by wasm_backend/kernels.py from its op tables ---- */"]
    lines += _macro_lines()
    lines += ["", "EXPORT(run_commands) void run_commands(const int *c, int n) {",
              "    const int *end = c + n;",
              "    while (c < end) {",
              "        switch (*c++) {"]
    for index, (name, params) in enumerate(queued_kernels()):
        args = ", ".join(("AT(c[%d])" if kind == "p" else "c[%d]") % i for i, kind in enumerate(params))
        lines.append("        case %d: %s(%s); c += %d; break;" % (index, name, args, len(params)))
    lines += ["        default: __builtin_trap();", "        }", "    }", "}"]
    return "\n".join(lines) + "\n"


def _macro_lines():
    lines = []
    for op, exprs in UNARY.items():
        for t, expr in exprs.items():
            to = UNARY_RESULT.get(op, t)
            lines.append("MAP1(unary_%s_%s, %s, %s, %s)" % (op, t, C_TYPE[to], C_TYPE[t], expr))
    for t, ct in C_TYPE.items():
        lines.append("MAP1(copy_%s, %s, %s, x)" % (t, ct, ct))
        lines.append("MAP3(where_%s, %s, u8, %s, %s, (c ? a : b))" % (t, ct, ct, ct))
    for t, ct in STORAGE_C_TYPE.items():
        lines.append("MAP1(copy_%s, %s, %s, x)" % (t, ct, ct))
    types = {**C_TYPE, **STORAGE_C_TYPE}
    for (a, b), expr in CAST.items():
        lines.append("MAP1(cast_%s_%s, %s, %s, %s)" % (a, b, types[b], types[a], expr))
    for op, exprs in BINARY.items():
        for t, expr in exprs.items():
            to = "u8" if op in BINARY_BOOL_RESULT else t
            lines.append("MAP2(binary_%s_%s, %s, %s, %s)" % (op, t, C_TYPE[to], C_TYPE[t], expr))
    for op, exprs in REDUCE.items():
        for t, (init, combine) in exprs.items():
            lines.append("REDUCE(reduce_%s_%s, %s, %s, %s)" % (op, t, C_TYPE[t], init, combine))
    for op, better in ARG_REDUCE.items():
        for t in ARG_DTYPES:
            lines.append("ARG_REDUCE(reduce_%s_%s, %s, %s)" % (op, t, C_TYPE[t], better))
    for t in GATHER_DTYPES:
        lines.append("GATHER(gather_%s, %s)" % (t, types[t]))
    for t in SCATTER_ADD_DTYPES:
        lines.append("SCATTER_ADD(scatter_add_%s, %s, %s)" % (t, C_TYPE[t], BINARY["add"][t]))
    return lines
