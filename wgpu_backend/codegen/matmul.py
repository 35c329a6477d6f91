"""The matmul templates: three kernels (shared-memory tiles, register tiles double-buffered,
direct) that share one parameter layout, prologue, bounds-checked global loads and stores of C;
each contributes only its entry point, its staging and its inner loop. At the store of C a
kernel either writes C or calls an epilogue generated from a fusion Program (program.py,
`epilogue_source`): bias + activation after a Linear or a conv, in the matmul kernel itself.
"""

from .mathlib import helpers_for
from .packing import binding_type, load
from .prelude import ParamLayout, header, unravel, dot
from .quantized import PackedReader

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
    lines.append(unravel("bz", P.array("batch"), "b"))
    bc = ["b%d" % d for d in range(nbatch)]
    for name, off, strides in (("a_base", "a_off", "a_bstride"), ("b_base", "b_off", "b_bstride")):
        lines.append("  let %s = %s;" % (name, dot(P[off], bc, [P[strides, d] for d in range(nbatch)])))
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
    src = header(matmul_param_count(nbatch, epilogue), _matmul_buffers(vec_a, vec_b, epilogue),
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


def regtile_kernel(bm, bn, bk, tm, tn, lanes_x, pad_a, load_a, load_b, next_k0, n0=None, acc="f32"):
    """The register-tiled, double-buffered loop of C[m, n] = sum_k A[m, k] * B[k, n] over k from
    `k_begin` to `k_end` (WGSL names the caller defines), shared by the matmul
    (matmul_regtile_wgsl) and the implicit-GEMM convolution (conv.py), which differ only in how
    they read A and B from global memory: load_a(j) returns WGSL filling the vec4 `pa<j>` with
    A[gm, gk..gk+3], load_b(j) the vec4 `pb<j>` with B[gk, gn..gn+3] (gm, gk, gn in scope, zeros
    outside the operand); next_k0(k0) is the WGSL of the slice a step prefetches; n0 the WGSL of
    the workgroup's first column (default: workgroup x counts column tiles).

    A workgroup of (bm/tm) * (bn/tn) threads computes a bm x bn tile of C; each thread a tm x tn
    block of registers (tm, tn multiples of 4) held as tm * tn/4 vec4 accumulators. Per bk-deep
    step A's slice is staged k-major (As[k][m], rows padded by pad_a vec4 against bank conflicts
    on the transposing stores) and B's as Bs[k][n], both as vec4, so every shared read in the fully
    unrolled inner loop is one vec4 of A (4 rows) or of B (4 columns) feeding 16 FMAs. Two
    shared buffers: the next slice is fetched from global memory into registers before the
    current one is multiplied and stored into the other buffer after it, one barrier per step.
    Thread t is placed so that a 32-lane warp covers lanes_x columns x 32/lanes_x rows of
    threads: few distinct shared addresses per warp-wide read (broadcasts). A thread's rows are
    m0 + i*4*wy + ty*4 + 0..3, its columns n0 + g*4*wx + tx*4 + 0..3.

    Returns (shared, entry, body, rows, cols): the workgroup memory, the entry point up to m0 and
    n0 (workgroup x: column tiles, y: row tiles), the loop, [(WGSL of row m, r)] and [(WGSL of
    the first of 4 columns, g)]; the accumulator of row r and column group g is the vec4 c<r>_<g>.
    acc: the type staged and summed, "f32" or "i32" (integer products: exact sums, a quantized
    convolution of integer images, conv.py)."""
    vt = "vec4<%s>" % acc
    wx, wy = bn // tn, bm // tm
    threads = wx * wy
    ri, gj = tm // 4, tn // 4           # vec4 groups of rows / columns per thread
    sa, sb = bm // 4 + pad_a, bn // 4   # shared row strides in vec4
    a_tile, b_tile = bk * sa, bk * sb   # vec4 per buffer
    shared = ("var<workgroup> As: array<%s, %d>;\nvar<workgroup> Bs: array<%s, %d>;"
              % (vt, 2 * a_tile, vt, 2 * b_tile))
    warps_x, lanes_y = wx // lanes_x, 32 // lanes_x
    entry = """
@compute @workgroup_size(%d)
fn main(@builtin(local_invocation_index) t: u32, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
  let tx = t %% %du + %du * ((t / 32u) %% %du);
  let ty = (t / %du) %% %du + %du * (t / %du);
  let m0 = wid.y * %du; let n0 = %s;""" % (
        threads, lanes_x, lanes_x, warps_x, lanes_x, lanes_y, lanes_y, 32 * warps_x, bm,
        n0 or "wid.x * %du" % bn)

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
            out += ["      " + line for line in load_a(j)] + ["    }"]
        for j in range(nbv):
            e = "(t + %du)" % (j * threads)
            out.append("    { let gk = %s + %s / %du; let gn = n0 + (%s %% %du) * 4u;"
                       % (k0, e, bn // 4, e, bn // 4))
            out += ["      " + line for line in load_b(j)] + ["    }"]
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

    body = ["  var pa%d: %s;" % (j, vt) for j in range(na)]
    body += ["  var pb%d: %s;" % (j, vt) for j in range(nbv)]
    body += ["  var c%d_%d = %s(0);" % (r, g, vt) for r in range(tm) for g in range(gj)]
    # (WGSL has no integer fma)
    madd = "fma(%s, %s, %s)" if acc == "f32" else "%s * %s + %s"
    body += fetch("k_begin") + stash("0u")
    body += ["  workgroupBarrier();", "  var cur = 0u;",
             "  for (var k0 = k_begin; k0 < k_end; k0 = k0 + %du) {" % bk]
    body += fetch(next_k0("k0"))
    body.append("    let ao = cur * %du + ty; let bo = cur * %du + tx;" % (a_tile, b_tile))
    for kk in range(bk):
        body += ["    let a%d_%d = As[ao + %du];" % (kk, i, kk * sa + i * wy) for i in range(ri)]
        body += ["    let b%d_%d = Bs[bo + %du];" % (kk, g, kk * sb + g * wx) for g in range(gj)]
        body += ["    c%d_%d = %s;" % (r, g, madd % ("%s(a%d_%d[%d])" % (vt, kk, r // 4, r % 4),
                                                   "b%d_%d" % (kk, g), "c%d_%d" % (r, g)))
                 for r in range(tm) for g in range(gj)]
    body.append("    cur = 1u - cur;")
    body += stash("cur")
    body.append("    workgroupBarrier();\n  }")
    rows = [("m0 + %du + ty * 4u" % ((r // 4) * 4 * wy + r % 4), r) for r in range(tm)]
    cols = [("n0 + %du + tx * 4u" % (g * 4 * wx), g) for g in range(gj)]
    return shared, entry, body, rows, cols


def matmul_regtile_wgsl(nbatch, bm, bn, bk, tm, tn, lanes_x, pad_a, vec_a=False, vec_b=False,
                        exact=False, epilogue=None):
    """Batched C = A @ B for large products: regtile_kernel's loop over the matmul's operands.
    Same parameters, grid, split-K, specialisations (vec_a, vec_b, exact) and epilogue as
    matmul_wgsl."""
    def load_a(j):
        if vec_a:
            return [_load("pa%d" % j, "vec4<f32>(0.0)", "gm < M && gk < k_end",
                          _a_at("gm", "gk", True), exact)]
        return [_load("pa%d[%d]" % (j, c), "0.0", "gm < M && gk + %du < k_end" % c,
                      _a_at("gm", "(gk + %du)" % c, False), exact) for c in range(4)]

    def load_b(j):
        if vec_b:
            return [_load("pb%d" % j, "vec4<f32>(0.0)", "gn < N && gk < k_end",
                          _b_at("gk", "gn", True), exact)]
        return [_load("pb%d[%d]" % (j, c), "0.0", "gn + %du < N && gk < k_end" % c,
                      _b_at("gk", "(gn + %du)" % c, False), exact) for c in range(4)]

    # The last step fetches a slice that is never read: with exact tiles its own (in range, no
    # branch in the loop), else the one past k_end (masked to zeros by the bounds checks).
    next_k0 = (lambda k0: "min(%s + %du, k_end - %du)" % (k0, bk, bk)) if exact else \
        (lambda k0: "%s + %du" % (k0, bk))
    shared, entry, body, rows, groups = regtile_kernel(bm, bn, bk, tm, tn, lanes_x, pad_a,
                                                       load_a, load_b, next_k0)
    if vec_b:
        cols = [(n, lambda r, g=g: "c%d_%d" % (r, g)) for n, g in groups]
    else:
        cols = [("%s + %du" % (n, c), lambda r, g=g, c=c: "c%d_%d[%d]" % (r, g, c))
                for n, g in groups for c in range(4)]
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


# ---- matmul with a quantized B (weights that stay packed) ----------------------------------
def matmul_quantized_layout():
    """P of the quantized-B matmul: sizes; A's offset (A contiguous (M, K)); B's element (k, n)
    at q_off + k * q_sk + n * q_sn (8-bit values, or nibbles when bits == 4); its scale and zero
    point per (block of k, n) at *_off + block * *_sb + n * *_sn; the default zero point."""
    return ParamLayout("M", "N", "K", "block", "a_off", "q_off", "q_sk", "q_sn", "s_off", "s_sb",
                       "s_sn", "z_off", "z_sb", "z_sn", "z_default")


QUANT_THREADS = 16   # the quantized-B matmul's workgroup: 16 x 16 invocations,
QUANT_BK = 32        # K per staged step: 32 bytes of an int8 row (one memory sector) per step
QUANT_MIN_GROUPS = 256  # fewer 64 x 64 tiles than this leave a GPU idle: 32 x 32 ones instead


def quantized_micro(m, n):
    """Outputs per invocation along each side: 4 (64 x 64 tiles of C), or 2 (32 x 32 tiles: four
    times the workgroups for the small products of a batch-1 transformer or a late conv layer)."""
    tiles = -(-m // (4 * QUANT_THREADS)) * -(-n // (4 * QUANT_THREADS))
    return 4 if tiles >= QUANT_MIN_GROUPS else 2


def quantized_tiling(m, n, cpu):
    """The register-tiled loop's tiling (matmul.VARIANTS) for a quantized-B product, or None for
    matmul_quantized_wgsl's tiles: the float32 matmul's rule (matmul.heuristic: reg64 once both
    sides fill a 64 x 64 tile on a GPU); CPU adapters keep the simpler tiles, whose fewer
    barriers they run faster."""
    return None if cpu or m < 64 or n < 64 else "reg64"


def quantized_per_word(q_dtype, bits):
    """Values of B in one u32 word of its packed storage (nibbles when bits == 4)."""
    return PackedReader(q_dtype, bits, None, None).per_word


def _quantized_b(reader, scale_dtype, zp_dtype, zp_bits):
    """dequantized(raw, gk, gn): the multiplied value of B[gk, gn] of the quantized-B matmuls
    whose packed value is `raw` (i32; a float16 B's f32): minus its block's zero point (or
    P.z_default), times its block's scale (where scale_dtype)."""
    P = matmul_quantized_layout()

    def dequantized(raw, gk, gn):
        if reader.is_float:   # a half model's weight: widened as loaded, no scale or zero point
            return raw
        blk = "(%s) / block" % gk
        zp = "bitcast<i32>(%s)" % P["z_default"] if zp_dtype is None else "i32(%s)" % reader.at(
            "z", "%s + %s * %s + (%s) * %s" % (P["z_off"], blk, P["z_sb"], gn, P["z_sn"]), zp_dtype, zp_bits)
        scale = None if scale_dtype is None else "f32(%s)" % load(
            scale_dtype, reader.storage, "s", "%s + %s * %s + (%s) * %s" % (P["s_off"], blk, P["s_sb"], gn, P["s_sn"]))
        return reader.dequantized(raw, zp, scale)
    return dequantized


def _quantized_buffers(a_dtype, q_dtype, scale_dtype, zp_dtype, storage, acc):
    """The quantized-B matmuls' bindings: a, q, s (scales), z (zero points), out."""
    buffers = [("a", binding_type(a_dtype, storage), False), ("q", binding_type(q_dtype, storage), False)]
    if scale_dtype is not None:
        buffers.append(("s", binding_type(scale_dtype, storage), False))
    if zp_dtype is not None:
        buffers.append(("z", binding_type(zp_dtype, storage), False))
    return buffers + [("out", acc, True)]


def matmul_quantized_wgsl(a_dtype, q_dtype, bits, scale_dtype, zp_dtype, zp_bits, storage, words=None,
                          micro=4):
    """C = A @ dequantize(B) in tile x tile blocks of C (tile = QUANT_THREADS * micro; grid:
    ceil(N / tile), ceil(M / tile)), each invocation micro x micro of them, with the
    register-blocked inner loop of the float32 tiles (a vector of `micro` rows of A times one of
    `micro` columns of B per k).
    Each step stages a tile x QUANT_BK slice of A and a QUANT_BK x tile slice of B in workgroup
    memory, B dequantized as it is staged ((q - zero point) * its block's scale), so B is read
    from its packed words only. `words` says how B is read (the caller checks alignment):
      "k"  B is k-contiguous (weights stored (N, K): conv weights, MatMulNBits) with its offset
           and row stride whole words: each invocation loads whole u32 words of one row,
           neighbouring invocations neighbouring words, and unpacks their 4 (8 nibbles) values;
      "n"  the same along n (B stored (K, N): MatMulInteger's B);
      "kv" one value per read along k (neighbouring invocations, neighbouring k): a float16 B
           stored (N, K) (conv and Gemm weights), read in order in both float16 layouts;
      None one value per read through the strides, neighbouring invocations along n.
    Integer A (scale_dtype None: MatMulInteger) stages q - zp and sums in i32, exactly for any
    K; float A in f32. zp_dtype None: every zero point is P.z_default. A float16 B (bits 16) is
    widened as it is read, one value per read (no scale or zero point). storage: the device's
    layout of storage dtypes (packing.py; float16 scales are read through it)."""
    P = matmul_quantized_layout()
    acc, T, R, BK = a_dtype.wgsl, QUANT_THREADS, micro, QUANT_BK
    tile, threads = T * R, T * T
    pw = quantized_per_word(q_dtype, bits)
    vec = "vec%d<%s>" % (R, acc)

    reader = PackedReader(q_dtype, bits, storage, acc)
    dequantized = _quantized_b(reader, scale_dtype, zp_dtype, zp_bits)
    buffers = _quantized_buffers(a_dtype, q_dtype, scale_dtype, zp_dtype, storage, acc)
    # ta[k][m / R][m % R], tb[k][n / R][n % R]: a vector of R rows of A / columns of B
    shared = ("var<workgroup> ta: array<array<{vec}, {tr}>, {BK}>;\n"
              "var<workgroup> tb: array<array<{vec}, {tr}>, {BK}>;").format(vec=vec, tr=tile // R, BK=BK)

    def staged(count, lines):
        """`lines` run for e over [0, count) spread over the workgroup's invocations."""
        out = []
        for r in range(-(-count // threads)):
            last = (r + 1) * threads > count
            out.append("    { let e = t + %du;%s" % (r * threads, " if (e < %du) {" % count if last else ""))
            out += ["      " + line for line in lines]
            out.append("    }" + ("}" if last else ""))
        return out

    # A along k within a row (neighbouring invocations read neighbouring values)
    stage = staged(tile * BK, [
        "let am = e / %du; let ak = e %% %du; let gm = m0 + am; let gk = k0 + ak;" % (BK, BK),
        "ta[ak][am / %du][am %% %du] = select(%s(0), a[%s + gm * K + gk], gm < M && gk < K);"
        % (R, R, acc, P["a_off"])])
    q_index = "%s + (%%s) * %s + (%%s) * %s" % (P["q_off"], P["q_sk"], P["q_sn"])
    if words == "k":
        per_row = BK // pw
        lines = ["let bn = e / %du; let kw = (e %% %du) * %du; let gn = n0 + bn; let gk0 = k0 + kw;"
                 % (per_row, per_row, pw),
                 "var word = 0u;",
                 "if (gn < N && gk0 < K) { word = q[(%s) / %du]; }" % (q_index % ("gk0", "gn"), pw)]
        for j in range(pw):
            lines.append("{ let gk = gk0 + %du; var v = %s(0); if (gn < N && gk < K) { v = %s; } "
                         "tb[kw + %du][bn / %du][bn %% %du] = v; }"
                         % (j, acc, dequantized(reader.field("word", j), "gk", "gn"), j, R, R))
        stage += staged(tile * BK // pw, lines)
    elif words == "n":
        per_row = tile // pw
        lines = ["let bk = e / %du; let nw = (e %% %du) * %du; let gk = k0 + bk; let gn0 = n0 + nw;"
                 % (per_row, per_row, pw),
                 "var word = 0u;",
                 "if (gk < K && gn0 < N) { word = q[(%s) / %du]; }" % (q_index % ("gk", "gn0"), pw)]
        for j in range(pw):
            lines.append("var v%d = %s(0); if (gk < K && gn0 + %du < N) { v%d = %s; }"
                         % (j, acc, j, j, dequantized(reader.field("word", j), "gk", "gn0 + %du" % j)))
        lines += ["tb[bk][nw / %du + %du] = %s(%s);" % (R, g, vec, ", ".join("v%d" % (R * g + c) for c in range(R)))
                  for g in range(pw // R)]
        stage += staged(tile * BK // pw, lines)
    elif words == "kv":
        stage += staged(tile * BK, [
            "let bn = e / %du; let bk = e %% %du; let gk = k0 + bk; let gn = n0 + bn;" % (BK, BK),
            "var v = %s(0);" % acc,
            "if (gk < K && gn < N) { v = %s; }" % dequantized(reader.at("q", q_index % ("gk", "gn")),
                                                              "gk", "gn"),
            "tb[bk][bn / %du][bn %% %du] = v;" % (R, R)])
    else:
        stage += staged(tile * BK, [
            "let bk = e / %du; let bn = e %% %du; let gk = k0 + bk; let gn = n0 + bn;" % (tile, tile),
            "var v = %s(0);" % acc,
            "if (gk < K && gn < N) { v = %s; }" % dequantized(reader.at("q", q_index % ("gk", "gn")),
                                                              "gk", "gn"),
            "tb[bk][bn / %du][bn %% %du] = v;" % (R, R)])
    madd = (lambda x, y, z: "fma(%s, %s, %s)" % (x, y, z)) if acc == "f32" else \
        (lambda x, y, z: "%s + %s * %s" % (z, x, y))
    inner = ["      c%d = %s;" % (i, madd("%s(av[%d])" % (vec, i), "bv", "c%d" % i)) for i in range(R)]
    body = """
@compute @workgroup_size({T}, {T})
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {{
  let M = {M}; let N = {N}; let K = {K}; let block = {block};
  let tx = lid.x; let ty = lid.y; let t = ty * {T}u + tx;
  let m0 = wid.y * {tile}u; let n0 = wid.x * {tile}u;
  {accs}
  for (var k0 = 0u; k0 < K; k0 = k0 + {BK}u) {{
{stage}
    workgroupBarrier();
    for (var k = 0u; k < {BK}u; k = k + 1u) {{
      let av = ta[k][ty]; let bv = tb[k][tx];
{inner}
    }}
    workgroupBarrier();
  }}
{store}
}}
""".format(T=T, BK=BK, tile=tile, M=P["M"], N=P["N"], K=P["K"], block=P["block"],
           accs=" ".join("var c%d = %s(0);" % (i, vec) for i in range(R)),
           stage="\n".join(stage), inner="\n".join(inner),
           store="\n".join("  {{ let m = m0 + ty * {R}u + {i}u;\n"
                           "    for (var j = 0u; j < {R}u; j = j + 1u) {{\n"
                           "      let n = n0 + tx * {R}u + j;\n"
                           "      if (m < M && n < N) {{ out[m * N + n] = c{i}[j]; }}\n"
                           "    }}\n  }}".format(R=R, i=i) for i in range(R)))
    src = header(P.size, buffers, shared) + body
    return helpers_for(src) + src


def matmul_quantized_regtile_wgsl(a_dtype, q_dtype, bits, scale_dtype, zp_dtype, zp_bits, storage, words, tiling):
    """C = A @ dequantize(B) for large products on regtile_kernel's loop (the float32 matmul's
    register tiles, double-buffered; `tiling` a matmul.VARIANTS reg* entry): same parameters,
    bindings and results as matmul_quantized_wgsl, grid (ceil(cols / bn), ceil(rows / bm)).
    Integer A sums in i32 (exact), float A in f32; B is dequantized as it is fetched. Where B is
    stored (N, K) (words "k": 8-bit rows of whole words; "kv": float16) the product runs
    transposed, C^T = B^T A^T, so that B is the loop's k-contiguous operand: a 4-deep quad of a
    row of 8-bit B is one u32 word; A^T's columns are then read down A's rows. Elsewhere B is
    the loop's B, a quad along n one word where B is stored (K, N) in whole words ("n")."""
    P = matmul_quantized_layout()
    acc = a_dtype.wgsl
    reader = PackedReader(q_dtype, bits, storage, acc)
    dequantized = _quantized_b(reader, scale_dtype, zp_dtype, zp_bits)
    zero4 = "vec4<%s>(%s(0))" % (acc, acc)
    q_index = "%s + (%%s) * %s + (%%s) * %s" % (P["q_off"], P["q_sk"], P["q_sn"])
    a_index = "%s + (%%s) * K + %%s" % P["a_off"]
    transposed = words in ("k", "kv")
    rows, cols = ("N", "M") if transposed else ("M", "N")
    word = reader.per_word == 4 and words in ("k", "n")

    def b_quad(j, gk, gn, along_k):
        """pa<j>/pb<j> = the 4 values of B from (gk, gn) along k or n."""
        dst = ("pa%d" if along_k else "pb%d") % j
        at = (lambda c: ("%s + %du" % (gk, c), gn)) if along_k else (lambda c: (gk, "%s + %du" % (gn, c)))
        inside = "%s < N && %s < K" % (gn, gk)
        if word:   # (the 4 values lie in one word; those past K or N -- a padded row -- stay 0: their
            # block's scale may lie past the scales' end)
            return ["%s = %s; if (%s) { let word = q[(%s) / 4u];" % (dst, zero4, inside, q_index % (gk, gn))] + \
                ["  if (%s < K && %s < N) { %s[%d] = %s; }" % (at(c)[0], at(c)[1], dst, c,
                                                           dequantized(reader.field("word", c), *at(c)))
                 for c in range(4)] + ["}"]
        out = []
        for c in range(4):
            k_c, n_c = at(c)
            out.append("%s[%d] = %s(0); if (%s < N && %s < K) { %s[%d] = %s; }"
                       % (dst, c, acc, n_c, k_c, dst, c, dequantized(reader.at("q", q_index % (k_c, n_c)), k_c, n_c)))
        return out

    def a_quad(j, gm, gk, along_k):
        dst = ("pa%d" if along_k else "pb%d") % j
        at = (lambda c: (gm, "%s + %du" % (gk, c))) if along_k else (lambda c: ("%s + %du" % (gm, c), gk))
        return ["%s[%d] = %s(0); if (%s < M && %s < K) { %s[%d] = a[%s]; }"
                % (dst, c, acc, at(c)[0], at(c)[1], dst, c, a_index % at(c)) for c in range(4)]

    if transposed:   # loop rows: n (B^T), loop columns: m (A^T)
        load_a = lambda j: b_quad(j, "gk", "gm", True)    # noqa: E731
        load_b = lambda j: a_quad(j, "gn", "gk", False)   # noqa: E731
    else:
        load_a = lambda j: a_quad(j, "gm", "gk", True)    # noqa: E731
        load_b = lambda j: b_quad(j, "gk", "gn", False)   # noqa: E731
    shared, entry, body, row_list, groups = regtile_kernel(
        tiling.bm, tiling.bn, tiling.bk, tiling.tm, tiling.tn, tiling.lanes_x, tiling.pad_a, load_a, load_b,
        lambda k0: "%s + %du" % (k0, tiling.bk), acc=acc)
    prologue = ["  let M = %s; let N = %s; let K = %s; let block = %s;" % (P["M"], P["N"], P["K"], P["block"]),
                "  let k_begin = 0u; let k_end = K;"]
    stores = []
    for n, g in groups:
        for c in range(4):
            for m, r in row_list:
                stores.append("  { let row = %s; let col = %s + %du; if (row < %s && col < %s) { out[%s] = c%d_%d[%d]; } }"
                              % (m, n, c, rows, cols, "col * N + row" if transposed else "row * N + col", r, g, c))
    src = header(P.size, _quantized_buffers(a_dtype, q_dtype, scale_dtype, zp_dtype, storage, acc), shared) + \
        entry + "\n" + "\n".join(prologue + body + stores) + "\n}\n"
    return helpers_for(src) + src
