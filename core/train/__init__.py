"""cn.train: the Learner (training loop with dashboard, checkpoints, resume, early stopping,
logs and plots), its metrics, and checkpoint files."""

from .metrics import Metric, Accuracy, Loss
from .learner import Learner, EarlyStopping
from .checkpoint import save_checkpoint, load_checkpoint, extract_model

__all__ = ["Metric", "Accuracy", "Loss", "Learner", "EarlyStopping", "save_checkpoint", "load_checkpoint", "extract_model"]
