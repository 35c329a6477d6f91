"""Optimizers, functional like Burn: `model = opt.step(model, grads)`.

step() reads each parameter's gradient from the Gradients that backward() returned, computes
the update on the INNER backend (no tape is recorded for it) and puts a fresh leaf that requires
grad in the parameter's place. The model object is updated in place and returned. Optimizer state
(momentum, Adam moments) is keyed by parameter path ("layers.1.weight"), so it survives the
parameters being replaced and can be saved with state_dict(). The math is PyTorch's.
"""

import math

from .. import capture
from ..errors import NotDifferentiableError
from ..tensor import Tensor


class Optimizer:
    """Base: subclasses define `_update(state, param, grad, lr) -> new param` on inner tensors."""

    def __init__(self, lr):
        if not callable(lr) and (not isinstance(lr, (int, float)) or lr < 0):
            raise ValueError("%s: lr must be a non-negative number or a schedule, got %r" % (type(self).__name__, lr))
        self.schedule = lr
        self.steps = 0   # step() calls so far
        self.state = {}  # parameter path -> {name: inner Tensor or number}

    @property
    def lr(self):
        """The learning rate the next step() uses."""
        return self.schedule(self.steps) if callable(self.schedule) else float(self.schedule)

    def step(self, model, grads):
        """Apply one update to every parameter of `model` that has a gradient in `grads`."""
        lr = self.lr
        capturing = capture.capturing()
        if capturing:  # replays run no Python: the step count advances through a callback
            capture.on_replay(self._count_step)

        def update(path, param):
            backend = param.backend
            if not backend.differentiable:
                raise NotDifferentiableError(
                    "%s.step: parameter %r is on %r, which records no gradients; move the model to "
                    "cn.Autodiff(%r) with model.to(...)" % (type(self).__name__, path, backend, backend))
            grad = param.grad(grads)
            if grad is None:
                return None
            state = self.state.setdefault(path, {})
            inner = backend.to_inner(param)
            if not capturing:
                return backend.from_inner(self._update(state, inner, grad, lr), require_grad=True)
            # Under cn.capture a replay reuses the recorded buffers: update them in place, with
            # the learning rate as a value uploaded per call (a schedule keeps working).
            before = dict(state)
            new = self._update(state, inner, grad, capture.host_value(lambda: self.lr,
                                                                         inner.backend))
            for name, value in state.items():
                old = before.get(name)
                if isinstance(old, Tensor) and value is not old:
                    capture.assign(old, value)
                    state[name] = old
                elif old is None and isinstance(value, Tensor):
                    capture.realize(value)
            capture.assign(inner, new)
            return None
        # All or nothing: a parameter on the wrong backend raises before anything is replaced.
        model.update_parameters(update)
        self._count_step()
        return model

    def _count_step(self):
        self.steps += 1

    # state[path]["_private"] is True while the state tensors of `path` were made by this
    # optimizer and never handed out: only then may a fused kernel update them in place.

    def state_dict(self):
        for s in self.state.values():
            s.pop("_private", None)  # handed out from now on: never written again
        return {"steps": self.steps, "state": {p: dict(s) for p, s in self.state.items()}}

    def load_state_dict(self, saved):
        self.steps = int(saved["steps"])
        self.state = {p: {k: v for k, v in s.items() if k != "_private"} for p, s in saved["state"].items()}


class SGD(Optimizer):
    """p -= lr * g, with momentum (optionally Nesterov), dampening and L2 weight decay."""

    def __init__(self, lr=0.01, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False):
        super().__init__(lr)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("SGD: nesterov needs momentum > 0 and dampening == 0")
        self.momentum, self.dampening = momentum, dampening
        self.weight_decay, self.nesterov = weight_decay, nesterov

    def _update(self, state, p, g, lr):
        if self.weight_decay:
            g = g + p * self.weight_decay
        if self.momentum:
            buf = state.get("momentum")
            buf = g if buf is None else buf * self.momentum + g * (1.0 - self.dampening)
            state["momentum"] = buf
            g = g + buf * self.momentum if self.nesterov else buf
        return p - g * lr


class Adam(Optimizer):
    """Adam (Kingma & Ba) with bias correction; weight_decay is L2 added to the gradient."""

    decoupled = False

    def __init__(self, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        super().__init__(lr)
        self.betas, self.eps, self.weight_decay = tuple(betas), eps, weight_decay

    def _update(self, state, p, g, lr):
        b1, b2 = self.betas
        if self.weight_decay:
            if self.decoupled:
                p = p * (1.0 - lr * self.weight_decay)
            else:
                g = g + p * self.weight_decay
        t = state.get("step", 0) + 1
        m, v = state.get("exp_avg"), state.get("exp_avg_sq")
        # torch: p -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps), with bc_i = 1 - beta_i ** t;
        # multiplied through by sqrt(bc2) it needs one pass over the parameter less.
        def scalars(lr, t):
            sqrt_bc2 = math.sqrt(1.0 - b2 ** t)
            return lr * sqrt_bc2 / (1.0 - b1 ** t), self.eps * sqrt_bc2
        if isinstance(lr, Tensor):
            # Under cn.capture (lr is then a per-call value): t changes every call, so the
            # bias-corrected factors are per-call values too, and replays advance t.
            state.setdefault("step", 0)
            step_size = capture.host_value(lambda: scalars(self.lr, state["step"] + 1)[0], p.backend)
            eps = capture.host_value(lambda: scalars(self.lr, state["step"] + 1)[1], p.backend)
            capture.on_replay(lambda: state.__setitem__("step", state["step"] + 1))
        else:
            step_size, eps = scalars(lr, t)
        kernel = getattr(p.backend, "fused_adam", None)
        if kernel is not None and state.get("_private") and not isinstance(lr, Tensor):
            # One call instead of ~12 tensor ops, updating the moments in place: on NumPy the
            # temporaries' allocations cost more than the arithmetic.
            state["step"] = t
            return Tensor(p.backend, kernel(p.handle, g.handle, m.handle, v.handle, b1, b2, step_size, eps),
                          p.shape, p.dtype)
        m = g * (1.0 - b1) if m is None else m + (g - m) * (1.0 - b1)  # lerp, like torch
        v = g * g * (1.0 - b2) if v is None else v * b2 + g * g * (1.0 - b2)
        state["step"], state["exp_avg"], state["exp_avg_sq"], state["_private"] = t, m, v, True
        return p - m / (v.sqrt() + eps) * step_size  # torch's addcdiv order: m / denom first


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter): p *= 1 - lr * weight_decay."""

    decoupled = True

    def __init__(self, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        super().__init__(lr, betas, eps, weight_decay)


def grad_norm(grads):
    """The global L2 norm of all gradients (a Python float)."""
    total = 0.0
    for g in grads.values():
        total += (g * g).sum().item()
    return math.sqrt(total)


def clip_grad_norm(grads, max_norm):
    """Gradients scaled so that their global L2 norm is at most max_norm (torch's
    clip_grad_norm_, returned instead of applied in place). Returns (clipped grads, norm)."""
    norm = grad_norm(grads)
    factor = max_norm / (norm + 1e-6)
    if factor >= 1.0:
        return grads, norm
    return grads.map(lambda g: g * factor), norm
