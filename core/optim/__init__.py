"""cn.optim: optimizers (`model = opt.step(model, grads)`), learning-rate schedules, clipping."""

from .optimizers import Optimizer, SGD, Adam, AdamW, clip_grad_norm, grad_norm
from .schedules import StepLR, CosineAnnealing, LinearWarmup

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "clip_grad_norm", "grad_norm",
           "StepLR", "CosineAnnealing", "LinearWarmup"]
