"""The WGSL side of the op table (core/ops.py): one expression per (op, operand kind) for the
elementwise ops, and identity / combine / comparison per reduction. Kernels are generated from
these entries alone (program.py), so a new op is one line here.

Operand kinds are `DType.kind`: f (f32), i (i32), b (bool held in a u32 as 0/1).
"""

from cinders.dtypes import COMPUTE_DTYPES

from .prelude import zero

_DTYPE_OF_KIND = {d.kind: d for d in COMPUTE_DTYPES}  # cast_<kind> names its target by kind

# {a} {b} {c} are the operand values; kinds f (f32), i (i32), b (u32 bool).
_ARITH = {
    "add": {"f": "{a} + {b}", "i": "{a} + {b}", "b": "{a} | {b}"},
    "sub": {"f": "{a} - {b}", "i": "{a} - {b}", "b": "{a} ^ {b}"},
    "mul": {"f": "{a} * {b}", "i": "{a} * {b}", "b": "{a} & {b}"},
    "div": {"f": "{a} / {b}", "i": "floordiv_i({a}, {b})"},
    "pow": {"f": "pow_f({a}, {b})"},
    "maximum": {"f": "fmax_f({a}, {b})", "i": "max({a}, {b})", "b": "max({a}, {b})"},
    "minimum": {"f": "fmin_f({a}, {b})", "i": "min({a}, {b})", "b": "min({a}, {b})"},
    "floordiv": {"f": "floor({a} / {b})", "i": "floordiv_i({a}, {b})"},
    "mod": {"f": "mod_f({a}, {b})", "i": "mod_i({a}, {b})"},
}
# `a != b` compiles to an *ordered* comparison (false for NaN), so ne is written !(a == b).
_CMP = {"eq": "{a} == {b}", "ne": "!({a} == {b})", "lt": "{a} < {b}", "le": "{a} <= {b}",
        "gt": "{a} > {b}", "ge": "{a} >= {b}"}
_UNARY = {
    "neg": {"f": "-{a}", "i": "-{a}"},
    "exp": {"f": "exp_f({a})"}, "log": {"f": "log_f({a})"}, "sqrt": {"f": "sqrt({a})"},
    "sin": {"f": "sin({a})"}, "cos": {"f": "cos({a})"}, "tanh": {"f": "tanh_f({a})"},
    "erf": {"f": "erf_f({a})"},
    "asin": {"f": "asin_f({a})"}, "acos": {"f": "acos_f({a})"}, "atan": {"f": "atan_f({a})"},
    "abs": {"f": "abs({a})", "i": "abs({a})", "b": "{a}"},
    "floor": {"f": "floor({a})", "i": "{a}", "b": "{a}"},
    "ceil": {"f": "ceil({a})", "i": "{a}", "b": "{a}"},
    # WGSL round() rounds half to even, as NumPy and PyTorch do.
    "round": {"f": "round({a})", "i": "{a}", "b": "{a}"},
    "copy": {"f": "{a}", "i": "{a}", "b": "{a}"},
}




def op_expression(op, operand_dtypes):
    """WGSL expression template of an elementwise op over operands of the given dtypes: {a}
    {b} {c} stand for the operand values."""
    k = operand_dtypes[0].kind
    if op in _UNARY:
        return _UNARY[op][k]
    if op == "logical_not":
        return "u32({a} == %s)" % zero(operand_dtypes[0].wgsl)
    if op in _ARITH:
        return _ARITH[op][k]
    if op in _CMP:
        return "u32(%s)" % _CMP[op]
    if op in ("logical_and", "logical_or"):
        z = zero(operand_dtypes[0].wgsl)
        return "u32(!({a} == %s) %s !({b} == %s))" % (z, "&&" if op == "logical_and" else "||", z)
    if op == "where":
        return "select({c}, {b}, {a} != 0u)"
    if op.startswith("cast_"):
        return _cast(operand_dtypes[0], op[5:])
    raise KeyError(op)


def _cast(src, dst_kind):
    # A storage target (cast_u: uint8) is computed as its compute dtype's value; the store
    # narrows it (packing.py).
    dst_kind = {"u": "i"}.get(dst_kind, dst_kind)
    if src.kind == dst_kind:
        return "{a}"
    if dst_kind == "b":
        return "u32(!({a} == %s))" % zero(src.wgsl)  # NaN -> True
    return "%s({a})" % _DTYPE_OF_KIND[dst_kind].wgsl  # f32(i32); i32(f32) truncates toward 0


# ---- reductions ----------------------------------------------------------------------------
# sum/prod/max/min fold with an identity; argmax/argmin keep the best value and its index.
# -inf / +inf are bitcast from a `var` (Tint rejects infinities in constant expressions):
# reduction code declares `var inf_bits = 0x7f800000u;` before using them.
REDUCE_IDENTITY = {
    "sum": {"f": "0.0", "i": "0i", "b": "0u"},
    "prod": {"f": "1.0", "i": "1i", "b": "1u"},
    "max": {"f": "bitcast<f32>(inf_bits | 0x80000000u)", "i": "bitcast<i32>(0x80000000u)", "b": "0u"},
    "min": {"f": "bitcast<f32>(inf_bits)", "i": "bitcast<i32>(0x7fffffffu)", "b": "1u"},
}
REDUCE_IDENTITY["argmax"], REDUCE_IDENTITY["argmin"] = REDUCE_IDENTITY["max"], REDUCE_IDENTITY["min"]
REDUCE_COMBINE = {
    "sum": {"f": "{a} + {b}", "i": "{a} + {b}", "b": "max({a}, {b})"},
    "prod": {"f": "{a} * {b}", "i": "{a} * {b}", "b": "min({a}, {b})"},
    "max": {"f": "fmax_f({a}, {b})", "i": "max({a}, {b})", "b": "max({a}, {b})"},  # NaN wins
    "min": {"f": "fmin_f({a}, {b})", "i": "min({a}, {b})", "b": "min({a}, {b})"},
}


def reduce_better(op, kind):
    """argmax/argmin: WGSL template, true when {v} beats the best so far {b}. NaN wins (the first
    NaN is the answer, like NumPy)."""
    better = "({v} > {b})" if op == "argmax" else "({v} < {b})"
    if kind == "f":
        better = "((isnan_f({v}) && !isnan_f({b})) || (!isnan_f({b}) && %s))" % better
    return better


def reduce_ties(kind):
    """argmax/argmin: WGSL template, true when {v} equals the best so far {b} (NaN equals NaN)."""
    return "({v} == {b} || (isnan_f({v}) && isnan_f({b})))" if kind == "f" else "({v} == {b})"
