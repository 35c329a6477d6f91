"""Learning-rate schedules: callables step -> lr, where step counts optimizer steps (pass one
as `lr=` to an optimizer). They compose: LinearWarmup wraps any schedule or number.

    lr = cn.optim.LinearWarmup(cn.optim.CosineAnnealing(1e-3, total_steps=5000), warmup_steps=200)
"""

import math


def _at(lr, step):
    return lr(step) if callable(lr) else float(lr)


class StepLR:
    """lr * gamma ** (step // step_size) (torch.optim.lr_scheduler.StepLR)."""

    def __init__(self, lr, step_size, gamma=0.1):
        if step_size < 1:
            raise ValueError("StepLR: step_size must be >= 1, got %r" % (step_size,))
        self.lr, self.step_size, self.gamma = lr, step_size, gamma

    def __call__(self, step):
        return _at(self.lr, step) * self.gamma ** (step // self.step_size)


class CosineAnnealing:
    """From lr down to min_lr over total_steps along half a cosine, then min_lr
    (torch's CosineAnnealingLR for step <= T_max)."""

    def __init__(self, lr, total_steps, min_lr=0.0):
        if total_steps < 1:
            raise ValueError("CosineAnnealing: total_steps must be >= 1, got %r" % (total_steps,))
        self.lr, self.total_steps, self.min_lr = lr, total_steps, min_lr

    def __call__(self, step):
        t = min(step, self.total_steps) / self.total_steps
        base = _at(self.lr, step)
        return self.min_lr + (base - self.min_lr) * (1.0 + math.cos(math.pi * t)) / 2.0


class LinearWarmup:
    """Scales `lr` (a number or schedule) linearly from start_factor to 1 over warmup_steps
    (torch's LinearLR), then leaves it unchanged."""

    def __init__(self, lr, warmup_steps, start_factor=0.0):
        if warmup_steps < 0:
            raise ValueError("LinearWarmup: warmup_steps must be >= 0, got %r" % (warmup_steps,))
        self.lr, self.warmup_steps, self.start_factor = lr, warmup_steps, start_factor

    def __call__(self, step):
        if step >= self.warmup_steps:
            factor = 1.0
        else:
            factor = self.start_factor + (1.0 - self.start_factor) * step / self.warmup_steps
        return _at(self.lr, step) * factor
