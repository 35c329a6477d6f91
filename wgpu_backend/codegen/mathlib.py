"""WGSL math helpers: functions a kernel includes only when its source calls them.

WGSL lacks some functions (erf) and leaves others undefined or driver-dependent where NumPy and
PyTorch define them (NaN through max/min, pow of a negative base, tanh/exp/log at the edges), so
the op table (optable.py) calls these instead. What a helper needs is found in its own source,
never listed by hand: `helpers_for(source)` emits every helper the source calls, and every
helper those call, callees first.
"""

import re

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
    # Packed storage dtypes (packing.py): element e of word w as its compute value, and the
    # float16 bits of an f32 (round to nearest even; beyond 65504 -> infinity).
    "i8_at": "fn i8_at(w: u32, e: u32) -> i32 { return extractBits(bitcast<i32>(w), (e & 3u) * 8u, 8u); }",
    "u8_at": "fn u8_at(w: u32, e: u32) -> i32 { return i32(extractBits(w, (e & 3u) * 8u, 8u)); }",
    "f16_at": """fn f16_at(w: u32, e: u32) -> f32 {
  let h = extractBits(w, (e & 1u) * 16u, 16u);
  let sign = (h & 0x8000u) << 16u;
  let ex = (h >> 10u) & 0x1fu;
  let m = h & 0x3ffu;
  if (ex == 0u) { return select(1.0, -1.0, sign != 0u) * f32(m) * 5.9604644775390625e-8; }
  if (ex == 31u) { return bitcast<f32>(sign | 0x7f800000u | (m << 13u)); }
  return bitcast<f32>(sign | ((ex + 112u) << 23u) | (m << 13u));
}""",
    "f16_bits": """fn f16_bits(v: f32) -> u32 {
  let x = bitcast<u32>(v);
  let sign = (x >> 16u) & 0x8000u;
  let a = x & 0x7fffffffu;
  if (a > 0x7f800000u) { return sign | 0x7e00u; }
  if (a >= 0x477ff000u) { return sign | 0x7c00u; }
  if (a >= 0x38800000u) { return sign | ((a - 0x38000000u + 0xfffu + ((a >> 13u) & 1u)) >> 13u); }
  if (a <= 0x33000000u) { return sign; }
  let m = (a & 0x7fffffu) | 0x800000u;
  let shift = 126u - (a >> 23u);
  var q = m >> shift;
  let rem = m & ((1u << shift) - 1u);
  let half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u) == 1u)) { q = q + 1u; }
  return sign | q;
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


_CALL = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)\s*\(")


def _calls(source):
    """Names of the helpers `source` calls, in order of first call."""
    seen = []
    for name in _CALL.findall(source):
        if name in HELPERS and name not in seen:
            seen.append(name)
    return seen


def helpers_for(source):
    """The helpers `source` needs, callees before callers (one definition each)."""
    order = []

    def visit(name, path):
        if name in order:
            return
        for callee in _calls(HELPERS[name]):
            if callee != name and callee not in path:
                visit(callee, path + (name,))
        order.append(name)

    for name in _calls(source):
        visit(name, ())
    return "".join(HELPERS[n] + "\n" for n in order)
