"""How Python reaches cn.Wasm()'s kernels: the engine interface and the engines.

An engine has `kernels` (the module's export names), `threads` (how many threads its kernels
run on: 1, or the threaded build's pool, runtime.h parallel_for) and
    call(name, *ints) -> int | None      run an exported kernel
    write(ptr, data)                     bytes into linear memory
    read(ptr, nbytes) -> bytes
    memory_grown()                       the memory grew (views of it must be renewed)

Engines: BrowserEngine (Pyodide: the module instantiated by the page, called through JS;
engine_browser.py), NativeEngine (the desktop's default where clang is installed: the same C
kernels compiled natively for this CPU), WasmtimeEngine (the desktop: the .wasm module itself
in-process, in Wasmtime) and NodeEngine (the desktop without the `wasmtime` package: a Node
child process). `cn.Wasm(engine="native" | "wasmtime" | "node")` picks one by name (ENGINES).

Why Wasmtime on the desktop: it is the reference WebAssembly runtime (Bytecode Alliance, the
SIMD128 proposal the kernels need is on by default), its PyPI wheel bundles the runtime for
Linux, macOS and Windows (no compiler, no Node), and it runs the module in this process: a
kernel call is a native call instead of a JSON line to a child process and back, and tensor
bytes are copied straight into the module's linear memory (`pip install cinders[wasm]`).
wasmer's Python package lags CPython releases; wasm3 and pywasm interpret (no SIMD JIT).

Why a native build as well: WebAssembly's SIMD is 128 bits wide where the desktop's CPU has
AVX2 or AVX-512 and fused multiply-adds, and a Wasmtime call from Python costs tens of
microseconds. The native library is the tab's kernel source (runtime.h, kernels.py) with
native.h in front (build.py), loaded with ctypes: its linear memory is an arena of this
process addressed by the same 32-bit offsets, and a kernel's out-of-bounds access is still a
WasmEngineError, not a stray write (native.h says how).
"""
import ctypes
import atexit
import base64
import json
import os
import shutil
import subprocess
import sys
import weakref

_default = None


class WasmEngineError(RuntimeError):
    """The module trapped or the engine's process died."""


class NodeEngine:
    """The module in `node node_engine.mjs`, one JSON line per request over stdio. Writes do not
    wait for an answer, so each kernel call costs one round trip."""

    def __init__(self, module_path=None, threads=None):
        """threads: run the threaded build on that many threads (worker threads of the Node
        process, wasm/kernel_threads.mjs); None: the single-threaded module."""
        from . import build
        from ..assets import REPO_ROOT
        path = module_path or build.module_path(threaded=threads is not None)
        node = shutil.which("node")
        if node is None:
            raise WasmEngineError("cn.Wasm() on the desktop runs its kernels in Node: install Node.js 20")
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "node_engine.mjs")
        pool = [] if threads is None else [str(threads), os.path.join(REPO_ROOT, "wasm", "kernel_threads.mjs")]
        self.threads = threads or 1
        self.proc = subprocess.Popen([node, script, path] + pool, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
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


class LinearMemory:
    """Reads and writes of an in-process linear memory at `base` (`size` bytes), bounds-checked:
    an address out of the memory is a WasmEngineError, never a stray host access."""

    def _address(self, ptr, nbytes):
        if ptr < 0 or nbytes < 0 or ptr + nbytes > self.size:
            raise WasmEngineError("cn.Wasm(): bytes [%d, %d) are outside the module's memory (%d "
                                  "bytes)" % (ptr, ptr + nbytes, self.size))
        return self.base + ptr

    def write(self, ptr, data):
        ctypes.memmove(self._address(ptr, len(data)), data, len(data))

    def read(self, ptr, nbytes):
        return ctypes.string_at(self._address(ptr, nbytes), nbytes)


class WasmtimeEngine(LinearMemory):
    """The module instantiated in this process by Wasmtime. Reads and writes copy between
    Python bytes and the linear memory directly."""

    threads = 1   # the single-threaded module

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

    def memory_grown(self):
        # growing may move the memory: its base address and size are read again
        self.base = ctypes.addressof(self.memory.data_ptr(self.store).contents)
        self.size = self.memory.data_len(self.store)


_PAGE = 65536
_MAX_PAGES = 65536  # wasm32's 4 GiB (native.h reserves that much address space)
_INDEXED_TRAPPED = -(1 << 31)  # native_indexed's result when its kernel trapped (native.h)


class NativeEngine(LinearMemory):
    """The kernels' C compiled for this CPU (build.native_library_path), called through ctypes.
    Every kernel runs under one of native.h's entries, which set this engine's arena and turn a
    fault in it into a trap: a queued kernel as a one-command list (native_run, the generated
    run_commands' interpreter), gather/scatter_add through native_indexed. The memory (the
    arena's committed pages, heap_base, growth) is kept here, as the module keeps its own."""

    HEAP_BASE = 1024      # nothing of the library lives in the arena: the host's heap starts low
    threads = 1           # (the desktop's onnxruntime comparisons are single-threaded too)
    INITIAL_PAGES = 16

    def __init__(self, library_path=None):
        from . import build, kernels
        lib = ctypes.CDLL(library_path or build.native_library_path())
        lib.arena_reserve.restype = ctypes.c_void_p
        lib.arena_commit.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        lib.arena_release.argtypes = [ctypes.c_void_p]
        lib.native_run.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
        lib.native_indexed.argtypes = [ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_int] * 6
        self.lib = lib
        self.base = lib.arena_reserve()
        if not self.base:
            raise WasmEngineError("cn.Wasm(engine='native'): cannot reserve 20 GiB of address space "
                                  "for its memory (try engine='wasmtime')")
        weakref.finalize(self, lib.arena_release, self.base)
        self.pages = 0
        if self.memory_grow(self.INITIAL_PAGES) < 0:
            raise WasmEngineError("cn.Wasm(engine='native'): cannot commit its first %d bytes"
                                  % (self.INITIAL_PAGES * _PAGE))
        self.ids = {name: i for i, (name, _) in enumerate(kernels.queued_kernels())}
        indexed = ["gather_%s" % t for t in kernels.GATHER_DTYPES]
        indexed += ["scatter_add_%s" % t for t in kernels.SCATTER_ADD_DTYPES]
        self.indexed = {name: ctypes.cast(getattr(lib, name), ctypes.c_void_p).value for name in indexed}
        self.memory_calls = {"heap_base": lambda: self.HEAP_BASE, "memory_pages": lambda: self.pages,
                             "memory_grow": self.memory_grow}
        self.kernels = frozenset(kernels.kernel_names())
        self.memory_grown()

    def call(self, name, *args):
        if name == "run_commands":
            ptr, n = args
            trapped = self.lib.native_run(self.base, self.base + (ptr & 0xFFFFFFFF), n)
        elif name in self.ids:
            command = (ctypes.c_int * (1 + len(args)))(self.ids[name], *args)
            trapped = self.lib.native_run(self.base, command, len(command))
        elif name in self.indexed:
            result = self.lib.native_indexed(self.base, self.indexed[name], *args)
            if result != _INDEXED_TRAPPED:
                return result
            trapped = True
        else:
            return self.memory_calls[name](*args)
        if trapped:
            raise WasmEngineError("cn.Wasm() kernel %s failed: memory access out of bounds" % name)
        return None

    def memory_grow(self, pages):
        """The module's memory.grow: the old size in pages, or -1 (the arena stays where it is)."""
        old = self.pages
        if pages < 0 or old + pages > _MAX_PAGES or self.lib.arena_commit(self.base, (old + pages) * _PAGE):
            return -1
        self.pages = old + pages
        return old

    def memory_grown(self):
        self.size = self.pages * _PAGE


def native_compiler():
    """The native engine's declared requirement: clang on a POSIX host (native.h's arena)."""
    return os.name == "posix" and shutil.which("clang") is not None


ENGINES = {"native": NativeEngine, "wasmtime": WasmtimeEngine, "node": NodeEngine}
_shared = {}


def engine(name):
    """The engine of that name shared by every cn.Wasm(engine=name) of this process."""
    if name not in ENGINES:
        from ..errors import ArgumentError
        raise ArgumentError("cn.Wasm(engine=%r): the engines are %s" % (name, ", ".join(ENGINES)))
    if name not in _shared:
        _shared[name] = ENGINES[name]()
    return _shared[name]


def default_engine_name():
    """The desktop's engine: the native build where clang is installed, else the .wasm module in
    this process through Wasmtime (the `wasm` extra), else in one Node process."""
    if native_compiler():
        return "native"
    try:
        import wasmtime  # noqa: F401  (an optional dependency: the `wasm` extra)
    except ImportError:
        return "node"
    return "wasmtime"


def default_engine():
    """Pyodide: the module the page loaded (cinders.wasm.load); elsewhere default_engine_name()'s."""
    global _default
    if _default is None:
        if sys.platform == "emscripten":
            from . import engine_browser
            _default = engine_browser.loaded_engine()
        else:
            _default = engine(default_engine_name())
    return _default
