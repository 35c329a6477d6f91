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

from .codegen.prelude import MAX_GROUPS, WG, ParamLayout, groups_for

ACTIVATIONS = {
    None: "v",
    "relu": "select(v, 0.0, v <= 0.0)",
    "relu6": "select(select(v, 0.0, v <= 0.0), 6.0, v >= 6.0)",
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
}
BK = TILES["t64"].bk  # groups with at least this many channels are staged by tap (kernel_kind)

PARAMS = ParamLayout("total", "N", "C", "H", "W", "O", "OH", "OW", "kh", "kw", "sh", "sw",
                     "pt", "pl", "dh", "dw", "groups", "cg", "og", "K", "cols",
                     "x_off", ("xs", 4), "w_off", ("ws", 4), "b_off", "b_stride")

_SCALARS = [name for name, _, count in PARAMS.fields if count is None]


def _header(has_bias, shared=""):
    buffers = ["X", "Wt"] + (["Bias"] if has_bias else [])
    lines = ["struct Params { v: array<vec4<u32>, %d> }" % -(-PARAMS.size // 4),
             "@group(0) @binding(0) var<uniform> P: Params;"]
    lines += ["@group(0) @binding(%d) var<storage, read> %s: array<f32>;" % (i, name)
              for i, name in enumerate(buffers, start=1)]
    lines.append("@group(0) @binding(%d) var<storage, read_write> Out: array<f32>;"
                 % (len(buffers) + 1))
    return "\n".join(lines) + "\n" + shared + "\n"


def _lets():
    """Every scalar parameter as a WGSL `let` of its own name, and the strides as xs0.. ws3."""
    lines = ["  let %s = %s;" % (name, PARAMS[name]) for name in _SCALARS]
    lines += ["  let %s%d = %s;" % (arr, i, PARAMS[arr, i]) for arr in ("xs", "ws") for i in range(4)]
    return "\n".join(lines) + "\n"


def _store(has_bias, activation):
    """WGSL storing accumulator `acc` of output channel `o`, image `b`, pixel `pix`."""
    bias = " + Bias[b_off + o * b_stride]" if has_bias else ""
    return ("var v = acc%s; v = %s; Out[(b * O + o) * (OH * OW) + pix] = v;"
            % (bias, ACTIVATIONS[activation]))


def direct_wgsl(has_bias, activation):
    """One thread per output element (b, o, oy, ox), in the output's row-major order."""
    return _header(has_bias) + """
@compute @workgroup_size(%d)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * %du;
%s  if (i >= total) { return; }
  let ox = i %% OW; var r = i / OW; let oy = r %% OH; r = r / OH; let o = r %% O; let b = r / O;
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
  %s
}
""" % (WG, WG, _lets(), _store(has_bias, activation))


_STAGE_FLAT = """
  for (var k0 = 0u; k0 < K; k0 = k0 + %(bk)du) {
    for (var e = t; e < %(a_size)du; e = e + %(threads)du) {
      let k = k0 + e / %(bm)du;
      var v = 0.0;
      if (a_in && k < K) {
        let c = k / khw; let rr = k %% khw;
        v = Wt[wb + c * ws1 + (rr / kw) * ws2 + (rr %% kw) * ws3];
      }
      As[e] = v;
    }
    for (var e = t; e < %(b_size)du; e = e + %(threads)du) {
      let k = k0 + e / %(bn)du;
      var v = 0.0;
      if (p_in && k < K) {
        let c = k / khw; let rr = k %% khw;
        let iy = iy0 + i32((rr / kw) * dh); let ix = ix0 + i32((rr %% kw) * dw);
        if (iy >= 0i && iy < i32(H) && ix >= 0i && ix < i32(W)) {
          v = X[xb + c * xs1 + u32(iy) * xs2 + u32(ix) * xs3];
        }
      }
      Bs[e] = v;
    }
%(step)s
  }
"""

_STAGE_TAPS = """
  for (var tap = 0u; tap < khw; tap = tap + 1u) {
    let ky = tap / kw; let kx = tap %% kw;
    let iy = iy0 + i32(ky * dh); let ix = ix0 + i32(kx * dw);
    let x_in = p_in && iy >= 0i && iy < i32(H) && ix >= 0i && ix < i32(W);
    let xtap = xb + select(0u, u32(iy) * xs2 + u32(ix) * xs3, x_in);
    let wtap = wb + ky * ws2 + kx * ws3;
    for (var c0 = 0u; c0 < cg; c0 = c0 + %(bk)du) {
      for (var e = t; e < %(a_size)du; e = e + %(threads)du) {
        let c = c0 + e / %(bm)du;
        var v = 0.0;
        if (a_in && c < cg) { v = Wt[wtap + c * ws1]; }
        As[e] = v;
      }
      for (var e = t; e < %(b_size)du; e = e + %(threads)du) {
        let c = c0 + e / %(bn)du;
        var v = 0.0;
        if (x_in && c < cg) { v = X[xtap + c * xs1]; }
        Bs[e] = v;
      }
%(step)s
    }
  }
"""


def gemm_wgsl(has_bias, activation, by_tap, tile):
    """The implicit-GEMM kernel of one Tile (see the module docstring). Grid: x * (z / groups)
    counts pixel tiles (x capped at MAX_GROUPS), y output-channel tiles, z % groups the group.
    K is staged bk entries at a time: by_tap, one kernel tap (ky, kx) and bk input channels
    per step, so staging needs no division and each thread tests its pixel's bounds once per
    tap (for groups with at least BK channels); else bk entries of the flattened (c, ky, kx)."""
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
    sizes = dict(bn=bn, bm=bm, bk=bk, a_size=bk * bm, b_size=bk * bn, threads=tile.threads)
    stage = (_STAGE_TAPS if by_tap else _STAGE_FLAT) % dict(sizes, step="\n".join(step))
    stores = []
    for r in range(tm):
        for c in range(tn):
            stores.append("  { let m = m0 + %du + ty; let p = n0 + %du + tx;\n"
                          "    if (m < og && p < cols) { let o = g * og + m; let b = p / (OH * OW); "
                          "let pix = p %% (OH * OW); let acc = acc[%d]; %s } }"
                          % (r * wy, c * wx, r * tn + c, _store(has_bias, activation)))
    return _header(has_bias, shared) + """
@compute @workgroup_size(%(wx)d, %(wy)d)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
%(lets)s  let tx = lid.x; let ty = lid.y; let t = ty * %(wx)du + tx;
  let g = wid.z %% groups;
  let n0 = (wid.x + nwg.x * (wid.z / groups)) * %(bn)du; let m0 = wid.y * %(bm)du;
  let khw = kh * kw;
  // The image column this thread stages: pixel p = (b, oy, ox).
  let p = n0 + t %% %(bn)du; let p_in = p < cols;
  let ox = p %% OW; let oy = (p / OW) %% OH; let b = p / (OW * OH);
  let iy0 = i32(oy * sh) - i32(pt); let ix0 = i32(ox * sw) - i32(pl);
  let xb = x_off + b * xs0 + g * cg * xs1;
  // The weight row this thread stages: output channel g * og + am.
  let am = m0 + t %% %(bm)du; let a_in = am < og;
  let wb = w_off + (g * og + am) * ws0;
  var acc: array<f32, %(acc)d>;
%(stage)s
%(stores)s
}
""" % dict(sizes, wx=wx, wy=wy, lets=_lets(), acc=tm * tn, stage=stage,
           stores="\n".join(stores))


def kernel_kind(og, cg, k):
    """"taps" or "gemm" (the tiled kernel, by tap where a group has BK channels or more) once a
    tile has enough output channels and reduction depth to reuse what it stages; "direct" for
    depthwise and tiny convolutions."""
    if og < 8 or k < 16:
        return "direct"
    return "taps" if cg >= BK else "gemm"


def tile_for(og, cols, groups):
    """t128 once its tiles still give a GPU two waves of workgroups (~264 on an H100), else t64."""
    return "t128" if -(-og // 128) * -(-cols // 128) * groups >= 264 else "t64"


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
        tiles = -(-cols // tile.bn)
        tiles_x = min(tiles, MAX_GROUPS)
        grid = (tiles_x, -(-og // tile.bm), groups * -(-tiles // tiles_x))
        if max(grid) > MAX_GROUPS:
            from .backend import DeviceLimitError  # (backend.py imports this module)
            raise DeviceLimitError("cn.Wgpu conv2d: %s * %s needs %r workgroups, more than the "
                                   "device's %d per dimension" % (x.shape, w.shape, grid, MAX_GROUPS))
    else:
        grid = groups_for(total, WG)
    params = PARAMS.pack(
        total=total, N=n, C=c, H=h, W=wd, O=o, OH=oh, OW=ow, kh=kh, kw=kw, sh=stride[0],
        sw=stride[1], pt=pt, pl=pl, dh=dilation[0], dw=dilation[1], groups=groups, cg=cg, og=og,
        K=k, cols=cols, x_off=x.offset, xs=x.strides, w_off=w.offset,
        ws=w.strides, b_off=0 if bias is None else bias.offset,
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
