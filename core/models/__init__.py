"""Ready-made model definitions. Each file is written in the MicroPython subset (no annotations,
no dataclasses) and imports only `cinders.nn`, so the same file runs on the desktop, in the
browser and on a board (`cinders export-micro` copies it as model.py)."""

from .vision import MobileNetV2, ResNet, mobilenet_v2, resnet18  # noqa: F401,E402  (cinders.models.resnet18())
