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


class ArgumentError(CindersError, ValueError):
    """An argument with a value the op does not accept (a step of 0, an unknown option...)."""


class ArgumentTypeError(CindersError, TypeError):
    """An argument of a type the op does not accept (a float where a dim or index must be an int)."""


class IndexingError(CindersError, IndexError):
    """An index outside the axis it indexes, or of a kind the op does not take (a float, a
    string); the message names the op, the index and the shape."""


class SizeLimitError(CindersError, ValueError):
    """A tensor larger than `cn.limits.max_elements()` was asked for; refused before allocating.
    Raise the limit with cn.limits.set_max_elements(n) or CINDERS_MAX_ELEMENTS."""


class InputError(CindersError, ValueError):
    """An input file (digits, data) that is too large, not valid, or not what was asked for."""


class FirmwareError(CindersError, RuntimeError):
    """MicroPython firmware that cannot be built: sources missing, a toolchain absent, make failed."""


class FirmwareSourcesMissing(FirmwareError):
    """The MicroPython/ulab source archives are not where CINDERS_MICROPYTHON_SRC /
    CINDERS_ULAB_SRC say (the message gives the reason; tests skip on it outside CI)."""


class BoardError(CindersError, RuntimeError):
    """A board that cannot be reached or used over its serial port: no device, no MicroPython
    answering, a bundle too large for its flash, an error raised on the board."""


class RemoteError(CindersError, RuntimeError):
    """A backend server (cn.Remote) refused the connection, closed it, or could not compute a
    value (the message says which and why)."""


class WireError(CindersError, ValueError):
    """A cn.Remote frame that does not follow the wire format (the server closes that connection)."""
