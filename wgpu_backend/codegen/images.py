"""Templates of the kernels that are not elementwise or reductions: fill and random, gather and
scatter_add, unfold2d and fold2d. Each lays out its parameters with one `ParamLayout`.
"""

from .mathlib import helpers_for
from .packing import binding_type, load, store
from .prelude import ParamLayout, header, entry_1d, unravel, dot, zero


# ---- fill and random -----------------------------------------------------------------------
FILL_PARAMS = ParamLayout("n", "bits")
RANDOM_PARAMS = ParamLayout("n", "key")


def fill_wgsl(out_type):
    """out[i] = the value whose bits are P.bits."""
    P = FILL_PARAMS
    return header(P.size, [("out", out_type, True)]) + entry_1d() + \
        "  if (i >= %s) { return; }\n  out[i] = bitcast<%s>(%s);\n}\n" % (P["n"], out_type, P["bits"])


def random_wgsl(distribution):
    """The RANDOM generator of core/backend.py. Uniform draws are bit-exact."""
    P = RANDOM_PARAMS
    body = "  if (i >= %s) { return; }\n" % P["n"]
    body += "  let key = %s;\n" % P["key"]
    if distribution == "uniform":
        body += "  out[i] = f32(hash32(i ^ key) >> 8u) * 5.9604644775390625e-8;\n"
    else:
        body += ("  let u1 = f32(hash32((2u * i) ^ key) >> 8u) * 5.9604644775390625e-8;\n"
                 "  let u2 = f32(hash32((2u * i + 1u) ^ key) >> 8u) * 5.9604644775390625e-8;\n"
                 "  out[i] = sqrt(-2.0 * log(1.0 - u1)) * cos(6.283185307179586 * u2);\n")
    src = header(P.size, [("out", "f32", True)]) + entry_1d() + body + "}\n"
    return helpers_for(src) + src


# ---- indexing ------------------------------------------------------------------------------
def gather_layout(ndim):
    return ParamLayout("n", "x_axis_len", ("shape", ndim), "idx_off", ("idx_strides", ndim),
                       "x_off", ("x_strides", ndim))


def gather_wgsl(dtype, storage, ndim, axis):
    """out[c] = x[c with c[axis] = index[c]] (out has index's shape, contiguous; x of any
    dtype, storage dtypes too, in the device's layout `storage`: packing.py)."""
    P = gather_layout(ndim)
    coords = ["c%d" % d for d in range(ndim)]
    body = unravel("i", P.array("shape"))
    body += "  var j = index[%s];\n" % dot(P["idx_off"], coords, P.array("idx_strides"))
    # Negative indices count from the end. An index still outside the axis reads 0: checking
    # would need a readback, but it must never read another row (core/backend.py, gather).
    body += "  if (j < 0i) { j = j + i32(%s); }\n" % P["x_axis_len"]
    body += "  if (j < 0i || j >= i32(%s)) { %s return; }\n" % (
        P["x_axis_len"], store(dtype, storage, "out", "i", zero(dtype.wgsl)))
    xc = ["u32(j)" if d == axis else c for d, c in enumerate(coords)]
    body += "  %s\n" % store(dtype, storage, "out", "i", load(dtype, storage, "x", dot(
        P["x_off"], xc, P.array("x_strides"))))
    src = header(P.size, [("x", binding_type(dtype, storage), False), ("index", "i32", False),
                          ("out", binding_type(dtype, storage, True), True)])
    src = helpers_for(src + body) + src
    return src + entry_1d() + "  if (i >= %s) { return; }\n" % P["n"] + body + "}\n"


def scatter_add_layout(ndim):
    return ParamLayout("n", ("x_shape", ndim), ("idx_shape", ndim), "x_off", ("x_strides", ndim),
                       "idx_off", ("idx_strides", ndim), "src_off", ("src_strides", ndim))


def scatter_add_wgsl(ty, ndim, axis):
    """Deterministic scatter_add written as a gather: each output element of x's shape sums the
    src entries whose index points at it, in index order (no atomics, same result every run)."""
    P = scatter_add_layout(ndim)
    coords = ["c%d" % d for d in range(ndim)]
    body = unravel("i", P.array("x_shape"))
    body += "  var acc = x[%s];\n" % dot(P["x_off"], coords, P.array("x_strides"))
    inside = " && ".join(["c%d < %s" % (d, P["idx_shape", d]) for d in range(ndim) if d != axis]) \
        or "true"
    jc = ["j" if d == axis else c for d, c in enumerate(coords)]
    body += "  if (%s) {\n" % inside
    body += "    for (var j = 0u; j < %s; j = j + 1u) {\n" % P["idx_shape", axis]
    body += "      var t = index[%s];\n" % dot(P["idx_off"], jc, P.array("idx_strides"))
    body += "      if (t < 0i) { t = t + i32(%s); }\n" % P["x_shape", axis]
    body += "      if (u32(t) == c%d) { acc = acc + src[%s]; }\n" % (
        axis, dot(P["src_off"], jc, P.array("src_strides")))
    body += "    }\n  }\n  out[i] = acc;\n"
    src = header(P.size, [("x", ty, False), ("index", "i32", False), ("src", ty, False),
                          ("out", ty, True)])
    return src + entry_1d() + "  if (i >= %s) { return; }\n" % P["n"] + body + "}\n"


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
    src = header(P.size, [("inp", ty, False), ("out", ty, True)])
    return src + entry_1d() + "  if (i >= %s) { return; }\n" % P["n"] + body + "}\n"


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
""".replace("{T}", ty).replace("{Z}", zero(ty))
    src = header(P.size, [("cols", ty, False), ("out", ty, True)])
    return src + entry_1d() + "  if (i >= %s) { return; }\n" % P["n"] + body + "}\n"


POOL2D_PARAMS = ParamLayout(*_GEOMETRY_FIELDS, "x_off", ("x_strides", 4))


def pool2d_wgsl(op, prologue=None):
    """max_pool2d / avg_pool2d without the unfolded matrix: each thread reads its window of x
    (through strides) and writes one pixel of out (N, C, OH, OW) contiguous. max propagates NaN
    and treats padding as -inf; avg divides by kh*kw (padding counts), avg_real by the pixels
    inside the image only. prologue: (WGSL of `fn prologue(i) -> f32`, binding types of its
    leaves, the size of the parameter block with its parameters): x is not stored but computed
    where a window reads it (program.prologue_wgsl; x_off, x_strides then address its frame,
    contiguous). P: POOL2D_PARAMS (then the prologue's own)."""
    P = POOL2D_PARAMS
    # -inf through a `let` of its bits: Chrome's WGSL compiler rejects a constant expression
    # that evaluates to inf (mathlib.py)
    first = "let ninf_bits = 0xff800000u;\n  var acc = bitcast<f32>(ninf_bits);" if op == "max" \
        else "var acc = 0.0;"
    combine = "fmax_f(acc, v)" if op == "max" else "acc + v"
    body = _geometry(P) + """  var r = i;
  let ox = r % OW; r = r / OW; let oy = r % OH; r = r / OH; let c = r % C; let n = r / C;
  let base = {XO} + n * {XS0} + c * {XS1};
  {FIRST}
  var count = 0u;
  for (var ki = 0u; ki < kh; ki = ki + 1u) {
    let y = i32(oy * sh + ki * dh) - i32(ph);
    if (y < 0i || y >= i32(H)) { continue; }
    for (var j = 0u; j < kw; j = j + 1u) {
      let x = i32(ox * sw + j * dw) - i32(pw);
      if (x < 0i || x >= i32(W)) { continue; }
      let v = {READ};
      acc = {COMBINE};
      count = count + 1u;
    }
  }
""".replace("{FIRST}", first).replace("{COMBINE}", combine).replace(
        "{READ}", ("inp[%s]" if prologue is None else "prologue(%s)") % "base + u32(y) * {XS2} + u32(x) * {XS3}")
    body += {"max": "  out[i] = acc;\n",
             "avg": "  out[i] = acc / f32(kh * kw);\n",
             "avg_real": "  out[i] = acc / f32(count);\n"}[op]
    for name, value in (("{XO}", P["x_off"]), ("{XS0}", P["x_strides", 0]), ("{XS1}", P["x_strides", 1]),
                        ("{XS2}", P["x_strides", 2]), ("{XS3}", P["x_strides", 3])):
        body = body.replace(name, value)
    if prologue is None:
        bindings, function, n_params = [("inp", "f32", False)], "", P.size
    else:
        function, slot_types, n_params = prologue
        bindings = [("b%d" % s, t, False) for s, t in enumerate(slot_types)]
    src = header(n_params, bindings + [("out", "f32", True)]) + function
    src += entry_1d() + "  if (i >= %s) { return; }\n" % P["n"] + body + "}\n"
    return helpers_for(src) + src
