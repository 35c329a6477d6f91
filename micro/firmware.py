"""MicroPython firmware with ulab, built from the source archives and cached.

    build(port="unix", float="float", dims=4)            the unix port (a `micropython` executable)
    build(port="qemu", float="float")                    MPS2 AN500 (Cortex-M7) for qemu-system-arm
    build(..., manifest="bundle/manifest.py")            with a frozen bundle (export-micro --freeze)

The sources are the archives (or unpacked folders) named by CINDERS_MICROPYTHON_SRC and
CINDERS_ULAB_SRC: MicroPython (py/, extmod/, ports/unix, ports/qemu, mpy-cross, tools) and ulab
(the folder holding code/). Nothing is downloaded. A build is kept under
cache_dir()/firmware/<name>-<key>/, where the key hashes both sources and every option (and the
frozen files), so a second call returns at once; `make -j2` (2 shared cores) takes ~30 s.

The float width and the number of ulab dimensions are build options because boards differ:
most ship float32 (MICROPY_FLOAT_IMPL_FLOAT), stock ulab is 2-D, the unix port defaults to
double. The board runtime detects both itself (cinders._ulab).
"""
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time

from ..assets import cache_dir
from ..errors import FirmwareError, FirmwareSourcesMissing

SOURCE_ENV = {"micropython": "CINDERS_MICROPYTHON_SRC", "ulab": "CINDERS_ULAB_SRC"}
QEMU_BOARDS = {"MPS2_AN500": "mps2-an500"}  # MicroPython BOARD -> qemu -machine
FLOATS = ("float", "double")
_BUILDER_VERSION = 1  # bump when the build commands change: invalidates the cache


def _root():
    return os.path.join(cache_dir(), "firmware")


def _sha256_file(path, h=None):
    h = h or hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h


def _tree_hash(path, suffixes=None):
    """Hash of a file, or of the names and contents of the files below a folder."""
    h = hashlib.sha256()
    if os.path.isfile(path):
        return _sha256_file(path, h).hexdigest()
    for top, dirs, files in sorted(os.walk(path)):
        dirs.sort()
        for name in sorted(files):
            if suffixes and not name.endswith(suffixes):
                continue
            p = os.path.join(top, name)
            h.update(os.path.relpath(p, path).encode() + b"\0")
            _sha256_file(p, h)
    return h.hexdigest()


def source_paths():
    """{"micropython": path, "ulab": path} from the environment; FirmwareSourcesMissing (with
    the reason) when a variable is unset or names nothing."""
    found = {}
    for name, var in SOURCE_ENV.items():
        path = os.environ.get(var)
        if not path:
            raise FirmwareSourcesMissing(
                "%s is not set: point it at the %s source archive (.tar.gz) or folder, e.g. "
                "../shared/vendor/%s" % (var, name, "micropython-src.tar.gz" if name == "micropython"
                                          else "micropython-ulab-src.tar.gz"))
        if not os.path.exists(path):
            raise FirmwareSourcesMissing("%s=%s: no such file or folder" % (var, path))
        found[name] = os.path.abspath(path)
    return found


def _unpack(src, dest, top):
    """The folder `top` of archive/folder `src`, unpacked (or copied) into dest/top."""
    out = os.path.join(dest, top)
    if os.path.isdir(src):
        shutil.copytree(src, out, symlinks=True)
        return out
    with tarfile.open(src) as tar:
        for m in tar.getmembers():
            if m.name.split("/")[0] != top or m.issym() or m.islnk() or os.path.isabs(m.name) \
                    or ".." in m.name.split("/"):
                raise FirmwareError("%s: unexpected member %r (expected files under %s/)"
                                    % (src, m.name, top))
        tar.extractall(dest, filter="data")
    if not os.path.isdir(out):
        raise FirmwareError("%s holds no %s/ folder" % (src, top))
    return out


def _need_tool(exe, apt):
    if shutil.which(exe) is None:
        raise FirmwareError("%s not found: apt-get install %s (scripts/setup.sh installs it)"
                            % (exe, apt))


def _make(args, log_path, what):
    with open(log_path, "a") as log:
        log.write("$ %s\n" % " ".join(args))
        log.flush()
        r = subprocess.run(args, stdout=log, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        with open(log_path) as f:
            tail = f.read()[-3000:]
        raise FirmwareError("building %s failed (make exit %d); log %s ends:\n%s"
                            % (what, r.returncode, log_path, tail))


class Firmware:
    """One built firmware: `path` (unix: the micropython executable; qemu: firmware.elf) and
    the options it was built with."""

    def __init__(self, path, port, float, dims, board, heap, frozen, ulab=True):
        self.path = path
        self.ulab = ulab
        self.port = port
        self.float = float
        self.dims = dims
        self.board = board
        self.heap = heap
        self.frozen = frozen

    @property
    def name(self):
        return "%s-%s%s-%s%s" % (self.port, "" if self.port == "unix" else self.board.lower() + "-",
                                 "float32" if self.float == "float" else "float64",
                                 "%dd" % self.dims if self.ulab else "noulab",
                                 "-frozen" if self.frozen else "")

    def qemu_command(self, serial="pty", icount=False, romfs=None):
        """qemu-system-arm arguments that boot this (qemu) firmware with its UART on `serial`
        ("pty", "stdio", ...); icount: one instruction = 1 ns of virtual time (deterministic
        ticks_us); romfs: an image loaded into the board's ROMFS partition."""
        if self.port != "qemu":
            raise FirmwareError("%s is not a qemu firmware" % self.name)
        cmd = ["qemu-system-arm", "-machine", QEMU_BOARDS[self.board], "-nographic",
               "-monitor", "none", "-semihosting", "-serial", serial, "-kernel", self.path]
        if icount:
            cmd[1:1] = ["-icount", "shift=0"]
        if romfs:
            cmd += ["-device", "loader,file=%s,addr=%s,force-raw=on" % (romfs, ROMFS_ADDR[self.board])]
        return cmd

    def __repr__(self):
        return "Firmware(%s, %s)" % (self.name, self.path)


ROMFS_ADDR = {"MPS2_AN500": "0x60C00000"}  # ports/qemu/boards/MPS2_AN500/mpconfigboard.mk


def build(port="unix", float="float", dims=4, board="MPS2_AN500", heap=None, manifest=None,
          ulab=True, jobs=2, log=sys.stderr):
    """Build (or find in the cache) MicroPython with ulab; returns a Firmware.

    port "unix" or "qemu"; float "float" (float32) or "double"; dims: ULAB_MAX_DIMS (1-4);
    heap: the qemu board's GC heap in bytes (default: the port's, 140 KB); manifest: a
    MicroPython manifest to freeze (`cinders export-micro --freeze` writes one); ulab=False:
    without ulab (the board runtime then uses its array engine; for comparisons)."""
    if port not in ("unix", "qemu"):
        raise FirmwareError("port must be 'unix' or 'qemu', got %r" % (port,))
    if float not in FLOATS:
        raise FirmwareError("float must be one of %s, got %r" % (FLOATS, float))
    if dims not in (1, 2, 3, 4):
        raise FirmwareError("ulab dims must be 1 to 4, got %r" % (dims,))
    if port == "qemu" and board not in QEMU_BOARDS:
        raise FirmwareError("qemu board %r is not supported (known: %s)" % (board, ", ".join(QEMU_BOARDS)))
    if port == "unix" and heap is not None:
        raise FirmwareError("the unix port takes its heap at run time: micropython -X heapsize=N")
    if manifest is not None:
        manifest = os.path.abspath(manifest)
        if not os.path.isfile(manifest):
            raise FirmwareError("manifest %s not found (cinders export-micro --freeze writes one)"
                                % manifest)
    src = source_paths()
    if port == "qemu":
        _need_tool("arm-none-eabi-gcc", "gcc-arm-none-eabi libnewlib-arm-none-eabi")
    _need_tool("make", "build-essential")
    _need_tool("gcc", "build-essential")

    src_key = hashlib.sha256(json.dumps([_tree_hash(src["micropython"]),
                                         _tree_hash(src["ulab"])]).encode()).hexdigest()[:12]
    options = {"port": port, "float": float, "dims": dims, "board": board if port == "qemu" else None,
               "heap": heap, "builder": _BUILDER_VERSION,
               "frozen": _tree_hash(os.path.dirname(manifest), (".py", ".mpy")) if manifest else None}
    if not ulab:
        options["ulab"] = False
    key = hashlib.sha256(json.dumps([src_key, options], sort_keys=True).encode()).hexdigest()[:12]
    fw = Firmware(None, port, float, dims, board if port == "qemu" else None, heap,
                  manifest is not None, ulab)
    out_dir = os.path.join(_root(), "%s-%s" % (fw.name, key))
    fw.path = os.path.join(out_dir, "micropython" if port == "unix" else "firmware.elf")
    done = os.path.join(out_dir, "firmware.json")
    if os.path.exists(done):
        return fw
    os.makedirs(_root(), exist_ok=True)
    with open(os.path.join(_root(), ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building the same sources
        if os.path.exists(done):
            return fw
        t0 = time.time()
        tree = _source_tree(src, src_key, jobs, log)
        mp = os.path.join(tree, "micropython")
        ulab_dir = os.path.join(tree, "micropython-ulab")
        work = os.path.join(tree, "build-" + key)
        if os.path.isdir(work):
            shutil.rmtree(work)  # a build that was interrupted
        log_path = os.path.join(tree, "build-%s.log" % key)
        print("cinders: building MicroPython %s (make -j%d, ~30 s; log %s)"
              % (fw.name, jobs, log_path), file=log, flush=True)
        args = ["make", "-j%d" % jobs, "BUILD=" + work, "USER_C_MODULES=" + (ulab_dir if ulab else ""),
                "FROZEN_MANIFEST=" + (manifest or "")]
        if manifest:
            args.append("MPY_LIB_DIR=" + _empty_micropython_lib(tree))
        dims_flag = "-DULAB_MAX_DIMS=%d" % dims
        if port == "unix":
            cflags = [dims_flag]
            if float == "float":
                cflags.insert(0, "-DMICROPY_FLOAT_IMPL=MICROPY_FLOAT_IMPL_FLOAT")
            args = args[:1] + ["-C", os.path.join(mp, "ports", "unix")] + args[1:] + [
                "VARIANT=standard", "MICROPY_PY_BTREE=0", "MICROPY_PY_SSL=0", "MICROPY_PY_FFI=0",
                "CFLAGS_EXTRA=" + " ".join(cflags)]
            built = os.path.join(work, "micropython")
        else:
            args = args[:1] + ["-C", os.path.join(mp, "ports", "qemu")] + args[1:] + [
                "BOARD=" + board, "MICROPY_FLOAT_IMPL=" + float, "CFLAGS_EXTRA=" + dims_flag]
            if heap is not None:
                args.append("MICROPY_HEAP_SIZE=%d" % heap)
            built = os.path.join(work, "firmware.elf")
        _make(args, log_path, fw.name)
        if not os.path.exists(built):
            raise FirmwareError("make finished but %s is missing; see %s" % (built, log_path))
        tmp = out_dir + ".tmp"
        if os.path.isdir(tmp):
            shutil.rmtree(tmp)
        os.makedirs(tmp)
        shutil.copy2(built, os.path.join(tmp, os.path.basename(fw.path)))
        with open(os.path.join(tmp, "firmware.json"), "w") as f:
            json.dump(dict(options, name=fw.name, sources=src, seconds=round(time.time() - t0, 1)),
                      f, indent=1)
        if os.path.isdir(out_dir):
            shutil.rmtree(out_dir)
        os.rename(tmp, out_dir)
        shutil.rmtree(work)  # objects are large; the cache keeps the binary
        fw.path = os.path.join(out_dir, os.path.basename(fw.path))
        print("cinders: built %s in %.0f s" % (fw.path, time.time() - t0), file=log, flush=True)
    return fw


def _empty_micropython_lib(tree):
    """The archives hold no micropython-lib (a submodule), which make insists on for any frozen
    manifest; bundle manifests require() nothing from it, so an empty stand-in does."""
    path = os.path.join(tree, "micropython-lib-absent")
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "README.md"), "w") as f:
        f.write("Empty on purpose: Cinders' frozen manifests use nothing from micropython-lib.\n")
    return path


def _source_tree(src, src_key, jobs, log):
    """The unpacked sources with mpy-cross built (shared by every build of these sources)."""
    tree = os.path.join(_root(), "src-" + src_key)
    ready = os.path.join(tree, ".ready")
    if os.path.exists(ready):
        return tree
    if os.path.isdir(tree):
        shutil.rmtree(tree)
    os.makedirs(tree)
    print("cinders: unpacking MicroPython and ulab sources into %s" % tree, file=log, flush=True)
    _unpack(src["micropython"], tree, "micropython")
    _unpack(src["ulab"], tree, "micropython-ulab")
    if not os.path.isdir(os.path.join(tree, "micropython-ulab", "code")):
        raise FirmwareError("%s: no code/ folder under micropython-ulab/ (is it ulab?)" % src["ulab"])
    _make(["make", "-C", os.path.join(tree, "micropython", "mpy-cross"), "-j%d" % jobs],
          os.path.join(tree, "mpy-cross.log"), "mpy-cross")
    open(ready, "w").close()
    return tree

