"""A MicroPython board on a serial port, driven through mpremote's own serial transport.

    flash(bundle, port)         install a bundle: a filesystem copy where the board has a
                                writable filesystem, else a ROMFS image (mpremote romfs build)
    run(port, pixels)           run the model on the board; its JSON answer as a dict

Boards without a writable filesystem (the QEMU port, ROMFS-only builds) take the bundle as a
ROMFS image: `mpremote romfs deploy` where the port can write its ROMFS partition
(vfs.rom_ioctl 3/4/5), and on the QEMU port, whose ROMFS partition is emulated RAM without those
ioctls, by writing the image into the partition's memory (uctypes) a deflated chunk at a time;
a soft reset then mounts it at /rom, as a board does at boot. The bundle runs from there:
bytecode (.mpy) executes in place, leaving the heap for data.
"""
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zlib

from ..errors import BoardError
from .export import TOP_FILES, flash_command

CHUNK = 16384  # image bytes per transfer (deflated + base64 on the wire)


def _transport(port, timeout=10):
    """mpremote's SerialTransport in the raw REPL; BoardError for no device or no MicroPython."""
    try:
        from mpremote.transport import TransportError
        from mpremote.transport_serial import SerialTransport
    except ImportError:
        raise BoardError("mpremote is not installed: pip install mpremote") from None
    if not os.path.exists(port) and port.startswith("/dev/"):
        raise BoardError("no serial device at %s (is the board plugged in / is qemu running?)" % port)
    try:
        t = SerialTransport(port, baudrate=115200, timeout=1)  # a pty read blocks without one
    except (TransportError, OSError) as e:
        raise BoardError("cannot open %s: %s" % (port, e)) from None
    try:
        t.enter_raw_repl(soft_reset=True, timeout_overall=timeout)
    except (TransportError, OSError) as e:
        t.close()
        raise BoardError("%s does not answer as a MicroPython REPL (%s): is MicroPython "
                         "running on it, and nothing else holding the port?" % (port, e)) from None
    # it answers: now reads may wait on a busy board (raw paste's flow control reads a byte and
    # fails on an empty one), while the short timeout above kept a silent port from hanging
    t.serial.timeout = 60
    return t


def _exec(t, code, what, timeout=10):
    """Run code in the raw REPL; its output. timeout: seconds of silence allowed."""
    from mpremote.transport import TransportError
    try:
        out, err = t.exec_raw(code, timeout=timeout)
    except (TransportError, OSError) as e:
        raise BoardError("%s: the serial link failed: %s" % (what, e)) from None
    if err.strip():
        traceback = err.decode(errors="replace").strip()
        last = traceback.splitlines()[-1]
        if last.startswith("MemoryError"):
            raise BoardError("%s: the board ran out of memory (%s): run fewer samples at once, "
                             "export-micro --mpy (bytecode runs from flash), cinders quantize the "
                             "record, or use a board with more RAM (qemu: cinders firmware --heap)"
                             % (what, last))
        # the board's own message first: the traceback's frames are the runtime's, not the user's
        raise BoardError("%s failed on the board: %s\n%s" % (what, last, traceback))
    return out.decode()


def _eval(t, expr, what):
    return json.loads(_exec(t, "import json\nprint(json.dumps(%s))" % expr, what).strip())


PROBE = """
import os, sys
try:
    import vfs
    rom = hasattr(vfs, "rom_ioctl") and vfs.rom_ioctl(1) > 0
except ImportError:
    rom = False
try:
    f = open("/.cinders-probe", "w"); f.close(); os.remove("/.cinders-probe"); fs = True
except OSError:
    fs = False
info = {"platform": sys.platform, "fs": fs, "rom": rom}
def ls(path):
    try:
        return os.listdir(path)
    except OSError:  # /rom before any image was written
        return []
if rom:
    seg = vfs.rom_ioctl(2, 0)
    info["rom_size"] = len(seg) if not hasattr(seg, "ioctl") else seg.ioctl(4, 0) * seg.ioctl(5, 0)
    # the QEMU port implements no ROMFS write ioctls; the other ports that have ROMFS do
    info["rom_writable"] = hasattr(seg, "ioctl") or sys.platform != "qemu"
"""


def probe(t):
    """What the board offers: platform, writable filesystem, ROMFS partition and its size."""
    _exec(t, PROBE, "probing the board")
    return _eval(t, "info", "probing the board")


def _mpremote(name):
    """The mpremote executable: on PATH, or beside this Python (a virtual environment's bin)."""
    exe = shutil.which(name) or os.path.join(os.path.dirname(sys.executable), name)
    if not os.path.exists(exe):
        raise BoardError("mpremote not found: pip install mpremote")
    return exe


def romfs_image(bundle_dir, out_path, mpremote="mpremote"):
    """The bundle as a ROMFS image (`mpremote romfs build`); returns its size in bytes."""
    _check_bundle(bundle_dir)
    r = subprocess.run([_mpremote(mpremote), "romfs", "--no-mpy", "--output", out_path, "build", bundle_dir],
                       capture_output=True, text=True)
    if r.returncode != 0 or not os.path.exists(out_path):
        raise BoardError("mpremote romfs build failed: %s" % (r.stderr or r.stdout).strip())
    return os.path.getsize(out_path)


def _check_bundle(bundle_dir):
    flash_command(bundle_dir, "-")  # raises FileNotFoundError naming what is missing


WRITE_RAM = """
import vfs, uctypes, binascii, deflate, io
seg = vfs.rom_ioctl(2, 0)
mem = uctypes.bytearray_at(uctypes.addressof(seg), len(seg))
def put(offset, b64):
    data = deflate.DeflateIO(io.BytesIO(binascii.a2b_base64(b64)), deflate.RAW, 9).read()
    mem[offset:offset + len(data)] = data
try:
    vfs.umount("/rom")
except OSError:
    pass
"""


def flash(bundle_dir, port, method="auto", mpremote="mpremote", log=sys.stderr, timeout=10):
    """Install the bundle on the board at `port`; returns "fs" or "romfs" (how it went).
    timeout: seconds to wait for the board's REPL."""
    _check_bundle(bundle_dir)
    if method not in ("auto", "fs", "romfs"):
        raise BoardError("method must be auto, fs or romfs, got %r" % (method,))
    t = _transport(port, timeout)
    try:
        info = probe(t)
        if method == "fs" or (method == "auto" and info["fs"]):
            if not info["fs"]:
                raise BoardError("the board at %s has no writable filesystem: flash with "
                                 "--method romfs" % port)
            t.close()
            t = None
            r = subprocess.run(flash_command(bundle_dir, port, _mpremote(mpremote)), cwd=bundle_dir)
            if r.returncode != 0:
                raise BoardError("mpremote fs cp failed (exit %d)" % r.returncode)
            return "fs"
        if not info["rom"]:
            raise BoardError("the board at %s (%s) has neither a writable filesystem nor a ROMFS "
                             "partition: build its firmware with MICROPY_VFS_ROM or a filesystem"
                             % (port, info["platform"]))
        with tempfile.TemporaryDirectory() as d:
            image = os.path.join(d, "bundle.romfs")
            size = romfs_image(bundle_dir, image, mpremote)
            if size > info["rom_size"]:
                raise BoardError("the bundle is too large for the board's flash: its ROMFS image "
                                 "is %d bytes, the partition holds %d (quantize the record: "
                                 "cinders quantize, or use a smaller model)" % (size, info["rom_size"]))
            print("cinders: writing a %d-byte ROMFS image to %s" % (size, port), file=log, flush=True)
            if info["rom_writable"]:
                t.close()
                t = None
                r = subprocess.run([_mpremote(mpremote), "connect", port, "romfs", "deploy", image])
                if r.returncode != 0:
                    raise BoardError("mpremote romfs deploy failed (exit %d)" % r.returncode)
                return "romfs"
            _write_ram(t, image)  # the QEMU port: its partition is emulated RAM
        return "romfs"
    finally:
        if t is not None:
            t.close()


def _write_ram(t, image):
    with open(image, "rb") as f:
        data = f.read()
    _exec(t, WRITE_RAM, "preparing the ROMFS partition")
    for offset in range(0, len(data), CHUNK):
        c = zlib.compressobj(9, zlib.DEFLATED, -9)
        packed = c.compress(data[offset:offset + CHUNK]) + c.flush()
        _exec(t, "put(%d, %r)" % (offset, base64.b64encode(packed)), "writing the ROMFS image")
    # a soft reset mounts the new image at /rom, as at boot
    t.exit_raw_repl()
    t.enter_raw_repl(soft_reset=True)
    got = _eval(t, "__import__('os').listdir('/rom')", "mounting the ROMFS image")
    missing = [n for n in TOP_FILES + ("lib",) if n not in got]
    if missing:
        raise BoardError("the ROMFS image did not mount: /rom lacks %s" % ", ".join(missing))


RUN = """
import gc
gc.collect()
total = gc.mem_free() + gc.mem_alloc()
if %(heap)d > total:
    raise ValueError("the board's heap is %%d bytes, less than the %(heap)d asked for" %% total)
reserved = bytearray(total - %(heap)d) if %(heap)d else None
import os, sys, json, time
from array import array
from binascii import a2b_base64
os.chdir(%(root)r)
if "lib" not in sys.path:
    sys.path.append("lib")
import cinders.safetensors
with open("model.safetensors", "rb") as f:
    shape = json.loads(cinders.safetensors.Reader(f).metadata.get("input_shape") or "null")
values = array("f", a2b_base64(%(values)r))
import model
import cinders
from cinders import record, run
sample = shape or %(nested)r  # a record without input_shape: the nesting is one sample
n = 1
for d in sample:
    n *= d
if len(values) %% n:
    raise ValueError("the input holds %%d numbers, expected a multiple of %%d (one sample of "
                     "shape %%s)" %% (len(values), n, sample))
full = (len(values) // n,) + tuple(sample)
net = record.load_model("model.safetensors", model)
gc.collect()
t0 = time.ticks_us()
out = run.result(net(cinders.tensor(values, full)))
us = time.ticks_diff(time.ticks_us(), t0)
out.update({"engine": cinders.ENGINE, "us": us, "heap_free": gc.mem_free()})
print(json.dumps(out))
"""


def execute(port, code, what="running a script", timeout=120, connect_timeout=10):
    """Run MicroPython `code` on the board at `port` (raw REPL); what it printed. timeout:
    seconds the board may stay silent while it computes."""
    t = _transport(port, connect_timeout)
    try:
        return _exec(t, code, what, timeout)
    finally:
        t.close()


def flat_input(values):
    """(flat floats, nested shape) of an input given as a number list, flat or nested and
    rectangular."""
    if not isinstance(values, list) or not values:
        raise BoardError("an input is a non-empty JSON list of numbers, flat or nested")
    if not isinstance(values[0], list):
        try:
            return [float(v) for v in values], [len(values)]
        except (TypeError, ValueError):
            raise BoardError("an input is a JSON list of numbers, flat or nested: it holds %r"
                             % (next(v for v in values if not isinstance(v, (int, float))),)) from None
    rows = [flat_input(v) for v in values]
    if any(r[1] != rows[0][1] for r in rows):
        raise BoardError("an input's nested lists must be rectangular: rows of shapes %s and %s"
                         % (rows[0][1], next(r[1] for r in rows if r[1] != rows[0][1])))
    return [x for r in rows for x in r[0]], [len(rows)] + rows[0][1]


def run(port, values, root=None, timeout=120, connect_timeout=10, heap=None):
    """Run the flashed model on one input (nested or flat number lists: one sample of the
    record's input_shape or a batch; a record without one takes the nesting as one sample's
    shape); the board's JSON answer as a dict: like predict.py's (class and logits, or output),
    engine, us (time.ticks_us around the forward), heap_free. timeout: seconds
    the board may stay silent while it computes; heap: bytes of heap to run in (the rest is
    reserved in one block right after the soft reset, as if the board had less RAM)."""
    import array
    flat, nested = flat_input(values)
    buf = array.array("f", flat)
    if sys.byteorder != "little":
        buf.byteswap()
    t = _transport(port, connect_timeout)
    try:
        if root is None:
            info = probe(t)
            for root in (["/rom"] if info["rom"] else []) + ["/"]:
                if "model.safetensors" in _eval(t, "ls(%r)" % root, "listing the board's files"):
                    break
            else:
                raise BoardError("no bundle on the board at %s: flash one first (cinders flash "
                                 "BUNDLE --port %s)" % (port, port))
        out = _exec(t, RUN % {"root": root, "values": base64.b64encode(buf.tobytes()),
                              "nested": nested, "heap": heap or 0},
                    "running the model" + (" in a %d-byte heap" % heap if heap else ""), timeout)
    finally:
        t.close()
    lines = [ln for ln in out.strip().splitlines() if ln.startswith("{")]
    if not lines:
        raise BoardError("the board printed no answer: %r" % out[-500:])
    return json.loads(lines[-1])
