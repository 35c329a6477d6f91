"""User kernels: an elementwise op written as one WGSL function, usable on every backend.

    swish = cn.fusion.custom_op(
        "swish_f",
        wgsl="fn swish_f(x: f32) -> f32 { return x / (1.0 + exp(-x)); }",
        reference=lambda x: x * cn.sigmoid(x),               # the same op in tensor ops
        backward=lambda x, y, g: (g * (y + cn.sigmoid(x) * (1.0 - y)),))
    y = swish(x)

Where it runs: the backend protocol's `custom(op, handles, shape)` (core/backend.py), so each
backend of the stack decides:
  cn.Autodiff(...)   computes on the inner backend and records `backward(*inputs, y, g)`, which
                     returns one gradient per input (None: no gradient), written with tensor ops
  cn.Fusion(Wgpu)    becomes a node of the lazy graph: the function is pasted into the fused
                     kernel, so it fuses with the ops around it (no launch of its own)
  cn.Wgpu()          one generated elementwise kernel around the function
  anything else      `reference(*inputs)` (NumPy, Python, MicroPython: no WGSL there)
The kernel goes through the same Device interface as every other kernel, so it runs in the
browser (Pyodide + WebGPU) unchanged. Inputs are float32 (others are cast) and broadcast like
binary ops; the result is float32.
"""

import re

from .. import dtypes
from ..errors import NotDifferentiableError
from ..tensor import Tensor, _broadcast_shapes

_SIGNATURE = re.compile(r"fn\s+([A-Za-z_][A-Za-z0-9_]*)\s*\(([^)]*)\)\s*->\s*f32")


class CustomOp:
    """An elementwise op from a WGSL function `fn <name>(a: f32, ...) -> f32` (see module doc)."""

    def __init__(self, name, wgsl, reference=None, backward=None):
        found = {m.group(1): m.group(2) for m in _SIGNATURE.finditer(wgsl)}
        if name not in found:
            raise ValueError("custom_op %r: the WGSL source must define `fn %s(...) -> f32`"
                             % (name, name))
        params = [p for p in found[name].split(",") if p.strip()]
        if not params or any(not p.strip().endswith("f32") for p in params):
            raise ValueError("custom_op %r: every parameter of %s must be f32, got (%s)"
                             % (name, name, found[name]))
        self.name = self.function = name
        self.wgsl = wgsl
        self.arity = len(params)
        self.reference = reference
        self.backward = backward
        self.key = (name, wgsl)  # part of the fused kernel's cache key

    def __repr__(self):
        return "cn.fusion.custom_op(%r)" % (self.name,)

    def __call__(self, *inputs):
        if len(inputs) != self.arity:
            raise TypeError("%s: takes %d tensors, got %d" % (self.name, self.arity, len(inputs)))
        ref = next((t for t in inputs if isinstance(t, Tensor)), None)
        if ref is None:
            raise TypeError("%s: needs at least one Tensor" % self.name)
        tensors = []
        for t in inputs:
            if not isinstance(t, Tensor):
                t = Tensor(ref.backend, ref.backend.full((), float(t), dtypes.float32), (), dtypes.float32)
            ref._same_device(self.name, t)
            tensors.append(t if t.dtype is dtypes.float32 else t.cast(dtypes.float32))
        shape = tensors[0].shape
        for t in tensors[1:]:
            shape = _broadcast_shapes(self.name, shape, t.shape)
        n = len(shape)
        handles = [t.handle if t.ndim == n else
                   t.backend.reshape(t.handle, (1,) * (n - t.ndim) + t.shape) for t in tensors]
        return Tensor(ref.backend, ref.backend.custom(self, handles, shape), shape, dtypes.float32)

    def run_reference(self, backend, handles, shape):
        """The op on a backend without WGSL: `reference(*inputs)` in tensor ops."""
        if self.reference is None:
            raise NotImplementedError(
                "%s: %r runs no WGSL and this op was registered without `reference=` (the same "
                "op written with tensor ops)" % (self.name, backend))
        args = [Tensor(backend, h, tuple(backend.shape(h)), dtypes.float32) for h in handles]
        out = self.reference(*args)
        if not isinstance(out, Tensor) or out.shape != shape:
            raise ValueError("%s: reference returned %r, expected a tensor of shape %s"
                             % (self.name, out, shape))
        return out.cast(dtypes.float32).handle

    def gradients(self, backend, values, out, shape, g):
        """One gradient per input (None: none) from `backward`, for Autodiff: values are the
        inputs' handles and out the result's, on `backend`; g the result's gradient."""
        if self.backward is None:
            raise NotDifferentiableError(
                "%s: registered without `backward=`, so it has no gradient" % self.name)
        xs = [Tensor(backend, v, tuple(backend.shape(v)), dtypes.float32) for v in values]
        y = Tensor(backend, out, shape, dtypes.float32)
        grads = self.backward(*xs, y, g)
        if not isinstance(grads, (tuple, list)) or len(grads) != len(xs):
            raise ValueError("%s: backward must return a tuple of %d gradients (None allowed)"
                             % (self.name, len(xs)))
        return tuple(None if gx is None else _sum_to(gx, x.shape) for gx, x in zip(grads, xs))


def _sum_to(g, shape):
    """Undo broadcasting: sum the gradient over the dims an input had as 1."""
    axes = tuple(d for d, n in enumerate(shape) if n == 1 and g.shape[d] != 1)
    return g.sum(axes, keepdim=True) if axes else g


def custom_op(name, wgsl, reference=None, backward=None):
    """Register an elementwise WGSL function as an op; see the module docstring."""
    return CustomOp(name, wgsl, reference, backward)
