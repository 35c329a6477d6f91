"""cinders.wasm: the WebAssembly SIMD backend (`cn.Wasm()`), for browsers without WebGPU.

Layers, top to bottom: backend.py (the protocol's primitives, strided views, the heap) ->
engines (how Python reaches the module: engine_browser.py in Pyodide through JS, engine_node.py on
the desktop through a Node child process) -> the module, whose C source kernels.py generates
from its op tables around runtime.h, and build.py compiles with clang -msimd128.
"""

from .backend import Wasm

__all__ = ["Wasm", "load"]


async def load(source=None):
    """Pyodide: fetch and instantiate the kernels (once per page) so that cn.Wasm() can run.
    source: the module's URL (default: the demo server's), or a JS promise of the compiled
    WebAssembly.Module."""
    from . import engine_browser
    return await engine_browser.load(source or engine_browser.DEFAULT_URL)
