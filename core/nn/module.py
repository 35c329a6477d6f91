"""nn.Module: parameters are found from attributes, no registration needed.

What a module's state is, by attribute:
* a Tensor                      -> a parameter (trained; requires grad on an Autodiff backend)
* a Tensor whose name is listed in the class's `buffers` tuple
                                -> a buffer (state that is saved but not trained, e.g.
                                   BatchNorm's running statistics)
* a Module                      -> a child; its state is prefixed with "name."
* a list/tuple of Modules/Tensors, or a dict of them
                                -> children named "name.0", "name.1", ... / "name.key"
                                   (PyTorch's ModuleList / ModuleDict naming)
* a name starting with "_"      -> private, ignored (constants such as masks live there)
The names are PyTorch's for the same structure, so torch state dicts load 1:1.
"""

import inspect
import json
import re
import warnings

from .. import capture, record
from ..dtypes import float32
from ..errors import RecordError
from ..tensor import Tensor


def _move(t, backend, trainable):
    """`t` on `backend`; trainable tensors on an Autodiff backend become leaves requiring grad."""
    inner = getattr(backend, "inner", None)
    if t.backend is backend:
        moved = t
    elif t.backend == backend:  # same device, another instance: adopt it (cheaper checks later)
        moved = Tensor(backend, t.handle, t.shape, t.dtype)
    elif inner is not None and backend.differentiable and (t.backend is inner or t.backend == inner):
        moved = backend.from_inner(t)
    elif t.backend.differentiable:
        moved = _move(t.backend.to_inner(t), backend, False)
    else:
        moved = t.to(backend)
    return parameter(moved) if trainable else _detach(moved)


def parameter(t):
    """A fresh leaf that requires grad when t's backend records gradients, else t itself."""
    if t.backend.differentiable:
        return t.require_grad()
    return t


def _detach(t):
    return t.detach() if t.backend.differentiable else t


class Module:
    """Base class of every layer and model: subclasses set attributes in __init__ and define
    forward(); calling the module calls forward."""

    buffers = ()     # attribute names of Tensors that are saved state but not parameters
    training = True  # class default, so subclasses that skip super().__init__() still work
    _init_args = None   # {name: value} the constructor was called with (see __new__)
    _input_shape = None  # shape of one sample of the first input (the batch dimension dropped)

    def __new__(cls, *args, **kwargs):
        # Capture the constructor's arguments here, before any __init__ runs, so that every
        # subclass gets a config() for free: a record rebuilds `cls(**config)` without the
        # user writing config() by hand.
        self = super().__new__(cls)
        self._init_args = _bind_init_args(cls, args, kwargs)
        return self

    def __init__(self):
        self.training = True

    def __call__(self, *args, **kwargs):
        if self._input_shape is None and args and isinstance(args[0], Tensor) and args[0].shape:
            self._input_shape = tuple(args[0].shape[1:])  # what exporters feed the model
        return self.forward(*args, **kwargs)

    def forward(self, *args, **kwargs):
        raise NotImplementedError("%s.forward() is not defined" % type(self).__name__)

    def config(self):
        """The constructor arguments that rebuild this module (records store them): by default
        those it was built with (defaults included) that are plain values: None, bool, int,
        float, str, and lists/tuples/dicts of them. Override to record something else."""
        return {k: v for k, v in (self._init_args or {}).items()
                if k not in _UNRECORDED and _is_plain(v)}

    def unrecorded_args(self):
        """Names of constructor arguments that config() leaves out because they are not plain
        values (a function, a module, ...): a record cannot rebuild them."""
        if type(self).config is not Module.config:
            return []  # the class says itself what rebuilds it
        return [k for k, v in (self._init_args or {}).items()
                if k not in _UNRECORDED and not _is_plain(v)]

    # -- walking the state ---------------------------------------------------------------------

    def _items(self):
        """(name, value) of the attributes that may hold state, in assignment order."""
        return [(k, v) for k, v in vars(self).items() if not k.startswith("_")]

    def _walk(self, prefix=""):
        """Yields (path, owner, key, value, is_buffer) for every tensor; `owner[key]` or
        `setattr(owner, key, ...)` replaces it (owner is a Module, list or dict)."""
        own_buffers = self.buffers
        for name, value in self._items():
            path = prefix + name
            if isinstance(value, Tensor):
                yield path, self, name, value, name in own_buffers
            elif isinstance(value, Module):
                yield from value._walk(path + ".")
            elif isinstance(value, (list, tuple, dict)):
                yield from _walk_container(value, path + ".")

    def named_parameters(self):
        """[(path, tensor)] of the trained tensors, e.g. ("layers.1.weight", ...). A tensor held
        in two places (tied weights) is listed once, under its first path, like torch."""
        seen, out = set(), []
        for p, _, _, v, is_buffer in self._walk():
            if not is_buffer and id(v) not in seen:
                seen.add(id(v))
                out.append((p, v))
        return out

    def parameters(self):
        return [v for _, v in self.named_parameters()]

    def named_buffers(self):
        return [(p, v) for p, _, _, v, is_buffer in self._walk() if is_buffer]

    def num_params(self):
        n = 0
        for t in self.parameters():
            n += t.numel()
        return n

    def modules(self):
        """This module and every module below it, depth first."""
        found = [self]
        for _, value in self._items():
            for child in _modules_in(value):
                found.extend(child.modules())
        return found

    def state_dict(self):
        """{path: tensor} of parameters and buffers, in PyTorch's key names and order."""
        return {p: v for p, _, _, v, _ in self._walk()}

    def replace_tensors(self, new):
        """Put `new[path]` in place of each named tensor (no checks: the callers check). Every
        place that held the same tensor gets the replacement, so tied weights stay tied."""
        found = list(self._walk())
        by_id = {id(value): new[path] for path, _, _, value, _ in found if path in new}
        for _, owner, key, value, _ in found:
            replacement = by_id.get(id(value))
            if replacement is not None:
                _assign(owner, key, replacement)
        return self

    def update_parameters(self, fn):
        """Put fn(path, tensor) in place of each parameter (listed once, like named_parameters)
        wherever it is held; None keeps it. One walk over the module tree: the optimizers call
        this every step."""
        found = list(self._walk())
        by_id = {}
        for path, _, _, value, is_buffer in found:
            if not is_buffer and id(value) not in by_id:
                by_id[id(value)] = fn(path, value)
        for _, owner, key, value, is_buffer in found:
            replacement = None if is_buffer else by_id.get(id(value))
            if replacement is not None:
                _assign(owner, key, replacement)
        return self

    def load_state_dict(self, state, strict=True, remap=()):
        """Copy `state` ({path: Tensor or array-like}, e.g. cinders.record.load_pytorch's) into
        this module, all or nothing: every key and shape is checked before anything changes.

        remap: [(regex, replacement), ...] applied in order to every key of `state` (re.sub),
        e.g. [(r"^module\\.", ""), (r"^fc\\.", "head.")] for a checkpoint of another naming.
        strict=True raises cn.RecordError listing missing keys, unexpected keys and shape
        mismatches; strict=False loads the keys that match. Shape mismatches are always an error.
        Returns LoadResult(missing_keys, unexpected_keys), like torch."""
        if remap:
            state = remap_keys(state, remap)
        current = {p: (v, is_buffer) for p, _, _, v, is_buffer in self._walk()}
        missing = [k for k in current if k not in state]
        unexpected = [k for k in state if k not in current]
        converted, mismatched = {}, []
        for key, value in state.items():
            if key not in current:
                continue
            old, is_buffer = current[key]
            new = _as_tensor(value, old)
            if tuple(new.shape) != tuple(old.shape):
                mismatched.append("%s: expected shape %s, got %s" % (key, tuple(old.shape), tuple(new.shape)))
                continue
            # A storage dtype (int8 weights of a quantized model) stays at its size where the
            # backend holds it: every op widens it to the slot's compute dtype anyway.
            if new.dtype is not old.dtype and not (
                    new.dtype.compute is old.dtype and new.dtype in old.backend.storage_dtypes):
                new = new.cast(old.dtype)
            converted[key] = _move(new, old.backend, not is_buffer)
        problems = []
        if missing and strict:
            problems.append("missing keys: " + ", ".join(missing))
        if unexpected and strict:
            problems.append("unexpected keys: " + ", ".join(unexpected))
        if mismatched:
            problems.append("shape mismatch: " + "; ".join(mismatched))
        if problems:
            raise RecordError("load_state_dict(%s): %s (nothing was loaded)"
                              % (type(self).__name__, " | ".join(problems)))
        self.replace_tensors(converted)
        return LoadResult(missing, unexpected)

    # -- records (safetensors files; see cinders.record) ---------------------------------------

    def save(self, path, dtype=float32, metadata=None):
        """Write parameters and buffers to a safetensors record with the class and config that
        rebuild the model; dtype: cn.float32 or cn.float16 storage. Warns (UserWarning) when a
        constructor argument cannot be recorded: cn.load_model would then build the model with
        that argument's default."""
        lost = self.unrecorded_args()
        if lost:
            warnings.warn("%s.save(%r): constructor argument%s %s cannot be recorded (not a plain "
                          "value); cn.load_model will use %s default%s. Override config() to "
                          "record them another way." % (
                              type(self).__name__, str(path), "s" if len(lost) > 1 else "",
                              ", ".join(lost), "their" if len(lost) > 1 else "its",
                              "s" if len(lost) > 1 else ""), UserWarning, stacklevel=2)
        extra = {}
        if self._input_shape is not None:
            extra["input_shape"] = json.dumps(list(self._input_shape))
        extra.update(metadata or {})
        return record.save(self, path, dtype, extra or None)

    load = record.LoadMethod()  # model.load(path) in place; Model.load(path, backend=None) builds one

    # -- device and mode -------------------------------------------------------------------------

    def to(self, backend):
        """Move every parameter and buffer to `backend` (in place; returns self). On an Autodiff
        backend the parameters become leaves that require grad."""
        moved = {p: _move(v, backend, not is_buffer) for p, _, _, v, is_buffer in self._walk()}
        return self.replace_tensors(moved)

    def train(self, mode=True):
        for m in self.modules():
            m.training = mode
        return self

    def eval(self):
        return self.train(False)

    def __repr__(self):
        children = [(k, v) for k, v in self._items() if isinstance(v, Module)]
        if not children:
            return "%s(%s)" % (type(self).__name__, self.extra_repr())
        lines = ["  (%s): %s" % (k, repr(v).replace("\n", "\n  ")) for k, v in children]
        return "%s(\n%s\n)" % (type(self).__name__, "\n".join(lines))

    def extra_repr(self):
        return ""


class LoadResult(tuple):
    """What load_state_dict did not match, like torch's (missing_keys, unexpected_keys)."""

    def __new__(cls, missing_keys, unexpected_keys):
        return super().__new__(cls, (list(missing_keys), list(unexpected_keys)))

    missing_keys = property(lambda self: self[0])
    unexpected_keys = property(lambda self: self[1])

    def __repr__(self):
        return "LoadResult(missing_keys=%r, unexpected_keys=%r)" % self


def remap_keys(state, rules):
    """{re.sub(rules...)(key): value}; two keys that land on one name are an error."""
    compiled = []
    for rule in rules:
        try:
            pattern, replacement = rule
            compiled.append((re.compile(pattern), replacement))
        except (TypeError, ValueError, re.error) as e:
            raise RecordError("load_state_dict: remap rule %r is not (regex, replacement): %s" % (rule, e)) from None
    out, source = {}, {}
    for key, value in state.items():
        new = key
        for pattern, replacement in compiled:
            try:
                new = pattern.sub(replacement, new)
            except (re.error, IndexError) as e:
                raise RecordError("load_state_dict: remap replacement %r fails on %r: %s"
                                  % (replacement, key, e)) from None
        if new in out:
            raise RecordError("load_state_dict: remap sends both %r and %r to %r" % (source[new], key, new))
        out[new], source[new] = value, key
    return out


# Constructor arguments a record never stores: where tensors live is chosen at load time.
_UNRECORDED = ("backend",)
_SIGNATURES = {}


def _bind_init_args(cls, args, kwargs):
    """{name: value} of cls(*args, **kwargs) by cls.__init__'s signature, defaults filled in;
    None when they cannot be named (a *args constructor, or a call that does not fit, which
    __init__ itself then reports)."""
    sig = _SIGNATURES.get(cls)
    if sig is None:
        try:
            sig = inspect.signature(cls.__init__)
        except (TypeError, ValueError):
            sig = False
        _SIGNATURES[cls] = sig
    if sig is False:
        return None
    try:
        bound = sig.bind(None, *args, **kwargs)  # None stands for self
    except TypeError:
        return None
    bound.apply_defaults()
    out = {}
    params = list(sig.parameters.values())[1:]
    for p in params:
        value = bound.arguments.get(p.name)
        if p.kind is p.VAR_POSITIONAL:
            if value:
                return None  # Sequential(*layers): nothing to name
        elif p.kind is p.VAR_KEYWORD:
            out.update(value or {})
        elif p.kind is not p.POSITIONAL_ONLY:
            out[p.name] = value
    return out


def _is_plain(v):
    if v is None or isinstance(v, (bool, int, str)):
        return True
    if isinstance(v, float):
        return v == v and v not in (float("inf"), float("-inf"))  # JSON has no NaN/inf
    if isinstance(v, (list, tuple)):
        return all(_is_plain(x) for x in v)
    if isinstance(v, dict):
        return all(isinstance(k, str) and _is_plain(x) for k, x in v.items())
    return False


def _walk_container(container, prefix):
    items = container.items() if isinstance(container, dict) else enumerate(container)
    for key, value in items:
        path = prefix + str(key)
        if isinstance(value, Tensor):
            yield path, container, key, value, False
        elif isinstance(value, Module):
            yield from value._walk(path + ".")


def _modules_in(value):
    if isinstance(value, Module):
        return [value]
    if isinstance(value, (list, tuple)):
        return [v for v in value if isinstance(v, Module)]
    if isinstance(value, dict):
        return [v for v in value.values() if isinstance(v, Module)]
    return []


def _assign(owner, key, value):
    if isinstance(owner, tuple):
        raise TypeError("cannot replace a tensor held in a tuple; hold parameters in a list")
    old = owner.__dict__.get(key) if isinstance(owner, Module) else owner[key]
    if isinstance(old, Tensor):
        capture.retire(old)   # captured programs reading it record again instead of replaying it
    if isinstance(owner, Module):
        object.__setattr__(owner, key, value)
    else:
        owner[key] = value


def _as_tensor(value, like):
    """A Tensor from a Tensor, NumPy array, PyTorch tensor or nested list (on like's device)."""
    from ..creation import tensor
    if isinstance(value, Tensor):
        return value
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # a torch.Tensor, without importing torch
        value = value.detach().cpu().numpy()
    backend = like.backend
    return tensor(value, backend=backend.inner if backend.differentiable else backend, dtype=like.dtype)
