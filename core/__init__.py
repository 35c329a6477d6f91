"""Cinders: one tensor API over swappable backends, from desktop to browser to microcontroller.

    import cinders as cn
    x = cn.tensor([[1.0, 2.0]], backend=cn.NumPy())
"""

__version__ = "0.1.0"

from .dtypes import float32, float16, int32, bool_ as bool  # noqa: A001  (cn.bool, like torch.bool)
from .dtypes import int8, uint8  # storage dtypes (core/dtypes.py)
from .errors import (CindersError, ShapeError, DTypeError, DeviceError, NotDifferentiableError, RecordError,
                     ArgumentError, ArgumentTypeError, IndexingError, SizeLimitError, InputError, RemoteError)
from . import limits
from .backend import Backend
from .tensor import (
    Tensor, default_backend, set_default_backend, matmul, where, maximum, minimum, cat, pad, unfold2d,
)
from .creation import tensor, full, zeros, ones, zeros_like, ones_like, arange, eye, random, manual_seed
from .functional import (
    sigmoid, relu, gelu, softmax, log_softmax, mean, clamp, stack, one_hot,
    conv2d, max_pool2d, avg_pool2d,
)
from . import functional
from .autodiff import Autodiff, Gradients, no_grad, is_grad_enabled
from .fusion import Fusion
from . import fusion
from . import nn, optim
from . import data, record, train
from .record import load_model, register_model
from .profile import profile
from .capture import capture, CaptureError

# Backends load on first use: NumPy is optional (Pyodide runs without it), so `import cinders`
# must not import it. Later backends add their `name: module` entry here.
_LAZY_BACKENDS = {
    "NumPy": ".backends.numpy_backend",
    "Python": ".backends.python_backend",
    "Wgpu": ".wgpu",
    "Wasm": ".wasm",
    "Router": ".backends.router",
    "Remote": ".backends.remote",
}


def __getattr__(name):
    module = _LAZY_BACKENDS.get(name)
    if module is None:
        raise AttributeError("module 'cinders' has no attribute %r" % (name,))
    import importlib
    try:
        loaded = importlib.import_module(module, __name__)
    except ImportError as e:  # an optional dependency (NumPy, wgpu-py, ...): name its extra
        from .extras import missing_extra
        raise (missing_extra(e) or e) from None
    return getattr(loaded, name)
