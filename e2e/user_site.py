"""A user's own model for the export-web tests: its source (not a cinders class), a record of it
saved on the desktop, and cn.NumPy()'s output for a few inputs (what the exported page must show)."""
import sys

import numpy as np

import cinders as cn

SOURCE = '''
from cinders import nn


class RingNet(nn.Module):
    """A user's classifier of 2-D points: Linear -> LayerNorm -> Tanh -> Linear."""

    def __init__(self, hidden=24, classes=3):
        super().__init__()
        self.fc1 = nn.Linear(2, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x):
        return self.fc2(self.norm(self.fc1(x)).tanh())
'''


def save_user_model(folder):
    """Write ring_model.py and ring.safetensors into `folder` (a pathlib.Path); returns (x, want):
    inputs and cn.NumPy()'s outputs for them."""
    (folder / "ring_model.py").write_text(SOURCE)
    sys.path.insert(0, str(folder))
    try:
        import ring_model
        cn.manual_seed(5)
        model = ring_model.RingNet(hidden=12).to(cn.NumPy())
        x = np.random.default_rng(2).normal(size=(4, 2)).astype(np.float32)
        want = model(cn.tensor(x, backend=cn.NumPy())).numpy()
        model.save(str(folder / "ring.safetensors"))
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("ring_model", None)
    return x, want
