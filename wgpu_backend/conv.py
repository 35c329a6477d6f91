"""cn.Wgpu()'s conv2d primitive: convolution kernels that never build the im2col matrix.

Two WGSL templates, one parameter layout:

* implicit GEMM (`gemm_wgsl`): per group g, Out[o, p] = sum_k W[o, k] * X_col[k, p] with
  o over the group's output channels, p over batch x output pixels and k over (c, ky, kx) of
  the group's input channels. A workgroup computes a tile of (o, p) (64 x 64, or 128 x 128
  for large layers: TILES); each K step stages a few rows of W and of the *virtual* im2col
  matrix in workgroup memory, gathering the column entries straight from the image (zero
  outside it). No intermediate tensor exists, so nothing but the input, weight and output has
  to fit the device's binding limit (maxStorageBufferBindingSize) -- and those are tensors,
  which the backend already keeps within it.
* direct (`direct_wgsl`): one thread per output element looping over its window; for
  depthwise convolutions (one input channel per group) and other products too small to tile.

Both read x, the weight and the bias through strides (views cost no copy), write the output
(N, O, OH, OW) contiguous, and apply the epilogue at the store: + bias[o], then the activation
(none / relu / relu6, NaN propagating like the composed where()). A batch-norm at inference
folds into weight and bias (a scale per output channel on the weight, a shift on the bias;
PyTorch's ONNX export already does so), so the epilogue needs nothing more. Padding may be
asymmetric ((top, bottom), (left, right)): the kernels need only top and left; bottom and
right decide OH, OW.
"""

from collections import namedtuple

from .codegen.prelude import MAX_GROUPS, WG, ParamLayout, entry_1d, groups_for, header as prelude_header

ACTIVATIONS = {
    None: "v",
    "relu": "select(v, 0.0, v <= 0.0)",
    "relu6": "select(select(v, 0.0, v <= 0.0), 6.0, v >= 6.0)",
    "silu": "v / (1.0 + exp(-v))",
    "hardsigmoid": "select(select(v + 3.0, 0.0, v + 3.0 <= 0.0), 6.0, v + 3.0 >= 6.0) / 6.0",
    "hardswish": "v * (select(select(v + 3.0, 0.0, v + 3.0 <= 0.0), 6.0, v + 3.0 >= 6.0) / 6.0)",
}


class Tile(namedtuple("Tile", "bm bn bk tm tn")):
    """An implicit-GEMM tile: bm output channels x bn output pixels per workgroup of
    (bn/tn) x (bm/tm) threads, each a tm x tn block of registers; K in bk-deep steps. bm and bn
    divide the thread count, so the image column (and weight row) a thread stages is the same
    at every K step."""

    @property
    def threads(self):
        return (self.bn // self.tn) * (self.bm // self.tm)


TILES = {
    "t64": Tile(64, 64, 16, 4, 4),      # more workgroups: small and mid layers
    "t128": Tile(128, 128, 8, 8, 8),    # 4 FMAs per shared read: large layers
    # Narrow tiles for products with few rows (the backward kernels' input or output channels
    # of a group, conv_grad.tile_for): a 64-row tile would leave most of its rows empty.
    "t16": Tile(16, 128, 16, 1, 8),
    "t32": Tile(32, 64, 16, 2, 4),
}
BK = TILES["t64"].bk  # groups with at least this many channels are staged by tap (kernel_kind)

# One parameter layout for every conv kernel, forward and backward (conv_grad.py): the geometry,
# then x, the weight, the bias and the output gradient g by offset and strides. K and cols are
# the implicit GEMM's reduction depth and column count (each kernel says what they count);
# slice_len is the length of one split of a reduction.
PARAMS = ParamLayout("total", "N", "C", "H", "W", "O", "OH", "OW", "kh", "kw", "sh", "sw",
                     "pt", "pl", "dh", "dw", "groups", "cg", "og", "K", "cols",
                     "x_off", ("xs", 4), "w_off", ("ws", 4), "b_off", "b_stride",
                     "g_off", ("gs", 4), "slice_len")

_SCALARS = [name for name, _, count in PARAMS.fields if count is None]
_STRIDES = ("xs", "ws", "gs")


def pack(x, w_shape, out_hw, stride, padding, dilation, groups, **fields):
    """The packed PARAMS of a conv of x (N, C, H, W) by a weight of `w_shape` with output size
    out_hw; `fields`: total, K, cols and the operands' offsets and strides (others 0)."""
    (n, c, h, wd), (o, cg, kh, kw) = x, w_shape
    values = dict(N=n, C=c, H=h, W=wd, O=o, OH=out_hw[0], OW=out_hw[1], kh=kh, kw=kw,
                  sh=stride[0], sw=stride[1], pt=padding[0][0], pl=padding[1][0],
                  dh=dilation[0], dw=dilation[1], groups=groups, cg=cg, og=o // groups,
                  x_off=0, xs=(0,) * 4, w_off=0, ws=(0,) * 4, b_off=0, b_stride=0,
                  g_off=0, gs=(0,) * 4, slice_len=0)
    values.update(fields)
    return PARAMS.pack(**values)


def header(buffers, shared=""):
    """The uniform block P and storage bindings 1.. of `buffers` (f32 arrays, read only), then
    the output Out."""
    return prelude_header(PARAMS.size, [(name, "f32", False) for name in buffers]
                          + [("Out", "f32", True)], shared)


def lets():
    """Every scalar parameter as a WGSL `let` of its own name, and the strides as xs0.. gs3."""
    lines = ["  let %s = %s;" % (name, PARAMS[name]) for name in _SCALARS]
    lines += ["  let %s%d = %s;" % (arr, i, PARAMS[arr, i]) for arr in _STRIDES for i in range(4)]
    return "\n".join(lines) + "\n"


def _store(has_bias, activation):
    """WGSL storing accumulator `acc` of output channel `o`, image `b`, pixel `pix`."""
    bias = " + Bias[b_off + o * b_stride]" if has_bias else ""
    return ("var v = acc%s; v = %s; Out[(b * O + o) * (OH * OW) + pix] = v;"
            % (bias, ACTIVATIONS[activation]))


def direct_wgsl(has_bias, activation):
    """One thread per output element (b, o, oy, ox), in the output's row-major order."""
    return header(["X", "Wt"] + (["Bias"] if has_bias else [])) + entry_1d() + lets() + """\
  if (i >= total) { return; }
  let ox = i % OW; var r = i / OW; let oy = r % OH; r = r / OH; let o = r % O; let b = r / O;
  let pix = oy * OW + ox;
  let iy0 = i32(oy * sh) - i32(pt); let ix0 = i32(ox * sw) - i32(pl);
  let xb = x_off + b * xs0 + (o / og) * cg * xs1; let wb = w_off + o * ws0;
  var acc = 0.0;
  for (var c = 0u; c < cg; c = c + 1u) {
    for (var ky = 0u; ky < kh; ky = ky + 1u) {
      let iy = iy0 + i32(ky * dh);
      if (iy < 0i || iy >= i32(H)) { continue; }
      for (var kx = 0u; kx < kw; kx = kx + 1u) {
        let ix = ix0 + i32(kx * dw);
        if (ix < 0i || ix >= i32(W)) { continue; }
        acc = fma(X[xb + c * xs1 + u32(iy) * xs2 + u32(ix) * xs3],
                  Wt[wb + c * ws1 + ky * ws2 + kx * ws3], acc);
      }
    }
  }
  STORE
}
""".replace("STORE", _store(has_bias, activation))


class Staged(namedtuple("Staged", "cond body")):
    """How a tiled kernel stages one operand: entry k of the thread's row (A) or column (B) of
    the reduction is read by `body` (WGSL assigning `v`, given `k`) where `cond` holds, else 0."""


class Reduction(namedtuple("Reduction", "begin end open close")):
    """The reduction loop of a tiled kernel: k0 from `begin` to `end` in bk steps, inside the
    WGSL `open` ... `close` (e.g. a loop over the kernel's taps; "" for none)."""


def _stage(dest, size, per, staged, threads):
    return ("    for (var e = t; e < %du; e = e + %du) {\n"
            "      let k = k0 + e / %du;\n      var v = 0.0;\n"
            "      if (%s) { %s }\n      %s[e] = v;\n    }\n"
            % (size, threads, per, staged.cond, staged.body, dest))


def tiled_wgsl(buffers, tile, n0, setup, reduction, a, b, store):
    """The one implicit-GEMM template (forward here, both backward products in conv_grad.py):
    a workgroup accumulates a bm x bn tile of Out[m, p] = sum_k A[m, k] * B[k, p], where A and B
    exist only as the WGSL that stages them (`a`, `b`: Staged) from the operands' buffers.
    Rows m0.. come from workgroup y, columns from `n0` (WGSL; `zs` = wid.z / groups); the group
    g is wid.z % groups. Each thread stages A's row `row` and B's column `col` (bm and bn divide
    the thread count, so they stay the same at every step), after `setup`. `store`: WGSL writing
    `acc` of (m, p), bounds tested there."""
    bm, bn, bk, tm, tn = tile
    wx, wy = bn // tn, bm // tm
    shared = "var<workgroup> As: array<f32, %d>;\nvar<workgroup> Bs: array<f32, %d>;" % (
        bk * bm, bk * bn)
    step = ["    workgroupBarrier();",
            "    for (var kk = 0u; kk < %du; kk = kk + 1u) {" % bk]
    step += ["      let b%d = Bs[kk * %du + %du + tx];" % (c, bn, c * wx) for c in range(tn)]
    for r in range(tm):
        step.append("      let a%d = As[kk * %du + %du + ty];" % (r, bm, r * wy))
        step += ["      acc[%d] = fma(a%d, b%d, acc[%d]);" % (r * tn + c, r, c, r * tn + c)
                 for c in range(tn)]
    step += ["    }", "    workgroupBarrier();"]
    loop = ("%s  for (var k0 = %s; k0 < %s; k0 = k0 + %du) {\n%s%s%s\n  }\n%s"
            % (reduction.open, reduction.begin, reduction.end, bk,
               _stage("As", bk * bm, bm, a, tile.threads), _stage("Bs", bk * bn, bn, b, tile.threads),
               "\n".join(step), reduction.close))
    stores = ["  { let m = m0 + %du + ty; let p = n0 + %du + tx; let acc = acc[%d];\n    %s }"
              % (r * wy, c * wx, r * tn + c, store) for r in range(tm) for c in range(tn)]
    return header(buffers, shared) + """
@compute @workgroup_size(%(wx)d, %(wy)d)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
%(lets)s  let tx = lid.x; let ty = lid.y; let t = ty * %(wx)du + tx;
  let g = wid.z %% groups; let zs = wid.z / groups;
  let n0 = %(n0)s; let m0 = wid.y * %(bm)du;
  let row = m0 + t %% %(bm)du; let col = n0 + t %% %(bn)du;
  let khw = kh * kw;
%(setup)s
  var acc: array<f32, %(acc)d>;
%(loop)s
%(stores)s
}
""" % dict(wx=wx, wy=wy, bm=bm, bn=bn, n0=n0, lets=lets(), setup=setup, acc=tm * tn, loop=loop,
           stores="\n".join(stores))


TAPS = "  for (var tap = 0u; tap < khw; tap = tap + 1u) {\n    let ky = tap / kw; let kx = tap %% kw;\n%s"
SPILL_N0 = "(wid.x + nwg.x * zs) * %du"  # column tiles past MAX_GROUPS continue in z (spill_grid)


def spill_grid(cols, rows, groups, tile):
    """The grid of a tiled kernel whose column tiles may exceed the per-dimension limit: x
    counts column tiles (capped, continuing in z / groups), y row tiles, z % groups the group."""
    tiles = -(-cols // tile.bn)
    tiles_x = min(tiles, MAX_GROUPS)
    return (tiles_x, -(-rows // tile.bm), groups * -(-tiles // tiles_x))


def check_grid(grid, what):
    if max(grid) > MAX_GROUPS:
        from .backend import DeviceLimitError  # (backend.py imports this module)
        raise DeviceLimitError("cn.Wgpu %s needs %r workgroups, more than the device's %d per "
                               "dimension" % (what, grid, MAX_GROUPS))


def gemm_wgsl(has_bias, activation, by_tap, tile):
    """The forward implicit GEMM (see the module docstring): m over the group's output
    channels, p over batch x output pixels, k over (c, ky, kx). by_tap: K is staged one kernel
    tap (ky, kx) and bk input channels per step, so staging needs no division and each thread
    tests its pixel's bounds once per tap (for groups with at least BK channels); else bk
    entries of the flattened (c, ky, kx)."""
    setup = """\
  // The image column this thread stages: pixel p = (b, oy, ox).
  let p = col; let p_in = p < cols;
  let ox = p % OW; let oy = (p / OW) % OH; let b = p / (OW * OH);
  let iy0 = i32(oy * sh) - i32(pt); let ix0 = i32(ox * sw) - i32(pl);
  let xb = x_off + b * xs0 + g * cg * xs1;
  // The weight row this thread stages: output channel g * og + row.
  let a_in = row < og;
  let wb = w_off + (g * og + row) * ws0;"""
    if by_tap:
        reduction = Reduction("0u", "cg", TAPS % """\
    let iy = iy0 + i32(ky * dh); let ix = ix0 + i32(kx * dw);
    let x_in = p_in && iy >= 0i && iy < i32(H) && ix >= 0i && ix < i32(W);
    let xtap = xb + select(0u, u32(iy) * xs2 + u32(ix) * xs3, x_in);
    let wtap = wb + ky * ws2 + kx * ws3;
""", "  }\n")
        a = Staged("a_in && k < cg", "v = Wt[wtap + k * ws1];")
        b = Staged("x_in && k < cg", "v = X[xtap + k * xs1];")
    else:
        reduction = Reduction("0u", "K", "", "")
        tap = "let c = k / khw; let rr = k % khw; "
        a = Staged("a_in && k < K", tap + "v = Wt[wb + c * ws1 + (rr / kw) * ws2 + (rr % kw) * ws3];")
        b = Staged("p_in && k < K", tap + """\
let iy = iy0 + i32((rr / kw) * dh); let ix = ix0 + i32((rr % kw) * dw);
        if (iy >= 0i && iy < i32(H) && ix >= 0i && ix < i32(W)) {
          v = X[xb + c * xs1 + u32(iy) * xs2 + u32(ix) * xs3];
        }""")
    store = ("if (m < og && p < cols) { let o = g * og + m; let b = p / (OH * OW); "
             "let pix = p % (OH * OW); " + _store(has_bias, activation) + " }")
    return tiled_wgsl(["X", "Wt"] + (["Bias"] if has_bias else []), tile, SPILL_N0 % tile.bn,
                      setup, reduction, a, b, store)


def kernel_kind(og, cg, k):
    """"taps" or "gemm" (the tiled kernel, by tap where a group has BK channels or more) once a
    tile has enough output channels and reduction depth to reuse what it stages; "direct" for
    depthwise and tiny convolutions."""
    if og < 8 or k < 16:
        return "direct"
    return "taps" if cg >= BK else "gemm"


TWO_WAVES = 264  # workgroups that give a large GPU two waves (an H100's 132 SMs)


def tile_for(og, cols, groups):
    """t128 once its tiles still give a GPU two waves of workgroups, else t64."""
    return "t128" if -(-og // 128) * -(-cols // 128) * groups >= TWO_WAVES else "t64"


def conv2d(backend, x, w, bias, stride, padding, dilation, groups, activation):
    """Launch one conv kernel on `backend` (a cn.Wgpu) through its public kernel interface;
    returns the (N, O, OH, OW) output handle. Arguments as the protocol's conv2d primitive."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    (pt, pb), (pl, pr) = padding
    oh = (h + pt + pb - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (wd + pl + pr - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    out = backend.empty((n, o, oh, ow), x.dtype)
    total = n * o * oh * ow
    if total == 0:
        return out
    og, k, cols = o // groups, cg * kh * kw, n * oh * ow
    kind = kernel_kind(og, cg, k)
    tile_name = tile_for(og, cols, groups)
    tile = TILES[tile_name]
    if kind != "direct":
        grid = spill_grid(cols, og, groups, tile)
        check_grid(grid, "conv2d: %s * %s" % (x.shape, w.shape))
    else:
        grid = groups_for(total, WG)
    params = pack(x.shape, w.shape, (oh, ow), stride, padding, dilation, groups, total=total,
                  K=k, cols=cols, x_off=x.offset, xs=x.strides, w_off=w.offset, ws=w.strides,
                  b_off=0 if bias is None else bias.offset,
                  b_stride=0 if bias is None else bias.strides[0])
    has_bias = bias is not None
    handles = [x, w] + ([bias] if has_bias else []) + [out]
    if kind != "direct":
        kind += "_" + tile_name
    name = "conv2d_%s%s" % (kind, "_" + activation if activation else "")

    def build():
        if kind == "direct":
            return direct_wgsl(has_bias, activation)
        return gemm_wgsl(has_bias, activation, kind.startswith("taps"), tile)
    backend.run_kernel(("conv2d", kind, has_bias, activation), build, handles, params, grid, name,
                       4 * (x.size + w.size + (o if has_bias else 0)), 4 * total, flops=2 * total * k)
    return out
