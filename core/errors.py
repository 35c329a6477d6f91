"""The errors users see. Each message names the op and the offending shapes/dtypes/devices."""

MAX_MESSAGE_CHARS = 2000  # a message quoting a file's content (a name, a header) stays readable


def printable(text, keep_newlines=False):
    """`text` safe to print on a terminal: control characters (C0, DEL, C1: escape sequences that
    clear or fake the screen, carriage returns, newlines unless `keep_newlines`) become \\xNN,
    and more than MAX_MESSAGE_CHARS are cut with "...". The one rule behind every message."""
    text = str(text)
    if len(text) > MAX_MESSAGE_CHARS:
        text = text[:MAX_MESSAGE_CHARS] + "..."
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or (keep_newlines and c == "\n") else _escape(c) for c in text)


def _escape(c):
    code = ord(c)
    return "\\x%02x" % code if code < 0x100 else "\\u%04x" % code if code < 0x10000 else "\\U%08x" % code


class CindersError(Exception):
    """Base class of every error Cinders raises on purpose. Its message is printable and one
    line (see `printable`), whatever file content it quotes; errors that carry a tool's log
    (a failed build) set `multiline = True` to keep that log's lines."""

    multiline = False

    def __str__(self):
        return printable(super().__str__(), keep_newlines=self.multiline)


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

    multiline = True  # the end of make's log


class FirmwareSourcesMissing(FirmwareError):
    """The MicroPython/ulab source archives are not where CINDERS_MICROPYTHON_SRC /
    CINDERS_ULAB_SRC say (the message gives the reason; tests skip on it outside CI)."""


class BoardError(CindersError, RuntimeError):
    """A board that cannot be reached or used over its serial port: no device, no MicroPython
    answering, a bundle too large for its flash, an error raised on the board."""

    multiline = True  # the board's traceback

class RemoteError(CindersError, RuntimeError):
    """A backend server (cn.Remote) refused the connection, closed it, or could not compute a
    value (the message says which and why)."""


class WireError(CindersError, ValueError):
    """A cn.Remote frame that does not follow the wire format (the server closes that connection)."""


class SetupError(CindersError, RuntimeError):
    """Something a command needs is not installed: the browser packages (`cinders setup-web`
    fetches them) or an optional dependency (the message names its extra, core/extras.py)."""


class MissingExtraError(SetupError, ImportError):
    """An optional dependency is not installed; the message names the extra that brings it
    (`pip install 'cinders[numpy]'`). An ImportError, so `except ImportError` fallbacks still work."""
