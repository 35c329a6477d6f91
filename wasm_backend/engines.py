"""How Python reaches cn.Wasm()'s module: the engine interface and the engines.

An engine has `kernels` (the module's export names) and
    call(name, *ints) -> int | None      run an exported kernel
    write(ptr, data)                     bytes into linear memory
    read(ptr, nbytes) -> bytes
    memory_grown()                       the memory grew (views of it must be renewed)

Engines: BrowserEngine (Pyodide: the module instantiated by the page, called through JS;
engine_browser.py), WasmtimeEngine (the desktop: the same module in-process, in Wasmtime) and
NodeEngine (the desktop without the `wasmtime` package: a Node child process).

Why Wasmtime on the desktop: it is the reference WebAssembly runtime (Bytecode Alliance, the
SIMD128 proposal the kernels need is on by default), its PyPI wheel bundles the runtime for
Linux, macOS and Windows (no compiler, no Node), and it runs the module in this process: a
kernel call is a native call instead of a JSON line to a child process and back, and tensor
bytes are copied straight into the module's linear memory (`pip install cinders[wasm]`).
wasmer's Python package lags CPython releases; wasm3 and pywasm interpret (no SIMD JIT).
"""
import ctypes
import atexit
import base64
import json
import os
import shutil
import subprocess
import sys

_default = None


class WasmEngineError(RuntimeError):
    """The module trapped or the engine's process died."""


class NodeEngine:
    """The module in `node node_engine.mjs`, one JSON line per request over stdio. Writes do not
    wait for an answer, so each kernel call costs one round trip."""

    def __init__(self, module_path=None):
        from . import build
        path = module_path or build.module_path()
        node = shutil.which("node")
        if node is None:
            raise WasmEngineError("cn.Wasm() on the desktop runs its kernels in Node: install Node.js 20")
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "node_engine.mjs")
        self.proc = subprocess.Popen([node, script, path], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.kernels = frozenset(self._reply())
        atexit.register(self.close)

    def _send(self, request):
        self.proc.stdin.write(json.dumps(request, separators=(",", ":")).encode() + b"\n")

    def _reply(self):
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise WasmEngineError("the Node process running cn.Wasm()'s kernels exited (code %s)"
                                  % self.proc.poll())
        answer = json.loads(line)
        if "e" in answer:
            raise WasmEngineError("cn.Wasm() kernel failed: %s" % answer["e"])
        return answer["v"]

    def call(self, name, *args):
        self._send(["c", name, args])
        return self._reply()

    def write(self, ptr, data):
        self._send(["w", ptr, base64.b64encode(data).decode()])

    def read(self, ptr, nbytes):
        self._send(["r", ptr, nbytes])
        return base64.b64decode(self._reply())

    def memory_grown(self):
        pass

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=10)


class WasmtimeEngine:
    """The module instantiated in this process by Wasmtime. Reads and writes copy between
    Python bytes and the linear memory directly (bounds-checked here: an address out of the
    memory is a WasmEngineError, never a stray host access)."""

    def __init__(self, module_path=None):
        import wasmtime
        from . import build
        self._trap = (wasmtime.Trap, wasmtime.WasmtimeError)
        engine = wasmtime.Engine()
        self.store = wasmtime.Store(engine)
        module = wasmtime.Module.from_file(engine, module_path or build.module_path())
        exports = wasmtime.Instance(self.store, module, []).exports(self.store)
        self.memory = exports["memory"]
        self.functions = {name: exports[name] for name in (e.name for e in module.exports)
                          if isinstance(exports[name], wasmtime.Func)}
        self.kernels = frozenset(self.functions)
        self.memory_grown()

    def call(self, name, *args):
        try:
            return self.functions[name](self.store, *args)
        except self._trap as e:
            # (the last line of Wasmtime's report is the trap's reason)
            reason = str(e).strip().splitlines()[-1].strip()
            raise WasmEngineError("cn.Wasm() kernel %s failed: %s" % (name, reason)) from None

    def _address(self, ptr, nbytes):
        if ptr < 0 or nbytes < 0 or ptr + nbytes > self.size:
            raise WasmEngineError("cn.Wasm(): bytes [%d, %d) are outside the module's memory (%d "
                                  "bytes)" % (ptr, ptr + nbytes, self.size))
        return self.base + ptr

    def write(self, ptr, data):
        ctypes.memmove(self._address(ptr, len(data)), data, len(data))

    def read(self, ptr, nbytes):
        return ctypes.string_at(self._address(ptr, nbytes), nbytes)

    def memory_grown(self):
        # growing may move the memory: its base address and size are read again
        self.base = ctypes.addressof(self.memory.data_ptr(self.store).contents)
        self.size = self.memory.data_len(self.store)


def default_engine():
    """Pyodide: the module the page loaded (cinders.wasm.load); elsewhere the module in this
    process through Wasmtime (the `wasm` extra), or in one Node process without it."""
    global _default
    if _default is None:
        if sys.platform == "emscripten":
            from . import engine_browser
            _default = engine_browser.loaded_engine()
        else:
            try:
                import wasmtime  # noqa: F401  (an optional dependency: the `wasm` extra)
            except ImportError:
                _default = NodeEngine()
            else:
                _default = WasmtimeEngine()
    return _default
