"""WGSL generation: every kernel of the Wgpu backend comes from the generators in this file.

Conventions (see device.py): binding 0 is the uniform parameter block P, an array of vec4<u32>;
bindings 1.. are storage buffers. Shapes, strides and offsets travel in P (counted in elements),
so one compiled pipeline serves every shape of the same rank; ranks, dtypes, ops and tile sizes
are baked into the source (they are the pipeline cache key).

Each generator `foo_wgsl(...)` sits next to `foo_params(...)`, which lays out P in the order the
generated code reads it. Dtypes: float32 -> f32, int32 -> i32, bool -> u32 holding 0/1.

1-D launches use up to 65535 workgroups in x and spill into y (WebGPU's per-dimension limit);
`groups_for(n, wg)` gives the counts and `LINEAR_ID` recovers the linear invocation index.
"""

from cinders import dtypes

WGSL_TYPE = {dtypes.float32: "f32", dtypes.int32: "i32", dtypes.bool_: "u32"}
ZERO = {"f32": "0.0", "i32": "0i", "u32": "0u"}
KIND = {dtypes.float32: "f", dtypes.int32: "i", dtypes.bool_: "b"}
WG = 256            # elementwise workgroup size
MAX_GROUPS = 65535  # WebGPU's default maxComputeWorkgroupsPerDimension


def groups_for(n, per_group):
    total = max(1, -(-n // per_group))
    x = min(total, MAX_GROUPS)
    return (x, -(-total // x), 1)


def _p(i):
    """The WGSL expression reading parameter i (u32) from the uniform block."""
    return "P.v[%d][%d]" % (i // 4, i % 4)


class ParamLayout:
    """A kernel's uniform parameters by name. One list of fields orders both the packer
    (`pack(name=value, ...)` -> the u32 list) and the generated code (`P[name]`, `P[name, i]`),
    so the two cannot drift apart. A field is a name (one u32) or (name, count) (an array)."""

    def __init__(self, *fields):
        self.fields, at = [], 0
        for field in fields:
            name, count = (field, None) if isinstance(field, str) else field
            self.fields.append((name, at, count))
            at += 1 if count is None else count
        self.size = at
        self._at = {name: (start, count) for name, start, count in self.fields}

    def __getitem__(self, key):
        """The WGSL expression reading field `name`, or element i of array field (name, i)."""
        name, i = key if isinstance(key, tuple) else (key, None)
        start, count = self._at[name]
        if (i is None) != (count is None) or (i is not None and not 0 <= i < count):
            raise KeyError("parameter %r has %s elements, asked for %r" % (name, count, i))
        return _p(start if i is None else start + i)

    def pack(self, **values):
        out = []
        for name, _, count in self.fields:
            value = values.pop(name)
            if count is None:
                out.append(int(value))
            else:
                value = [int(v) for v in value]
                if len(value) != count:
                    raise ValueError("parameter %r takes %d values, got %d" % (name, count, len(value)))
                out += value
        if values:
            raise TypeError("unknown kernel parameters %s" % sorted(values))
        return out


def _header(n_params, buffers, shared=""):
    """Uniform block, storage bindings [(name, wgsl_type, writable)], helpers, entry point."""
    lines = ["struct Params { v: array<vec4<u32>, %d> }" % max(1, -(-n_params // 4)),
             "@group(0) @binding(0) var<uniform> P: Params;"]
    for b, (name, ty, writable) in enumerate(buffers, start=1):
        access = "read_write" if writable else "read"
        lines.append("@group(0) @binding(%d) var<storage, %s> %s: array<%s>;" % (b, access, name, ty))
    lines.append(shared)
    return "\n".join(lines) + "\n"


_ENTRY_1D = """
@compute @workgroup_size(%d)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * %du;
"""


def _entry_1d(wg=WG):
    return _ENTRY_1D % (wg, wg)


def _unravel(index, shape_p, ndim, prefix="c"):
    """Lines computing coordinates c0..c{ndim-1} of a row-major linear `index`;
    shape_p(d) gives the WGSL expression of dim d's size."""
    if ndim == 0:
        return ""
    lines = ["  var rem_%s = %s;" % (prefix, index)]
    for d in reversed(range(ndim)):
        lines.append("  let %s%d = rem_%s %% %s; rem_%s = rem_%s / %s;"
                     % (prefix, d, prefix, shape_p(d), prefix, prefix, shape_p(d)))
    return "\n".join(lines) + "\n"


def _dot(offset, coords, strides):
    """WGSL for offset + sum(coord * stride)."""
    return " + ".join([offset] + ["%s * %s" % (c, s) for c, s in zip(coords, strides)])


# ---- helper functions, emitted only when an expression names them ------------------------
HELPERS = {
    "isnan_f": "fn isnan_f(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u; }",
    "fmax_f": "fn fmax_f(a: f32, b: f32) -> f32 { if (isnan_f(a)) { return a; } "
              "if (isnan_f(b)) { return b; } return max(a, b); }",
    "fmin_f": "fn fmin_f(a: f32, b: f32) -> f32 { if (isnan_f(a)) { return a; } "
              "if (isnan_f(b)) { return b; } return min(a, b); }",
    # tanh through exp overflows to NaN for large |x| on some drivers; clamp where it is +-1.
    "tanh_f": "fn tanh_f(x: f32) -> f32 { if (isnan_f(x)) { return x; } "
              "return tanh(clamp(x, -15.0, 15.0)); }",
    # WGSL pow is exp2(b*log2(a)): undefined for a < 0. NumPy: integer b keeps the sign rule.
    # asin/acos/atan from one atan (Cephes' single-precision range reduction and polynomial):
    # the drivers' own are as coarse as 1e-4 (lavapipe), and leave |x| > 1 undefined (NaN here).
    "atan_f": """fn atan_f(a: f32) -> f32 {
  var x = abs(a);
  var base = 0.0;
  if (x > 2.414213562373095) { base = 1.5707963267948966; x = -1.0 / x; }
  else if (x > 0.4142135623730950) { base = 0.7853981633974483; x = (x - 1.0) / (x + 1.0); }
  let z = x * x;
  let r = base + ((((8.05374449538e-2 * z - 1.38776856032e-1) * z + 1.99777106478e-1) * z
                   - 3.33329491539e-1) * z * x + x);
  return select(r, -r, a < 0.0);
}""",
    "asin_f": """fn asin_f(a: f32) -> f32 {
  if (!(abs(a) <= 1.0)) { let nan_bits = 0x7fc00000u; return bitcast<f32>(nan_bits); }
  return atan_f(a / sqrt((1.0 - a) * (1.0 + a)));
}""",
    "acos_f": """fn acos_f(a: f32) -> f32 {
  if (!(abs(a) <= 1.0)) { let nan_bits = 0x7fc00000u; return bitcast<f32>(nan_bits); }
  return 2.0 * atan_f(sqrt((1.0 - a) / (1.0 + a)));
}""",
    "pow_f": """fn pow_f(a: f32, b: f32) -> f32 {
  if (b == 0.0) { return 1.0; }
  let r = pow(abs(a), b);
  if (a < 0.0) {
    if (floor(b) != b) {
      // a negative base to a non-integer power is NaN, except -inf (C99/NumPy/torch: inf or 0)
      if (bitcast<u32>(a) == 0xff800000u) { return r; }
      let nan_bits = 0x7fc00000u;
      return bitcast<f32>(nan_bits);
    }
    if (fract(b * 0.5) != 0.0) { return -r; }
  }
  return r;
}""",
    # Python/NumPy modulo: the result takes the sign of the divisor.
    "mod_f": """fn mod_f(a: f32, b: f32) -> f32 {
  let r = a - b * trunc(a / b);
  if (r != 0.0 && ((r < 0.0) != (b < 0.0))) { return r + b; }
  return r;
}""",
    "floordiv_i": """fn floordiv_i(a: i32, b: i32) -> i32 {
  if (b == 0i) { return 0i; }
  let q = a / b;
  if ((a % b != 0i) && ((a < 0i) != (b < 0i))) { return q - 1i; }
  return q;
}""",
    "mod_i": """fn mod_i(a: i32, b: i32) -> i32 {
  if (b == 0i) { return 0i; }
  let r = a % b;
  if (r != 0i && ((r < 0i) != (b < 0i))) { return r + b; }
  return r;
}""",
    # WGSL has no erf. Norbert Juffa's erff (as in CUDA and MLX; error < 1 ulp): two minimax
    # polynomials in fma Horner form, both evaluated and one selected. No branch: a warp of
    # mixed inputs runs both sides anyway, and GELU is bandwidth-bound only if erf is cheap.
    # t is clamped at 4 (erf rounds to 1 there) so exp never sees -inf; NaN takes the small side.
    "erf_f": """fn erf_f(x: f32) -> f32 {
  let s = x * x;
  let small = fma(fma(fma(fma(fma(fma(-5.96761703e-4, s, 4.99119423e-3), s, -2.67681349e-2), s,
                  1.12819925e-1), s, -3.76125336e-1), s, 1.28379166e-1), x, x);
  let t = min(abs(x), 4.0);
  var r = fma(fma(-1.72853470e-5, t, 3.83197126e-4), t * t, fma(-3.88396438e-3, t, 2.42546219e-2));
  r = fma(fma(fma(fma(r, t, -1.06777877e-1), t, -6.34846687e-1), t, -1.28717512e-1), t, -t);
  let big = bitcast<f32>(bitcast<u32>(1.0 - exp(r)) | (bitcast<u32>(x) & 0x80000000u));
  return select(small, big, abs(x) > 0.927734375);
}""",
    # SwiftShader's exp/log do not propagate NaN/inf; NaN and inf must come from runtime values
    # (`let`): Chrome's WGSL compiler rejects a constant expression that evaluates to NaN or inf.
    "exp_f": "fn exp_f(x: f32) -> f32 { if (isnan_f(x)) { return x; } return exp(x); }",
    "log_f": """fn log_f(x: f32) -> f32 {
  if (isnan_f(x)) { return x; }
  if (x < 0.0) { let nan_bits = 0x7fc00000u; return bitcast<f32>(nan_bits); }
  if (x == 0.0) { let minus_inf = 0xff800000u; return bitcast<f32>(minus_inf); }
  if (bitcast<u32>(x) == 0x7f800000u) { return x; }
  return log(x);
}""",
    "hash32": """fn hash32(v: u32) -> u32 {
  var x = v;
  x = x ^ (x >> 16u); x = x * 0x7feb352du; x = x ^ (x >> 15u); x = x * 0x846ca68bu;
  return x ^ (x >> 16u);
}""",
}
_HELPER_DEPS = {"fmax_f": ("isnan_f",), "fmin_f": ("isnan_f",), "tanh_f": ("isnan_f",),
                "exp_f": ("isnan_f",), "log_f": ("isnan_f",), "asin_f": ("atan_f",), "acos_f": ("atan_f",)}


def _helpers_for(source):
    names = []
    for name in HELPERS:
        if name + "(" in source:
            for dep in _HELPER_DEPS.get(name, ()) + (name,):
                if dep not in names:
                    names.append(dep)
    return "\n".join(HELPERS[n] for n in names) + "\n"


# ---- the op table: one WGSL expression per (op, operand kind) ----------------------------
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


def op_expression(op, kinds):
    """WGSL expression for an elementwise op over operands of the given kinds (a, b, c)."""
    k = kinds[0]
    if op in _UNARY:
        return _UNARY[op][k]
    if op == "logical_not":
        return "u32({a} == %s)" % ZERO[_KIND_TYPE[k]]
    if op in _ARITH:
        return _ARITH[op][k]
    if op in _CMP:
        return "u32(%s)" % _CMP[op]
    if op in ("logical_and", "logical_or"):
        z = ZERO[_KIND_TYPE[k]]
        return "u32(!({a} == %s) %s !({b} == %s))" % (z, "&&" if op == "logical_and" else "||", z)
    if op == "where":
        return "select({c}, {b}, {a} != 0u)"
    if op.startswith("cast_"):
        return _cast(k, op[5:])
    raise KeyError(op)


_KIND_TYPE = {"f": "f32", "i": "i32", "b": "u32"}


def _cast(src, dst):
    if src == dst:
        return "{a}"
    if dst == "b":
        return "u32(!({a} == %s))" % ZERO[_KIND_TYPE[src]]  # NaN -> True
    return "%s({a})" % _KIND_TYPE[dst]  # f32(i32), i32(f32) truncates toward zero, f32(u32)...


# ---- elementwise ---------------------------------------------------------------------------
def elementwise_wgsl(op, in_types, out_type, ndim, layouts, out_strided=False, inplace=None):
    """One thread per output element. layouts[k]: "c" operand k is contiguous with the output's
    shape (read at offset + i), "s" strided (broadcast/view: read through its strides).
    out_strided: the output is itself a strided view (copies into cat/pad destinations).
    inplace=k: the output is written into operand k's buffer (declared read_write)."""
    kinds = [{"f32": "f", "i32": "i", "u32": "b"}[t] for t in in_types]
    expr = op_expression(op, kinds)
    n_in = len(in_types)
    buffers = [("in%d" % k, t, k == inplace) for k, t in enumerate(in_types)]
    if inplace is None:
        buffers.append(("out", out_type, True))
    layout = _elementwise_layout(n_in, ndim, out_strided)
    body = ["  if (i >= %s) { return; }" % _p(0)]
    need_coords = out_strided or "s" in layouts
    code = _unravel("i", lambda d: _p(layout["shape"] + d), ndim) if need_coords else ""
    coords = ["c%d" % d for d in range(ndim)]
    values = {}
    for k in range(n_in):
        base = layout["inputs"][k]
        if layouts[k] == "c":
            index = "%s + i" % _p(base)
        else:
            index = _dot(_p(base), coords, [_p(base + 1 + d) for d in range(ndim)])
        body.append("  let v%d = in%d[%s];" % (k, k, index))
        values["abc"[k]] = "v%d" % k
    out_index = _dot(_p(1), coords, [_p(layout["out_strides"] + d) for d in range(ndim)]) \
        if out_strided else "%s + i" % _p(1)
    target = "in%d" % inplace if inplace is not None else "out"
    body.append("  %s[%s] = %s;" % (target, out_index, expr.format(**values)))
    src = _header(layout["count"], buffers) + _entry_1d() + code + "\n".join(body) + "\n}\n"
    return _helpers_for(src) + src


def _elementwise_layout(n_in, ndim, out_strided):
    # P: n, out_offset, shape[ndim], (out_strides[ndim]), per input: offset, strides[ndim]
    shape = 2
    out_strides = shape + ndim
    first = out_strides + (ndim if out_strided else 0)
    inputs = [first + k * (1 + ndim) for k in range(n_in)]
    return {"shape": shape, "out_strides": out_strides, "inputs": inputs,
            "count": first + n_in * (1 + ndim)}


def elementwise_params(n, out_offset, shape, out_strides, inputs, out_strided=False):
    """inputs: [(offset, strides)] in operand order."""
    params = [n, out_offset] + list(shape)
    if out_strided:
        params += list(out_strides)
    for offset, strides in inputs:
        params += [offset] + list(strides)
    return params


# ---- fill and random -----------------------------------------------------------------------
def fill_wgsl(out_type):
    """out[i] = the value whose bits are P[1] (P: n, bits)."""
    src = _header(2, [("out", out_type, True)]) + _entry_1d() + \
        "  if (i >= %s) { return; }\n  out[i] = bitcast<%s>(%s);\n}\n" % (_p(0), out_type, _p(1))
    return src


def random_wgsl(distribution):
    """The RANDOM generator of core/backend.py (P: n, key). Uniform draws are bit-exact."""
    body = "  if (i >= %s) { return; }\n" % _p(0)
    body += "  let key = %s;\n" % _p(1)
    if distribution == "uniform":
        body += "  out[i] = f32(hash32(i ^ key) >> 8u) * 5.9604644775390625e-8;\n"
    else:
        body += ("  let u1 = f32(hash32((2u * i) ^ key) >> 8u) * 5.9604644775390625e-8;\n"
                 "  let u2 = f32(hash32((2u * i + 1u) ^ key) >> 8u) * 5.9604644775390625e-8;\n"
                 "  out[i] = sqrt(-2.0 * log(1.0 - u1)) * cos(6.283185307179586 * u2);\n")
    src = _header(2, [("out", "f32", True)]) + _entry_1d() + body + "}\n"
    return _helpers_for(src) + src


# ---- reductions ----------------------------------------------------------------------------
REDUCE_WG = 64


def reduce_wgsl(op, in_type, ndim, threads):
    """Reduce one axis. Output contiguous over the other ndim-1 dims (P: n_out, axis_len,
    axis_stride, in_offset, outer_shape[ndim-1], outer_strides[ndim-1]).
    threads=1: one invocation per output loops over the axis (short axes, many outputs);
    threads=REDUCE_WG: one workgroup per output, strided partial results, tree in shared memory."""
    outer = ndim - 1
    arg = op in ("argmax", "argmin")
    out_type = "i32" if arg else in_type
    acc_type = in_type
    kind = {"f32": "f", "i32": "i", "u32": "b"}[in_type]
    if op in ("max", "argmax"):
        better = "({v} > {b})"
    else:
        better = "({v} < {b})"
    if kind == "f":
        # NaN wins (propagates; argmax/argmin point at the first NaN, like NumPy).
        better = "((isnan_f({v}) && !isnan_f({b})) || (!isnan_f({b}) && %s))" % better
    cmp = better.format(v="v", b="best")
    tie = better.format(v="ov", b="best")
    tie_eq = "(ov == best || (isnan_f(ov) && isnan_f(best)))" if kind == "f" else "(ov == best)"

    lines = []
    if threads == 1:
        lines.append(_entry_1d() + "  if (i >= %s) { return; }\n  let o = i;" % _p(0))
        tid, step = "0u", "1u"
    else:
        lines.append("""
@compute @workgroup_size(%d)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
  let o = wid.x + wid.y * nwg.x;
  let t = lid.x;""" % threads)
        tid, step = "t", "%du" % threads
    coords = ["c%d" % d for d in range(outer)]
    lines.append(_unravel("o", lambda d: _p(4 + d), outer))
    lines.append("  let base = %s;" % _dot(_p(3), coords, [_p(4 + outer + d) for d in range(outer)]))
    lines.append("  let alen = %s; let st = %s;" % (_p(1), _p(2)))
    if op in ("sum", "prod"):
        identity = {"sum": "0", "prod": "1"}[op]
        init = {"f": identity + ".0", "i": identity + "i", "b": identity + "u"}[kind]
        combine = "acc = acc + v;" if op == "sum" else "acc = acc * v;"
        lines.append("  var acc: %s = %s;" % (acc_type, init))
        lines.append("  for (var k = %s; k < alen; k = k + %s) { let v = inp[base + k * st]; %s }"
                     % (tid, step, combine))
        if threads > 1:
            lines.append("  red[t] = acc; workgroupBarrier();")
            lines.append("  for (var s = %du; s > 0u; s = s >> 1u) {" % (threads // 2))
            lines.append("    if (t < s) { %s }" % combine.replace("v;", "red[t + s]; red[t] = acc;"))
            lines.append("    workgroupBarrier();\n  }")
            lines.append("  if (t != 0u || o >= %s) { return; }" % _p(0))
        result = "acc"
        if kind == "b":
            result = "min(acc, 1u)"
        lines.append("  out[o] = %s;" % result)
    else:
        # The first element each thread sees seeds it (max/min have no finite identity);
        # threads past the axis re-read element 0, harmless for max/min/arg* (index ties go low).
        lines.append("  let k0 = select(0u, %s, %s < alen);" % (tid, tid))
        lines.append("  var best = inp[base + k0 * st]; var bi = k0;")
        lines.append("  for (var k = k0 + %s; k < alen; k = k + %s) {" % (step, step))
        lines.append("    let v = inp[base + k * st];")
        lines.append("    if %s { best = v; bi = k; }\n  }" % cmp)
        if threads > 1:
            lines.append("  red[t] = best; redi[t] = bi; workgroupBarrier();")
            lines.append("  for (var s = %du; s > 0u; s = s >> 1u) {" % (threads // 2))
            lines.append("    if (t < s) {")
            lines.append("      let ov = red[t + s]; let oi = redi[t + s];")
            lines.append("      if (%s || (%s && oi < bi)) { best = ov; bi = oi; red[t] = ov; redi[t] = oi; }"
                         % (tie, tie_eq))
            lines.append("    }\n    workgroupBarrier();\n  }")
            lines.append("  if (t != 0u || o >= %s) { return; }" % _p(0))
        lines.append("  out[o] = %s;" % ("i32(bi)" if arg else "best"))
    shared = ""
    if threads > 1:
        shared = "var<workgroup> red: array<%s, %d>;" % (acc_type, threads)
        if op not in ("sum", "prod"):
            shared += "\nvar<workgroup> redi: array<u32, %d>;" % threads
    src = _header(4 + 2 * outer, [("inp", in_type, False), ("out", out_type, True)], shared)
    src += "\n".join(lines) + "\n}\n"
    return _helpers_for(src) + src


def reduce_params(n_out, axis_len, axis_stride, offset, outer_shape, outer_strides):
    return [n_out, axis_len, axis_stride, offset] + list(outer_shape) + list(outer_strides)


# ---- matmul --------------------------------------------------------------------------------
# The three matmul kernels (shared-memory tiles, register tiles double-buffered, direct) are one
# template: the same parameters, prologue, bounds-checked global loads and stores of C; each
# contributes only its entry point, its staging and its inner loop.

def matmul_layout(nbatch):
    """P of every matmul kernel; an epilogue's own parameters follow (matmul_param_count)."""
    return ParamLayout("M", "N", "K", "kchunk", "a_off", "b_off", "a_sm", "a_sk", "b_sk", "b_sn",
                       "nbatch", ("batch", nbatch), ("a_bstride", nbatch), ("b_bstride", nbatch))


def matmul_param_count(nbatch, epilogue=None):
    return matmul_layout(nbatch).size + (0 if epilogue is None else epilogue.n_params)


def matmul_params(m, n, k, kchunk, a_off, b_off, a_sm, a_sk, b_sk, b_sn, batch_shape,
                  a_bstrides, b_bstrides):
    nb = 1
    for s in batch_shape:
        nb *= s
    return matmul_layout(len(batch_shape)).pack(
        M=m, N=n, K=k, kchunk=kchunk, a_off=a_off, b_off=b_off, a_sm=a_sm, a_sk=a_sk, b_sk=b_sk,
        b_sn=b_sn, nbatch=nb, batch=batch_shape, a_bstride=a_bstrides, b_bstride=b_bstrides)


def _matmul_prologue(nbatch):
    """Sizes, this workgroup's split and batch element (grid z = batch * splits), the operands'
    base offsets and strides, its range of k."""
    P = matmul_layout(nbatch)
    lines = ["  let M = %s; let N = %s; let K = %s; let kchunk = %s;" % (
        P["M"], P["N"], P["K"], P["kchunk"]),
        "  let z = wid.z; let nb = %s;" % P["nbatch"],
        "  let split = z / nb; let bz = z % nb;"]
    lines.append(_unravel("bz", lambda d: P["batch", d], nbatch, "b"))
    bc = ["b%d" % d for d in range(nbatch)]
    for name, off, strides in (("a_base", "a_off", "a_bstride"), ("b_base", "b_off", "b_bstride")):
        lines.append("  let %s = %s;" % (name, _dot(P[off], bc, [P[strides, d] for d in range(nbatch)])))
    lines.append("  let a_sm = %s; let a_sk = %s; let b_sk = %s; let b_sn = %s;"
                 % (P["a_sm"], P["a_sk"], P["b_sk"], P["b_sn"]))
    lines.append("  let k_begin = split * kchunk; let k_end = min(K, k_begin + kchunk);")
    return lines


def _a_at(gm, gk, vec):
    """WGSL reading A[gm, gk] (with vec: the vec4 of A[gm, gk..gk+3], k-contiguous)."""
    return "A[(a_base + %s * a_sm + %s) / 4u]" % (gm, gk) if vec else \
        "A[a_base + %s * a_sm + %s * a_sk]" % (gm, gk)


def _b_at(gk, gn, vec):
    """WGSL reading B[gk, gn] (with vec: the vec4 of B[gk, gn..gn+3], n-contiguous)."""
    return "B[(b_base + %s * b_sk + %s) / 4u]" % (gk, gn) if vec else \
        "B[b_base + %s * b_sk + %s * b_sn]" % (gk, gn)


def _load(dst, zero, inside, expr, exact):
    """dst = expr, or zero where the element lies outside (checked only for ragged tiles;
    zero None: dst already holds it)."""
    if exact:
        return "%s = %s;" % (dst, expr)
    reset = "" if zero is None else "%s = %s; " % (dst, zero)
    return "%sif (%s) { %s = %s; }" % (reset, inside, dst, expr)


def _c_store(index, value, vec, epilogue):
    """The WGSL storing `value` (a vec4 of 4 consecutive columns when vec) at C[index]; with an
    epilogue, the call of its `epilogue(acc, i)` per element instead (it writes its outputs)."""
    if epilogue is None:
        return "C[(%s) / 4u] = %s;" % (index, value) if vec else "C[%s] = %s;" % (index, value)
    if not vec:
        return "epilogue(%s, %s);" % (value, index)
    return "let ci = %s; %s" % (index, " ".join("epilogue(%s[%d], ci + %du);" % (value, j, j)
                                                 for j in range(4)))


def _store_tile(rows, cols, vec, exact, epilogue):
    """A thread's block of C. rows: [(WGSL of the row m, r)]; cols: [(WGSL of the column n,
    value(r) -> WGSL of the accumulator)], each a vec4 of columns n..n+3 when vec."""
    lines = ["  let c_base = z * M * N;"]
    for m, r in rows:
        lines.append("  { let m = %s;" % m)
        lines.append("    if (%s) {" % ("true" if exact else "m < M"))
        for n, value in cols:
            lines.append("      { let n = %s; if (%s) { %s } }" % (
                n, "true" if exact else "n < N",
                _c_store("c_base + m * N + n", value(r), vec, epilogue)))
        lines.append("    }\n  }")
    return lines


def _matmul_kernel(nbatch, vec_a, vec_b, epilogue, shared, entry, body, store):
    """The template: header (P, A, B, then C or the epilogue's buffers, workgroup memory), entry
    point, the shared prologue, the kernel's own body, its stores, the epilogue's function."""
    src = _header(matmul_param_count(nbatch, epilogue), _matmul_buffers(vec_a, vec_b, epilogue),
                  shared)
    lines = [entry] + _matmul_prologue(nbatch) + body + store
    src += "\n".join(lines) + "\n}\n"
    return src if epilogue is None else src + epilogue.source()


def _matmul_buffers(vec_a, vec_b, epilogue):
    """A, B, then C, or (with an epilogue) the epilogue's own buffers instead of C."""
    vec = lambda v: "vec4<f32>" if v else "f32"  # noqa: E731
    out = [("C", vec(vec_b), True)] if epilogue is None else list(epilogue.buffers)
    return [("A", vec(vec_a), False), ("B", vec(vec_b), False)] + out


def matmul_wgsl(nbatch, bm, bn, bk, tm, tn, vec_a=False, vec_b=False, exact=False, epilogue=None):
    """Batched C = A @ B, one template for every tiling: a workgroup of (bn/tn, bm/tm) threads
    computes a bm x bn tile; each thread a tm x tn block of registers (vec4 when tn is a
    multiple of 4) from bk-deep slices of A and B staged in shared memory. A and B are read
    through strides (transposed views need no copy). Split-K: grid z = batch * splits; split s
    covers k in [s*kchunk, (s+1)*kchunk) and writes its partial product into slab s of C.
    Specialisations (the caller checks they hold): vec_a: A is k-contiguous with every offset,
    row stride and K a multiple of 4, so A is read as vec4; vec_b: the same for B along n (then
    C, whose N is a multiple of 4, is written as vec4 too); exact: M, N, K (and every split) are
    multiples of the tile, so no bounds checks.
    epilogue (no split-K): an object with `source()` (WGSL defining `fn epilogue(acc: f32, i: u32)`
    that computes and writes the element at linear index i of batch x M x N from its product
    `acc`), `buffers` (bindings replacing C) and `n_params` (its parameters follow ours).
    P: matmul_layout(nbatch)."""
    wx, wy = bn // tn, bm // tm
    threads = wx * wy
    width = 4 if tn % 4 == 0 else 1
    vec_b = vec_b and width == 4
    groups = tn // width
    vt = "vec4<f32>" if width == 4 else "f32"
    shared = ("var<workgroup> As: array<f32, %d>;\nvar<workgroup> Bs: array<%s, %d>;"
              % (bk * bm, vt, bk * bn // width))
    entry = """
@compute @workgroup_size(%d, %d)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
  let tx = lid.x; let ty = lid.y; let t = ty * %du + tx;
  let m0 = wid.y * %du; let n0 = wid.x * %du;""" % (wx, wy, wx, bm, bn)
    body = ["  var acc: array<%s, %d>;" % (vt, tm * groups),
            "  for (var k0 = k_begin; k0 < k_end; k0 = k0 + %du) {" % bk]
    # Stage A[m0.., k0..] as As[kk * bm + mm] (k-major: the compute loop reads rows as a broadcast).
    if vec_a:
        body += ["    for (var e = t; e < %du; e = e + %du) {" % (bk * bm // 4, threads),
                 "      let mm = e / %du; let kq = (e %% %du) * 4u; let gm = m0 + mm; let gk = k0 + kq;"
                 % (bk // 4, bk // 4),
                 "      var v = vec4<f32>(0.0);",
                 "      " + _load("v", None, "gm < M && gk < k_end", _a_at("gm", "gk", True), exact)]
        body += ["      As[(kq + %du) * %du + mm] = v[%d];" % (j, bm, j) for j in range(4)]
        body.append("    }")
    else:
        body += ["    for (var e = t; e < %du; e = e + %du) {" % (bk * bm, threads),
                 "      let kk = e / %du; let mm = e %% %du; let gm = m0 + mm; let gk = k0 + kk;"
                 % (bm, bm),
                 "      var v = 0.0;",
                 "      " + _load("v", None, "gm < M && gk < k_end", _a_at("gm", "gk", False), exact),
                 "      As[e] = v;\n    }"]
    # Stage B[k0.., n0..] as Bs[kk * bn + nn] (vec4 over nn when width is 4).
    if vec_b:
        body += ["    for (var e = t; e < %du; e = e + %du) {" % (bk * bn // 4, threads),
                 "      let kk = e / %du; let gn = n0 + (e %% %du) * 4u; let gk = k0 + kk;"
                 % (bn // 4, bn // 4),
                 "      var v = vec4<f32>(0.0);",
                 "      " + _load("v", None, "gn < N && gk < k_end", _b_at("gk", "gn", True), exact),
                 "      Bs[e] = v;\n    }"]
    else:
        body += ["    for (var e = t; e < %du; e = e + %du) {" % (bk * bn, threads),
                 "      let kk = e / %du; let nn = e %% %du; let gn = n0 + nn; let gk = k0 + kk;"
                 % (bn, bn),
                 "      var v = 0.0;",
                 "      " + _load("v", None, "gn < N && gk < k_end", _b_at("gk", "gn", False), exact),
                 "      Bs[e / %du]%s = v;\n    }" % (width, "[e % 4u]" if width == 4 else "")]
    body += ["    workgroupBarrier();",
             "    for (var kk = 0u; kk < %du; kk = kk + 1u) {" % bk]
    body += ["      let bv%d = Bs[kk * %du + %du + tx];" % (g, bn // width, g * wx)
             for g in range(groups)]
    for r in range(tm):
        body.append("      let av%d = As[kk * %du + %du + ty];" % (r, bm, r * wy))
        body += ["      acc[%d] = fma(%s(av%d), bv%d, acc[%d]);"
                 % (r * groups + g, vt, r, g, r * groups + g) for g in range(groups)]
    body.append("    }\n    workgroupBarrier();\n  }")
    # Thread (tx, ty) owns rows m0 + r*wy + ty and columns n0 + (g*wx + tx)*width + j.
    rows = [("m0 + %du + ty" % (r * wy), r) for r in range(tm)]
    if vec_b:
        cols = [("n0 + (%du + tx) * 4u" % (g * wx),
                 lambda r, g=g: "acc[%d]" % (r * groups + g)) for g in range(groups)]
    else:
        comp = (lambda j: "[%d]" % j) if width == 4 else (lambda j: "")
        cols = [("n0 + (%du + tx) * %du + %du" % (g * wx, width, j),
                 lambda r, g=g, j=j: "acc[%d]%s" % (r * groups + g, comp(j)))
                for g in range(groups) for j in range(width)]
    return _matmul_kernel(nbatch, vec_a, vec_b, epilogue, shared, entry, body,
                          _store_tile(rows, cols, vec_b, exact, epilogue))


def matmul_regtile_wgsl(nbatch, bm, bn, bk, tm, tn, lanes_x, pad_a, vec_a=False, vec_b=False,
                        exact=False, epilogue=None):
    """Batched C = A @ B for large products (the register-tiled, double-buffered kernel).
    A workgroup of (bm/tm) * (bn/tn) threads computes a bm x bn tile of C; each thread a tm x tn
    block of registers (tm, tn multiples of 4) held as tm * tn/4 vec4 accumulators. Per bk-deep
    step A's slice is staged k-major (As[k][m], rows padded by pad_a vec4 against bank conflicts
    on the transposing stores) and B's as Bs[k][n], both as vec4, so every shared read in the fully
    unrolled inner loop is one vec4 of A (4 rows) or of B (4 columns) feeding 16 FMAs. Two
    shared buffers: the next slice is fetched from global memory into registers before the
    current one is multiplied and stored into the other buffer after it, one barrier per step.
    Thread t is placed so that a 32-lane warp covers lanes_x columns x 32/lanes_x rows of
    threads: few distinct shared addresses per warp-wide read (broadcasts). A thread's rows are
    m0 + i*4*wy + ty*4 + 0..3, its columns n0 + g*4*wx + tx*4 + 0..3 (vec4 stores of C).
    Same parameters, grid, split-K, specialisations (vec_a, vec_b, exact) and epilogue as
    matmul_wgsl."""
    wx, wy = bn // tn, bm // tm
    threads = wx * wy
    ri, gj = tm // 4, tn // 4           # vec4 groups of rows / columns per thread
    sa, sb = bm // 4 + pad_a, bn // 4   # shared row strides in vec4
    a_tile, b_tile = bk * sa, bk * sb   # vec4 per buffer
    shared = ("var<workgroup> As: array<vec4<f32>, %d>;\n"
              "var<workgroup> Bs: array<vec4<f32>, %d>;" % (2 * a_tile, 2 * b_tile))
    warps_x, lanes_y = wx // lanes_x, 32 // lanes_x
    entry = """
@compute @workgroup_size(%d)
fn main(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>) {
  let tx = t %% %du + %du * ((t / 32u) %% %du);
  let ty = (t / %du) %% %du + %du * (t / %du);
  let m0 = wid.y * %du; let n0 = wid.x * %du;""" % (
        threads, lanes_x, lanes_x, warps_x, lanes_x, lanes_y, lanes_y, 32 * warps_x, bm, bn)

    # Global -> registers: A as vec4 along k (row mm, k quad kq), B as vec4 along n.
    na, nbv = bm * bk // 4 // threads, bk * bn // 4 // threads
    assert na * threads * 4 == bm * bk and nbv * threads * 4 == bk * bn, "tile/thread mismatch"
    assert wx % lanes_x == 0 and wy % lanes_y == 0, "warp shape does not tile the threads"

    def fetch(k0):
        out = []
        for j in range(na):
            e = "(t + %du)" % (j * threads)
            out.append("    { let mm = %s / %du; let gm = m0 + mm; let gk = %s + (%s %% %du) * 4u;"
                       % (e, bk // 4, k0, e, bk // 4))
            if vec_a:
                out.append("      " + _load("pa%d" % j, "vec4<f32>(0.0)", "gm < M && gk < k_end",
                                            _a_at("gm", "gk", True), exact))
            for c in range(0 if vec_a else 4):
                out.append("      " + _load("pa%d[%d]" % (j, c), "0.0",
                                            "gm < M && gk + %du < k_end" % c,
                                            _a_at("gm", "(gk + %du)" % c, False), exact))
            out.append("    }")
        for j in range(nbv):
            e = "(t + %du)" % (j * threads)
            out.append("    { let gk = %s + %s / %du; let gn = n0 + (%s %% %du) * 4u;"
                       % (k0, e, bn // 4, e, bn // 4))
            if vec_b:
                out.append("      " + _load("pb%d" % j, "vec4<f32>(0.0)", "gn < N && gk < k_end",
                                            _b_at("gk", "gn", True), exact))
            for c in range(0 if vec_b else 4):
                out.append("      " + _load("pb%d[%d]" % (j, c), "0.0",
                                            "gn + %du < N && gk < k_end" % c,
                                            _b_at("gk", "(gn + %du)" % c, False), exact))
            out.append("    }")
        return out

    def stash(buf):
        """Registers -> shared buffer `buf` (a WGSL expression, 0 or 1)."""
        out = []
        for j in range(na):
            e = "(t + %du)" % (j * threads)
            out.append("    { let mm = %s / %du; let kq = (%s %% %du) * 4u;"
                       % (e, bk // 4, e, bk // 4))
            out.append("      let at = %s * %du + mm / 4u;" % (buf, a_tile))
            out += ["      As[at + (kq + %du) * %du][mm %% 4u] = pa%d[%d];" % (c, sa, j, c)
                    for c in range(4)]
            out.append("    }")
        out += ["    Bs[%s * %du + t + %du] = pb%d;" % (buf, b_tile, j * threads, j)
                for j in range(nbv)]
        return out

    body = ["  var pa%d: vec4<f32>;" % j for j in range(na)]
    body += ["  var pb%d: vec4<f32>;" % j for j in range(nbv)]
    body += ["  var c%d_%d = vec4<f32>(0.0);" % (r, g) for r in range(tm) for g in range(gj)]
    body += fetch("k_begin") + stash("0u")
    body += ["  workgroupBarrier();", "  var cur = 0u;",
             "  for (var k0 = k_begin; k0 < k_end; k0 = k0 + %du) {" % bk]
    # The last step fetches a slice that is never read: with exact tiles its own (in range, no
    # branch in the loop), else the one past k_end (masked to zeros by the bounds checks).
    body += fetch("min(k0 + %du, k_end - %du)" % (bk, bk) if exact else "k0 + %du" % bk)
    body.append("    let ao = cur * %du + ty; let bo = cur * %du + tx;" % (a_tile, b_tile))
    for kk in range(bk):
        body += ["    let a%d_%d = As[ao + %du];" % (kk, i, kk * sa + i * wy) for i in range(ri)]
        body += ["    let b%d_%d = Bs[bo + %du];" % (kk, g, kk * sb + g * wx) for g in range(gj)]
        body += ["    c%d_%d = fma(vec4<f32>(a%d_%d[%d]), b%d_%d, c%d_%d);"
                 % (r, g, kk, r // 4, r % 4, kk, g, r, g) for r in range(tm) for g in range(gj)]
    body.append("    cur = 1u - cur;")
    body += stash("cur")
    body.append("    workgroupBarrier();\n  }")
    rows = [("m0 + %du + ty * 4u" % ((r // 4) * 4 * wy + r % 4), r) for r in range(tm)]
    if vec_b:
        cols = [("n0 + %du + tx * 4u" % (g * 4 * wx), lambda r, g=g: "c%d_%d" % (r, g))
                for g in range(gj)]
    else:
        cols = [("n0 + %du + tx * 4u + %du" % (g * 4 * wx, c),
                 lambda r, g=g, c=c: "c%d_%d[%d]" % (r, g, c)) for g in range(gj) for c in range(4)]
    return _matmul_kernel(nbatch, vec_a, vec_b, epilogue, shared, entry, body,
                          _store_tile(rows, cols, vec_b, exact, epilogue))


def matmul_direct_wgsl(nbatch, bm, bn, tm, tn, epilogue=None):
    """The matmul without shared memory or barriers: each thread reads its rows of A and
    columns of B straight from global memory (what CPU adapters such as lavapipe and
    SwiftShader run fastest: barriers are expensive there). Same parameters and grid as
    matmul_wgsl, split-K and epilogue included."""
    wx, wy = bn // tn, bm // tm
    entry = """
@compute @workgroup_size(%d, %d)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
  let m0 = wid.y * %du + lid.y; let n0 = wid.x * %du + lid.x;""" % (wx, wy, bm, bn)
    body = ["  var acc: array<f32, %d>;" % (tm * tn)]
    # Rows and columns past the edge are clamped for reading and skipped for writing.
    body += ["  let ar%d = a_base + min(m0 + %du, M - 1u) * a_sm;" % (r, r * wy) for r in range(tm)]
    body += ["  let bc%d = b_base + min(n0 + %du, N - 1u) * b_sn;" % (c, c * wx) for c in range(tn)]
    body.append("  for (var k = k_begin; k < k_end; k = k + 1u) {")
    body += ["    let a%d = A[ar%d + k * a_sk];" % (r, r) for r in range(tm)]
    body += ["    let b%d = B[bc%d + k * b_sk];" % (c, c) for c in range(tn)]
    body += ["    acc[%d] = fma(a%d, b%d, acc[%d]);" % (r * tn + c, r, c, r * tn + c)
             for r in range(tm) for c in range(tn)]
    body.append("  }")
    rows = [("m0 + %du" % (r * wy), r) for r in range(tm)]
    cols = [("n0 + %du" % (c * wx), lambda r, c=c: "acc[%d]" % (r * tn + c)) for c in range(tn)]
    return _matmul_kernel(nbatch, False, False, epilogue, "", entry, body,
                          _store_tile(rows, cols, False, False, epilogue))

# ---- indexing ------------------------------------------------------------------------------
def gather_wgsl(ty, ndim, axis):
    """out[c] = x[c with c[axis] = index[c]] (out has index's shape, contiguous).
    P: n, x_axis_len, shape[ndim], idx_off, idx_strides[ndim], x_off, x_strides[ndim]"""
    sh, io, xo = 2, 2 + ndim, 3 + 2 * ndim
    coords = ["c%d" % d for d in range(ndim)]
    body = _unravel("i", lambda d: _p(sh + d), ndim)
    body += "  var j = index[%s];\n" % _dot(_p(io), coords, [_p(io + 1 + d) for d in range(ndim)])
    # Negative indices count from the end. An index still outside the axis reads 0: checking
    # would need a readback, but it must never read another row (core/backend.py, gather).
    body += "  if (j < 0i) { j = j + i32(%s); }\n" % _p(1)
    body += "  if (j < 0i || j >= i32(%s)) { out[i] = %s(0); return; }\n" % (_p(1), ty)
    xc = ["u32(j)" if d == axis else c for d, c in enumerate(coords)]
    body += "  out[i] = x[%s];\n" % _dot(_p(xo), xc, [_p(xo + 1 + d) for d in range(ndim)])
    src = _header(4 + 3 * ndim, [("x", ty, False), ("index", "i32", False), ("out", ty, True)])
    return src + _entry_1d() + "  if (i >= %s) { return; }\n" % _p(0) + body + "}\n"


def gather_params(n, x_axis_len, shape, idx_off, idx_strides, x_off, x_strides):
    return [n, x_axis_len] + list(shape) + [idx_off] + list(idx_strides) + [x_off] + list(x_strides)


def scatter_add_wgsl(ty, ndim, axis):
    """Deterministic scatter_add written as a gather: each output element of x's shape sums the
    src entries whose index points at it, in index order (no atomics, same result every run).
    P: n, x_shape[ndim], index_shape[ndim], x_off, x_strides[ndim], idx_off, idx_strides[ndim],
       src_off, src_strides[ndim]"""
    xs, ish = 1, 1 + ndim
    xo, io, so = 1 + 2 * ndim, 2 + 3 * ndim, 3 + 4 * ndim
    coords = ["c%d" % d for d in range(ndim)]
    body = _unravel("i", lambda d: _p(xs + d), ndim)
    body += "  var acc = x[%s];\n" % _dot(_p(xo), coords, [_p(xo + 1 + d) for d in range(ndim)])
    inside = " && ".join(["c%d < %s" % (d, _p(ish + d)) for d in range(ndim) if d != axis]) or "true"
    jc = ["j" if d == axis else c for d, c in enumerate(coords)]
    body += "  if (%s) {\n" % inside
    body += "    for (var j = 0u; j < %s; j = j + 1u) {\n" % _p(ish + axis)
    body += "      var t = index[%s];\n" % _dot(_p(io), jc, [_p(io + 1 + d) for d in range(ndim)])
    body += "      if (t < 0i) { t = t + i32(%s); }\n" % _p(xs + axis)
    body += "      if (u32(t) == c%d) { acc = acc + src[%s]; }\n" % (
        axis, _dot(_p(so), jc, [_p(so + 1 + d) for d in range(ndim)]))
    body += "    }\n  }\n  out[i] = acc;\n"
    src = _header(4 + 5 * ndim, [("x", ty, False), ("index", "i32", False), ("src", ty, False),
                                 ("out", ty, True)])
    return src + _entry_1d() + "  if (i >= %s) { return; }\n" % _p(0) + body + "}\n"


def scatter_add_params(n, x_shape, index_shape, x_view, idx_view, src_view):
    params = [n] + list(x_shape) + list(index_shape)
    for offset, strides in (x_view, idx_view, src_view):
        params += [offset] + list(strides)
    return params


# ---- images --------------------------------------------------------------------------------
# The geometry both kernels read (n: elements of the output), then each kernel's own fields.
_GEOMETRY_FIELDS = ("n", "N", "C", "H", "W", "kh", "kw", "sh", "sw", "ph", "pw", "dh", "dw",
                    "OH", "OW")
UNFOLD2D_PARAMS = ParamLayout(*_GEOMETRY_FIELDS, "x_off", ("x_strides", 4), "pad_bits")
FOLD2D_PARAMS = ParamLayout(*_GEOMETRY_FIELDS)


def _geometry(P):
    return "".join("  let %s = %s;\n" % (name, P[name]) for name in _GEOMETRY_FIELDS[1:])


def geometry_values(n, x_shape, kernel, stride, padding, dilation, out_hw):
    """The geometry fields by name, for `UNFOLD2D_PARAMS.pack` / `FOLD2D_PARAMS.pack`."""
    names = _GEOMETRY_FIELDS
    return dict(zip(names, [n] + list(x_shape) + list(kernel) + list(stride) + list(padding)
                    + list(dilation) + list(out_hw)))


def unfold2d_wgsl(ty):
    """im2col: out (N, C*kh*kw, OH*OW) contiguous; x (N, C, H, W) read through strides.
    P: UNFOLD2D_PARAMS"""
    P = UNFOLD2D_PARAMS
    body = _geometry(P) + """  var r = i;
  let ox = r % OW; r = r / OW; let oy = r % OH; r = r / OH;
  let j = r % kw; r = r / kw; let ki = r % kh; r = r / kh; let c = r % C; let n = r / C;
  let y = i32(oy * sh + ki * dh) - i32(ph); let x = i32(ox * sw + j * dw) - i32(pw);
  var v = bitcast<{T}>({PAD});
  if (y >= 0i && y < i32(H) && x >= 0i && x < i32(W)) {
    v = inp[{XO} + n * {XS0} + c * {XS1} + u32(y) * {XS2} + u32(x) * {XS3}];
  }
  out[i] = v;
"""
    for name, value in (("{T}", ty), ("{PAD}", P["pad_bits"]), ("{XO}", P["x_off"]),
                        ("{XS0}", P["x_strides", 0]), ("{XS1}", P["x_strides", 1]),
                        ("{XS2}", P["x_strides", 2]), ("{XS3}", P["x_strides", 3])):
        body = body.replace(name, value)
    src = _header(P.size, [("inp", ty, False), ("out", ty, True)])
    return src + _entry_1d() + "  if (i >= %s) { return; }\n" % P["n"] + body + "}\n"


def fold2d_wgsl(ty):
    """col2im as a gather: each image pixel sums the kh*kw column entries that cover it
    (deterministic, no atomics). cols (N, C*kh*kw, OH*OW) contiguous; out (N, C, H, W).
    P: FOLD2D_PARAMS"""
    P = FOLD2D_PARAMS
    body = _geometry(P) + """  var r = i;
  let x = r % W; r = r / W; let y = r % H; r = r / H; let c = r % C; let n = r / C;
  var acc: {T} = {Z};
  for (var ki = 0u; ki < kh; ki = ki + 1u) {
    let yy = i32(y + ph) - i32(ki * dh);
    if (yy < 0i || yy % i32(sh) != 0i) { continue; }
    let oy = u32(yy) / sh;
    if (oy >= OH) { continue; }
    for (var j = 0u; j < kw; j = j + 1u) {
      let xx = i32(x + pw) - i32(j * dw);
      if (xx < 0i || xx % i32(sw) != 0i) { continue; }
      let ox = u32(xx) / sw;
      if (ox >= OW) { continue; }
      acc = acc + cols[((n * C + c) * kh * kw + ki * kw + j) * OH * OW + oy * OW + ox];
    }
  }
  out[i] = acc;
""".replace("{T}", ty).replace("{Z}", ZERO[ty])
    src = _header(P.size, [("cols", ty, False), ("out", ty, True)])
    return src + _entry_1d() + "  if (i >= %s) { return; }\n" % P["n"] + body + "}\n"
