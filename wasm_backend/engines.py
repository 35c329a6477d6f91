"""How Python reaches cn.Wasm()'s module: the engine interface and the engines.

An engine has `kernels` (the module's export names) and
    call(name, *ints) -> int | None      run an exported kernel
    write(ptr, data)                     bytes into linear memory
    read(ptr, nbytes) -> bytes
    memory_grown()                       the memory grew (views of it must be renewed)

Engines: BrowserEngine (Pyodide: the module instantiated by the page, called through JS;
engine_browser.py) and NodeEngine (the desktop: the same module in a Node child process,
which is how the test suites run cn.Wasm()).
"""
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


def default_engine():
    """Pyodide: the module the page loaded (cinders.wasm.load); elsewhere one Node process."""
    global _default
    if _default is None:
        if sys.platform == "emscripten":
            from . import engine_browser
            _default = engine_browser.loaded_engine()
        else:
            _default = NodeEngine()
    return _default
