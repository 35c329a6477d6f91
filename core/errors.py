"""The errors users see. Each message names the op and the offending shapes/dtypes/devices."""


class CindersError(Exception):
    """Base class of every error Cinders raises on purpose."""


class ShapeError(CindersError, ValueError):
    """Shapes that do not fit the op (the message names the op and both shapes)."""


class DTypeError(CindersError, TypeError):
    """A dtype the op does not support (the message names the op and the dtype)."""


class DeviceError(CindersError, ValueError):
    """Tensors of two different backends/devices met in one op (the message names both)."""


class NotDifferentiableError(CindersError, RuntimeError):
    """backward() on a tensor whose backend does not record gradients."""


class RecordError(CindersError, ValueError):
    """A model record (safetensors file) that is truncated, corrupt or does not match the model."""
