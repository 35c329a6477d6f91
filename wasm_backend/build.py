"""Builds cn.Wasm()'s WebAssembly module from source: kernels.py's generated C -> clang -> wasm-opt.

    python -m cinders.wasm.build          # builds (when the source changed) and prints path + size

Toolchain from Debian (scripts/setup.sh installs it): clang and lld (wasm32 target, -msimd128),
wasi-libc (libm: expf, erff, ...), binaryen (wasm-opt). The module is never committed: it lands
in <cache>/wasm/ named by the hash of its source and flags, so a changed kernel is a new file.
"""
import hashlib
import os
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
WASM_OPT_FLAGS = ["-O3", "--enable-simd", "--enable-bulk-memory", "--enable-nontrapping-float-to-int",
                  "--enable-sign-ext"]


class WasmBuildError(RuntimeError):
    """The kernels could not be compiled (missing toolchain or a compiler error)."""


def c_source():
    with open(os.path.join(HERE, "runtime.h")) as f:
        return kernels.source(f.read())


def _source_hash(source):
    digest = hashlib.sha256(source.encode())
    digest.update(" ".join(CLANG_FLAGS + LINK_FLAGS + WASM_OPT_FLAGS).encode())
    return digest.hexdigest()[:16]


def module_dir():
    path = os.path.join(cache_dir(), "wasm")
    os.makedirs(path, exist_ok=True)
    return path


SERVED_NAME = "cinders-kernels.wasm"   # the name pages ask for at /wasm-kernels/
STALE_AFTER_S = 24 * 3600               # other sources' builds older than this are removed


def module_path(build=True):
    """Path of the built module for the current source; builds it first when missing."""
    source = c_source()
    path = os.path.join(module_dir(), "cinders-kernels-%s.wasm" % _source_hash(source))
    if not os.path.exists(path):
        if not build:
            raise FileNotFoundError("cn.Wasm()'s module is not built: run `python -m cinders.wasm.build`")
        _build(source, path)
    return path


def served_dir(build=True):
    """The folder the demo server serves at /wasm-kernels/: this source's module as SERVED_NAME,
    in a folder of its own per source, so checkouts of other versions sharing the cache (or
    running at the same time) each serve the module their pages' command ids were made for."""
    path = module_path(build)
    folder = os.path.join(module_dir(), "served-" + os.path.basename(path)[len("cinders-kernels-"):-len(".wasm")])
    served = os.path.join(folder, SERVED_NAME)
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


def _build(source, path):
    print("cinders: building the WebAssembly kernels (clang -msimd128) into %s" % path,
          file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        c_file, obj, raw = (os.path.join(tmp, name) for name in ("kernels.c", "kernels.o", "raw.wasm"))
        with open(c_file, "w") as f:
            f.write(source)
        done = subprocess.run([_tool("clang")] + CLANG_FLAGS + ["-o", obj, c_file],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise WasmBuildError("clang failed on the generated kernels:\n" + done.stderr[-4000:])
        if not os.path.exists(LIBC):
            raise WasmBuildError("%s is missing: apt-get install wasi-libc (scripts/setup.sh)" % LIBC)
        done = subprocess.run([_tool("wasm-ld")] + LINK_FLAGS + [obj, LIBC, "-o", raw],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise WasmBuildError("wasm-ld failed:\n" + done.stderr[-4000:])
        optimised = os.path.join(tmp, "opt.wasm")
        done = subprocess.run([_tool("wasm-opt")] + WASM_OPT_FLAGS + [raw, "-o", optimised],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise WasmBuildError("wasm-opt failed:\n" + done.stderr[-4000:])
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
    path = module_path()
    print("%s %d bytes" % (path, os.path.getsize(path)))


if __name__ == "__main__":
    main()
