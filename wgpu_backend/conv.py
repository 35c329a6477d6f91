"""cn.Wgpu()'s conv2d primitive: convolution kernels that never build the im2col matrix.

Two forward kernels, one parameter layout (shared with the backward kernels, conv_grad.py):

* implicit GEMM (`reg_wgsl`): per group g, Out[o, p] = sum_k W[o, k] * X_col[k, p] with
  o over the group's output channels, p over batch x output pixels and k over (c, ky, kx) of
  the group's input channels, on the register-tiled, double-buffered loop of the large matmuls
  (codegen/matmul.py regtile_kernel; REG_TILES: 64 output channels x 128 or 64 pixels per
  workgroup). Each K step stages a slice of W and of the *virtual* im2col matrix in workgroup
  memory, gathering the column entries straight from the image (zero outside it). No
  intermediate tensor exists, so nothing but the input, weight and output has to fit the
  device's binding limit (maxStorageBufferBindingSize) -- and those are tensors, which the
  backend already keeps within it.
* direct (`direct_wgsl`): one thread per output element looping over its window; for
  depthwise convolutions (one input channel per group) and other products too small to tile.

Both read x, the weight and the bias through strides (views cost no copy), write the output
(N, O, OH, OW) contiguous, and apply the epilogue at the store: + bias[o], then the activation
(none / relu / relu6, NaN propagating like the composed where()). A batch-norm at inference
folds into weight and bias (a scale per output channel on the weight, a shift on the bias;
PyTorch's ONNX export already does so), so the epilogue needs nothing more. Padding may be
asymmetric ((top, bottom), (left, right)): the kernels need only top and left; bottom and
right decide OH, OW. The same two kernels, generated with a weight reader (ConvReads), are
conv2d_quantized: an 8-bit or float16 weight read from its storage (docs/gpu-kernels.md). The
simpler tiled template (`tiled_wgsl`, TILES) serves the backward
kernels, whose staging is irregular (stride phases, split reductions).
"""

from collections import namedtuple

from cinders import dtypes
from cinders.errors import DTypeError
from .codegen.matmul import regtile_kernel
from .codegen.mathlib import helpers_for
from .codegen.packing import binding_type
from .codegen.prelude import MAX_GROUPS, WG, ParamLayout, entry_1d, groups_for, header as prelude_header, zero
from .codegen.quantized import PackedReader
from .matmul import VARIANTS

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
    "t64": Tile(64, 64, 16, 4, 4),      # more workgroups: small and mid products
    "t128": Tile(128, 128, 8, 8, 8),    # 4 FMAs per shared read: large products
    # Narrow tiles for products with few rows (the backward kernels' input or output channels
    # of a group, conv_grad.tile_for): a 64-row tile would leave most of its rows empty.
    "t16": Tile(16, 128, 16, 1, 8),
    "t32": Tile(32, 64, 16, 2, 4),
}

# One parameter layout for every conv kernel, forward and backward (conv_grad.py): the geometry,
# then x, the weight, the bias and the output gradient g by offset and strides. K and cols are
# the implicit GEMM's reduction depth and column count (each kernel says what they count);
# slice_len is the length of one split of a reduction. A quantized weight's scale and zero point
# (one or one per output channel: stride 0 or 1) and an integer image's zero point follow.
PARAMS = ParamLayout("total", "N", "C", "H", "W", "O", "OH", "OW", "kh", "kw", "sh", "sw",
                     "pt", "pl", "dh", "dw", "groups", "cg", "og", "K", "cols",
                     "x_off", ("xs", 4), "w_off", ("ws", 4), "b_off", "b_stride",
                     "g_off", ("gs", 4), "slice_len", "s_off", "s_stride", "z_off", "z_stride",
                     "xz_off")

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
                  g_off=0, gs=(0,) * 4, slice_len=0, s_off=0, s_stride=0, z_off=0, z_stride=0,
                  xz_off=0)
    values.update(fields)
    return PARAMS.pack(**values)


def header(buffers, shared="", reads=None):
    """The uniform block P and storage bindings 1.. of `buffers` (f32 arrays, read only), then
    the output Out; with `reads` (ConvReads) the bindings it names instead."""
    bindings = [(name, "f32", False) for name in buffers] + [("Out", "f32", True)] \
        if reads is None else reads.bindings(buffers)
    return prelude_header(PARAMS.size, bindings, shared)


def lets():
    """Every scalar parameter as a WGSL `let` of its own name, and the strides as xs0.. gs3."""
    lines = ["  let %s = %s;" % (name, PARAMS[name]) for name in _SCALARS]
    lines += ["  let %s%d = %s;" % (arr, i, PARAMS[arr, i]) for arr in _STRIDES for i in range(4)]
    return "\n".join(lines) + "\n"


class ConvReads(namedtuple("ConvReads", "w_dtype bits storage x_int scale zp_dtype x_zp")):
    """How a forward conv kernel reads its operands and finishes a sum: the conv2d primitive's
    float32 image and weight (FLOAT), or conv2d_quantized's (core/backend.py "quantized_conv2d")
    weight `w_dtype` of `bits` (int8/uint8 packed four to a word; float16, widened as read)
    through a codegen.quantized.PackedReader on the device's `storage` layout. x_int: the image
    is int32 (minus its zero point Xz[xz_off] where x_zp) and the sums are exact i32; else
    float32 sums. The weight's zero point (zp_dtype: its buffer's dtype, None: 0) is subtracted
    as a value is staged; its scale (where `scale`) multiplies the sum at the store, being one
    per output channel, so the staged weight values stay small integers."""

    @property
    def acc(self):
        return "i32" if self.x_int else "f32"

    @property
    def reader(self):
        return None if self.w_dtype is dtypes.float32 else \
            PackedReader(self.w_dtype, self.bits, self.storage, self.acc)

    def bindings(self, names):
        """The storage bindings of inputs `names` (X, Wt, Bias), the quantization's, then Out."""
        types = {"X": self.acc, "Wt": "f32" if self.reader is None else binding_type(self.w_dtype, self.storage),
                 "Bias": "f32"}
        out = [(name, types[name], False) for name in names if name != "Bias"]
        out += [("Xz", "i32", False)] if self.x_zp else []
        out += [("Scale", "f32", False)] if self.scale else []
        out += [("Zp", binding_type(self.zp_dtype, self.storage), False)] if self.zp_dtype else []
        out += [("Bias", "f32", False)] if "Bias" in names else []
        return out + [("Out", "f32" if self.scale or not self.x_int else "i32", True)]

    def x_at(self, index):
        return "(X[%s] - Xz[xz_off])" % index if self.x_zp else "X[%s]" % index

    def zp_let(self, o):
        """WGSL defining `wz`, the weight's zero point of output channel o, read once where a
        thread's weight values share it ("" where there is none)."""
        if self.zp_dtype is None:
            return ""
        return "let wz = i32(%s);" % self.reader.at("Zp", "z_off + (%s) * z_stride" % o, self.zp_dtype, 8)

    def w_at(self, index):
        """Weight element `index` as the value multiplied (after zp_let of its channel)."""
        if self.reader is None:
            return "Wt[%s]" % index
        return self.reader.dequantized(self.reader.at("Wt", index), self.zp_dtype and "wz")

    def w_word(self, word, j):
        """Value j of packed weight word `word` as the value multiplied (after zp_let)."""
        return self.reader.dequantized(self.reader.field(word, j), self.zp_dtype and "wz")

    def madd(self, x, w, acc):
        return "fma(%s, %s, %s)" % (x, w, acc) if self.acc == "f32" else "%s + %s * %s" % (acc, x, w)

    def finish(self):
        """WGSL of the stored value from sum `acc` of output channel `o` (before bias)."""
        return "acc * Scale[s_off + o * s_stride]" if self.scale else "acc"


FLOAT = ConvReads(dtypes.float32, 32, None, False, False, None, False)


def _store(has_bias, activation, reads=FLOAT):
    """WGSL storing accumulator `acc` of output channel `o`, image `b`, pixel `pix`."""
    bias = " + Bias[b_off + o * b_stride]" if has_bias else ""
    return ("var v = %s%s; v = %s; Out[(b * O + o) * (OH * OW) + pix] = v;"
            % (reads.finish(), bias, ACTIVATIONS[activation]))


def direct_wgsl(has_bias, activation, reads=FLOAT):
    """One thread per output element (b, o, oy, ox), in the output's row-major order."""
    src = header(["X", "Wt"] + (["Bias"] if has_bias else []), reads=reads) + entry_1d() + lets() + """\
  if (i >= total) { return; }
  let ox = i % OW; var r = i / OW; let oy = r % OH; r = r / OH; let o = r % O; let b = r / O;
  let pix = oy * OW + ox;
  let iy0 = i32(oy * sh) - i32(pt); let ix0 = i32(ox * sw) - i32(pl);
  let xb = x_off + b * xs0 + (o / og) * cg * xs1; let wb = w_off + o * ws0; ZP
  var acc = ZERO;
  for (var c = 0u; c < cg; c = c + 1u) {
    for (var ky = 0u; ky < kh; ky = ky + 1u) {
      let iy = iy0 + i32(ky * dh);
      if (iy < 0i || iy >= i32(H)) { continue; }
      for (var kx = 0u; kx < kw; kx = kx + 1u) {
        let ix = ix0 + i32(kx * dw);
        if (ix < 0i || ix >= i32(W)) { continue; }
        acc = MADD;
      }
    }
  }
  STORE
}
""".replace("ZP", reads.zp_let("o")).replace("ZERO", zero(reads.acc)).replace("MADD", reads.madd(
        reads.x_at("xb + c * xs1 + u32(iy) * xs2 + u32(ix) * xs3"),
        reads.w_at("wb + c * ws1 + ky * ws2 + kx * ws3"), "acc")).replace(
        "STORE", _store(has_bias, activation, reads))
    return helpers_for(src) + src


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
    """The backward kernels' implicit-GEMM template (both products in conv_grad.py):
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
# Column tiles past MAX_GROUPS continue in z (spill_grid); read before the parameters' lets.
SPILL_N0 = "(wid.x + nwg.x * (wid.z / %s)) * %%du" % PARAMS["groups"]


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


# The forward implicit GEMM's register tiles: two of the matmul's (wgpu_backend/matmul.py), both
# within WebGPU's default 16 KiB of workgroup memory: 64 output channels x 128 pixels, or x 64
# pixels (twice the workgroups) where the wider tile would leave a large GPU under two waves. On
# the H200 these beat 128 x 128 tiles (also with 16-deep K steps) on every ResNet-50 layer.
REG_TILES = {"r64x128": VARIANTS["reg64x128"], "r64x64": VARIANTS["reg64x64"]}


def reg_wgsl(has_bias, activation, tile, flat_weight, reads=FLOAT, weight_words=False):
    """The forward implicit GEMM (see the module docstring) on the register-tiled loop the large
    matmuls use: A is the group's weight as an og x K matrix (k = (c, ky, kx), read through its
    strides, or at k itself when each weight row is contiguous: flat_weight), B the virtual
    im2col matrix, gathered as it is staged. A thread's image columns stay the same at every K
    step, so their pixel coordinates are computed once, before the loop. reads: ConvReads (the
    quantized and half weights); weight_words: each 4-value quad of a flat weight row is one
    packed 8-bit word (row starts and K whole words), read as one u32."""
    acc_zero = zero(reads.acc)
    threads = (tile.bn // tile.tn) * (tile.bm // tile.tm)
    quads = tile.bk * tile.bn // 4 // threads
    setup = ["  let g = wid.z % groups; let khw = kh * kw; let ohw = OH * OW;",
             "  let k_begin = 0u; let k_end = K; let wg = w_off + g * og * ws0;"]
    for j in range(quads):
        for c in range(4):
            q = "%d_%d" % (j, c)
            setup += [
                "  let pn%s = n0 + ((t + %du) %% %du) * 4u + %du; let pin%s = pn%s < cols;"
                % (q, j * threads, tile.bn // 4, c, q, q),
                "  let xb%s = x_off + (pn%s / ohw) * xs0 + g * cg * xs1;" % (q, q),
                "  let iy%s = i32(((pn%s / OW) %% OH) * sh) - i32(pt); let ix%s = i32((pn%s %% OW) * sw)"
                " - i32(pl);" % (q, q, q, q)]

    def weight(k):
        if flat_weight:
            return reads.w_at("wg + gm * ws0 + %s" % k)
        return reads.w_at("wg + gm * ws0 + (%s / khw) * ws1 + ((%s %% khw) / kw) * ws2 + (%s %% kw) * ws3"
                          % (k, k, k))

    def load_a(j):
        # (past the group's last row, min() keeps the zero point's read inside its buffer)
        zp = [reads.zp_let("g * og + min(gm, og - 1u)")]
        if weight_words:
            return zp + ["pa%d = vec4<%s>(%s); if (gm < og && gk < K) { let word = Wt[(wg + gm * ws0 + gk) / 4u];"
                         % (j, reads.acc, acc_zero)] + \
                ["  pa%d[%d] = %s;" % (j, c, reads.w_word("word", c)) for c in range(4)] + ["}"]
        return zp + ["pa%d[%d] = %s; if (gm < og && gk + %du < K) { pa%d[%d] = %s; }"
                     % (j, c, acc_zero, c, j, c, weight("(gk + %du)" % c)) for c in range(4)]

    def load_b(j):
        lines = ["let kin = gk < K; let xc = (gk / khw) * xs1; let tap = gk % khw;",
                 "let dy = i32((tap / kw) * dh); let dx = i32((tap % kw) * dw);"]
        for c in range(4):
            q = "%d_%d" % (j, c)
            lines.append("{ let iy = iy%s + dy; let ix = ix%s + dx; pb%d[%d] = %s;" % (q, q, j, c, acc_zero))
            lines.append("  if (kin && pin%s && iy >= 0i && iy < i32(H) && ix >= 0i && ix < i32(W)) {"
                         " pb%d[%d] = %s; } }"
                         % (q, j, c, reads.x_at("xb%s + xc + u32(iy) * xs2 + u32(ix) * xs3" % q)))
        return lines

    shared, entry, body, rows, groups = regtile_kernel(
        tile.bm, tile.bn, tile.bk, tile.tm, tile.tn, tile.lanes_x, tile.pad_a, load_a, load_b,
        lambda k0: "%s + %du" % (k0, tile.bk), SPILL_N0 % tile.bn, reads.acc)
    stores = []
    for n, gi in groups:
        for c in range(4):
            stores.append("  { let p = %s + %du; let b = p / ohw; let pix = p %% ohw;" % (n, c))
            stores += ["    { let m = %s; if (m < og && p < cols) { let o = g * og + m; "
                       "let acc = c%d_%d[%d]; %s } }" % (m, r, gi, c, _store(has_bias, activation, reads))
                       for m, r in rows]
            stores.append("  }")
    src = (header(["X", "Wt"] + (["Bias"] if has_bias else []), shared, reads) + entry + "\n" + lets()
           + "\n".join(setup + body + stores) + "\n}\n")
    return helpers_for(src) + src


def kernel_kind(og, k, cpu):
    """"reg" (the register-tiled implicit GEMM) once a tile has enough output channels and
    reduction depth to reuse what it stages; "direct" for depthwise and tiny convolutions, and
    on CPU adapters (lavapipe, SwiftShader), as the matmul's heuristic does: barriers cost them
    more than they save. (In Chromium, SwiftShader lost its device on the register-tiled kernel,
    e2e/test_capture_browser.py; why -- the JIT's time on the large unrolled kernel, or a
    construct it mishandles -- is not pinned down.)"""
    return "direct" if cpu or og < 8 or k < 16 else "reg"


TWO_WAVES = 264  # workgroups that give a large GPU two waves (an H100's 132 SMs)


def tile_for(og, cols, groups):
    """t128 once its tiles still give a GPU two waves of workgroups, else t64 (the backward
    kernels' tiles, conv_grad.py)."""
    return "t128" if -(-og // 128) * -(-cols // 128) * groups >= TWO_WAVES else "t64"


def reg_tile_for(og, cols, groups):
    """r64x128 once its tiles still give a GPU two waves of workgroups, else r64x64."""
    return "r64x128" if -(-og // 64) * -(-cols // 128) * groups >= TWO_WAVES else "r64x64"


def conv2d(backend, x, w, bias, stride, padding, dilation, groups, activation):
    """Launch one conv kernel on `backend` (a cn.Wgpu) through its public kernel interface;
    returns the (N, O, OH, OW) output handle. Arguments as the protocol's conv2d primitive."""
    return _launch(backend, x, w, bias, stride, padding, dilation, groups, activation, FLOAT, [], {})


def conv2d_quantized(backend, x, x_param, q, scale, zero_point, bias, stride, padding, dilation, groups):
    """The conv2d_quantized ability (core/backend.py "quantized_conv2d") on the forward kernels:
    the weight q (int8/uint8, or float16) read from its storage and dequantized as staged. An
    int32 image minus its zero point x_param gives exact i32 sums (scale None); a float32 image
    (a QDQ activation: its integers times x_param, its scale) times q - zero_point sums in f32,
    scaled at the store by scale[o] (x_param is already in the image's values); a float16 q is
    a half model's weight, no scale or zero point."""
    half = q.dtype is dtypes.float16
    if q.dtype not in (dtypes.int8, dtypes.uint8) and not half:
        raise DTypeError("cn.Wgpu conv2d_quantized: the weight is %s; int8, uint8 or float16 are "
                         "read in the conv kernels" % q.dtype.name)
    x_int = x.dtype is dtypes.int32
    valid = not x_int and scale is None and zero_point is None if half else x_int == (scale is None)
    if not valid:
        raise DTypeError("cn.Wgpu conv2d_quantized: a %s image with a %s weight%s is not a "
                         "quantized convolution (core/backend.py \"quantized_conv2d\")"
                         % (x.dtype.name, q.dtype.name, " and a scale" if scale is not None else ""))
    x_zp = x_int and x_param is not None
    reads = ConvReads(q.dtype, 16 if half else 8, backend.storage_layout, x_int, scale is not None,
                      None if zero_point is None else zero_point.dtype, x_zp)
    handles = ([x_param] if x_zp else []) + ([scale] if scale is not None else []) + \
        ([zero_point] if zero_point is not None else [])
    fields = dict(xz_off=x_param.offset if x_zp else 0)
    if scale is not None:
        fields.update(s_off=scale.offset, s_stride=int(scale.size > 1))
    if zero_point is not None:
        fields.update(z_off=zero_point.offset, z_stride=int(zero_point.size > 1))
    return _launch(backend, x, q, bias, stride, padding, dilation, groups, None, reads, handles, fields)


def _launch(backend, x, w, bias, stride, padding, dilation, groups, activation, reads, quant_handles,
            quant_fields):
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    (pt, pb), (pl, pr) = padding
    oh = (h + pt + pb - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (wd + pl + pr - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    out_dtype = dtypes.int32 if reads.x_int and not reads.scale else dtypes.float32
    out = backend.empty((n, o, oh, ow), out_dtype)
    total = n * o * oh * ow
    if total == 0:
        return out
    og, k, cols = o // groups, cg * kh * kw, n * oh * ow
    kind = kernel_kind(og, k, backend.device.is_cpu)
    if kind != "direct":
        tile_name = reg_tile_for(og, cols, groups)
        tile = REG_TILES[tile_name]
        grid = spill_grid(cols, og, groups, tile)
        check_grid(grid, "conv2d: %s * %s" % (x.shape, w.shape))
        kind += "_" + tile_name
    else:
        grid = groups_for(total, WG)
    params = pack(x.shape, w.shape, (oh, ow), stride, padding, dilation, groups, total=total,
                  K=k, cols=cols, x_off=x.offset, xs=x.strides, w_off=w.offset, ws=w.strides,
                  b_off=0 if bias is None else bias.offset,
                  b_stride=0 if bias is None else bias.strides[0], **quant_fields)
    has_bias = bias is not None
    handles = [x, w] + quant_handles + ([bias] if has_bias else []) + [out]
    # Each weight row (c, ky, kx) contiguous: A is read at k itself, no index arithmetic; packed
    # 8-bit rows that start on words with K whole words are read a word (4 values) at a time.
    flat_weight = tuple(w.strides[1:]) == (kh * kw, kw, 1)
    weight_words = flat_weight and w.dtype.per_word == 4 and k % 4 == 0 and w.offset % 4 == 0 \
        and w.strides[0] % 4 == 0
    quantized = "" if reads is FLOAT else "q%s_" % w.dtype.name
    name = "conv2d_%s%s%s" % (quantized, kind, "_" + activation if activation else "")

    def build():
        if kind == "direct":
            return direct_wgsl(has_bias, activation, reads)
        return reg_wgsl(has_bias, activation, tile, flat_weight, reads, weight_words)
    backend.run_kernel(("conv2d", kind, has_bias, activation, flat_weight, reads, weight_words), build,
                       handles, params, grid, name, 4 * (x.size + (o if has_bias else 0)) + w.size * w.dtype.itemsize,
                       4 * total, flops=2 * total * k)
    return out
