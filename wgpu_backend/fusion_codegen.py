"""WGSL for cn.Fusion: one generated kernel per fusion group (core/fusion/graph.py `Program`).

Every op's WGSL comes from codegen.op_expression, the table the plain Wgpu kernels use, so a
fused kernel computes exactly what the unfused ones would; this file only decides where values
are read, in which order the expressions run, and where results are written.

Two kernel shapes:
  flat   no reduction: one invocation per element of the frame shape; each node is one `let`.
  rows   reductions along one axis: one workgroup (or, for short axes, one invocation) per row.
         Row values (reduction results and what is computed from them) are computed once per
         row; full values are recomputed inside each loop over the axis that needs them (the
         prologue of every reduction, then the epilogue loop that writes full outputs). So
         softmax and layer norm read their input a few times from cache and write it once.

Leaves are read through (offset, strides) from the uniform block, so one pipeline serves every
shape of the same rank; the cache key is the Program's structure plus the leaves' layouts.
"""

import math
import struct

from cinders import dtypes

from . import codegen
from cinders.backend import row_major_strides
from .codegen import _p, _dot, _unravel, _header, _entry_1d, _helpers_for
from .pool import Placement

ROW_THREADS = 64     # workgroup size of the rows kernel when the reduced axis is long
ROW_MIN_AXIS = 128   # shorter axes: one invocation loops over the whole row
_TYPE = codegen.WGSL_TYPE
_KIND = codegen.KIND
_INIT = {  # identity of each reduction, as WGSL, per kind
    "sum": {"f": "0.0", "i": "0i", "b": "0u"},
    "prod": {"f": "1.0", "i": "1i", "b": "1u"},
    # -inf / +inf: bitcast from a `var` (Tint rejects infinities in constant expressions)
    "max": {"f": "bitcast<f32>(inf_bits | 0x80000000u)", "i": "bitcast<i32>(0x80000000u)", "b": "0u"},
    "min": {"f": "bitcast<f32>(inf_bits)", "i": "bitcast<i32>(0x7fffffffu)", "b": "1u"},
}
_COMBINE = {
    "sum": {"f": "{a} + {b}", "i": "{a} + {b}", "b": "max({a}, {b})"},
    "prod": {"f": "{a} * {b}", "i": "{a} * {b}", "b": "min({a}, {b})"},
    # NaN propagates, as in the plain reduce kernel
    "max": {"f": "fmax_f({a}, {b})", "i": "max({a}, {b})", "b": "max({a}, {b})"},
    "min": {"f": "fmin_f({a}, {b})", "i": "min({a}, {b})", "b": "min({a}, {b})"},
}


def compiler(inner, max_buffers=None):
    return WgslFusion(inner, max_buffers)


def _bits(value, dtype):
    if dtype is dtypes.float32:
        return struct.unpack("<I", struct.pack("<f", float(value)))[0]
    if dtype is dtypes.int32:
        return int(value) & 0xFFFFFFFF
    return 1 if value else 0


class WgslFusion:
    """The fusion compiler of cn.Wgpu: Programs in, launched kernels and result handles out."""

    def __init__(self, inner, max_buffers=None):
        self.inner = inner
        limit = inner.device.limits["max_storage_buffers_per_shader_stage"]
        self.max_buffers = min(limit, max_buffers) if max_buffers else limit

    @staticmethod
    def binding_key(h):
        return id(h.storage)

    # ---- running a Program ------------------------------------------------------------------
    def run(self, program):
        shape, axis = program.shape, program.axis
        inner = self.inner
        if math.prod(shape) == 0:
            return [inner._new(program.exprs[o].shape, program.exprs[o].dtype)
                    for o in program.outputs]
        views = [self._frame_view(e.value, shape, axis) for e in program.leaves]
        # One binding per distinct buffer (a tensor read through two views binds once).
        slots, binding_of, storages = [], [], {}
        for e in program.leaves:
            key = (id(e.value.storage), e.dtype)
            if key not in slots:
                slots.append(key)
                storages[key] = e.value.storage
            binding_of.append(slots.index(key))
        slot_types = tuple(_TYPE[dt] for _, dt in slots)
        flat = not program.has_reduce and all(program.nodes[o][3] == "full" for o in program.outputs)
        donors = ()
        if flat:
            layouts = tuple("c" if v[0] == shape and e.value.is_contiguous() else "s"
                            for v, e in zip(views, program.leaves))
            n = math.prod(shape)
            # Contiguous everywhere and 16-byte aligned: each invocation moves vec4s.
            width = 4 if (n % 4 == 0 and all(layout == "c" for layout in layouts)
                          and all(v[2] % 4 == 0 for v in views)) else 1
            key = ("fusion", "flat", program.key, tuple(binding_of), slot_types, layouts, width)
            params = [n // width] + list(shape) + [_bits(c.arg, c.dtype) for c in program.consts]
            for (vshape, strides, offset) in views:
                params += [offset // width] + list(strides)
            groups = codegen.groups_for(n // width, codegen.WG)

            def build(inplace=None):
                return flat_wgsl(program, binding_of, slot_types, layouts, width, inplace)

            if len(program.outputs) == 1 and inner.device.recording_here() is None:
                donors = self._donors(program, slots, binding_of, layouts, views)
        else:
            length = shape[axis]
            rows = math.prod(shape) // length
            threads = ROW_THREADS if length >= ROW_MIN_AXIS else 1
            key = ("fusion", "rows", program.key, tuple(binding_of), slot_types, threads)
            outer = [d for d in range(len(shape)) if d != axis]
            params = [rows, length] + [shape[d] for d in outer]
            params += [_bits(c.arg, c.dtype) for c in program.consts]
            for (vshape, strides, offset) in views:
                params += [offset] + [strides[d] for d in outer] + [strides[axis]]
            cs = row_major_strides(shape)
            params += [cs[d] for d in outer] + [cs[axis]]
            groups = codegen.groups_for(rows, 1 if threads > 1 else ROW_THREADS)
            build = lambda: rows_wgsl(program, binding_of, slot_types, threads)  # noqa: E731
        buffers = [storages[k].raw for k in slots]
        placement = None
        if donors:
            # Like a plain elementwise result, the group's one output may take the buffer of a
            # leaf that dies before the next launch (pool.py, "In-place results").
            out = program.exprs[program.outputs[0]]
            outs = [inner._new(out.shape, out.dtype, unplaced=True)]
            # The in-place kernels' sources are written now, where still missing: a closure
            # over the Program would keep its leaves, the very buffers to donate, alive.
            sources = {slot: build(slot) for slot in donors
                       if key + (slot,) not in inner._rt.kernels}
            name = program.name
            placement = Placement(
                inner.pool, outs[0].storage,
                [(slot, buffers[slot], storages[slots[slot]].nbytes) for slot in donors],
                lambda slot: inner._pipeline(key + (slot,), lambda: sources[slot], name))
            buffers.append(None)
        else:
            outs = [inner._new(program.exprs[o].shape, program.exprs[o].dtype)
                    for o in program.outputs]
            buffers += [o.storage.raw for o in outs]
        inner._launch(key, build, buffers, params, groups, program.name,
                      4 * sum(e.value.size for e in program.leaves),
                      4 * sum(o.size for o in outs), placement=placement)
        return outs

    @staticmethod
    def _donors(program, slots, binding_of, layouts, views):
        """Slots whose buffer the flat group's one output may be written into: read by one
        leaf, at the output's own index (contiguous over the frame from offset 0), in the
        output's dtype, and bound nowhere else."""
        out = program.exprs[program.outputs[0]]
        if out.shape != program.shape:
            return ()
        found = []
        for slot, (storage_id, dtype) in enumerate(slots):
            readers = [j for j, b in enumerate(binding_of) if b == slot]
            if (len(readers) == 1 and layouts[readers[0]] == "c" and views[readers[0]][2] == 0
                    and dtype is out.dtype and program.leaves[readers[0]].shape == out.shape
                    and sum(1 for other, _ in slots if other == storage_id) == 1):
                found.append(slot)
        return found

    def run_matmul(self, program, product, a, b):
        """The group `program` (flat, over the shape of the matmul a @ b, whose result is its
        leaf `product`) computed inside the matmul kernel at the store of C (the epilogue):
        [inner handle per output], or None where the matmul cannot take it (split-K)."""
        shape = program.shape
        outs = [self.inner._new(program.exprs[o].shape, program.exprs[o].dtype)
                for o in program.outputs]
        leaves = [(j, e) for j, e in enumerate(program.leaves) if j != product]
        slots, binding_of = [], {}
        for j, e in leaves:
            key = (id(e.value.storage), e.dtype)
            if key not in slots:
                slots.append(key)
            binding_of[j] = slots.index(key)
        raw = {}
        for j, e in leaves:
            raw.setdefault((id(e.value.storage), e.dtype), e.value.storage.raw)
        slot_types = tuple(_TYPE[dt] for _, dt in slots)
        params = list(shape) + [_bits(c.arg, c.dtype) for c in program.consts]
        for j, e in leaves:
            vshape, strides, offset = self._frame_view(e.value, shape, None)
            params += [offset] + list(strides)
        # Its parameters follow the matmul's own (the frame has the product's rank).
        first = codegen.matmul_param_count(len(a.shape) - 2)
        epilogue = MatmulEpilogue(
            key=("fusion", "epilogue", program.key, product,
                 tuple(binding_of[j] for j, _ in leaves), slot_types),
            source=lambda: epilogue_wgsl(program, product, binding_of, first),
            buffers=_buffers(program, slot_types), params=params,
            raw_buffers=[raw[k] for k in slots] + [o.storage.raw for o in outs],
            name=program.name, bytes_read=4 * sum(e.value.size for _, e in leaves),
            bytes_written=4 * sum(o.size for o in outs))
        if not self.inner.matmul_epilogue(a, b, epilogue):
            return None
        return outs

    @staticmethod
    def _frame_view(h, shape, axis):
        """(shape, strides, offset) of leaf h in frame coordinates: a leaf that lost the
        reduced axis gets it back with size 1; broadcast dims read with stride 0."""
        vshape, strides = h.shape, h.strides
        if len(vshape) == len(shape) - 1:
            vshape = vshape[:axis] + (1,) + vshape[axis:]
            strides = strides[:axis] + (0,) + strides[axis:]
        strides = tuple(0 if n == 1 else s for n, s in zip(vshape, strides))
        return vshape, strides, h.offset


# ---- expressions ---------------------------------------------------------------------------
def _node_expression(op, arg, refs, dtype, operand_dtypes, values):
    """WGSL of one elementwise node; `values` are the WGSL names of its operands."""
    if op == "custom":
        return "%s(%s)" % (arg.function, ", ".join(values))
    kinds = [_KIND[dt] for dt in operand_dtypes]
    return codegen.op_expression(op, kinds).format(**dict(zip("abc", values)))


def _operand_dtypes(program, refs):
    out = []
    for kind, j in refs:
        if kind == "n":
            out.append(program.nodes[j][4])
        elif kind == "l":
            out.append(program.leaves[j].dtype)
        else:
            out.append(program.consts[j].dtype)
    return out


def _const_lines(program, first):
    lines = []
    for j, c in enumerate(program.consts):
        ty = _TYPE[c.dtype]
        read = _p(first + j)
        lines.append("  let k%d = %s;" % (j, read if ty == "u32" else "bitcast<%s>(%s)" % (ty, read)))
    return lines


def _custom_sources(program):
    seen = []
    for op, arg, *_ in program.nodes:
        if op == "custom" and arg.wgsl not in seen:
            seen.append(arg.wgsl)
    return "\n".join(seen) + ("\n" if seen else "")


def _finish(src, program):
    src = _custom_sources(program) + src
    return _helpers_for(src) + src


def _buffers(program, slot_types, width=1, inplace=None):
    """Leaf slots b0.., then outputs out0.. (none when the output goes into slot `inplace`)."""
    def ty(t):
        return t if width == 1 else "vec4<%s>" % t
    return ([("b%d" % s, ty(t), s == inplace) for s, t in enumerate(slot_types)]
            + [("out%d" % j, ty(_TYPE[program.nodes[o][4]]), True)
               for j, o in enumerate(program.outputs) if inplace is None])


# ---- flat kernels --------------------------------------------------------------------------
def _flat_chain(program, leaf_names, suffix):
    """`let` lines of every node for one element; leaf j is read as leaf_names[j]."""
    names = {"c": "k%d", "n": "x%d" + suffix}
    lines = []
    for k, (op, arg, refs, role, dtype) in enumerate(program.nodes):
        values = [leaf_names[j] if kind == "l" else names[kind] % j for kind, j in refs]
        expr = _node_expression(op, arg, refs, dtype, _operand_dtypes(program, refs), values)
        lines.append("  let x%d%s = %s;" % (k, suffix, expr))
    return lines


def flat_wgsl(program, binding_of, slot_types, layouts, width=1, inplace=None):
    """One invocation per element (width 1) or per 4 consecutive elements read and written as
    vec4 (width 4: every leaf contiguous, so no index arithmetic beyond offset + i; the
    expressions run once per lane). On an H200 this reaches the bandwidth of a plain copy
    kernel; 2 to 8 vec4s per invocation or other workgroup sizes measured no faster.
    inplace=s: the one output is written into leaf slot s (declared read_write).
    P: n / width, shape[nd], const bits, per leaf: offset / width, strides[nd]."""
    nd = len(program.shape)
    first_const = 1 + nd
    first_leaf = first_const + len(program.consts)
    n_params = first_leaf + len(program.leaves) * (1 + nd)
    lines = ["  if (i >= %s) { return; }" % _p(0)]
    if "s" in layouts:
        lines.append(_unravel("i", lambda d: _p(1 + d), nd).rstrip("\n"))
    lines += _const_lines(program, first_const)
    coords = ["c%d" % d for d in range(nd)]
    for j, layout in enumerate(layouts):
        base = first_leaf + j * (1 + nd)
        index = "%s + i" % _p(base) if layout == "c" else \
            _dot(_p(base), coords, [_p(base + 1 + d) for d in range(nd)])
        lines.append("  let l%d = b%d[%s];" % (j, binding_of[j], index))
    leaves = range(len(layouts))
    target = ["b%d" % inplace] if inplace is not None else \
        ["out%d" % j for j in range(len(program.outputs))]
    if width == 1:
        lines += _flat_chain(program, ["l%d" % j for j in leaves], "")
        lines += ["  %s[i] = x%d;" % (target[j], o) for j, o in enumerate(program.outputs)]
    else:
        for q in range(width):
            lines += _flat_chain(program, ["l%d[%d]" % (j, q) for j in leaves], "_%d" % q)
        lines += ["  %s[i] = vec4<%s>(%s);" % (
            target[j], _TYPE[program.nodes[o][4]], ", ".join("x%d_%d" % (o, q) for q in range(width)))
            for j, o in enumerate(program.outputs)]
    src = _header(n_params, _buffers(program, slot_types, width, inplace)) + _entry_1d() \
        + "\n".join(lines) + "\n}\n"
    return _finish(src, program)


# ---- rows kernels --------------------------------------------------------------------------
def rows_wgsl(program, binding_of, slot_types, threads):
    """Reductions along the frame's axis with their prologues and epilogue, one row per
    workgroup (threads > 1) or per invocation. P: rows, axis_len, outer_shape[nd-1], const bits,
    per leaf: offset, outer strides[nd-1], axis stride; then the output's outer strides, axis
    stride (full outputs are contiguous in the frame shape; row outputs are indexed by row)."""
    nd = len(program.shape)
    outer = nd - 1
    first_const = 2 + outer
    first_leaf = first_const + len(program.consts)
    leaf_stride = outer + 2
    first_out = first_leaf + len(program.leaves) * leaf_stride
    n_params = first_out + outer + 1
    nodes = program.nodes
    lines = []
    shared = []
    if threads > 1:
        lines.append("""
@compute @workgroup_size(%d)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
  let row = wid.x + wid.y * nwg.x;
  let t = lid.x;""" % threads)
        step = "%du" % threads
    else:
        lines.append(_entry_1d(ROW_THREADS) + "  let row = i;\n  let t = 0u;")
        step = "1u"
    lines.append("  if (row >= %s) { return; }" % _p(0))
    lines.append("  let L = %s;" % _p(1))
    lines.append("  var inf_bits = 0x7f800000u;")
    lines.append(_unravel("row", lambda d: _p(2 + d), outer, "o").rstrip("\n"))
    coords = ["o%d" % d for d in range(outer)]
    lines += _const_lines(program, first_const)
    for j in range(len(program.leaves)):
        base = first_leaf + j * leaf_stride
        lines.append("  let lb%d = %s; let ls%d = %s;" % (
            j, _dot(_p(base), coords, [_p(base + 1 + d) for d in range(outer)]),
            j, _p(base + 1 + outer)))

    def full_block(roots, indent):
        """Lines computing the full nodes `roots` need at axis position k (memo per block)."""
        done, out = set(), []

        def value(ref):
            kind, j = ref
            if kind == "c":
                return "k%d" % j
            if kind == "l":
                if ("l", j) not in done:
                    done.add(("l", j))
                    out.append("%slet f_l%d = b%d[lb%d + k * ls%d];" % (indent, j, binding_of[j], j, j))
                return "f_l%d" % j
            if nodes[j][3] == "row":
                return "x%d" % j
            if ("n", j) not in done:
                op, arg, refs, role, dtype = nodes[j]
                values = [value(r) for r in refs]
                done.add(("n", j))
                expr = _node_expression(op, arg, refs, dtype, _operand_dtypes(program, refs), values)
                out.append("%slet f_x%d = %s;" % (indent, j, expr))
            return "f_x%d" % j

        names = [value(r) for r in roots]
        return out, names

    def row_value(ref):  # row nodes read leaves at the row's base (they are size 1 on the axis)
        kind, j = ref
        if kind == "c":
            return "k%d" % j
        if kind == "l":
            return "b%d[lb%d]" % (binding_of[j], j)
        return "x%d" % j

    for k, (op, arg, refs, role, dtype) in enumerate(nodes):
        if role == "full":
            continue  # computed inside the loops that need it
        if op.startswith("reduce_"):
            rop = op[7:]
            kind = _KIND[dtype]
            ty = _TYPE[dtype]
            combine = _COMBINE[rop][kind]
            body, (v,) = full_block(refs, "    ")
            lines.append("  var a%d: %s = %s;" % (k, ty, _INIT[rop][kind]))
            lines.append("  for (var k = t; k < L; k = k + %s) {" % step)
            lines += body
            lines.append("    a%d = %s;" % (k, combine.format(a="a%d" % k, b=v)))
            lines.append("  }")
            if threads > 1:
                shared.append("var<workgroup> r%d: array<%s, %d>;" % (k, ty, threads))
                lines.append("  r%d[t] = a%d; workgroupBarrier();" % (k, k))
                lines.append("  for (var s = %du; s > 0u; s = s >> 1u) {" % (threads // 2))
                lines.append("    if (t < s) { r%d[t] = %s; }" % (
                    k, combine.format(a="r%d[t]" % k, b="r%d[t + s]" % k)))
                lines.append("    workgroupBarrier();\n  }")
                lines.append("  let x%d = r%d[0];" % (k, k))
            else:
                lines.append("  let x%d = a%d;" % (k, k))
        else:
            values = [row_value(r) for r in refs]
            expr = _node_expression(op, arg, refs, dtype, _operand_dtypes(program, refs), values)
            lines.append("  let x%d = %s;" % (k, expr))
    full_outputs = [(j, o) for j, o in enumerate(program.outputs) if nodes[o][3] == "full"]
    if full_outputs:
        lines.append("  let ob = %s; let os = %s;" % (
            _dot("0u", coords, [_p(first_out + d) for d in range(outer)]), _p(first_out + outer)))
        lines.append("  for (var k = t; k < L; k = k + %s) {" % step)
        body, names = full_block([("n", o) for _, o in full_outputs], "    ")
        lines += body
        for (j, _), name in zip(full_outputs, names):
            lines.append("    out%d[ob + k * os] = %s;" % (j, name))
        lines.append("  }")
    row_outputs = [(j, o) for j, o in enumerate(program.outputs) if nodes[o][3] == "row"]
    if row_outputs:
        lines.append("  if (t == 0u) {")
        for j, o in row_outputs:
            lines.append("    out%d[row] = x%d;" % (j, o))
        lines.append("  }")
    src = _header(n_params, _buffers(program, slot_types), "\n".join(shared))
    src += "\n".join(lines) + "\n}\n"
    return _finish(src, program)


# ---- matmul epilogues ----------------------------------------------------------------------
class MatmulEpilogue:
    """What codegen's matmul templates need to run a flat group at their store of C: `source()`
    (WGSL of `fn epilogue(acc: f32, i: u32)`, built only when the kernel is compiled), `buffers` (bindings after A and B), `n_params`
    and `params` (after the matmul's own), `raw_buffers` (the buffers bound), `key` (its
    structure, part of the matmul kernel's cache key)."""

    def __init__(self, key, source, buffers, params, raw_buffers, name, bytes_read,
                 bytes_written):
        self.key, self.source, self.buffers = key, source, buffers
        self.params, self.n_params, self.raw_buffers = params, len(params), raw_buffers
        self.name, self.bytes_read, self.bytes_written = name, bytes_read, bytes_written


def epilogue_wgsl(program, product, binding_of, first):
    """`fn epilogue(acc, i)`: the group's chain for element i of the frame, its leaf `product`
    being `acc` (the matmul's sum), every other leaf read through (offset, strides), every
    output written at i. P from `first`: shape[nd], const bits, per other leaf: offset,
    strides[nd]."""
    nd = len(program.shape)
    first_const = first + nd
    first_leaf = first_const + len(program.consts)
    lines = ["fn epilogue(acc: f32, i: u32) {"]
    others = [j for j in range(len(program.leaves)) if j != product]
    if others:
        lines.append(_unravel("i", lambda d: _p(first + d), nd).rstrip("\n"))
    lines += _const_lines(program, first_const)
    coords = ["c%d" % d for d in range(nd)]
    names = []
    for j in range(len(program.leaves)):
        if j == product:
            names.append("acc")
            continue
        base = first_leaf + others.index(j) * (1 + nd)
        lines.append("  let l%d = b%d[%s];" % (
            j, binding_of[j], _dot(_p(base), coords, [_p(base + 1 + d) for d in range(nd)])))
        names.append("l%d" % j)
    lines += _flat_chain(program, names, "")
    lines += ["  out%d[i] = x%d;" % (j, o) for j, o in enumerate(program.outputs)]
    return _finish("\n".join(lines) + "\n}\n", program)
