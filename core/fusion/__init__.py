"""cn.Fusion: lazy elementwise graphs compiled into generated kernels (see backend.py), and
cn.fusion.custom, user kernels that fuse like built-in ops (see custom.py, docs/fusion.md)."""

from .backend import Fusion, compiler_for, MAX_GROUP_OPS
from .custom import CustomOp, custom_op

__all__ = ["Fusion", "compiler_for", "MAX_GROUP_OPS", "CustomOp", "custom_op"]
