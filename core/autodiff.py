"""cn.Autodiff(inner): the backend decorator that records a tape and differentiates it.

    backend = cn.Autodiff(cn.NumPy())
    w = cn.random((3, 2), backend=backend).require_grad()
    loss = (x @ w).relu().sum()
    grads = loss.backward()          # a cn.Gradients, never stored on tensors
    w.grad(grads)                    # a Tensor on the inner backend (cn.NumPy() here)

How it works. An Autodiff handle (`Var`) pairs the inner backend's handle with a tape `Node`
(None for constants). Each primitive below calls the inner backend and, when an input requires
grad, records a Node whose backward rule sits right next to the forward call. Backward rules are
written with Tensor operations on the INNER backend, so they reuse the tensor layer (broadcasting,
composites) and run on any backend (Python, NumPy, Wgpu, Fusion...). Composite ops (softmax,
gelu, conv2d = unfold2d + matmul, pooling = unfold2d + reduce) are built from these primitives
in the tensor layer, so they are differentiated without any rule of their own; where the inner
backend declares a conv2d kernel, conv2d is recorded as one op with its rule composed likewise,
or run by the inner backend's backward kernels where it declares conv2d_backward_kernels.

Semantics worth knowing (PyTorch's unless stated):
* max/min reductions share the gradient evenly among tied maxima (torch.amax/amin, and
  torch.max()/min() without a dim); maximum/minimum give each side half at a tie.
* prod: the true product of the other entries, also when entries are zero (one zero: only the
  zero entry gets a gradient; two or more: none), never via exp(sum(log)).
* floor/ceil/round/floordiv have zero gradient; comparisons, argmax/argmin, logical ops and casts
  to int/bool are not differentiable (their results are constants).
* backward() on a non-scalar tensor seeds with ones (like Burn), i.e. differentiates its sum.
* backward() frees the tape behind the tensor (like PyTorch without retain_graph): a second
  backward() through the same graph raises. Leaves (require_grad()) stay usable.
* require_grad() returns a new leaf that shares the data and starts a fresh history. Only
  leaves get gradients in the Gradients (intermediate ones are dropped as backward() goes).
* max pooling is unfold2d + max, so tied window maxima share the gradient (torch's max_pool2d
  gives it to one of them); relu = where(x <= 0, 0, x) has gradient 0 at 0, like torch.
* Composites are recorded primitive by primitive, which is what makes them differentiable.
"""

import itertools
import operator
import threading

from . import dtypes
from .backend import Backend
from .errors import DTypeError, NotDifferentiableError
from .ops import OPS
from .tensor import Tensor, where as _where


# ----------------------------------------------------------------------------- grad mode

class _GradMode(threading.local):
    disabled = 0  # depth of nested no_grad() blocks in this thread


_grad_mode = _GradMode()


class no_grad:
    """`with cn.no_grad():` computes without recording (this thread only, nestable); also a
    decorator, `@cn.no_grad()`."""

    def __call__(self, fn):
        def wrapper(*args, **kwargs):
            with no_grad():
                return fn(*args, **kwargs)
        wrapper.__name__, wrapper.__doc__ = fn.__name__, fn.__doc__
        return wrapper

    def __enter__(self):
        _grad_mode.disabled += 1
        return self

    def __exit__(self, *exc):
        _grad_mode.disabled -= 1
        return False


def is_grad_enabled():
    return _grad_mode.disabled == 0


# ----------------------------------------------------------------------------- tape

def _freed_backward(grad):
    raise NotDifferentiableError(
        "backward() through a graph whose tape was already freed by an earlier backward(); "
        "compute the loss again before calling backward() again")


class Node:
    """One tape entry. Leaves have `backward is None`; other nodes map the gradient of their
    output to gradients of their parents (a tuple aligned with `parents`, None = no gradient)."""

    __slots__ = ("parents", "backward", "seq", "__weakref__")

    def __init__(self, parents, backward):
        self.parents = parents
        self.backward = backward
        self.seq = next(_creation_order)  # after every parent's: a topological order for free


_creation_order = itertools.count()
_newest_first = operator.attrgetter("seq")


class Var:
    """An Autodiff handle: the inner backend's handle and the tape node (None = constant)."""

    __slots__ = ("value", "node")

    def __init__(self, value, node=None):
        self.value = value
        self.node = node


class Gradients:
    """The gradients one backward() computed, keyed by leaf. `t.grad(grads)` reads them.

    Immutable once returned, so any number of threads may read it; it is never attached to
    tensors, so two backward passes never interfere."""

    __slots__ = ("_by_node",)

    def __init__(self, by_node):
        self._by_node = by_node

    def get(self, tensor):
        """The gradient of `tensor` (a Tensor on the inner backend), or None when the loss does
        not depend on it."""
        handle = tensor.handle
        node = handle.node if isinstance(handle, Var) else None
        return self._by_node.get(node) if node is not None else None

    @classmethod
    def of(cls, pairs):
        """Gradients from (tensor, gradient) pairs, tensors being leaves that require grad:
        how data-parallel training hands the averaged gradients of several backward passes to
        an optimizer."""
        return cls({tensor.handle.node: grad for tensor, grad in pairs})

    def __len__(self):
        return len(self._by_node)

    def values(self):
        return list(self._by_node.values())

    def map(self, fn):
        """New Gradients with fn(grad) in place of every gradient (e.g. clipping)."""
        return Gradients({node: fn(g) for node, g in self._by_node.items()})

    def __repr__(self):
        return "cn.Gradients(%d tensors)" % len(self._by_node)


# ----------------------------------------------------------------------------- the backend

class Autodiff(Backend):
    """Decorator backend: computes on `inner`, records what requires grad, differentiates."""

    name = "autodiff"
    differentiable = True  # the declared ability (core/backend.py, "Abilities")

    def __init__(self, inner):
        if not isinstance(inner, Backend):
            raise TypeError("cn.Autodiff(inner) wraps a backend such as cn.NumPy(), got %r" % (inner,))
        self._inner = inner
        self._key = ("Autodiff",) + tuple(inner.device_key())

    @property
    def inner(self):
        return self._inner

    def device_key(self):
        return self._key

    def device(self, index):
        """Autodiff over the inner backend's device `index` (a cn.Router's member)."""
        inner = self._inner.device(index)
        return self if inner is self._inner else Autodiff(inner)

    @property
    def shares_constants(self):
        # A constant Var (node None) is never changed: require_grad() makes a new Var.
        return self._inner.shares_constants

    def __repr__(self):
        return "cn.Autodiff(%r)" % (self._inner,)

    def shape(self, h):
        return self._inner.shape(h.value)

    def dtype(self, h):
        return self._inner.dtype(h.value)

    def synchronize(self):
        self._inner.synchronize()

    def __getattr__(self, name):
        # Optional extras of the inner backend that take one handle (to_numpy, to_flat_async)
        # or none (memory_stats) pass straight through.
        if name in ("to_numpy", "to_flat_async"):
            fn = getattr(self._inner, name)
            return lambda h: fn(h.value)
        if name == "memory_stats":
            return getattr(self._inner, name)
        raise AttributeError(name)

    # -- the user-facing hooks, called by Tensor.require_grad/backward/detach/grad ---------

    def _wrap(self, tensor, var):
        return Tensor(self, var, tensor.shape, tensor.dtype)

    def _inner_tensor(self, value, shape=None, dtype=dtypes.float32):
        """A Tensor of the inner backend around a handle (float32 unless told: every value
        that carries a gradient is float32)."""
        inner = self._inner
        return Tensor(inner, value, tuple(inner.shape(value)) if shape is None else shape, dtype)

    def require_grad(self, tensor):
        if not tensor.dtype.is_float:
            raise DTypeError("require_grad(): only float tensors have gradients, got %r of shape %s"
                             % (tensor.dtype, tensor.shape))
        return self._wrap(tensor, Var(tensor.handle.value, Node((), None)))

    def requires_grad(self, tensor):
        return tensor.handle.node is not None

    def detach(self, tensor):
        return self._wrap(tensor, Var(tensor.handle.value))

    def assign(self, target, new):
        # x[key] = v: the result's history flows back to x's old value and to v (index_put). A
        # leaf that requires grad keeps its identity (it is what the gradients are keyed by), so
        # it may only be written under no_grad, as in torch (optimizer-style updates).
        node = target.handle.node
        if node is not None and node.backward is None:
            if not _grad_mode.disabled:
                raise NotDifferentiableError(
                    "setitem: %s tensor of shape %s is a leaf that requires grad; writing into it would "
                    "lose its gradient. Write under cn.no_grad(), or into a copy (y = x * 1.0)"
                    % (target.dtype, target.shape))
            return Var(new.handle.value, node)
        return new.handle

    def grad(self, tensor, grads):
        if not isinstance(grads, Gradients):
            raise TypeError("t.grad(grads) takes the cn.Gradients that loss.backward() returned, got %r"
                            % (type(grads).__name__,))
        return grads.get(tensor)

    def to_inner(self, tensor):
        """The tensor's data as a Tensor of the inner backend (no history)."""
        return self._inner_tensor(tensor.handle.value, tensor.shape, tensor.dtype)

    def from_inner(self, tensor, require_grad=False):
        """Wrap a Tensor of the inner backend; optionally as a new leaf that requires grad."""
        node = Node((), None) if require_grad else None
        return Tensor(self, Var(tensor.handle, node), tensor.shape, tensor.dtype)

    # The decorator's two directions, named as on every decorator (cn.capture walks the stack).
    def inner_tensor(self, tensor):
        return self.to_inner(tensor)

    def outer_tensor(self, tensor):
        return self.from_inner(tensor)

    def backward(self, tensor):
        root = tensor.handle.node
        if root is None:
            raise NotDifferentiableError(
                "backward(): this tensor does not require grad; none of its inputs was marked with "
                "t.require_grad() (or it was computed inside cn.no_grad())")
        if not tensor.dtype.is_float:
            raise DTypeError("backward() needs a float tensor, got %r" % (tensor.dtype,))
        # Every node is created after its parents, so creation order is topological: collect
        # what the root reaches (iteratively: graphs can be deep), then visit newest first.
        reached, stack = {root}, [root]
        while stack:
            for parent in stack.pop().parents:
                if parent is not None and parent not in reached:
                    reached.add(parent)
                    stack.append(parent)
        order = sorted(reached, key=_newest_first, reverse=True)
        inner = self._inner
        seed = inner.full(tuple(tensor.shape), 1.0, dtypes.float32)
        pending = {root: self._inner_tensor(seed, tuple(tensor.shape), dtypes.float32)}
        leaves = {}
        with no_grad():
            for node in order:
                grad = pending.pop(node, None)
                if node.backward is None:  # a leaf
                    if grad is not None:
                        leaves[node] = grad
                    continue
                if grad is not None:
                    for parent, parent_grad in zip(node.parents, node.backward(grad)):
                        if parent is None or parent_grad is None:
                            continue
                        before = pending.get(parent)
                        pending[parent] = parent_grad if before is None else before + parent_grad
                # Free the tape as we go: closures hold the saved activations.
                node.parents = ()
                node.backward = _freed_backward
        return Gradients(leaves)

    # -- recording helper ------------------------------------------------------------------

    def _record(self, value, inputs, backward):
        """A Var for `value`; records `backward` when grad mode is on and an input needs grad."""
        if _grad_mode.disabled:
            return Var(value)
        if len(inputs) == 1:  # reshape, permute, expand, slice, pad, cast...
            node = inputs[0].node
            return Var(value) if node is None else Var(value, Node((node,), backward))
        parents = tuple(x.node for x in inputs)
        for p in parents:
            if p is not None:
                return Var(value, Node(parents, backward))
        return Var(value)

    # -- user kernels (cinders.fusion.custom_op) ----------------------------------------------

    def custom(self, op, handles, shape):
        values = [h.value for h in handles]
        out = self._inner.custom(op, values, shape)
        if not handles:
            return Var(out)
        return self._record(out, handles, lambda g: op.gradients(self._inner, values, out, shape, g))

    # -- creation / reading: constants -----------------------------------------------------

    def from_flat(self, values, shape, dtype):
        return Var(self._inner.from_flat(values, shape, dtype))

    def full(self, shape, value, dtype):
        return Var(self._inner.full(shape, value, dtype))

    def random(self, shape, distribution, seed, dtype):
        return Var(self._inner.random(shape, distribution, seed, dtype))

    def to_flat(self, h):
        return self._inner.to_flat(h.value)

    # -- elementwise -----------------------------------------------------------------------

    def unary(self, op, x):
        y = self._inner.unary(op, x.value)
        entry = OPS[op]
        if entry.grad is None or x.node is None or _grad_mode.disabled:
            return Var(y)
        rule, (params,) = entry.grad, entry.params
        xv = x.value if "x" in entry.saves else None  # keep only what the rule reads
        yv = y if "y" in entry.saves else None
        T = self._inner_tensor

        def backward(g):
            values = {"x": None if xv is None else T(xv, g.shape), "y": None if yv is None else T(yv, g.shape),
                      "g": g}
            return (rule(*[values[p] for p in params]),)
        return Var(y, Node((x.node,), backward))

    def binary(self, op, a, b):
        out = self._inner.binary(op, a.value, b.value)
        entry = OPS[op]
        if entry.grad is None or (a.node is None and b.node is None) or _grad_mode.disabled:
            return Var(out)
        (rule_a, rule_b), (params_a, params_b) = entry.grad, entry.params
        inner, T = self._inner, self._inner_tensor
        need_a, need_b = a.node is not None, b.node is not None
        shape_a, shape_b = inner.shape(a.value), inner.shape(b.value)
        av = a.value if "a" in entry.saves else None
        bv = b.value if "b" in entry.saves else None
        ov = out if "out" in entry.saves else None

        def backward(g):
            values = {"a": None if av is None else T(av, shape_a), "b": None if bv is None else T(bv, shape_b),
                      "out": None if ov is None else T(ov, g.shape), "g": g}
            return (_sum_to(rule_a(*[values[p] for p in params_a]), shape_a) if need_a else None,
                    _sum_to(rule_b(*[values[p] for p in params_b]), shape_b) if need_b else None)
        return Var(out, Node((a.node, b.node), backward))

    def where(self, cond, a, b):
        out = self._inner.where(cond.value, a.value, b.value)
        if (a.node is None and b.node is None) or _grad_mode.disabled:
            return Var(out)
        T = self._inner_tensor
        cv = cond.value
        ash = self.shape(a) if a.node is not None else None
        bsh = self.shape(b) if b.node is not None else None

        def backward(g):
            c = T(cv, None, dtypes.bool_)
            ga = None if ash is None else _sum_to(_where(c, g, 0.0), ash)
            gb = None if bsh is None else _sum_to(_where(c, 0.0, g), bsh)
            return (None, ga, gb)
        return Var(out, Node((None, a.node, b.node), backward))

    def cast(self, x, dtype):
        out = self._inner.cast(x.value, dtype)
        if not dtype.is_float:  # int/bool results are constants
            return Var(out)
        return self._record(out, (x,), lambda g: (g,))

    # -- reductions ------------------------------------------------------------------------

    def reduce(self, op, x, axis, keepdim):
        out = self._inner.reduce(op, x.value, axis, keepdim)
        entry = OPS[op]
        if entry.grad is None or x.node is None or _grad_mode.disabled:
            return Var(out)
        rule, (params,) = entry.grad, entry.params
        T = self._inner_tensor
        shape = self.shape(x)
        kept = shape[:axis] + (1,) + shape[axis + 1:]
        xv = x.value if "x" in entry.saves else None  # sum keeps nothing but the shape
        yv = out if "y" in entry.saves else None

        def backward(g):
            values = {"x": None if xv is None else T(xv, shape), "g": g.reshape(kept), "axis": axis,
                      "y": None if yv is None else T(yv, kept if keepdim else g.shape).reshape(kept),
                      "shape": shape}
            return (rule(*[values[p] for p in params]),)
        return Var(out, Node((x.node,), backward))

    # -- linear algebra --------------------------------------------------------------------

    def matmul(self, a, b):
        out = self._inner.matmul(a.value, b.value)
        if (a.node is None and b.node is None) or _grad_mode.disabled:
            return Var(out)
        T = self._inner_tensor
        need_a, need_b = a.node is not None, b.node is not None
        shape_a, shape_b = self.shape(a), self.shape(b)
        av = a.value if need_b else None  # d/db reads a, d/da reads b
        bv = b.value if need_a else None

        def backward(g):
            # d(a @ b) = da @ b + a @ db; batch dims that were broadcast are summed back.
            ga = _sum_to(g @ _t(T(bv, shape_b)), shape_a) if need_a else None
            gb = _sum_to(_t(T(av, shape_a)) @ g, shape_b) if need_b else None
            return (ga, gb)
        return Var(out, Node((a.node, b.node), backward))

    # -- movement: each backward is the inverse movement -----------------------------------

    def reshape(self, x, shape):
        out = self._inner.reshape(x.value, shape)
        in_shape = self.shape(x) if x.node is not None else None
        return self._record(out, (x,), lambda g: (g.reshape(in_shape),))

    def permute(self, x, dims):
        out = self._inner.permute(x.value, dims)
        if x.node is None or _grad_mode.disabled:
            return Var(out)
        inverse = [0] * len(dims)
        for i, d in enumerate(dims):
            inverse[d] = i
        inverse = tuple(inverse)
        return Var(out, Node((x.node,), lambda g: (g.permute(inverse),)))

    def expand(self, x, shape):
        out = self._inner.expand(x.value, shape)
        in_shape = self.shape(x) if x.node is not None else None
        return self._record(out, (x,), lambda g: (_sum_to(g, in_shape),))

    def slice(self, x, starts, stops, steps):
        out = self._inner.slice(x.value, starts, stops, steps)
        in_shape = self.shape(x) if x.node is not None else None

        def backward(g):
            # Strided dims: interleave step-1 zeros after each element (unsqueeze, pad, merge),
            # then pad every dim back to the input's extent.
            pads = []
            for d, (start, step, size) in enumerate(zip(starts, steps, in_shape)):
                n = g.shape[d]
                if step > 1 and n > 0:
                    s = g.shape
                    g = _pad(g.reshape(s[:d + 1] + (1,) + s[d + 1:]),
                             [(0, 0)] * (d + 1) + [(0, step - 1)] + [(0, 0)] * (len(s) - d - 1))
                    g = g.reshape(s[:d] + (n * step,) + s[d + 1:])
                    n = n * step
                after = size - start - n
                if after < 0:  # the last interleaved zeros run past the input's end
                    g = _slice_dim(g, d, 0, n + after)
                    after = 0
                pads.append((start, after))
            return (_pad(g, pads),)
        return self._record(out, (x,), backward)

    def cat(self, xs, axis):
        out = self._inner.cat([x.value for x in xs], axis)
        sizes = [self.shape(x)[axis] for x in xs]

        def backward(g):
            grads, start = [], 0
            for size in sizes:
                grads.append(_slice_dim(g, axis, start, start + size))
                start += size
            return tuple(grads)
        return self._record(out, tuple(xs), backward)

    def pad(self, x, pads, value):
        out = self._inner.pad(x.value, pads, value)
        in_shape = self.shape(x) if x.node is not None else None

        def backward(g):
            return (g[tuple(slice(before, before + n) for (before, _), n in zip(pads, in_shape))],)
        return self._record(out, (x,), backward)

    # -- indexing: gather and scatter_add are each other's backward ------------------------

    def gather(self, x, axis, index):
        out = self._inner.gather(x.value, axis, index.value)
        T = self._inner_tensor
        iv = index.value
        in_shape = self.shape(x) if x.node is not None else None

        def backward(g):
            zeros = T(self._inner.full(in_shape, 0.0, dtypes.float32), in_shape, dtypes.float32)
            return (zeros.scatter_add(axis, T(iv, None, dtypes.int32), g), None)
        return self._record(out, (x, index), backward)

    def scatter_add(self, x, axis, index, src):
        out = self._inner.scatter_add(x.value, axis, index.value, src.value)
        T = self._inner_tensor
        iv = index.value
        src_shape = self.shape(src) if src.node is not None else None

        def backward(g):
            gsrc = None
            if src_shape is not None:
                gsrc = g.gather(axis, T(iv, None, dtypes.int32))
                gsrc = _pad(gsrc, [(0, s - n) for s, n in zip(src_shape, gsrc.shape)])
            return (g, None, gsrc)
        return self._record(out, (x, index, src), backward)

    # -- images: unfold2d and fold2d are adjoint -------------------------------------------

    def unfold2d(self, x, kernel, stride, padding, dilation, pad_value):
        out = self._inner.unfold2d(x.value, kernel, stride, padding, dilation, pad_value)
        T = self._inner_tensor
        size = tuple(self.shape(x)[2:])

        def backward(g):
            return (T(self._inner.fold2d(g.handle, size, kernel, stride, padding, dilation)),)
        return self._record(out, (x,), backward)

    def fold2d(self, cols, size, kernel, stride, padding, dilation):
        out = self._inner.fold2d(cols.value, size, kernel, stride, padding, dilation)
        T = self._inner_tensor

        def backward(g):
            return (T(self._inner.unfold2d(g.handle, kernel, stride, padding, dilation, 0.0)),)
        return self._record(out, (cols,), backward)

    # -- conv2d: an optional primitive, reached only when the inner backend declares it ---------

    @property
    def conv2d_kernel(self):
        return self._inner.conv2d_kernel

    @property
    def conv2d_activations(self):
        # those whose gradient the output alone gives (backward below); functional.conv2d
        # composes the others after the kernel, and records their gradients op by op
        return tuple(a for a in self._inner.conv2d_activations if a in ("relu", "relu6"))

    def conv2d(self, x, w, bias, stride, padding, dilation, groups, activation):
        out = self._inner.conv2d(x.value, w.value, None if bias is None else bias.value, stride,
                                 padding, dilation, groups, activation)
        inputs = (x, w) if bias is None else (x, w, bias)
        T = self._inner_tensor
        xv, wv = x.value, w.value
        x_shape, w_shape = self.shape(x), self.shape(w)
        need = tuple(v.node is not None for v in inputs)

        def backward(g):
            if activation is not None:  # the activation's gradient first (0 where it clamped)
                y = T(out, g.shape)
                g = _where(y <= 0.0 if activation == "relu" else (y <= 0.0) | (y >= 6.0), 0.0, g)
            gradients = _conv2d_kernel_gradients if self._inner.conv2d_backward_kernels \
                else _conv2d_gradients
            return gradients(T(xv, x_shape), T(wv, w_shape), g, stride, padding, dilation,
                             groups, need)
        return self._record(out, inputs, backward)


# ----------------------------------------------------------------------------- helpers
# Written with Tensor operations of the inner backend; `g` is the gradient of the output.

def _sum_to(g, shape):
    """Reverse of broadcasting: sum g over the dims where `shape` has 1 and g does not."""
    if g.shape == shape:
        return g
    axes = tuple(d for d, n in enumerate(shape) if n == 1 and g.shape[d] != 1)
    if not axes:
        return g
    return g.sum(axes[0] if len(axes) == 1 else axes, keepdim=True)  # an int: the one-axis fast path


def _t(x):
    """Swap the last two dims."""
    n = len(x.shape)
    return x.permute(tuple(range(n - 2)) + (n - 1, n - 2))


def _pad(x, pads):
    """Zero padding with raw (before, after) pairs per dim, through the inner backend."""
    pads = tuple((int(a), int(b)) for a, b in pads)
    if not any(a or b for a, b in pads):
        return x
    out = x.backend.pad(x.handle, pads, 0.0)
    shape = tuple(n + a + b for n, (a, b) in zip(x.shape, pads))
    return Tensor(x.backend, out, shape, x.dtype)


def _slice_dim(x, axis, start, stop):
    index = [slice(None)] * len(x.shape)
    index[axis] = slice(start, stop)
    return x[tuple(index)]


def _conv2d_kernel_gradients(x, w, g, stride, padding, dilation, groups, need):
    """(dx, dw[, dbias]) of conv2d from the inner backend's backward kernels (it declares
    conv2d_backward_kernels): no unfolded image, no column matrix. None where `need` says no."""
    backend, f32 = x.backend, dtypes.float32
    grads = [None, None, None][:len(need)]
    if need[0]:
        grads[0] = Tensor(backend, backend.conv2d_grad_input(
            g.handle, w.handle, x.shape[2:], stride, padding, dilation, groups), x.shape, f32)
    if need[1]:
        grads[1] = Tensor(backend, backend.conv2d_grad_weight(
            x.handle, g.handle, w.shape[2:], stride, padding, dilation, groups), w.shape, f32)
    if len(need) == 3 and need[2]:
        grads[2] = Tensor(backend, backend.conv2d_grad_bias(g.handle), w.shape[:1], f32)
    return tuple(grads)


def _conv2d_gradients(x, w, g, stride, padding, dilation, groups, need):
    """(dx, dw[, dbias]) of conv2d from its output gradient g, composed like the reference
    (functional.conv2d): dw = g @ unfold2d(x)^T, dx = fold2d(w^T @ g) (the transposed
    convolution), dbias = g summed over batch and pixels. None where `need` says no."""
    backend = x.backend
    (n, c, h, wd), (o, cg, kh, kw) = x.shape, w.shape
    (pt, pb), (pl, pr) = padding
    kernel, per_group, taps = (kh, kw), o // groups, cg * kh * kw
    pixels = g.shape[2] * g.shape[3]
    symmetric = pt == pb and pl == pr  # unfold2d/fold2d pad both sides alike; else pad x first
    g = g.reshape(n, groups, per_group, pixels)
    grads = [None, None, None][:len(need)]
    if need[0]:
        cols = (_t(w.reshape(1, groups, per_group, taps)) @ g).reshape(n, c * kh * kw, pixels)
        size = (h, wd) if symmetric else (h + pt + pb, wd + pl + pr)
        at = (pt, pl) if symmetric else (0, 0)
        dx = Tensor(backend, backend.fold2d(cols.handle, size, kernel, stride, at, dilation),
                    (n, c) + size, dtypes.float32)
        grads[0] = dx if symmetric else dx[:, :, pt:pt + h, pl:pl + wd]
    if need[1]:
        xp = x if symmetric else _pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
        at = (pt, pl) if symmetric else (0, 0)
        cols = Tensor(backend, backend.unfold2d(xp.handle, kernel, stride, at, dilation, 0.0),
                      (n, c * kh * kw, pixels), dtypes.float32).reshape(n, groups, taps, pixels)
        grads[1] = (g @ _t(cols)).sum(0).reshape(o, cg, kh, kw)
    if len(need) == 3 and need[2]:
        grads[2] = g.sum((0, 3)).reshape(o)
    return tuple(grads)
