"""cn.Wgpu()'s conv2d backward kernels (core/backend.py: conv2d_backward_kernels): the input,
weight and bias gradients of a convolution, none of which builds an unfolded matrix.

With x (N, C, H, W), w (O, C/G, kh, kw), the output gradient g (N, O, OH, OW) and, per group,
cg = C/G input and og = O/G output channels:

* dx (`grad_input`): the transposed convolution as an implicit GEMM per group,
  dx[c, p] = sum_{o, tap} w[o, c, tap] * g[o, (p - tap) / stride], m over the group's input
  channels, p over batch x *input* pixels, k over (tap, o). A tap reaches pixel p only where
  (p + padding - tap * dilation) divides by the stride and lands inside g; a workgroup's pixels
  share one stride phase, so the taps that reach none of them are skipped, and the staged entry
  is 0 only at g's borders. The forward template (conv.tiled_wgsl) with other staging: taps
  outer, bk output channels per step. Few channels: one thread per input element (`dx_direct_wgsl`).
* dw (`grad_weight`): an implicit GEMM that reduces over batch x output pixels,
  dw[o, (c, tap)] = sum_q g[o, q] * x[c, q * stride + tap * dilation - padding], the image
  entries gathered as they are staged (no unfold2d of x). That reduction is long (N*OH*OW) and
  the product small, so it is split into slices (split-K) that each write a partial product;
  the partials are summed by the backend's reduction kernel. The partials hold
  slices x |dw| floats, and the slice count is capped so that they fit the binding limit
  (maxStorageBufferBindingSize) -- no intermediate is ever larger than that. Few channels or
  taps: one thread per (slice, weight element) (`dw_direct_wgsl`).
* dbias (`grad_bias`): g summed over batch and pixels, one workgroup per output channel (the
  reduction lines of the one elementwise/reduction generator, codegen/program.py).

All read their operands through strides (g is often a view: an expanded or masked gradient)
and share conv.py's parameter layout, header and tiled template.
"""

from cinders import dtypes

from . import conv
from .codegen.prelude import MAX_GROUPS, WG, entry_1d, entry_per_group, groups_for
from .codegen.program import reduction_lines

TARGET_GROUPS = conv.TWO_WAVES           # workgroups that keep a large GPU busy
TARGET_THREADS = conv.TWO_WAVES * WG     # the same for the one-thread-per-element kernels
MIN_SLICE = 256                 # reduction entries a dw slice has at least (GEMM)
MIN_SLICE_PIXELS = 64           # ... and at least this many pixels (direct)
BIAS_THREADS = 256


def dx_kind(cg, og):
    """"taps" (tiled: rows are the group's input channels, k its output channels per tap) once
    both are wide enough to fill a tile's rows and steps; else "direct"."""
    return "taps" if cg >= 8 and og >= 8 else "direct"


def dw_kind(og, cols):
    """"gemm" (tiled over output channels x (c, ky, kx)) where both fill a tile; else "direct"."""
    return "gemm" if og >= 8 and cols >= 16 else "direct"


def tile_for(rows, cols, groups):
    """The narrowest tile that holds `rows` (16 or 32), else the forward kernel's choice."""
    return "t16" if rows <= 16 else "t32" if rows <= 32 else conv.tile_for(rows, cols, groups)


def dx_taps_wgsl(tile):
    """Columns are the input pixels of one stride phase (ry, rx) per workgroup (wid.z / groups
    counts phases, then column tiles past the grid's x limit): pixels (ry + jy * sh, rx + jx *
    sw), which the same taps reach, so a tap that reaches none of them is skipped by the whole
    workgroup (a strided conv stages no zero rows for it)."""
    setup = """\
  let phase = zs % (sh * sw); let ry = phase / sw; let rx = phase % sw;
  let HQ = (H + sh - 1u) / sh; let WQ = (W + sw - 1u) / sw;
  // The pixel this thread stages: input pixel (b, iy, ix) of the phase, reached by output pixel
  // ((iy, ix) + padding - tap * dilation) / stride where that lies inside g.
  let p = col;
  let jx = p % WQ; let jy = (p / WQ) % HQ; let b = p / (WQ * HQ);
  let iy = ry + jy * sh; let ix = rx + jx * sw;
  let p_in = p < cols && iy < H && ix < W;
  let gb = g_off + b * gs0 + g * og * gs1;
  // The weight row this thread stages: input channel row of the group.
  let a_in = row < cg;
  let wb = w_off + g * og * ws0 + row * ws1;"""
    reduction = conv.Reduction("0u", "og", conv.TAPS % """\
    let ey = i32(ry + pt) - i32(ky * dh); let ex = i32(rx + pl) - i32(kx * dw);
    if (ey % i32(sh) != 0i || ex % i32(sw) != 0i) { continue; }
    let qy = i32(iy + pt) - i32(ky * dh); let qx = i32(ix + pl) - i32(kx * dw);
    let g_in = p_in && qy >= 0i && qx >= 0i && qy / i32(sh) < i32(OH) && qx / i32(sw) < i32(OW);
    let gtap = gb + select(0u, u32(qy / i32(sh)) * gs2 + u32(qx / i32(sw)) * gs3, g_in);
    let wtap = wb + ky * ws2 + kx * ws3;
""", "  }\n")
    a = conv.Staged("a_in && k < og", "v = Wt[wtap + k * ws0];")
    b = conv.Staged("g_in && k < og", "v = G[gtap + k * gs1];")
    store = ("if (m < cg && p < cols) { let iy = ry + ((p / WQ) % HQ) * sh; "
             "let ix = rx + (p % WQ) * sw;\n    if (iy < H && ix < W) { "
             "Out[(((p / (WQ * HQ)) * C + g * cg + m) * H + iy) * W + ix] = acc; } }")
    return conv.tiled_wgsl(["G", "Wt"], tile, "(wid.x + nwg.x * (zs / (sh * sw))) * %du" % tile.bn,
                           setup, reduction, a, b, store)


def dx_direct_wgsl():
    """One thread per element (b, c, iy, ix) of dx, summing over its group's output channels
    and the taps that reach it."""
    return conv.header(["G", "Wt"]) + entry_1d() + conv.lets() + """\
  if (i >= total) { return; }
  let ix = i % W; var r = i / W; let iy = r % H; r = r / H; let c = r % C; let b = r / C;
  let g = c / cg;
  let gb = g_off + b * gs0 + g * og * gs1; let wb = w_off + g * og * ws0 + (c % cg) * ws1;
  var acc = 0.0;
  for (var ky = 0u; ky < kh; ky = ky + 1u) {
    let qy = i32(iy + pt) - i32(ky * dh);
    if (qy < 0i || qy % i32(sh) != 0i || u32(qy) / sh >= OH) { continue; }
    let oy = u32(qy) / sh;
    for (var kx = 0u; kx < kw; kx = kx + 1u) {
      let qx = i32(ix + pl) - i32(kx * dw);
      if (qx < 0i || qx % i32(sw) != 0i || u32(qx) / sw >= OW) { continue; }
      let at = gb + oy * gs2 + (u32(qx) / sw) * gs3; let wt = wb + ky * ws2 + kx * ws3;
      for (var o = 0u; o < og; o = o + 1u) {
        acc = fma(G[at + o * gs1], Wt[wt + o * ws0], acc);
      }
    }
  }
  Out[i] = acc;
}
"""


def dw_gemm_wgsl(tile):
    # K counts batch x output pixels q = (b, oy, ox); workgroup z / groups is the slice.
    setup = """\
  let q0 = zs * slice_len; let q1 = min(q0 + slice_len, K);
  // The gradient row this thread stages: output channel g * og + row.
  let a_in = row < og;
  let ga = g_off + (g * og + row) * gs1;
  // The image column this thread stages: weight entry p = (c, ky, kx) of the group.
  let p = col; let p_in = p < cols;
  let c = p / khw; let rr = p % khw;
  let ry = i32((rr / kw) * dh) - i32(pt); let rx = i32((rr % kw) * dw) - i32(pl);
  let xc = x_off + (g * cg + c) * xs1;"""
    pixel = "let ox = k % OW; let r = k / OW; "
    a = conv.Staged("a_in && k < q1", pixel + "v = G[ga + (r / OH) * gs0 + (r % OH) * gs2 + ox * gs3];")
    b = conv.Staged("p_in && k < q1", pixel + """\
let iy = i32((r % OH) * sh) + ry; let ix = i32(ox * sw) + rx;
        if (iy >= 0i && iy < i32(H) && ix >= 0i && ix < i32(W)) {
          v = X[xc + (r / OH) * xs0 + u32(iy) * xs2 + u32(ix) * xs3];
        }""")
    store = "if (m < og && p < cols) { Out[(zs * O + g * og + m) * cols + p] = acc; }"
    return conv.tiled_wgsl(["X", "G"], tile, "wid.x * %du" % tile.bn, setup,
                           conv.Reduction("q0", "q1", "", ""), a, b, store)


def dw_direct_wgsl():
    """One thread per (slice, o, c, ky, kx): the slice's rows (b, oy) of K = N * OH, every
    output pixel of each row. Out is (slices, O, cols) in that order."""
    return conv.header(["X", "G"]) + entry_1d() + conv.lets() + """\
  if (i >= total) { return; }
  let khw = kh * kw;
  let p = i % cols; var r = i / cols; let o = r % O; let s = r / O;
  let g = o / og; let c = p / khw; let rr = p % khw;
  let ry = i32((rr / kw) * dh) - i32(pt); let rx = i32((rr % kw) * dw) - i32(pl);
  let xc = x_off + (g * cg + c) * xs1; let go = g_off + o * gs1;
  let q0 = s * slice_len; let q1 = min(q0 + slice_len, K);
  var acc = 0.0;
  for (var q = q0; q < q1; q = q + 1u) {
    let oy = q % OH; let b = q / OH;
    let iy = i32(oy * sh) + ry;
    if (iy < 0i || iy >= i32(H)) { continue; }
    let grow = go + b * gs0 + oy * gs2; let xrow = xc + b * xs0 + u32(iy) * xs2;
    for (var ox = 0u; ox < OW; ox = ox + 1u) {
      let ix = i32(ox * sw) + rx;
      if (ix >= 0i && ix < i32(W)) {
        acc = fma(G[grow + ox * gs3], X[xrow + u32(ix) * xs3], acc);
      }
    }
  }
  Out[i] = acc;
}
"""


def db_wgsl():
    """One workgroup per output channel o summing g[:, o] over batch and pixels."""
    lines, shared = reduction_lines(0, "sum", dtypes.float32, (
        ["    let ox = k % OW; let r = k / OW;",
         "    let v = G[go + (r / OH) * gs0 + (r % OH) * gs2 + ox * gs3];"], "v"),
        BIAS_THREADS, "%du" % BIAS_THREADS)
    return (conv.header(["G"], "\n".join(shared)) + entry_per_group(BIAS_THREADS, "o")
            + "\n" + conv.lets() + "  if (o >= O) { return; }\n  let L = K; let go = g_off + o * gs1;\n"
            + "\n".join(lines) + "\n  if (t == 0u) { Out[o] = x0; }\n}\n")


def _geometry(x_shape, w_shape, g, stride, padding, dilation, groups, **fields):
    return conv.pack(x_shape, w_shape, g.shape[2:], stride, padding, dilation, groups,
                     g_off=g.offset, gs=g.strides, **fields)


def grad_input(backend, g, w, size, stride, padding, dilation, groups):
    """dx (N, C, H, W) of conv2d from g and w (the protocol's conv2d_grad_input)."""
    n, o, oh, ow = g.shape
    _, cg, kh, kw = w.shape
    x_shape = (n, cg * groups) + tuple(size)
    out = backend.empty(x_shape, dtypes.float32)
    total = out.size
    if total == 0:
        return out
    og, (sh, sw) = o // groups, stride
    kind = dx_kind(cg, og)
    if kind == "taps":
        cols = n * -(-size[0] // sh) * -(-size[1] // sw)   # the pixels of one stride phase
        tile_name = tile_for(cg, cols, groups)
        tile = conv.TILES[tile_name]
        x_tiles, y_tiles, z = conv.spill_grid(cols, cg, groups, tile)
        grid = (x_tiles, y_tiles, z * sh * sw)
        conv.check_grid(grid, "conv2d's input gradient: %s" % (x_shape,))
        kind += "_" + tile_name
        build = lambda: dx_taps_wgsl(tile)  # noqa: E731
    else:
        cols = n * size[0] * size[1]
        grid = groups_for(total, WG)
        build = dx_direct_wgsl
    params = _geometry(x_shape, w.shape, g, stride, padding, dilation, groups, total=total,
                       K=og * kh * kw, cols=cols, w_off=w.offset, ws=w.strides)
    backend.run_kernel(("conv2d_dx", kind), build, [g, w, out], params, grid, "conv2d_dx_" + kind,
                       4 * (g.size + w.size), 4 * total, flops=2 * total * og * kh * kw)
    return out


def _slices(length, parallel, want, min_len, max_slices, multiple):
    """(slices, slice length) splitting a reduction of `length` so that parallel * slices
    reaches `want`, each slice at least `min_len` long (a multiple of `multiple`), at most
    `max_slices` of them."""
    slices = max(1, min(-(-want // parallel), -(-length // min_len), max_slices))
    per = -(-length // slices)
    per = -(-per // multiple) * multiple
    return -(-length // per), per


def grad_weight(backend, x, g, kernel, stride, padding, dilation, groups):
    """dw (O, C/groups, kh, kw) of conv2d from x and g (the protocol's conv2d_grad_weight)."""
    n, c, h, wd = x.shape
    o, oh, ow = g.shape[1:]
    cg, (kh, kw) = c // groups, kernel
    w_shape = (o, cg, kh, kw)
    og, cols = o // groups, cg * kh * kw
    if o * cols == 0:
        return backend.empty(w_shape, dtypes.float32)
    if n * oh * ow == 0:
        return backend.full(w_shape, 0.0, dtypes.float32)
    # Partials of `slices` x |dw| floats must fit one binding (and the grid its z limit).
    max_slices = max(1, min(backend.pool.limit // (4 * o * cols), MAX_GROUPS // groups))
    kind = dw_kind(og, cols)
    if kind == "gemm":
        tile_name = tile_for(og, cols, groups)
        tile = conv.TILES[tile_name]
        kind += "_" + tile_name
        tiles = -(-cols // tile.bn) * -(-og // tile.bm) * groups
        reduce_len = n * oh * ow
        slices, per = _slices(reduce_len, tiles, TARGET_GROUPS, MIN_SLICE, max_slices, tile.bk)
        grid = (-(-cols // tile.bn), -(-og // tile.bm), groups * slices)
        conv.check_grid(grid, "conv2d's weight gradient: %s" % (w_shape,))
        build = lambda: dw_gemm_wgsl(tile)  # noqa: E731
    else:
        reduce_len = n * oh  # rows (b, oy)
        slices, per = _slices(reduce_len, o * cols, TARGET_THREADS, -(-MIN_SLICE_PIXELS // ow),
                              max_slices, 1)
        grid = groups_for(slices * o * cols, WG)
        build = dw_direct_wgsl
    partial = backend.empty((slices, o * cols), dtypes.float32)
    params = _geometry(x.shape, w_shape, g, stride, padding, dilation, groups,
                       total=slices * o * cols, K=reduce_len, cols=cols, x_off=x.offset,
                       xs=x.strides, slice_len=per)
    backend.run_kernel(("conv2d_dw", kind), build, [x, g, partial], params, grid, "conv2d_dw_" + kind,
                       4 * (x.size + g.size), 4 * partial.size, flops=2 * o * cols * n * oh * ow)
    dw = backend.reduce("sum", partial, 0, False) if slices > 1 else partial
    return backend.reshape(dw, w_shape)


def grad_bias(backend, g):
    """dbias (O,) of conv2d: g summed over batch and pixels (the protocol's conv2d_grad_bias)."""
    n, o, oh, ow = g.shape
    out = backend.empty((o,), dtypes.float32)
    if o == 0:
        return out
    params = conv.pack((n, o, 1, 1), (o, 1, 1, 1), (oh, ow), (1, 1), ((0, 0), (0, 0)), (1, 1), 1,
                       total=o, K=n * oh * ow, cols=0, g_off=g.offset, gs=g.strides)
    backend.run_kernel(("conv2d_db",), db_wgsl, [g, out], params, groups_for(o, 1),
                       "conv2d_db", 4 * g.size, 4 * o)
    return out
