"""cn.Wasm() in Pyodide: the module instantiated in the page, its kernels called through JS.

    from cinders.wasm import engine_browser
    await engine_browser.load()            # fetch + instantiate (the demo server's copy by default)
    backend = cn.Wasm()                    # backend.threads: 1, or the threaded build's pool

wasm/cinders.js prepares the kernels itself (wasmKernels) while Pyodide starts: the threaded
build on a pool of Web Workers where the page is cross-origin isolated, else the single-threaded
module; it passes them here, and awaiting them starts them. With the threaded build the memory is a SharedArrayBuffer
that the workers' instances share; the copies in and out below are the same.

Tensor bytes cross into the module's memory with one typed-array copy each way
(`Uint8Array.assign` from a Python buffer, `assign_to` into one); kernel calls are plain JS
calls with integer arguments. Making a view (`subarray`) is a JS call that costs far more
than the copy, so views are kept per (address, length): a model writes the same input and
command blocks every time. Nothing here holds a JS object at import time (the Pyodide memory
snapshot of wasm/precompile.mjs imports this module).
"""
# The demo server (cinders.web.server) serves the built module here.
DEFAULT_URL = "/wasm-kernels/cinders-kernels.wasm"

_loaded = None


class BrowserEngine:
    def __init__(self, instance, memory, threads):
        import js
        self.exports = instance.exports
        self.memory = memory
        self.threads = threads
        self.kernels = frozenset(js.Object.keys(self.exports).to_py())
        self._functions = {}
        self._bytes = js.Uint8Array.new(self.memory.buffer)
        self._views = {}

    def call(self, name, *args):
        function = self._functions.get(name)
        if function is None:
            function = self._functions[name] = getattr(self.exports, name)
        return function(*args)

    def _view(self, ptr, nbytes):
        view = self._views.get((ptr, nbytes))
        if view is None:
            if len(self._views) >= 256:
                self._views.clear()
            view = self._views[ptr, nbytes] = self._bytes.subarray(ptr, ptr + nbytes)
        return view

    def write(self, ptr, data):
        self._view(ptr, len(data)).assign(data)

    def read(self, ptr, nbytes):
        out = bytearray(nbytes)
        self._view(ptr, nbytes).assign_to(out)
        return bytes(out)

    def memory_grown(self):
        import js
        self._bytes = js.Uint8Array.new(self.memory.buffer)  # growing detaches the old buffer
        self._views.clear()


async def load(source=DEFAULT_URL):
    """Instantiate the module once per page; returns the engine. source: the single-threaded
    module's URL, or a JS thenable of the started kernels, {instance, memory, threads}
    (wasm/cinders.js wasmKernels: the threaded build where the page may share memory)."""
    global _loaded
    if _loaded is None:
        import js
        if isinstance(source, str):
            response = await js.fetch(source)
            if not response.ok:
                raise RuntimeError("cn.Wasm(): cannot fetch the kernels from %s: HTTP %s"
                                   % (source, response.status))
            module = await js.WebAssembly.compile(await response.arrayBuffer())
            instance = await js.WebAssembly.instantiate(module, js.Object.new())
            _loaded = BrowserEngine(instance, instance.exports.memory, 1)
        else:
            started = await source
            _loaded = BrowserEngine(started.instance, started.memory, started.threads)
    return _loaded


def loaded_engine():
    if _loaded is None:
        raise RuntimeError("cn.Wasm() in the browser needs its module: `await cinders.wasm.load()` "
                           "first (wasm/cinders.js does it when it picks the wasm backend)")
    return _loaded
