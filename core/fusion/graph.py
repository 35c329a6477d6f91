"""The lazy op graph of cn.Fusion: expressions, frames, and the structure of a fusion group.

An `Expr` is one value of the graph. Three kinds:
    LEAF     data the inner backend already holds (`value` is its handle)
    CONST    a fill value (`arg`) of some shape; inlined into kernels as a parameter, and only
             turned into a buffer (`value`) when a non-fusable op needs it
    PENDING  an elementwise op or a reduction not computed yet (`op`, `arg`, `inputs`)
    MATMUL   a matmul not launched yet (`arg`: the inner handles of its operands). To the
             groups that read it, it is a leaf; a flat group over its shape may instead run
             inside the matmul kernel as its epilogue (bias + activation), see backend._flush.

A user-visible handle (`Lazy`) points at its Expr; the Expr keeps only a weak reference back.
So at flush time "is this intermediate still wanted?" is "is its handle still alive?": dead
intermediates are computed in registers and never written, live ones become extra outputs.

Frames. Every pending Expr belongs to a frame (S, axis): the shape the kernel iterates over and,
for groups with reductions, the one axis they reduce. axis None: a plain elementwise group of
shape S. With an axis, S is the reduced input's shape and the group holds "full" values (shape
S, computed per element) and "row" values (shape S with S[axis] = 1, or that shape without the
axis when a reduction dropped it: computed once per row). The recording rules in backend.py keep
every pending ancestor of an Expr in the Expr's own frame, so a flush never sees a mix.
"""

import weakref

LEAF, CONST, PENDING, MATMUL = 0, 1, 2, 3
FUSED_REDUCE_OPS = ("sum", "prod", "max", "min")


class Expr:
    __slots__ = ("kind", "op", "arg", "inputs", "shape", "fshape", "dtype", "value", "frame",
                 "ref", "size", "leaves", "__weakref__")

    def __init__(self, kind, op, arg, inputs, shape, fshape, dtype, value=None, frame=None,
                 size=0, leaves=frozenset()):
        self.kind = kind
        self.op = op          # "add", "exp", "cast_f", "where", "reduce_sum", "custom", ...
        self.arg = arg        # const value, or a custom op object
        self.inputs = inputs  # tuple of Expr
        self.shape = shape    # the public shape (what the tensor layer sees)
        self.fshape = fshape  # the shape in frame coordinates (keeps a reduced axis as 1)
        self.dtype = dtype
        self.value = value    # the inner backend's handle once computed
        self.frame = frame
        self.ref = None       # weakref to the Lazy handle
        self.size = size      # pending ops behind this one (an upper bound), caps group size
        self.leaves = leaves  # binding keys of the buffers the pending group reads

    def materialized(self, value, key):
        """Turn a computed PENDING expr into a LEAF (dropping its inputs frees the graph)."""
        self.kind, self.value, self.inputs, self.frame = LEAF, value, (), None
        self.size, self.leaves = 0, frozenset((key,))


class Lazy:
    """The handle cn.Fusion gives the tensor layer (and Autodiff): a pointer to an Expr."""

    __slots__ = ("expr", "__weakref__")

    def __init__(self, expr):
        self.expr = expr
        if expr.kind in (PENDING, MATMUL):
            expr.ref = weakref.ref(self)

    def __repr__(self):
        return "Lazy(%s, shape=%s, %s)" % (("leaf", "const", "pending", "matmul")[self.expr.kind],
                                           self.expr.shape, self.expr.dtype)


def row_shape(frame):
    shape, axis = frame
    return shape[:axis] + (1,) + shape[axis + 1:]


def squeezed_row_shape(frame):
    shape, axis = frame
    return shape[:axis] + shape[axis + 1:]


def fits_frame(frame, shape):
    """Can a value of public `shape` live in `frame`? (full, row, or row without the axis)"""
    if frame[1] is None:
        return shape == frame[0]
    return shape == frame[0] or shape == row_shape(frame) or shape == squeezed_row_shape(frame)


def broadcasts_into(shape, frame):
    """Can a pending value of `shape` be evaluated at the frame's coordinates? (It may be
    smaller than the frame: elementwise values broadcast by reading their inputs broadcast.)"""
    full, axis = frame
    if len(shape) == len(full) - 1 and axis is not None:
        full = squeezed_row_shape(frame)
    return len(shape) == len(full) and all(a == b or a == 1 for a, b in zip(shape, full))


def is_row(fshape, frame):
    """Does a value of frame-coordinate shape `fshape` stay constant along the frame's axis?"""
    full, axis = frame
    return axis is not None and (len(fshape) == len(full) - 1 or fshape[axis] == 1)


def writable(e, frame):
    """Can a kernel of `frame` store e? Full values at the element, row values at the row."""
    full, axis = frame
    if axis is None:
        return e.shape == full
    return e.fshape == full or e.shape == row_shape(frame) or e.shape == squeezed_row_shape(frame)


def topo_pending(target):
    """The pending exprs `target` depends on (itself included), inputs before users."""
    order, seen, stack = [], set(), [(target, False)]
    while stack:
        e, expanded = stack.pop()
        if expanded:
            order.append(e)
            continue
        if id(e) in seen:
            continue
        seen.add(id(e))
        stack.append((e, True))
        for x in e.inputs:
            if x.kind == PENDING and id(x) not in seen:
                stack.append((x, False))
    return order


def alive(e):
    return e.ref is not None and e.ref() is not None


def plan_split(order, target, limit, binding_key, frame):
    """The longest prefix of `order` that one kernel can compute within `limit` bound buffers,
    and the exprs it must write (the target, live handles, values the rest still reads);
    None when no prefix can write what it must (a broadcast value the rest needs)."""
    # The common case first: the whole group fits one kernel.
    keys = {binding_key(x.value) for e in order for x in e.inputs if x.kind == LEAF}
    outputs = [x for x in order if x is target or alive(x)]
    if len(keys) + len(outputs) <= limit and all(writable(x, frame) for x in outputs):
        return len(order), outputs
    position = {id(e): i for i, e in enumerate(order)}
    last_use = {}  # expr id -> index of its last pending user in order
    for i, e in enumerate(order):
        for x in e.inputs:
            if id(x) in position:
                last_use[id(x)] = i
    best = None
    keys = set()
    for p in range(1, len(order) + 1):
        e = order[p - 1]
        for x in e.inputs:
            if x.kind == LEAF:
                keys.add(binding_key(x.value))
        if len(keys) + 1 > limit:
            break
        outputs = [x for x in order[:p]
                   if x is target or alive(x) or last_use.get(id(x), -1) >= p]
        if len(keys) + len(outputs) <= limit and all(writable(x, frame) for x in outputs):
            best = (p, outputs)
    return best


class Program:
    """A fusion group in backend-neutral form: what a compiler turns into one kernel.

    nodes:   [(op, arg, refs, role, dtype)] in order; refs name inputs as ("n", i) a node,
             ("l", j) a leaf, ("c", j) a constant; role "full" or "row" (per row of the frame)
    leaves:  [Expr] distinct LEAF inputs (their `.value` is the inner handle)
    consts:  [Expr] CONST inputs (their `.arg` is the value)
    outputs: [node index]
    key:     hashable structure (ops, dtypes, roles, wiring, frame rank): equal keys, same
             kernel source, for any shape of the same rank
    """

    def __init__(self, nodes, outputs, frame):
        shape, axis = frame
        self.shape, self.axis = shape, axis
        self.leaves, self.consts, self.nodes = [], [], []
        self.exprs = nodes
        index = {id(e): i for i, e in enumerate(nodes)}
        leaf_index, const_index, structure = {}, {}, []
        self.has_reduce = False
        for e in nodes:
            refs = []
            for x in e.inputs:
                i = index.get(id(x))
                if i is not None:
                    refs.append(("n", i))
                elif x.kind == CONST:
                    j = const_index.setdefault(id(x), len(self.consts))
                    if j == len(self.consts):
                        self.consts.append(x)
                    refs.append(("c", j))
                else:
                    j = leaf_index.setdefault(id(x), len(self.leaves))
                    if j == len(self.leaves):
                        self.leaves.append(x)
                    refs.append(("l", j))
            refs = tuple(refs)
            role = "row" if axis is not None and is_row(e.fshape, frame) else "full"
            op = e.op
            self.nodes.append((op, e.arg, refs, role, e.dtype))
            structure.append((op, e.arg.key if op == "custom" else None, refs, role, e.dtype))
            self.has_reduce = self.has_reduce or op.startswith("reduce_")
        self.outputs = [index[id(e)] for e in outputs]
        self.key = (len(shape), axis is not None, tuple(structure),
                    tuple(x.dtype for x in self.consts), tuple(self.outputs))

    @property
    def name(self):
        """What cn.profile calls its kernel: the op of a one-node Program (a plain op), else
        fused_ and its ops."""
        ops = [op for op, *_ in self.nodes]
        if len(ops) == 1:
            return ops[0]
        return "fused_" + "_".join(ops[:6]) + ("_x%d" % len(ops) if len(ops) > 6 else "")
