"""cn.Fusion(inner): the decorator backend that records elementwise ops lazily and compiles each
group of them into one generated kernel of the inner backend.

    backend = cn.Fusion(cn.Wgpu())
    y = x * ((x / SQRT_2).erf() + 1) / 2      # recorded, nothing launched
    y.tolist()                                # one kernel computes the whole chain

What is recorded: unary/binary/comparison ops, where, cast, constants (`full`), and the
reductions sum/prod/max/min (whose elementwise prologue and epilogue join the same kernel:
softmax and layer norm become one kernel per row), and matmul, launched only when its result
is needed: an elementwise group over its output (bias + activation after a Linear or a conv)
runs inside the matmul kernel, at its store. A pool (the optional pool2d primitive) whose
input is a pending flat group runs that group as its prologue, where its windows read it.
Everything else (argmax, movement copies, gather, unfold, conv2d...) is a boundary: its inputs
are computed first, then the inner backend runs it as usual. A group is compiled and launched
("flushed") when
  * its data is read (to_flat) or a boundary op consumes it;
  * it would read more buffers than one kernel may bind (the device's
    maxStorageBuffersPerShaderStage), or grow beyond MAX_GROUP_OPS ops;
  * an op mixes shapes it cannot iterate together (a pending value broadcast to a larger
    shape, reductions over different axes...).
Intermediates whose handles are dead are never written to memory.

The inner backend supplies a compiler (see `compiler_for`); inner backends without one (NumPy,
Python) get every op passed straight through: same results, no laziness.
"""

from ..backend import Backend, broadcast_shape
from .. import dtypes
from ..ops import result_dtype
from .graph import (Expr, Lazy, LEAF, CONST, PENDING, MATMUL, FUSED_REDUCE_OPS, fits_frame,
                    row_shape, squeezed_row_shape, broadcasts_into, writable, alive, topo_pending,
                    plan_split, Program)

MAX_GROUP_OPS = 64


def compiler_for(inner, max_buffers=None):
    """The fusion compiler of `inner` (a backend declaring `compiles_kernels`), or None (then
    Fusion passes ops through). A compiler has `max_buffers` (storage buffers one kernel may
    bind), `binding_key(handle)` (which buffer a handle reads), `run(program) -> [inner handle
    per output]` (graph.Program), `run_matmul(program, leaf_index, a, b)`: the program run
    as the epilogue of the matmul a @ b (its leaf `leaf_index`), or None where that matmul
    cannot take one; and, where the inner backend declares pool2d_kernel,
    `run_pool(program, op, kernel, stride, padding, dilation)`: the pool of the program's one
    output, the program computed inside the pool kernel."""
    return inner.fusion_compiler(max_buffers) if inner.compiles_kernels else None


class Fusion(Backend):
    """Decorator backend: lazy elementwise graphs, compiled into generated kernels of `inner`.

    max_buffers: bind at most this many storage buffers per kernel (default: the device's
    limit; a smaller value emulates a stricter device, e.g. 8 as in most browsers)."""

    name = "fusion"

    def __init__(self, inner, max_buffers=None):
        if not isinstance(inner, Backend):
            raise TypeError("cn.Fusion(inner) wraps a backend such as cn.Wgpu(), got %r" % (inner,))
        self._inner = inner
        self._key = ("Fusion",) + tuple(inner.device_key())
        self.compiler = compiler_for(inner, max_buffers)
        if self.compiler is None:
            self._pass_through()

    def _pass_through(self):
        # No compiler for this inner backend: every primitive is the inner one, handles too.
        from ..backend import PRIMITIVES
        for name in PRIMITIVES + ("shape", "dtype"):
            setattr(self, name, getattr(self._inner, name))

    @property
    def inner(self):
        return self._inner

    @property
    def lazy(self):
        """True when ops are recorded and fused (the inner backend has a compiler)."""
        return self.compiler is not None

    @property
    def shares_constants(self):
        # Lazy constants are never changed (computing one only caches its buffer).
        return True if self.compiler is not None else self._inner.shares_constants

    def device_key(self):
        return self._key

    @property
    def storage_dtypes(self):
        # The inner backend's: a storage-dtype leaf is its handle, and a generated kernel loads
        # and stores such values as the inner backend's own kernels do (in registers, a cast to
        # one holds the value it would have in memory: wgpu_backend/codegen/program.py).
        return self._inner.storage_dtypes

    def __repr__(self):
        return "cn.Fusion(%r)" % (self._inner,)

    def __getattr__(self, name):
        if name in ("to_numpy", "to_flat_async"):
            fn = getattr(self._inner, name)
            if self.compiler is None:
                return fn
            return lambda h: fn(self._value(h))
        if name in ("memory_stats", "empty_cache"):
            return getattr(self._inner, name)
        raise AttributeError(name)

    def synchronize(self):
        self._inner.synchronize()

    def shape(self, h):
        return h.expr.shape

    def dtype(self, h):
        return h.expr.dtype

    # -- leaves and materialisation ----------------------------------------------------------

    def _leaf(self, value, shape, dtype):
        key = self.compiler.binding_key(value)
        return Lazy(Expr(LEAF, None, None, (), tuple(shape), tuple(shape), dtype, value,
                         leaves=frozenset((key,))))

    def _compute(self, e):
        """The inner handle of expr e, launching its group if it is pending."""
        if e.value is not None:
            return e.value
        if e.kind == CONST:
            e.value = self._inner.full(e.shape, e.arg, e.dtype)
            return e.value
        if e.kind == MATMUL:
            a, b, origin = e.arg
            value = self._inner.matmul(a, b) if origin is None else \
                self._inner.reshape(self._compute(origin), e.shape)
            e.materialized(value, self.compiler.binding_key(value))
            e.arg = None
            return value
        self._flush(e)
        return e.value

    def _value(self, h):
        return self._compute(h.expr)

    # -- the decorator's two directions (cn.capture walks the stack with them) ----------------

    def inner_tensor(self, tensor):
        """The tensor as a Tensor of the inner backend (its pending group computed)."""
        from ..tensor import Tensor
        h = self._value(tensor.handle) if self.compiler is not None else tensor.handle
        return Tensor(self._inner, h, tensor.shape, tensor.dtype)

    def outer_tensor(self, tensor):
        """A Tensor of the inner backend as a tensor of this one."""
        from ..tensor import Tensor
        h = self._leaf(tensor.handle, tensor.shape, tensor.dtype) if self.compiler is not None \
            else tensor.handle
        return Tensor(self, h, tensor.shape, tensor.dtype)

    def realize(self, tensor):
        """Compute a tensor's pending group now, without reading it back (benchmarks, or to
        overlap GPU work with Python); returns the tensor."""
        if self.compiler is not None:
            self._value(tensor.handle)
        return tensor

    def _flush(self, target):
        """Compute target's group; split into several kernels when it binds too many buffers."""
        frame = target.frame
        key_of = self.compiler.binding_key
        # A live value smaller than the frame (broadcast into it) cannot be stored by this
        # group's kernel: it gets its own, and is a plain input here.
        order = topo_pending(target)
        narrow = [e for e in order if e is not target and alive(e) and not writable(e, frame)]
        if narrow:
            for e in narrow:
                self._compute(e)
            order = topo_pending(target)
        products = {id(x): x for e in order for x in e.inputs if x.kind == MATMUL}
        if len(products) == 1 and self._flush_into_matmul(order, target, *products.values()):
            return
        for product in products.values():
            self._compute(product)
        while order:
            plan = plan_split(order, target, self.compiler.max_buffers, key_of, frame)
            if plan is None:  # the split point needs a broadcast value: compute that first
                self._compute(next(e for e in order if not writable(e, frame)))
                order = topo_pending(target)
                continue
            count, outputs = plan
            values = self.compiler.run(Program(order[:count], outputs, frame))
            for e, value in zip(outputs, values):
                e.materialized(value, key_of(value))
            order = [e for e in order[count:] if e.kind == PENDING]

    def _flush_into_matmul(self, order, target, product):
        """Run the flat group `order` as the epilogue of the matmul `product` it reads, when
        the matmul's own result is not wanted and one kernel can bind everything; True if so."""
        frame = target.frame
        if frame[1] is not None or frame[0] != product.shape or alive(product):
            return False
        outputs = [x for x in order if x is target or alive(x)]
        if not all(writable(x, frame) for x in outputs):
            return False
        a, b, origin = product.arg
        if origin is not None and (alive(origin) or origin.value is not None):
            return False  # the product itself is wanted too (through another view of it)
        key_of = self.compiler.binding_key
        keys = {key_of(x.value) for e in order for x in e.inputs if x.kind == LEAF}
        if len(keys) + 2 + len(outputs) > self.compiler.max_buffers:
            return False
        program = Program(order, outputs, frame)
        index = next(j for j, x in enumerate(program.leaves) if x is product)
        values = self.compiler.run_matmul(program, index, a, b)
        if values is None:
            return False
        for e, value in zip(outputs, values):
            e.materialized(value, key_of(value))
        return True

    # -- recording -----------------------------------------------------------------------------

    def _record(self, op, arg, handles, shape, dtype, frame=None):
        """A pending expr of `op` over the exprs of `handles` (public output shape `shape`)."""
        inputs = tuple([h.expr for h in handles])
        pending = [e for e in inputs if e.kind == PENDING]
        if frame is None:  # elementwise: join the frame of a pending input that can host it
            frame = next((e.frame for e in pending if e.frame[1] is not None
                          and fits_frame(e.frame, shape)), (shape, None)) if pending else (shape, None)
        if pending:
            computed = False
            for e in pending:
                if e.frame != frame and not self._joins(e, frame):
                    self._compute(e)
                    computed = True
            if computed:
                pending = [e for e in inputs if e.kind == PENDING]
        # Keep the group within one kernel's limits: compute the biggest pending input first.
        while True:
            leaves = inputs[0].leaves if len(inputs) == 1 else \
                inputs[0].leaves.union(*[e.leaves for e in inputs[1:]])
            size = 1 + sum([e.size for e in pending])
            if not pending or (len(leaves) < self.compiler.max_buffers and size <= MAX_GROUP_OPS):
                break
            self._compute(max(pending, key=lambda e: (len(e.leaves), e.size)))
            pending = [e for e in inputs if e.kind == PENDING]
        if frame[1] is None or shape == frame[0]:
            fshape = shape
        else:
            fshape = row_shape(frame)
        return Lazy(Expr(PENDING, op, arg, inputs, shape, fshape, dtype, frame=frame, size=size,
                         leaves=leaves))

    @staticmethod
    def _joins(e, frame):
        if e.frame[1] is not None:
            return e.frame == frame
        return broadcasts_into(e.shape, frame)

    # -- creation and reading ------------------------------------------------------------------

    def from_flat(self, values, shape, dtype):
        return self._leaf(self._inner.from_flat(values, shape, dtype), shape, dtype)

    def full(self, shape, value, dtype):
        shape = tuple(shape)
        if dtype.is_storage:  # data, not a kernel parameter (which holds compute values)
            return self._leaf(self._inner.full(shape, value, dtype), shape, dtype)
        return Lazy(Expr(CONST, "const", value, (), shape, shape, dtype))

    def random(self, shape, distribution, seed, dtype):
        return self._leaf(self._inner.random(shape, distribution, seed, dtype), shape, dtype)

    def to_flat(self, h):
        return self._inner.to_flat(self._value(h))

    # -- elementwise (recorded) ----------------------------------------------------------------

    def unary(self, op, x):
        dtype = result_dtype(op, x.expr.dtype)
        return self._record(op, None, (x,), x.expr.shape, dtype)

    def binary(self, op, a, b):
        dtype = result_dtype(op, a.expr.dtype)
        return self._record(op, None, (a, b), broadcast_shape(a.expr.shape, b.expr.shape), dtype)

    def where(self, cond, a, b):
        shape = broadcast_shape(cond.expr.shape, a.expr.shape, b.expr.shape)
        return self._record("where", None, (cond, a, b), shape, a.expr.dtype)

    def cast(self, x, dtype):
        if x.expr.dtype is dtype:
            return x
        v = x.expr.arg
        if x.expr.kind == CONST and not dtype.is_storage and (dtype is not dtypes.int32
                                                              or abs(v) < 2.0 ** 31):
            # constants stay constants (NaN/inf -> int is left to the kernels' own rule)
            value = float(v) if dtype is dtypes.float32 else (int(v) if dtype is dtypes.int32
                                                              else (1 if v != 0 else 0))
            return self.full(x.expr.shape, value, dtype)
        return self._record("cast_" + dtype.kind, None, (x,), x.expr.shape, dtype)

    def custom(self, op, handles, shape):
        """A user-registered elementwise kernel (cinders.fusion.custom): recorded like any op."""
        if self.compiler is None:
            return self._inner.custom(op, handles, shape)
        return self._record("custom", op, handles, shape, dtypes.float32)

    # -- reductions: sum/prod/max/min fuse with what feeds them and what follows -------------

    def reduce(self, op, x, axis, keepdim):
        e = x.expr
        shape = e.shape
        if op not in FUSED_REDUCE_OPS or shape[axis] <= 1 or 0 in shape:
            return self._boundary("reduce", op, x, axis, keepdim)
        frame = (shape, axis)
        if e.kind == PENDING and not (e.fshape == shape and e.shape == shape and
                                      (e.frame[1] is None or e.frame == frame)):
            self._compute(e)
        out_shape = row_shape(frame) if keepdim else squeezed_row_shape(frame)
        return self._record("reduce_" + op, None, (x,), out_shape, e.dtype, frame)

    # -- boundaries: computed inputs, then the inner backend's own kernel ---------------------

    def _boundary(self, name, *args):
        inner_args = [self._value(a) if isinstance(a, Lazy) else
                      ([self._value(h) for h in a] if isinstance(a, list) else a) for a in args]
        out = getattr(self._inner, name)(*inner_args)
        inner = self._inner
        return self._leaf(out, inner.shape(out), inner.dtype(out))

    def matmul(self, a, b):
        inner = self._inner
        a, b = self._value(a), self._value(b)
        if inner.dtype(a) is not dtypes.float32:
            out = inner.matmul(a, b)
            return self._leaf(out, inner.shape(out), inner.dtype(out))
        (*abatch, m, _), (*bbatch, _, n) = inner.shape(a), inner.shape(b)
        shape = tuple(max(p, q) for p, q in zip(abatch, bbatch)) + (m, n)
        key_of = self.compiler.binding_key
        return Lazy(Expr(MATMUL, "matmul", (a, b, None), (), shape, shape, dtypes.float32,
                         leaves=frozenset((key_of(a), key_of(b)))))

    def cat(self, xs, axis):
        return self._boundary("cat", list(xs), axis)

    def pad(self, x, pads, value):
        return self._boundary("pad", x, pads, value)

    def gather(self, x, axis, index):
        return self._boundary("gather", x, axis, index)

    def scatter_add(self, x, axis, index, src):
        return self._boundary("scatter_add", x, axis, index, src)

    def unfold2d(self, x, kernel, stride, padding, dilation, pad_value):
        return self._boundary("unfold2d", x, kernel, stride, padding, dilation, pad_value)

    def fold2d(self, cols, size, kernel, stride, padding, dilation):
        return self._boundary("fold2d", cols, size, kernel, stride, padding, dilation)

    @property
    def conv2d_kernel(self):
        return self._inner.conv2d_kernel

    @property
    def conv2d_activations(self):
        return self._inner.conv2d_activations

    def conv2d(self, x, w, bias, stride, padding, dilation, groups, activation):
        # Only called when the inner backend declares the kernel; its bias and activation
        # run inside it, so the conv is a boundary like unfold2d.
        return self._inner_kernel("conv2d", x, w, bias, stride, padding, dilation, groups, activation)

    @property
    def conv2d_backward_kernels(self):
        return self._inner.conv2d_backward_kernels

    # conv2d's backward kernels (only called when the inner backend declares them): boundaries.
    def conv2d_grad_input(self, g, w, size, stride, padding, dilation, groups):
        return self._inner_kernel("conv2d_grad_input", g, w, size, stride, padding, dilation, groups)

    def conv2d_grad_weight(self, x, g, kernel, stride, padding, dilation, groups):
        return self._inner_kernel("conv2d_grad_weight", x, g, kernel, stride, padding, dilation, groups)

    def conv2d_grad_bias(self, g):
        return self._inner_kernel("conv2d_grad_bias", g)

    def _inner_kernel(self, name, *args):
        if self.compiler is None:
            return getattr(self._inner, name)(*args)
        return self._boundary(name, *args)

    # The products whose weights stay packed (core/backend.py "quantized_matmul",
    # "quantized_conv2d", "half_conv2d"): boundaries, so int8, 4-bit and float16 weights stay
    # at their size under Fusion. (dynamic_quantize and quantize_dequantize are not forwarded:
    # their compositions are reductions and elementwise ops, which fuse with what they read.)
    @property
    def quantized_matmul(self):
        return self._inner.quantized_matmul

    def matmul_quantized(self, a, q, scale, zero_point, layout, a_scale=None):
        return self._inner_kernel("matmul_quantized", a, q, scale, zero_point, layout, a_scale)

    @property
    def quantized_conv2d(self):
        return self._inner.quantized_conv2d

    @property
    def half_conv2d(self):
        return self._inner.half_conv2d

    def conv2d_quantized(self, x, x_param, q, scale, zero_point, bias, stride, padding, dilation, groups):
        return self._inner_kernel("conv2d_quantized", x, x_param, q, scale, zero_point, bias, stride, padding,
                                  dilation, groups)

    @property
    def pool2d_kernel(self):
        return self._inner.pool2d_kernel

    def pool2d(self, x, op, kernel, stride, padding, dilation):
        if self.compiler is None:
            return self._inner.pool2d(x, op, kernel, stride, padding, dilation)
        order = self._pool_prologue(x.expr)
        if order is None:
            return self._boundary("pool2d", x, op, kernel, stride, padding, dilation)
        # The pending group runs inside the pool kernel, where its windows read it. It stays
        # pending: dead afterwards (the usual case: conv -> ReLU -> pool) it is never stored;
        # still wanted, it is computed again by its own kernel when read.
        e = x.expr
        out = self.compiler.run_pool(Program(order, [e], e.frame), op, kernel, stride, padding, dilation)
        return self._leaf(out, self._inner.shape(out), e.dtype)

    def _pool_prologue(self, e):
        """The pending exprs of e's group (inputs first) when one pool kernel can compute them
        as its prologue: a flat float32 group of e's shape within the binding limit; else None."""
        if e.kind != PENDING or e.frame != (e.shape, None) or e.dtype is not dtypes.float32:
            return None
        order = topo_pending(e)
        for product in {id(x): x for y in order for x in y.inputs if x.kind == MATMUL}.values():
            self._compute(product)      # (a leaf of the group from now on)
        if not all(y.shape == e.shape and y.frame == e.frame for y in order):
            return None
        keys = {self.compiler.binding_key(x.value) for y in order for x in y.inputs if x.kind == LEAF}
        return order if len(keys) + 1 <= self.compiler.max_buffers else None

    # -- movement: constants stay constants, views of data stay views --------------------------

    def _const_as(self, x, shape):
        return self.full(shape, x.expr.arg, x.expr.dtype)

    def reshape(self, x, shape):
        e = x.expr
        if e.kind == CONST:
            return self._const_as(x, tuple(shape))
        if e.kind == MATMUL:  # a view of the (contiguous) product: its epilogue may still fuse
            a, b, origin = e.arg
            return Lazy(Expr(MATMUL, "matmul", (a, b, origin or e), (), tuple(shape),
                             tuple(shape), e.dtype, leaves=e.leaves))
        return self._boundary("reshape", x, shape)

    def permute(self, x, dims):
        if x.expr.kind == CONST:
            return self._const_as(x, tuple(x.expr.shape[d] for d in dims))
        return self._boundary("permute", x, dims)

    def expand(self, x, shape):
        if x.expr.kind == CONST:
            return self._const_as(x, tuple(shape))
        if x.expr.kind == PENDING:  # broadcasting a pending value is elementwise: stays lazy
            return self._record("copy", None, (x,), tuple(shape), x.expr.dtype)
        return self._boundary("expand", x, shape)

    def slice(self, x, starts, stops, steps):
        if x.expr.kind == CONST:
            shape = tuple(max(0, -(-(b - a) // s)) for a, b, s in zip(starts, stops, steps))
            return self._const_as(x, shape)
        return self._boundary("slice", x, starts, stops, steps)
