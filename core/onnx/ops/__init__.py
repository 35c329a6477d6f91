"""ONNX operators composed from the cinders Tensor API (one function per op, named as in ONNX).

Generated models call these (`ops.Conv(x, self.w, pads=[1, 1, 1, 1])`); inputs arrive
positionally in ONNX order (None for an omitted optional input), attributes as keywords with
their ONNX names. Parameters listed in `host=` of @op take Python numbers (shapes, axes, pads):
the importer writes constant ones as literals, and a tensor arriving there at run time is read
with tolist(). Nothing here touches a backend handle, so every op runs on every backend and
under Autodiff and Fusion. Semantics follow the ONNX operator specs (onnx.ai/onnx/operators);
where cinders differs (no float64/int64: those compute in float32/int32) docs/onnx.md says so.

One module per operator family; `base` holds the registry and the helpers every family shares
(host parameters, the host backend).
"""

from .base import *  # noqa: F401,F403  (REGISTRY, op, host helpers the generated code calls)
from .elementwise import *  # noqa: F401,F403
from .reductions import *  # noqa: F401,F403
from .shapes import *  # noqa: F401,F403
from .linalg import *  # noqa: F401,F403
from .conv import *  # noqa: F401,F403
from .normalization import *  # noqa: F401,F403
from .resize import *  # noqa: F401,F403
from .quantization import *  # noqa: F401,F403
from .quantization_contrib import *  # noqa: F401,F403  (com.microsoft ops, looked up through MS_OPS)
from .recurrent import *  # noqa: F401,F403
from .losses import *  # noqa: F401,F403
from .attention import *  # noqa: F401,F403
