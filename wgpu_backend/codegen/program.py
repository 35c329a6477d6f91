"""The one generator of elementwise and reduction kernels: WGSL from a fusion Program
(core/fusion/graph.py), the intermediate form under the op table. A plain op of cn.Wgpu is a
Program of one node; cn.Fusion hands over groups of many. Every op's WGSL comes from optable.py,
so a fused kernel computes exactly what the unfused ones would; this file only decides where
values are read, in which order the expressions run, and where results are written.

Three kernel shapes:
  flat      no reduction: one invocation per element of the frame shape (or per 4 consecutive
            elements, as vec4, when everything is contiguous); each node is one `let`.
  rows      reductions along one axis: one workgroup (or, for short axes, one invocation) per
            row. Row values (reduction results and what is computed from them) are computed once
            per row; full values are recomputed inside each loop over the axis that needs them
            (the prologue of every reduction, then the epilogue loop that writes full outputs).
            So softmax and layer norm read their input a few times from cache and write it once.
            Few rows over a long axis (a whole tensor's min, a long sum) would leave the GPU
            idle with one workgroup per row: there the axis is cut into chunks (`row_splits`)
            and the rows kernel runs in two stages, `split` "partial" (one workgroup per
            (row, chunk): each reduction's value over its chunk, and an arg reduction's index,
            into one scratch buffer of words) then "combine" (per row: the same reduction of the
            partials, then the row values and outputs). A Program splits where every output is
            a row value and no reduction's prologue reads a row value (`splittable`): sums and
            extrema with their prologues and epilogues; softmax and layer norm keep one stage.
  epilogue  a flat Program run at a matmul's store of C (`fn epilogue(acc, i)`, matmul.py).

Bindings: leaf slots b0.. (one per distinct buffer and dtype), then outputs out0.. Leaves are
read through (offset, strides) from the uniform block, so one pipeline serves every shape of the
same rank; each kernel shape has one `ParamLayout` (flat_layout, rows_layout, epilogue_layout).
Storage-dtype leaves and outputs are read and written through packing.py in the device's layout
(`storage`: packing.PACKED or packing.HALF).
"""

from .mathlib import helpers_for
from .packing import binding_type, load, narrow, store
from .optable import (op_expression, REDUCE_IDENTITY, REDUCE_COMBINE, reduce_better,
                      reduce_ties)
from .prelude import ParamLayout, header, entry_1d, entry_per_group, unravel, dot

ROW_THREADS = 64     # workgroup size of the rows kernel when the reduced axis is long
ROW_MIN_AXIS = 128   # shorter axes: one invocation loops over the whole row
ARG_REDUCTIONS = ("argmax", "argmin")
# Two-stage rows kernels: aim for SPLIT_GROUPS workgroups, each over at least SPLIT_MIN_CHUNK
# elements of its row (16 per thread: fewer and the partials' pass costs what it saves).
SPLIT_GROUPS = 512
SPLIT_MIN_CHUNK = 16 * ROW_THREADS


def row_threads(length):
    """Threads per row of a rows kernel over an axis of `length`."""
    return ROW_THREADS if length >= ROW_MIN_AXIS else 1


def row_splits(rows, length):
    """Chunks each row's axis is cut into (1: one stage): enough for SPLIT_GROUPS workgroups
    where the rows alone are too few, none shorter than SPLIT_MIN_CHUNK."""
    if rows >= SPLIT_GROUPS // 2:
        return 1
    return max(1, min(-(-SPLIT_GROUPS // rows), length // SPLIT_MIN_CHUNK))


def splittable(program):
    """Can the Program's reductions run in two stages? Every output a row value, and no
    reduction reads a row value (through the full values of its prologue)."""
    nodes = program.nodes
    if any(nodes[o][3] != "row" for o in program.outputs):
        return False

    def reads_row(refs):
        return any(kind == "n" and (nodes[j][3] == "row" or reads_row(nodes[j][2]))
                   for kind, j in refs)
    return not any(op.startswith("reduce_") and reads_row(refs) for op, _, refs, _, _ in nodes)


def partial_planes(program):
    """The scratch planes of a split Program: [(node, "value" or "index")] in node order."""
    planes = []
    for k, (op, *_) in enumerate(program.nodes):
        if op.startswith("reduce_"):
            planes.append((k, "value"))
            if op[7:] in ARG_REDUCTIONS:
                planes.append((k, "index"))
    return planes


# ---- expressions ---------------------------------------------------------------------------
def _operand_dtypes(program, refs):
    """The dtypes a node's operands are computed in (a packed leaf is unpacked on load)."""
    out = []
    for kind, j in refs:
        if kind == "n":
            out.append(program.nodes[j][4])
        elif kind == "l":
            out.append(program.leaves[j].dtype)
        else:
            out.append(program.consts[j].dtype)
    return [d.compute for d in out]


def _node_expression(program, op, arg, refs, values, dtype):
    """WGSL of one elementwise node of `dtype`; `values` are the WGSL names of its operands. A
    storage-dtype node (a cast to int8 or float16) holds the value its store would keep, so the
    nodes of a fused kernel that read it see what they would read back from memory."""
    if op == "custom":
        return "%s(%s)" % (arg.function, ", ".join(values))
    return narrow(dtype, op_expression(op, _operand_dtypes(program, refs)).format(
        **dict(zip("abc", values))))


def _const_lines(program, P):
    lines = []
    for j, c in enumerate(program.consts):
        ty, read = c.dtype.wgsl, P["consts", j]
        lines.append("  let k%d = %s;" % (j, read if ty == "u32" else "bitcast<%s>(%s)" % (ty, read)))
    return lines


def _finish(src, program):
    """Prepend the user functions (custom ops) and the math helpers the source calls."""
    seen = []
    for op, arg, *_ in program.nodes:
        if op == "custom" and arg.wgsl not in seen:
            seen.append(arg.wgsl)
    src = "".join(s + "\n" for s in seen) + src
    return helpers_for(src) + src


def buffers(program, slot_types, storage, width=1, inplace=None):
    """Leaf slots b0.., then outputs out0.. (none when the output goes into slot `inplace`).
    slot_types: the binding type of each slot (packing.binding_type in the device's layout)."""
    def ty(t):
        return t if width == 1 else "vec4<%s>" % t
    return ([("b%d" % s, ty(t), s == inplace) for s, t in enumerate(slot_types)]
            + [("out%d" % j, ty(binding_type(program.nodes[o][4], storage, True)), True)
               for j, o in enumerate(program.outputs) if inplace is None])


def _leaf_fields(n_leaves, per_leaf):
    fields = []
    for j in range(n_leaves):
        fields += ["l%d_off" % j] + [(name % j, count) for name, count in per_leaf]
    return fields


# ---- flat kernels --------------------------------------------------------------------------
def flat_layout(program, out_layouts):
    """P of a flat kernel: n (invocations), shape, const bits, per leaf offset and strides, per
    output offset (and strides where it is a strided view, layout "s")."""
    nd = len(program.shape)
    fields = ["n", ("shape", nd), ("consts", len(program.consts))]
    fields += _leaf_fields(len(program.leaves), [("l%d_strides", nd)])
    for j, layout in enumerate(out_layouts):
        fields.append("o%d_off" % j)
        if layout == "s":
            fields.append(("o%d_strides" % j, nd))
    return ParamLayout(*fields)


def _flat_chain(program, leaf_names, suffix):
    """`let` lines of every node for one element; leaf j is read as leaf_names[j]."""
    names = {"c": "k%d", "n": "x%d" + suffix}
    lines = []
    for k, (op, arg, refs, role, dtype) in enumerate(program.nodes):
        values = [leaf_names[j] if kind == "l" else names[kind] % j for kind, j in refs]
        lines.append("  let x%d%s = %s;" % (k, suffix, _node_expression(program, op, arg, refs,
                                                                      values, dtype)))
    return lines


def flat_wgsl(program, binding_of, slot_types, storage, layouts, out_layouts, width=1, inplace=None):
    """One invocation per element (width 1) or per 4 consecutive elements read and written as
    vec4 (width 4: every leaf and output contiguous, so no index arithmetic beyond offset + i;
    the expressions run once per lane). On an H200 this reaches the bandwidth of a plain copy
    kernel; 2 to 8 vec4s per invocation or other workgroup sizes measured no faster.
    layouts / out_layouts: "c" contiguous in the frame shape (read at offset + i), "s" strided
    (broadcasts, views; outputs: a strided destination such as a region of a cat).
    inplace=s: the one output is written into leaf slot s (declared read_write).
    storage: the device's layout of storage dtypes (packing.py)."""
    nd = len(program.shape)
    P = flat_layout(program, out_layouts)
    lines = ["  if (i >= %s) { return; }" % P["n"]]
    if "s" in layouts or "s" in out_layouts:
        lines.append(unravel("i", P.array("shape")).rstrip("\n"))
    lines += _const_lines(program, P)
    coords = ["c%d" % d for d in range(nd)]
    for j, layout in enumerate(layouts):
        index = "%s + i" % P["l%d_off" % j] if layout == "c" else \
            dot(P["l%d_off" % j], coords, P.array("l%d_strides" % j))
        lines.append("  let l%d = %s;" % (j, load(program.leaves[j].dtype, storage,
                                                 "b%d" % binding_of[j], index)))
    leaves = range(len(layouts))
    target = ["b%d" % inplace] if inplace is not None else \
        ["out%d" % j for j in range(len(program.outputs))]
    stores = ["%s + i" % P["o%d_off" % j] if layout == "c" else
              dot(P["o%d_off" % j], coords, P.array("o%d_strides" % j))
              for j, layout in enumerate(out_layouts)]
    if width == 1:
        lines += _flat_chain(program, ["l%d" % j for j in leaves], "")
        lines += ["  " + store(program.nodes[o][4], storage, target[j], stores[j], "x%d" % o)
                  for j, o in enumerate(program.outputs)]
    else:
        for q in range(width):
            lines += _flat_chain(program, ["l%d[%d]" % (j, q) for j in leaves], "_%d" % q)
        lines += ["  %s[%s] = vec4<%s>(%s);" % (
            target[j], stores[j], program.nodes[o][4].wgsl,
            ", ".join("x%d_%d" % (o, q) for q in range(width)))
            for j, o in enumerate(program.outputs)]
    src = header(P.size, buffers(program, slot_types, storage, width, inplace)) + entry_1d() \
        + "\n".join(lines) + "\n}\n"
    return _finish(src, program)


# ---- rows kernels --------------------------------------------------------------------------
def _bitcast(to, source, value):
    """WGSL of `value` (of type `source`) as type `to`, the same bits (no identity bitcast)."""
    return value if to == source else "bitcast<%s>(%s)" % (to, value)


def rows_layout(program, split=False):
    """P of a rows kernel: rows, axis length L, the outer shape (the frame without the axis),
    const bits, per leaf offset, outer strides and axis stride, then the outer strides and axis
    stride of full outputs (contiguous in the frame shape; row outputs are indexed by row); a
    split one (both stages) also the chunks per row S and their length C."""
    outer = len(program.shape) - 1
    fields = ["rows", "L", ("outer", outer), ("consts", len(program.consts))]
    fields += _leaf_fields(len(program.leaves), [("l%d_outer", outer), ("l%d_axis", None)])
    fields += [("o_outer", outer), "o_axis"]
    if split:
        fields += ["S", "C"]
    return ParamLayout(*fields)


def reduction_lines(k, op, operand_dtype, value_block, threads, step, span=("t", "L", "0u"),
                    result="x%d"):
    """Lines folding node k's reduction over the axis (value_block: the loop body's lines and the
    operand's name at position k) into `result` % k; and its workgroup arrays. span: the loop's
    first position, its end, and the index an arg reduction answers where nothing beat the
    identity (a split kernel's chunk: its start). An arg reduction also names its best value
    `xv{k}`."""
    body, v = value_block
    first, end, fallback = span
    kind, ty = operand_dtype.kind, operand_dtype.wgsl
    lines = ["  var a%d: %s = %s;" % (k, ty, REDUCE_IDENTITY[op][kind])]
    shared = ["var<workgroup> r%d: array<%s, %d>;" % (k, ty, threads)] if threads > 1 else []
    if op in ARG_REDUCTIONS:
        # Index L marks "nothing better than the identity seen": then every element equals the
        # identity and the first one is the answer. Ties go to the lower index.
        better, ties = reduce_better(op, kind), reduce_ties(kind)
        lines.append("  var ai%d = L;" % k)
        lines.append("  for (var k = %s; k < %s; k = k + %s) {" % (first, end, step))
        lines += body
        lines.append("    if %s { a%d = %s; ai%d = k; }" % (better.format(v=v, b="a%d" % k), k, v, k))
        lines.append("  }")
        if threads > 1:
            shared.append("var<workgroup> ri%d: array<u32, %d>;" % (k, threads))
            lines.append("  r%d[t] = a%d; ri%d[t] = ai%d; workgroupBarrier();" % (k, k, k, k))
            lines.append("  for (var s = %du; s > 0u; s = s >> 1u) {" % (threads // 2))
            lines.append("    if (t < s) {")
            lines.append("      let ov = r%d[t + s]; let oi = ri%d[t + s];" % (k, k))
            lines.append("      if (%s || (%s && oi < ri%d[t])) { r%d[t] = ov; ri%d[t] = oi; }" % (
                better.format(v="ov", b="r%d[t]" % k), ties.format(v="ov", b="r%d[t]" % k), k, k, k))
            lines.append("    }\n    workgroupBarrier();\n  }")
            lines.append("  let bi%d = ri%d[0]; let xv%d = r%d[0];" % (k, k, k, k))
        else:
            lines.append("  let bi%d = ai%d; let xv%d = a%d;" % (k, k, k, k))
        lines.append("  let %s = i32(select(bi%d, %s, bi%d >= L));" % (result % k, k, fallback, k))
        return lines, shared
    combine = REDUCE_COMBINE[op][kind]
    lines.append("  for (var k = %s; k < %s; k = k + %s) {" % (first, end, step))
    lines += body
    lines.append("    a%d = %s;" % (k, combine.format(a="a%d" % k, b=v)))
    lines.append("  }")
    if threads > 1:
        lines.append("  r%d[t] = a%d; workgroupBarrier();" % (k, k))
        lines.append("  for (var s = %du; s > 0u; s = s >> 1u) {" % (threads // 2))
        lines.append("    if (t < s) { r%d[t] = %s; }" % (
            k, combine.format(a="r%d[t]" % k, b="r%d[t + s]" % k)))
        lines.append("    workgroupBarrier();\n  }")
        lines.append("  let %s = r%d[0];" % (result % k, k))
    else:
        lines.append("  let %s = a%d;" % (result % k, k))
    return lines, shared


def _touched(bound):
    """A line that references every buffer in `bound`: each stage of a split Program binds all
    the leaves, but may read only some, and a browser's pipeline layout ("auto") leaves out
    the bindings its shader never references (Dawn then refuses the bind group)."""
    return "  " + " ".join("_ = arrayLength(&%s);" % name for name, _, _ in bound)


def rows_wgsl(program, binding_of, slot_types, storage, threads, split=None):
    """Reductions along the frame's axis with their prologues and epilogue, one row per
    workgroup (threads > 1) or per invocation (P: rows_layout). split "partial": the first
    stage of a split Program, a workgroup per (row, chunk) writing the `partial_planes` into
    the scratch binding `part` (plane p of row r, chunk c at (p * rows + r) * S + c); "combine":
    the second, reading `part` (bound after the leaves) where the one stage reads the axis."""
    outer = len(program.shape) - 1
    P = rows_layout(program, split is not None)
    nodes = program.nodes
    shared = []
    if split == "partial":
        lines = [entry_per_group(threads, "g"),
                 "  let row = g / %s; let chunk = g %% %s;" % (P["S"], P["S"])]
        step = "%du" % threads
    elif threads > 1:
        lines = [entry_per_group(threads, "row")]
        step = "%du" % threads
    else:
        lines = [entry_1d(ROW_THREADS) + "  let row = i;\n  let t = 0u;"]
        step = "1u"
    lines.append("  if (row >= %s) { return; }" % P["rows"])
    # (combine: the loops run over the row's S partials, its "axis")
    lines.append("  let L = %s;" % P["S" if split == "combine" else "L"])
    span = ("t", "L", "0u")
    if split == "partial":
        lines.append("  let chunk_lo = chunk * %s; let chunk_hi = min(L, chunk_lo + %s);" % (P["C"], P["C"]))
        span = ("chunk_lo + t", "chunk_hi", "chunk_lo")
    planes = partial_planes(program) if split else []
    lines.append("  var inf_bits = 0x7f800000u;")
    lines.append(unravel("row", P.array("outer"), "o").rstrip("\n"))
    coords = ["o%d" % d for d in range(outer)]
    lines += _const_lines(program, P)
    for j in range(len(program.leaves)):
        lines.append("  let lb%d = %s; let ls%d = %s;" % (
            j, dot(P["l%d_off" % j], coords, P.array("l%d_outer" % j)), j, P["l%d_axis" % j]))

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
                    out.append("%slet f_l%d = %s;" % (indent, j, load(
                        program.leaves[j].dtype, storage, "b%d" % binding_of[j],
                        "lb%d + k * ls%d" % (j, j))))
                return "f_l%d" % j
            if nodes[j][3] == "row":
                return "x%d" % j
            if ("n", j) not in done:
                op, arg, refs, role, dtype = nodes[j]
                values = [value(r) for r in refs]
                done.add(("n", j))
                out.append("%slet f_x%d = %s;" % (indent, j, _node_expression(
                    program, op, arg, refs, values, dtype)))
            return "f_x%d" % j

        names = [value(r) for r in roots]
        return out, names

    def row_value(ref):  # row nodes read leaves at the row's base (they are size 1 on the axis)
        kind, j = ref
        if kind == "c":
            return "k%d" % j
        if kind == "l":
            return load(program.leaves[j].dtype, storage, "b%d" % binding_of[j], "lb%d" % j)
        return "x%d" % j

    def plane_at(k, what, chunk):  # the scratch word of node k's plane `what`
        return "part[(%du * %s + row) * %s + %s]" % (planes.index((k, what)), P["rows"], P["S"], chunk)

    for k, (op, arg, refs, role, dtype) in enumerate(nodes):
        if role == "full":
            continue  # computed inside the loops that need it
        if op.startswith("reduce_"):
            operand = _operand_dtypes(program, refs)[0]
            if split == "combine":  # the same reduction over the chunks' values
                v = "f_p%d" % k
                body = ["    let %s = %s;" % (v, _bitcast(operand.wgsl, "i32", plane_at(k, "value", "k")))]
            else:
                body, (v,) = full_block(refs, "    ")
            arg_combine = split == "combine" and op[7:] in ARG_REDUCTIONS
            more, arrays = reduction_lines(k, op[7:], operand, (body, v), threads, step, span,
                                           "c%d" if arg_combine else "x%d")
            lines += more
            shared += arrays
            if arg_combine:  # the best chunk's index
                lines.append("  let x%d = %s;" % (k, plane_at(k, "index", "u32(c%d)" % k)))
        elif split != "partial":
            values = [row_value(r) for r in refs]
            lines.append("  let x%d = %s;" % (k, _node_expression(program, op, arg, refs, values,
                                                                  dtype)))
    if split == "partial":
        lines.append("  if (t == 0u) {")
        for k, what in planes:
            value = "x%d" % k if what == "index" or nodes[k][0][7:] not in ARG_REDUCTIONS else "xv%d" % k
            operand = "i32" if what == "index" else _operand_dtypes(program, nodes[k][2])[0].wgsl
            lines.append("    %s = %s;" % (plane_at(k, what, "chunk"), _bitcast("i32", operand, value)))
        lines.append("  }")
        leaves = buffers(program, slot_types, storage)[:len(slot_types)]
        lines.insert(1, _touched(leaves))
        src = header(P.size, leaves + [("part", "i32", True)], "\n".join(shared))
        return _finish(src + "\n".join(lines) + "\n}\n", program)
    full_outputs = [(j, o) for j, o in enumerate(program.outputs) if nodes[o][3] == "full"]
    if full_outputs:
        lines.append("  let ob = %s; let os = %s;" % (dot("0u", coords, P.array("o_outer")),
                                                        P["o_axis"]))
        lines.append("  for (var k = t; k < L; k = k + %s) {" % step)
        body, names = full_block([("n", o) for _, o in full_outputs], "    ")
        lines += body
        for (j, _), name in zip(full_outputs, names):
            lines.append("    " + store(nodes[program.outputs[j]][4], storage, "out%d" % j,
                                          "ob + k * os", name))
        lines.append("  }")
    row_outputs = [(j, o) for j, o in enumerate(program.outputs) if nodes[o][3] == "row"]
    if row_outputs:
        lines.append("  if (t == 0u) {")
        for j, o in row_outputs:
            lines.append("    " + store(nodes[o][4], storage, "out%d" % j, "row", "x%d" % o))
        lines.append("  }")
    bound = buffers(program, slot_types, storage)
    if split == "combine":
        lines.insert(1, _touched(bound[:len(slot_types)]))
        bound.insert(len(slot_types), ("part", "i32", False))
    src = header(P.size, bound, "\n".join(shared))
    src += "\n".join(lines) + "\n}\n"
    return _finish(src, program)


# ---- matmul epilogues ----------------------------------------------------------------------
def epilogue_layout(program, product, first):
    """P of an epilogue, from `first` (after its matmul's own): the frame shape, const bits,
    per leaf other than the product: offset, strides."""
    nd = len(program.shape)
    fields = [("shape", nd), ("consts", len(program.consts))]
    for j in range(len(program.leaves)):
        if j != product:
            fields += ["l%d_off" % j, ("l%d_strides" % j, nd)]
    return ParamLayout(*fields, first=first)


def epilogue_wgsl(program, product, binding_of, first, storage):
    """`fn epilogue(acc, i)`: the group's chain for element i of the frame, its leaf `product`
    being `acc` (the matmul's sum), every other leaf read through (offset, strides), every
    output written at i (P: epilogue_layout)."""
    nd = len(program.shape)
    P = epilogue_layout(program, product, first)
    lines = ["fn epilogue(acc: f32, i: u32) {"]
    if len(program.leaves) > 1:
        lines.append(unravel("i", P.array("shape")).rstrip("\n"))
    lines += _const_lines(program, P)
    coords = ["c%d" % d for d in range(nd)]
    names = []
    for j in range(len(program.leaves)):
        if j == product:
            names.append("acc")
            continue
        lines.append("  let l%d = %s;" % (j, load(
            program.leaves[j].dtype, storage, "b%d" % binding_of[j],
            dot(P["l%d_off" % j], coords, P.array("l%d_strides" % j)))))
        names.append("l%d" % j)
    lines += _flat_chain(program, names, "")
    lines += ["  " + store(program.nodes[o][4], storage, "out%d" % j, "i", "x%d" % o)
              for j, o in enumerate(program.outputs)]
    return _finish("\n".join(lines) + "\n}\n", program)


# ---- pool prologues ------------------------------------------------------------------------
def prologue_wgsl(program, binding_of, first, storage):
    """`fn prologue(i) -> f32`: the value of the group's one output at element i of its frame,
    every leaf read through (offset, strides), nothing written (P: epilogue_layout with no
    product): the pool kernel calls it for each pixel of its windows (images.pool2d_wgsl)."""
    nd = len(program.shape)
    P = epilogue_layout(program, None, first)
    lines = ["fn prologue(i: u32) -> f32 {", unravel("i", P.array("shape")).rstrip("\n")]
    lines += _const_lines(program, P)
    coords = ["c%d" % d for d in range(nd)]
    names = []
    for j in range(len(program.leaves)):
        lines.append("  let l%d = %s;" % (j, load(
            program.leaves[j].dtype, storage, "b%d" % binding_of[j],
            dot(P["l%d_off" % j], coords, P.array("l%d_strides" % j)))))
        names.append("l%d" % j)
    lines += _flat_chain(program, names, "")
    lines.append("  return x%d;" % program.outputs[0])
    return _finish("\n".join(lines) + "\n}\n", program)
