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


SERVED_NAME = "cinders-kernels.wasm"   # the copy the demo server serves at /wasm-kernels/


def module_path(build=True):
    """Path of the built module for the current source; builds it first when missing, and
    keeps the served copy (SERVED_NAME, same folder) equal to it."""
    source = c_source()
    path = os.path.join(module_dir(), "cinders-kernels-%s.wasm" % _source_hash(source))
    if not os.path.exists(path):
        if not build:
            raise FileNotFoundError("cn.Wasm()'s module is not built: run `python -m cinders.wasm.build`")
        _build(source, path)
    served = os.path.join(module_dir(), SERVED_NAME)
    with open(path, "rb") as f:
        data = f.read()
    if not os.path.exists(served) or os.path.getsize(served) != len(data) or open(served, "rb").read() != data:
        with open(served + ".tmp", "wb") as f:
            f.write(data)
        os.replace(served + ".tmp", served)
    return path


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
        # old builds of other sources are stale
        for old in os.listdir(os.path.dirname(path)):
            if old.startswith("cinders-kernels-") and old.endswith(".wasm") and old != SERVED_NAME:
                os.remove(os.path.join(os.path.dirname(path), old))
        tmp_out = path + ".tmp"
        shutil.copyfile(optimised, tmp_out)
        os.replace(tmp_out, path)


def main():
    path = module_path()
    print("%s %d bytes" % (path, os.path.getsize(path)))


if __name__ == "__main__":
    main()
