"""Builds cn.Wasm()'s WebAssembly module from source: kernels.py's generated C -> clang -> wasm-opt,
and the desktop's native library from the same C: native.h + the source -> the host's clang.

    python -m cinders.wasm.build          # builds (when the source changed) and prints paths + sizes

Toolchain from Debian (scripts/setup.sh installs it): clang and lld (wasm32 target, -msimd128),
wasi-libc (libm: expf, erff, ...), binaryen (wasm-opt). The module is never committed: it lands
in <cache>/wasm/ named by the hash of its source and flags, so a changed kernel is a new file.
"""
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

from cinders.assets import cache_dir

from . import kernels

HERE = os.path.dirname(os.path.abspath(__file__))
CLANG_FLAGS = [
    "--target=wasm32-wasi", "--sysroot=/usr", "-O2", "-fno-unroll-loops", "-msimd128", "-mbulk-memory",
    "-mnontrapping-fptoint", "-msign-ext", "-std=c11", "-Wall", "-Werror", "-Wno-pass-failed", "-c",
]
# wasm-ld directly (clang's driver would run wasm-opt itself, without the SIMD feature flags);
# wasi-libc's libc.a holds libm; no WASI function is imported, as no kernel does I/O.
LINK_FLAGS = ["--no-entry", "--strip-all", "--gc-sections", "-z", "stack-size=65536"]
LIBC = "/usr/lib/wasm32-wasi/libc.a"
# The native library (engines.NativeEngine): vectorised by the compiler for this CPU's width.
# -fno-math-errno: sqrtf and friends become instructions (the values are the same).
NATIVE_FLAGS = ["-O3", "-march=native", "-fno-math-errno", "-fPIC", "-shared", "-std=gnu11", "-Wall",
                "-Wno-unused-function",  # (not every SIMD128 shim of native.h is used)
                "-Wno-unknown-pragmas"]
WASM_OPT_FLAGS = ["-O3", "--enable-simd", "--enable-bulk-memory", "--enable-nontrapping-float-to-int",
                  "--enable-sign-ext"]
# The threaded build of the same source (runtime.h parallel_for), for pages that may share memory
# (cross-origin isolated): atomics, its memory imported and shared with the pool's workers
# (each a Web Worker or a Node worker thread instantiating this module on it), growable to
# wasm32's 4 GiB (a shared memory must declare a maximum), and __stack_pointer exported so that
# each worker runs on its own stack (runtime.h pool_stack_top). Debian's wasi-libc has no
# threads sysroot; its libc.a links into a shared memory all the same, and no code a worker runs
# calls into it (the tasks are matmul and convolution loops).
THREADS_MAX = 8   # runtime.h POOL_THREADS: the calling thread and up to 7 workers
THREADED_FLAGS = {
    "clang": ["-matomics", "-mmutable-globals", "-DPOOL_THREADS=%d" % THREADS_MAX],
    "wasm-ld": ["--shared-memory", "--import-memory", "--max-memory=%d" % (65536 * 65536),
                "--export=__stack_pointer"],
    "wasm-opt": ["--enable-threads", "--enable-mutable-globals"],
}


class WasmBuildError(RuntimeError):
    """The kernels could not be compiled (missing toolchain or a compiler error)."""


def c_source():
    with open(os.path.join(HERE, "runtime.h")) as f:
        return kernels.source(f.read())


def _flags(tool, threaded):
    own = {"clang": CLANG_FLAGS, "wasm-ld": LINK_FLAGS, "wasm-opt": WASM_OPT_FLAGS}[tool]
    return own + (THREADED_FLAGS[tool] if threaded else [])


def _source_hash(source, threaded=False):
    digest = hashlib.sha256(source.encode())
    digest.update(" ".join(sum((_flags(t, threaded) for t in ("clang", "wasm-ld", "wasm-opt")), [])).encode())
    return digest.hexdigest()[:16]


def native_source():
    with open(os.path.join(HERE, "native.h")) as f:
        return f.read() + c_source()


def _host():
    """What -march=native compiles for: the machine and its CPU's feature flags (a cache shared
    between machines keeps one library per kind of CPU)."""
    flags = ""
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith(("flags", "Features"))), "")
    return platform.machine() + platform.processor() + flags


def native_library_path():
    """Path of the native library for the current source and this CPU; builds it when missing."""
    source = native_source()
    digest = hashlib.sha256((source + " ".join(NATIVE_FLAGS) + _host()).encode()).hexdigest()[:16]
    path = os.path.join(module_dir(), "cinders-kernels-native-%s.so" % digest)
    if not os.path.exists(path):
        print("cinders: building the native kernels (clang -O3 -march=native) into %s" % path,
              file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            c_file, library = os.path.join(tmp, "kernels.c"), os.path.join(tmp, "kernels.so")
            with open(c_file, "w") as f:
                f.write(source)
            _run([_tool("clang")] + NATIVE_FLAGS + ["-o", library, c_file, "-lm"], "clang")
            _remove_stale(os.path.dirname(path))
            shutil.copyfile(library, path + ".%d.tmp" % os.getpid())
            os.replace(path + ".%d.tmp" % os.getpid(), path)
    return path


def _run(command, what):
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise WasmBuildError("%s failed on the generated kernels:\n%s" % (what, done.stderr[-4000:]))


def module_dir():
    path = os.path.join(cache_dir(), "wasm")
    os.makedirs(path, exist_ok=True)
    return path


SERVED_NAME = "cinders-kernels.wasm"   # the name pages ask for at /wasm-kernels/
THREADED_SERVED_NAME = "cinders-kernels-threads.wasm"   # ... and the threaded build's
STALE_AFTER_S = 24 * 3600               # other sources' builds older than this are removed


def module_path(build=True, threaded=False):
    """Path of the built module for the current source (threaded: its threaded build); builds
    it first when missing."""
    source = c_source()
    path = os.path.join(module_dir(), "cinders-kernels-%s%s.wasm"
                        % ("threads-" if threaded else "", _source_hash(source, threaded)))
    if not os.path.exists(path):
        if not build:
            raise FileNotFoundError("cn.Wasm()'s module is not built: run `python -m cinders.wasm.build`")
        _build(source, path, threaded)
    return path


def served_dir(build=True):
    """The folder the demo server serves at /wasm-kernels/: this source's module as SERVED_NAME
    and its threaded build as THREADED_SERVED_NAME, in a folder of its own per source, so
    checkouts of other versions sharing the cache (or running at the same time) each serve the
    modules their pages' command ids were made for."""
    modules = {SERVED_NAME: module_path(build)}
    folder = os.path.join(module_dir(), "served-" + os.path.basename(modules[SERVED_NAME])[len("cinders-kernels-"):-len(".wasm")])
    served = os.path.join(folder, THREADED_SERVED_NAME)
    if not os.path.exists(served):
        try:
            modules[THREADED_SERVED_NAME] = module_path(build, threaded=True)
        except WasmBuildError as e:   # the pages then run the single-threaded module
            print("cinders: cn.Wasm()'s threaded build failed, pages run one thread: %s" % e, file=sys.stderr)
    for name, path in modules.items():
        served = os.path.join(folder, name)
        if not os.path.exists(served):
            os.makedirs(folder, exist_ok=True)
            shutil.copyfile(path, served + ".%d.tmp" % os.getpid())
            os.replace(served + ".%d.tmp" % os.getpid(), served)
    return folder


def _tool(name):
    found = shutil.which(name)
    if found is None:
        raise WasmBuildError("building cn.Wasm()'s kernels needs `%s`: run scripts/setup.sh (apt-get "
                             "install clang lld wasi-libc binaryen)" % name)
    return found


def _build(source, path, threaded):
    print("cinders: building the %sWebAssembly kernels (clang -msimd128) into %s"
          % ("threaded " if threaded else "", path), file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        c_file, obj, raw = (os.path.join(tmp, name) for name in ("kernels.c", "kernels.o", "raw.wasm"))
        with open(c_file, "w") as f:
            f.write(source)
        _run([_tool("clang")] + _flags("clang", threaded) + ["-o", obj, c_file], "clang")
        if not os.path.exists(LIBC):
            raise WasmBuildError("%s is missing: apt-get install wasi-libc (scripts/setup.sh)" % LIBC)
        _run([_tool("wasm-ld")] + _flags("wasm-ld", threaded) + [obj, LIBC, "-o", raw], "wasm-ld")
        optimised = os.path.join(tmp, "opt.wasm")
        _run([_tool("wasm-opt")] + _flags("wasm-opt", threaded) + [raw, "-o", optimised], "wasm-opt")
        _remove_stale(os.path.dirname(path))
        tmp_out = path + ".tmp"
        shutil.copyfile(optimised, tmp_out)
        os.replace(tmp_out, path)


def _remove_stale(folder):
    """Builds of other sources not used for a day (a process of another version may still be
    running on a recent one: the cache is shared)."""
    now = time.time()
    for old in os.listdir(folder):
        full = os.path.join(folder, old)
        if not old.startswith(("cinders-kernels-", "served-")) or now - os.path.getmtime(full) <= STALE_AFTER_S:
            continue
        if os.path.isdir(full):
            shutil.rmtree(full, ignore_errors=True)
        else:
            os.remove(full)


def main():
    from .engines import native_compiler
    paths = [module_path(), module_path(threaded=True)] + ([native_library_path()] if native_compiler() else [])
    for path in paths:
        print("%s %d bytes" % (path, os.path.getsize(path)))


if __name__ == "__main__":
    main()
