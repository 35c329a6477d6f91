"""Running Programs (core/fusion/graph.py) on cn.Wgpu: the fusion compiler of this backend, and
the path of its own elementwise ops and reductions, which are Programs of one node.

A `ProgramRunner` lays out bindings and parameters for the generated kernel (codegen/program.py),
chooses its shape (flat or rows, vec4 or not, threads per row) and launches it through the
backend's public compile-and-launch interface (`Wgpu.empty`, `Wgpu.launch`). It is what
`Wgpu.fusion_compiler()` returns to cn.Fusion (the interface described in core/fusion/backend.py:
`max_buffers`, `binding_key`, `run`, `run_matmul`, `run_pool`).

Planning a Program (bindings, layouts, parameter block, grid) is the runner's Python cost per
launch. A plain op's plan depends only on its structure (op, shapes, strides, dtypes, alignment,
shared buffers), so `run_op` keeps it per structure and later calls only patch the operands'
offsets into the parameter block: a plain op costs no more host time than a hand-written kernel
call would (benchmarks/wgpu_dispatch.py).
"""

import math

from cinders import dtypes
from cinders.backend import row_major_strides, unfold2d_output_size
from cinders.fusion.graph import Expr, LEAF, PENDING, Program, row_shape

from .codegen import images
from .codegen.prelude import WG, bits, groups_for
from .codegen.program import (flat_layout, flat_wgsl, rows_layout, rows_wgsl, row_threads,
                              row_splits, splittable, partial_planes,
                              epilogue_layout, epilogue_wgsl, prologue_wgsl, buffers, ROW_THREADS)
from .codegen.matmul import matmul_param_count
from .codegen.packing import binding_type


_LAYOUTS = {}  # kernel key -> its ParamLayout (built once per kernel, like its source)
_SOURCES = {}  # kernel key -> {None or in-place slot: WGSL} of the plans kept
_POOL_SOURCES = {}  # kernel key -> WGSL of the pool kernels with a prologue (run_pool)
MAX_PLANS = 4096


def leaf(h):
    """A Program leaf holding the backend handle h."""
    return Expr(LEAF, None, None, (), tuple(h.shape), tuple(h.shape), h.dtype, h)


def one_node(op, arg, handles, shape, dtype, frame=None):
    """The Program of one op over `handles` (a plain op of cn.Wgpu): elementwise over `shape`
    (frame None), or a reduction of frame (input shape, axis) whose result has `shape`."""
    frame = frame or (shape, None)
    fshape = shape if frame[1] is None else row_shape(frame)
    node = Expr(PENDING, op, arg, tuple(leaf(h) for h in handles), shape, fshape, dtype,
                frame=frame)
    return Program([node], [node], frame)


class ProgramRunner:
    """Programs in, launched kernels and result handles out (see the module docstring)."""

    def __init__(self, backend, max_buffers=None):
        self.backend = backend
        self.storage_layout = backend.storage_layout  # where storage dtypes sit in words (packing.py)
        self._plans = {}  # plain op signature (run_op), program_signature (run) -> Plan
        limit = backend.device.limits["max_storage_buffers_per_shader_stage"]
        self.max_buffers = min(limit, max_buffers) if max_buffers else limit

    @property
    def kept_plans(self):
        """How many plans are kept (of plain ops and of fused Programs)."""
        return len(self._plans)

    @staticmethod
    def binding_key(h):
        return id(h.storage)

    def run(self, program, out=None, name=None):
        """Launch `program`; returns [handle per output]. out: destination views, one per
        output, to write into instead of new buffers (copies into a region of a cat or pad).
        name: what cn.profile calls its kernel (default: the Program's `name`).
        Its plan is kept per `program_signature` (a training step flushes the same groups over
        the same shapes every step); later calls patch the leaves' offsets and the constants'
        values into the parameter block."""
        leaves = [e.value for e in program.leaves]
        signature = program_signature(program, leaves, out)
        plan = self._plans.get(signature)
        if plan is None:
            plan = self._plan(program, out, name)
            self._keep(signature, plan)
        return self._execute(plan, leaves, out, [bits(c.arg, c.dtype) for c in program.consts])

    def run_op(self, op, arg, handles, shape, dtype, frame=None, out=None):
        """A plain op of the backend (see `one_node`), launched like `run(one_node(...))`. Its
        plan is kept per structure (op, shapes, strides, dtypes, alignment, which handles share
        a buffer), so the Program is built only the first time: a plain op is called often."""
        signature = (op, arg.key if op == "custom" else None, dtype, shape, frame and frame[1],
                     tuple((h.dtype, h.shape, h.strides, h.offset % 4, h.offset == 0)
                           for h in handles),
                     tuple(next(k for k, g in enumerate(handles) if g.storage is h.storage)
                           for h in handles) if len(handles) > 1 else (),
                     out and tuple((o.shape, o.strides, o.offset % 4) for o in out))
        plan = self._plans.get(signature)
        if plan is None:
            plan = self._plan(one_node(op, arg, handles, shape, dtype, frame), out)
            self._keep(signature, plan)
        return self._execute(plan, handles, out)

    def _keep(self, signature, plan):
        plan.keep_sources()
        if len(self._plans) >= MAX_PLANS:  # many shapes (varying inputs): start afresh
            self._plans.clear()
        self._plans[signature] = plan

    def _plan(self, program, out, name=None):
        """How to launch `program` (a Plan; its key is None where nothing is to compute)."""
        shape, axis = program.shape, program.axis
        flat = not program.has_reduce and all(program.nodes[o][3] == "full" for o in program.outputs)
        items = math.prod(shape) if flat else math.prod(shape[:axis] + shape[axis + 1:])
        specs = [(program.exprs[o].shape, program.exprs[o].dtype) for o in program.outputs]
        if items == 0:
            return Plan(None, None, None, (), None, None, specs, (), name or program.name, (), None, None)
        views = [self._frame_view(e.value, shape, axis) for e in program.leaves]
        # One binding per distinct buffer (a tensor read through two views binds once).
        slots, binding_of, slot_leaf = {}, [], []
        for j, e in enumerate(program.leaves):
            slot = slots.setdefault((id(e.value.storage), e.dtype), len(slots))
            if slot == len(slot_leaf):
                slot_leaf.append(j)
            binding_of.append(slot)
        slots = list(slots)
        # (the kernel keys name the slots' dtypes: packed ones share the binding type u32; and
        # the storage layout: kernel sources are kept per key for every device)
        storage_layout = self.storage_layout
        slot_types = tuple(binding_type(dt, storage_layout) for _, dt in slots)
        slot_dtypes = tuple(dt for _, dt in slots)
        consts = [bits(c.arg, c.dtype) for c in program.consts]
        donors, partial = (), None
        if flat:
            n = items
            # "c": contiguous in the frame shape (read at offset + i); "s": through strides.
            layouts = tuple("c" if e.shape == shape and e.value.is_contiguous() else "s"
                            for e in program.leaves)
            out_layouts = tuple("c" if o.is_contiguous() else "s" for o in out) if out else \
                ("c",) * len(program.outputs)
            # Contiguous everywhere, 16-byte aligned and of compute dtypes (a storage dtype is
            # unpacked or converted per element: packing.py): each invocation moves vec4s.
            narrow = any(e.dtype.is_storage for e in program.leaves) or \
                any(program.exprs[o].dtype.is_storage for o in program.outputs)
            width = 4 if (n % 4 == 0 and not narrow and "s" not in layouts and "s" not in out_layouts
                          and not any(v[2] % 4 for v in views)
                          and not any(o.offset % 4 for o in out or ())) else 1
            key = ("flat", program.key, tuple(binding_of), slot_dtypes, storage_layout, layouts,
                   out_layouts, width)
            values = {"n": n // width, "shape": shape, "consts": consts}
            for j, (_, strides, offset) in enumerate(views):
                values["l%d_off" % j], values["l%d_strides" % j] = offset // width, strides
            for j, o in enumerate(out or ()):
                values["o%d_off" % j] = o.offset // width
                if out_layouts[j] == "s":
                    values["o%d_strides" % j] = o.strides
            if not out:
                values.update(("o%d_off" % j, 0) for j in range(len(program.outputs)))
            layout = _LAYOUTS.get(key)
            if layout is None:
                layout = _LAYOUTS[key] = flat_layout(program, out_layouts)
            groups = groups_for(n // width, WG)

            def build(inplace=None):
                return flat_wgsl(program, binding_of, slot_types, storage_layout, layouts,
                                 out_layouts, width, inplace)

            if not out and len(program.outputs) == 1 and not narrow:
                donors = self._donors(program, slots, binding_of, layouts, views)
            out_fields = [("o%d_off" % j, j, width) for j in range(len(out or ()))]
        else:
            width, length = 1, shape[axis]
            # Few rows over a long axis: two stages (codegen/program.py "rows"), where the
            # second binds the scratch buffer besides what the one stage binds.
            splits = row_splits(items, length) if splittable(program) and \
                len(slots) + 1 + len(program.outputs) <= self.max_buffers else 1
            threads = row_threads(length if splits == 1 else splits)
            key = ("rows", program.key, tuple(binding_of), slot_dtypes, storage_layout, threads,
                   splits > 1)
            outer = [d for d in range(len(shape)) if d != axis]
            values = {"rows": items, "L": length, "outer": [shape[d] for d in outer],
                      "consts": consts}
            if splits > 1:
                chunk = -(-length // splits)
                values["S"], values["C"] = splits, chunk
                partial_key = key + ("partial",)
                partial = (partial_key, lambda inplace=None: rows_wgsl(  # noqa: E731
                    program, binding_of, slot_types, storage_layout, ROW_THREADS, "partial"),
                           groups_for(items * splits, 1), len(partial_planes(program)) * items * splits)
            for j, (_, strides, offset) in enumerate(views):
                values["l%d_off" % j] = offset
                values["l%d_outer" % j] = [strides[d] for d in outer]
                values["l%d_axis" % j] = strides[axis]
            cs = row_major_strides(shape)
            values["o_outer"], values["o_axis"] = [cs[d] for d in outer], cs[axis]
            layout = _LAYOUTS.get(key)
            if layout is None:
                layout = _LAYOUTS[key] = rows_layout(program, splits > 1)
            groups = groups_for(items, 1 if threads > 1 else ROW_THREADS)
            build = lambda inplace=None: rows_wgsl(  # noqa: E731
                program, binding_of, slot_types, storage_layout, threads,
                "combine" if splits > 1 else None)
            out_fields = []
        # Where the per-call values (the offsets of leaves and destinations, the constants) sit
        # in P.
        offsets = [(layout.position("l%d_off" % j), j, width) for j in range(len(views))]
        out_offsets = [(layout.position(name), j, w) for name, j, w in out_fields]
        consts_at = layout.array_position("consts") if consts else None
        return Plan(key, build, layout.pack(**values), offsets, groups, slot_leaf, specs,
                    donors, name or program.name, out_offsets, consts_at, partial)

    def _execute(self, plan, leaf_handles, out, consts=()):
        """Launch a plan over these leaves (and destinations), with these constants' words."""
        backend = self.backend
        if plan.key is None:
            return out or [backend.empty(s, dt) for s, dt in plan.specs]
        params = list(plan.params)
        if consts:
            params[plan.consts_at:plan.consts_at + len(consts)] = consts
        for position, j, width in plan.offsets:
            params[position] = leaf_handles[j].offset // width
        for position, j, width in plan.out_offsets:
            params[position] = out[j].offset // width
        inputs = [leaf_handles[j] for j in plan.slot_leaf]
        read = sum(4 * h.size // h.dtype.per_word for h in leaf_handles)
        if plan.partial is not None:  # a split reduction's first stage: its partials
            key, build, groups, words = plan.partial
            inputs += backend.launch(key, build, inputs, [((words,), dtypes.int32)], params, groups,
                                     plan.name + "_partial", read, 4 * words)
            read = 4 * words
        return backend.launch(plan.key, plan.build, inputs, out or plan.specs, params, plan.groups,
                              plan.name, read,
                              sum(4 * math.prod(s) // dt.per_word for s, dt in plan.specs),
                              donors=plan.donors)

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
        [handle per output], or None where the matmul cannot take it (split-K)."""
        shape = program.shape
        backend = self.backend
        outs = [backend.empty(program.exprs[o].shape, program.exprs[o].dtype)
                for o in program.outputs]
        leaves = [(j, e) for j, e in enumerate(program.leaves) if j != product]
        slots, binding_of, handles = self._leaf_slots(leaves)
        storage_layout = self.storage_layout
        slot_types = tuple(binding_type(dt, storage_layout) for _, dt in slots)
        # Its parameters follow the matmul's own (the frame has the product's rank).
        first = matmul_param_count(len(a.shape) - 2)
        layout = epilogue_layout(program, product, first)
        values = {"shape": shape, "consts": [bits(c.arg, c.dtype) for c in program.consts]}
        for j, e in leaves:
            _, strides, offset = self._frame_view(e.value, shape, None)
            values["l%d_off" % j], values["l%d_strides" % j] = offset, strides
        epilogue = MatmulEpilogue(
            key=("epilogue", program.key, product, tuple(binding_of[j] for j, _ in leaves),
                 tuple(dt for _, dt in slots)),
            source=lambda: epilogue_wgsl(program, product, binding_of, first, storage_layout),
            buffers=buffers(program, slot_types, storage_layout), params=layout.pack(**values),
            handles=handles + outs, name=program.name,
            bytes_read=4 * sum(e.value.size for _, e in leaves),
            bytes_written=4 * sum(o.size for o in outs))
        if not backend.matmul_epilogue(a, b, epilogue):
            return None
        return outs

    def _leaf_slots(self, leaves):
        """(slots, binding_of, handles): one binding per distinct (buffer, dtype) of `leaves`
        [(leaf index, Expr)]; binding_of[leaf index] -> its slot."""
        slots, binding_of, handles = [], {}, []
        for j, e in leaves:
            key = (id(e.value.storage), e.dtype)
            if key not in slots:
                slots.append(key)
                handles.append(e.value)
            binding_of[j] = slots.index(key)
        return slots, binding_of, handles

    def run_pool(self, program, op, kernel, stride, padding, dilation):
        """The flat float32 group `program` (one output over an (N, C, H, W) frame) computed
        where the pool2d kernel reads its windows (its prologue), never stored: the pooled
        handle. op, kernel, ...: as the pool2d primitive (core/backend.py)."""
        shape = program.shape
        n, c, h, w = shape
        oh, ow = unfold2d_output_size(h, w, kernel, stride, padding, dilation)
        total = n * c * oh * ow
        slots, binding_of, handles = self._leaf_slots(list(enumerate(program.leaves)))
        storage_layout = self.storage_layout
        slot_types = tuple(binding_type(dt, storage_layout) for _, dt in slots)
        first = images.POOL2D_PARAMS.size
        layout = epilogue_layout(program, None, first)
        values = {"shape": shape, "consts": [bits(x.arg, x.dtype) for x in program.consts]}
        for j, e in enumerate(program.leaves):
            _, strides, offset = self._frame_view(e.value, shape, None)
            values["l%d_off" % j], values["l%d_strides" % j] = offset, strides
        params = images.POOL2D_PARAMS.pack(
            x_off=0, x_strides=row_major_strides(shape),
            **images.geometry_values(total, shape, kernel, stride, padding, dilation, (oh, ow)))
        key = ("pool2d_prologue", op, program.key,
               tuple(binding_of[j] for j in range(len(program.leaves))), slot_types,
               storage_layout)
        if key not in _POOL_SOURCES:  # (a builder closing over the program would keep its buffers)
            _POOL_SOURCES[key] = images.pool2d_wgsl(
                op, (prologue_wgsl(program, binding_of, first, storage_layout), slot_types,
                     layout.size))
        return self.backend.launch(
            key, lambda: _POOL_SOURCES[key], handles, [((n, c, oh, ow), dtypes.float32)],
            params + layout.pack(**values), groups_for(total, WG), "pool2d_%s_%s" % (op, program.name),
            4 * sum(e.value.size for e in program.leaves), 4 * total)[0]

    @staticmethod
    def _frame_view(h, shape, axis):
        """(shape, strides, offset) of leaf h in frame coordinates: a leaf that lost the
        reduced axis gets it back with size 1; broadcast dims read with stride 0."""
        vshape, strides = h.shape, h.strides
        if axis is not None and len(vshape) == len(shape) - 1:
            vshape = vshape[:axis] + (1,) + vshape[axis:]
            strides = strides[:axis] + (0,) + strides[axis:]
        strides = tuple(0 if n == 1 else s for n, s in zip(vshape, strides))
        return vshape, strides, h.offset


def program_signature(program, leaves, out):
    """Everything `ProgramRunner._plan` reads of a Program, but the values patched per call (the
    leaves' offsets, the constants' values): its structure (Program.key: ops, wiring, roles,
    dtypes, constants' dtypes, outputs), the frame, the outputs' public shapes (a row kept or
    squeezed), each leaf's dtype, shape and view (strides, alignment, whether at offset 0; a
    leaf has its handle's shape and dtype), which leaves share a buffer, and the destination
    views. Equal signatures, equal plans (tests/test_fusion_plans.py)."""
    return (program.key, program.shape, program.axis,
            tuple(program.exprs[o].shape for o in program.outputs),
            tuple((h.dtype, h.shape, h.strides, h.offset % 4, h.offset == 0) for h in leaves),
            tuple(next(k for k, g in enumerate(leaves) if g.storage is h.storage)
                  for h in leaves) if len(leaves) > 1 else (),
            out and tuple((o.shape, o.strides, o.offset % 4) for o in out))


class Plan:
    """How to launch a Program: its kernel key and source builder, the parameter block with the
    positions of the per-call offsets (and of the constants, `consts_at`), grid, bindings (the
    leaf bound in each slot), outputs."""

    __slots__ = ("key", "build", "params", "offsets", "groups", "slot_leaf", "specs", "donors",
                 "name", "out_offsets", "consts_at", "partial")

    def __init__(self, key, build, params, offsets, groups, slot_leaf, specs, donors, name,
                 out_offsets, consts_at, partial):
        self.key, self.build, self.params, self.offsets = key, build, params, offsets
        self.groups, self.slot_leaf, self.specs, self.donors = groups, slot_leaf, specs, donors
        self.name, self.out_offsets, self.consts_at = name, out_offsets, consts_at
        # a split reduction's first stage (key, build, groups, scratch words), launched with the
        # same parameters before this plan's kernel, which reads its scratch buffer
        self.partial = partial

    def keep_sources(self):
        """Let the plan outlive its Program, whose leaves hold the first call's buffers: the
        kernel sources (the usual one, the in-place variants, a first stage's) are generated
        now, once per kernel, and the plan's builders read them."""
        if self.key is None:
            return
        self.build = _kept(self.key, self.build, self.donors)
        if self.partial is not None:
            key, build, groups, words = self.partial
            self.partial = (key, _kept(key, build, ()), groups, words)


def _kept(key, build, donors):
    """A builder reading the sources of `key` (the usual one and the in-place variants of
    `donors`), generated now."""
    sources = _SOURCES.setdefault(key, {})
    for inplace in (None,) + tuple(donors):
        if inplace not in sources:
            sources[inplace] = build(inplace)
    return lambda inplace=None: sources[inplace]


class MatmulEpilogue:
    """What the matmul templates (codegen/matmul.py) need to run a flat group at their store of
    C: `source()` (WGSL of `fn epilogue(acc: f32, i: u32)`, built only when the kernel is
    compiled), `buffers` (bindings after A and B), `n_params` and `params` (after the matmul's
    own), `handles` (what is bound), `key` (its structure, part of the matmul kernel's key)."""

    def __init__(self, key, source, buffers, params, handles, name, bytes_read, bytes_written):
        self.key, self.source, self.buffers = key, source, buffers
        self.params, self.n_params, self.handles = params, len(params), handles
        self.name, self.bytes_read, self.bytes_written = name, bytes_read, bytes_written
