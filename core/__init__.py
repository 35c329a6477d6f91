"""Cinders: one tensor API over swappable backends, from desktop to browser to microcontroller.

    import cinders as cn
    x = cn.tensor([[1.0, 2.0]], backend=cn.NumPy())
"""

__version__ = "0.1.0"

from .dtypes import float32, float16, int32, bool_ as bool  # noqa: A001  (cn.bool, like torch.bool)
from .errors import CindersError, ShapeError, DTypeError, DeviceError, NotDifferentiableError, RecordError
from .backend import Backend
