"""cinders.wasm: the WebAssembly SIMD backend (`cn.Wasm()`), for browsers without WebGPU.

Layers, top to bottom: backend.py (the protocol's primitives, strided views, the heap, the
queue of kernel calls) -> engines (how Python reaches the module: engine_browser.py in Pyodide
through JS; engines.WasmtimeEngine on the desktop, in-process, or engines.NodeEngine, a Node
child process running node_engine.mjs, without the `wasmtime` package)
-> the module, whose C source kernels.py generates from its op tables around runtime.h, and
build.py compiles with clang -msimd128. capture.py records the queued kernel calls for
cn.capture and replays them as one run_commands call. The board runtime's
MicroPython-WebAssembly engine (micro/runtime/cinders/_wasm.py) uses the same module through
wasm/micro_kernels.mjs.
"""

from .backend import Wasm

__all__ = ["Wasm", "load"]


async def load(source=None):
    """Pyodide: fetch and instantiate the kernels (once per page) so that cn.Wasm() can run.
    source: the module's URL (default: the demo server's), or a JS thenable of the kernels
    wasm/cinders.js prepared ({instance, memory, threads}: the threaded build where it could)."""
    from . import engine_browser
    return await engine_browser.load(source or engine_browser.DEFAULT_URL)
