"""cn.Router(*backends): one backend made of several; each tensor lives on one member.

    router = cn.Router(cn.Wgpu(), cn.NumPy())
    x = cn.tensor(data, backend=router)              # device 0 (the first member)
    y = cn.tensor(data, backend=router, device=1)    # device 1 (cn.NumPy())
    z = x.to(router.device(1)) + y                   # moved explicitly; x + y raises DeviceError

`router.device(i)` is the Router placed on member i (cached: one object per device); the
Router itself is `router.device(0)`. A tensor's backend says where it lives, so an op runs
where its inputs live, with no lookup per op: device i's primitives are member i's own methods.
Two devices are two backends to the tensor layer (their `device_key`s differ), so mixing them
raises cn.DeviceError naming both, before anything runs.

Fallback. An op that member i lists in its `unsupported_ops` (core/backend.py) runs on the next
member that supports it (i+1, i+2, ... wrapping around): its inputs move there and the result
moves back, so the tensor stays where the user put it. A warning says so once per (device, op),
and `cn.profile` gets one "move" event per handle moved (fields: name, source, target, bytes).

Decorators compose on top: `cn.Autodiff(router.device(1))` differentiates on device 1 (its
constants, gradients included, are made on device 1). cn.capture walks `inner` down to the
member, so a forward on a capturable member (cn.Wgpu) records and replays there; a fallback
move inside it reads data on the host and is refused with cn.CaptureError.
"""

import warnings

from ..backend import (Backend, BINARY_OPS, PRIMITIVES, REDUCE_OPS, UNARY_OPS, join_call, numel,
                       split_call)
from ..errors import ArgumentError, ArgumentTypeError
from ..profile import ACTIVE as _PROFILING, record as _profile_event
from ..tensor import Tensor

# The primitives whose first argument names an op of the op table (its `unsupported_ops` key).
_OP_PRIMITIVES = {"unary": UNARY_OPS, "binary": BINARY_OPS, "reduce": REDUCE_OPS}
# A member's optional extras that take its handles as they are (core/backend.py).
_EXTRAS = ("to_numpy", "to_flat_async", "memory_stats", "empty_cache", "fused_adam", "element_bytes")


class Router(Backend):
    """Several backends behind one: tensors live on one member (`device(i)`); see the module
    docstring."""

    name = "router"

    def __init__(self, *backends):
        if not backends:
            raise ArgumentError("cn.Router(*backends) needs at least one backend, got none")
        for b in backends:
            if not isinstance(b, Backend):
                raise ArgumentTypeError("cn.Router(*backends) takes backends such as cn.NumPy(), got %r" % (b,))
        self._place(backends, 0, [self], set())

    def _place(self, members, index, devices, warned):
        self.members = tuple(members)
        self.index = index
        self._devices = devices   # one Router per member, shared by all of them (device(i))
        self._warned = warned     # (device, op) pairs whose fallback was announced
        self._member = member = self.members[index]
        self._key = ("Router", index) + tuple(tuple(m.device_key()) for m in self.members)
        for name in PRIMITIVES + ("shape", "dtype", "custom", "synchronize", "assign"):
            setattr(self, name, getattr(member, name))
        # Only what this member cannot run is wrapped: every other primitive is its own method.
        gaps = member.unsupported_ops
        for name, names in _OP_PRIMITIVES.items():
            if any(op in gaps for op in names):
                setattr(self, name, self._op_with_fallback(name, gaps))
        for name in PRIMITIVES:
            if name in gaps and name != "to_flat":
                setattr(self, name, self._with_fallback(name, name))

    def device(self, index):
        """This Router placed on member `index` (tensors created or moved there live there)."""
        if isinstance(index, bool) or not isinstance(index, int):
            raise ArgumentTypeError("Router.device(index): index must be an int, got %r" % (index,))
        if not 0 <= index < len(self.members):
            raise ArgumentError("Router.device(%d): this router has devices 0..%d (%s)"
                                % (index, len(self.members) - 1, ", ".join(map(repr, self.members))))
        devices = self._devices
        while len(devices) <= index:
            view = object.__new__(Router)
            view._place(self.members, len(devices), devices, self._warned)
            devices.append(view)
        return devices[index]

    @property
    def inner(self):
        # The member computes this device's ops on the same handles: a decorator in cn.capture's
        # and cn.profile's sense (they walk `inner`).
        return self._member

    def inner_tensor(self, tensor):
        return Tensor(self._member, tensor.handle, tensor.shape, tensor.dtype)

    def outer_tensor(self, tensor):
        return Tensor(self, tensor.handle, tensor.shape, tensor.dtype)

    @property
    def shares_constants(self):
        return self._member.shares_constants

    @property
    def unsupported_ops(self):
        """What no member can run (the rest falls back to a member that can)."""
        gaps = [m.unsupported_ops for m in self.members]
        return {op: why for op, why in gaps[0].items() if all(op in g for g in gaps[1:])}

    def device_key(self):
        return self._key

    def __repr__(self):
        head = "cn.Router(%s)" % ", ".join(map(repr, self.members))
        return head if self.index == 0 else "%s.device(%d)" % (head, self.index)

    def __getattr__(self, name):
        if name in _EXTRAS:  # the member's optional extras, where it has them
            return getattr(self._member, name)
        raise AttributeError(name)

    # -- fallback -----------------------------------------------------------------------------

    def _op_with_fallback(self, primitive, gaps):
        own = getattr(self._member, primitive)
        fallback = self._with_fallback

        def run(op, *args):
            if op in gaps:
                return fallback(primitive, op)(op, *args)
            return own(op, *args)
        return run

    def _with_fallback(self, primitive, op):
        """primitive(*args) run on the next member that supports `op` (named by the warning), its
        handles moved there and the result moved back."""
        source = self._member

        def run(*call):
            target = self._helper_for(op)
            handles, args = split_call(primitive, call)
            moved = [self._move(h, source, target) for h in handles]
            out = getattr(target, primitive)(*join_call(primitive, moved, args))
            return self._move(out, target, source)
        return run

    def _helper_for(self, op):
        n = len(self.members)
        for step in range(1, n):
            j = (self.index + step) % n
            if op not in self.members[j].unsupported_ops:
                key = (self.index, op)
                if key not in self._warned:
                    self._warned.add(key)
                    warnings.warn("cn.Router: %s is not supported on device %d %r (%s); it runs on "
                                  "device %d %r, its inputs moved there and its result moved back"
                                  % (op, self.index, self._member, self._member.unsupported_ops[op],
                                     j, self.members[j]), RuntimeWarning, stacklevel=4)
                return self.members[j]
        raise ArgumentError("cn.Router: no member of %r supports %s" % (self, op))

    def _move(self, h, source, target):
        shape, dtype = source.shape(h), source.dtype(h)
        if _PROFILING:
            _profile_event(self, {"kind": "move", "name": "move", "source": repr(source),
                                  "target": repr(target), "bytes": dtype.itemsize * numel(shape)})
        return target.from_flat(source.to_flat(h), shape, dtype)
