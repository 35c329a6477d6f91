"""Model records: a module's tensors in a safetensors file, with the metadata to rebuild it.

    model.save("mnist-cnn.safetensors", dtype=cn.float16)
    model.load("mnist-cnn.safetensors")            # in place, all or nothing
    MnistCNN.load("mnist-cnn.safetensors")         # a new model, config from the file
    cn.load_model("mnist-cnn.safetensors")         # class and config from the file

The byte format is in `safetensors.py` (shared with the micro runtime and Pyodide). Metadata
(all strings, as the format requires):
    format="cinders", cinders_version, model_class ("cinders.models.mnist.MnistCNN"),
    model_config (JSON of model.config()), dtype ("float32" | "float16")
plus whatever a caller adds (checkpoints add their own keys).

Loading validates everything first (header, names, shapes, dtypes, every tensor's bytes) and
only then assigns, so a bad file leaves the model exactly as it was. Rebuilding a model from a
file looks its class up in a registry (registry.py) and never imports anything a file names; the
config is checked against the file's own tensors on shapes alone before anything is allocated
(validate.py). NaN/infinite weights, unknown formats and records of a newer cinders are refused.
"""

import json
import os

from .. import dtypes
from ..errors import CindersError, DTypeError, RecordError
from ..files import check_writable_target, open_regular
from ..tensor import Tensor
from . import safetensors, safetensors_write, validate
from .pytorch import load_pytorch  # noqa: F401  (cinders.record.load_pytorch: torch.save files)
from .registry import class_path, register_model, resolve_class  # noqa: F401  (the public names)

FORMAT = validate.FORMAT

_CODE_OF = {dtypes.float32: "F32", dtypes.float16: "F16", dtypes.int32: "I32", dtypes.bool_: "BOOL",
            dtypes.int8: "I8", dtypes.uint8: "U8"}
_STORED_AS = {"F16": dtypes.float16, "I8": dtypes.int8, "U8": dtypes.uint8}  # read_tensors(keep_dtypes)
# What each stored dtype becomes in memory (float16 is storage only; tensors compute in float32).
_TENSOR_DTYPE = validate.TENSOR_DTYPE


def _version():
    from .. import __version__
    return __version__


def model_metadata(model, dtype):
    config = model.config() if hasattr(model, "config") else {}
    return {"format": FORMAT, "cinders_version": _version(), "model_class": class_path(type(model)),
            "model_config": json.dumps(config, sort_keys=True), "dtype": dtype.name}


def _storage_dtype(dtype):
    dtype = dtypes.from_name(dtype) if isinstance(dtype, str) else dtype
    if dtype not in (dtypes.float32, dtypes.float16):
        raise RecordError("records store float tensors as cn.float32 or cn.float16, not %r" % (dtype,))
    return dtype


def save_tensors(path, tensors, metadata=None, dtype=dtypes.float32):
    """Write {name: Tensor} atomically (temp file + os.replace): a crash never leaves half a file.

    Float32 tensors are stored as `dtype` (float32 or float16); every other dtype keeps its own
    (int32, bool, and the storage dtypes int8 -> I8, uint8 -> U8, float16 -> F16).
    """
    dtype = _storage_dtype(dtype)
    check_writable_target(path, RecordError)
    entries = []
    for name, t in tensors.items():
        code = _CODE_OF[dtype] if t.dtype is dtypes.float32 else _CODE_OF[t.dtype]

        def payload(t=t, code=code, name=name):  # encode one tensor at a time, while writing
            return safetensors_write.encode(t.backend.to_flat(t.handle), code, name)

        entries.append((name, code, t.shape, payload))
    tmp = "%s%s%d" % (path, TMP_SUFFIX, os.getpid())
    try:
        with open(tmp, "wb") as f:
            safetensors_write.write(f, entries, metadata)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    remove_stale_temporaries(path)


TMP_SUFFIX = ".tmp-"  # save_tensors writes PATH.tmp-PID, then renames it to PATH


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, AttributeError):  # another user's process, or no os.kill (Pyodide): keep it
        return True
    return True


def remove_stale_temporaries(path):
    """Delete PATH.tmp-PID files left by writers that were killed mid-write (their process is
    gone); a write in progress in a live process keeps its file. Returns the removed paths."""
    folder, name = os.path.split(os.path.abspath(path))
    removed = []
    try:
        entries = os.listdir(folder)
    except OSError:
        return removed
    for entry in entries:
        pid = entry[len(name) + len(TMP_SUFFIX):]
        if entry.startswith(name + TMP_SUFFIX) and pid.isdigit() and int(pid) != os.getpid() \
                and not _alive(int(pid)):
            try:
                os.remove(os.path.join(folder, entry))
                removed.append(os.path.join(folder, entry))
            except OSError:
                pass
    return removed


def _open(path):
    return open_regular(path, RecordError, "record")


def read_header(path):
    """(metadata, {name: (dtype code, shape)}) of a record: its header only, validated
    (`safetensors.parse_header`, `validate.check_format`), no tensor bytes read."""
    with _open(path) as f:
        reader = safetensors.Reader(f)
        validate.check_format(reader.metadata, "record %r" % (path,))
        return reader.metadata, {n: (reader.info(n).dtype, reader.info(n).shape) for n in reader.names()}


def nonfinite_names(tensors):
    """Names of the float tensors of {name: Tensor} that hold NaN or infinity: what a record
    declares in its "nonfinite" metadata when they are part of the model (an ONNX -inf mask)."""
    return [name for name, t in tensors.items() if t.dtype is dtypes.float32
            and not validate.all_finite(t.backend.to_flat(t.handle))]


def read_tensors(path, backend, expected=None, allow_nonfinite=False, keep_dtypes=False):
    """(metadata, {name: Tensor on backend}) of a record, everything validated before returning.

    I8/U8/F16 tensors are widened to int32/float32 (what models compute in), or with keep_dtypes
    kept as cn.int8/uint8/float16 at their size (the backend must hold them: DTypeError if not).

    expected: optional {name: (shape, dtype)}; names missing or unexpected and shape or dtype
    mismatches raise RecordError listing all of them. Float tensors holding NaN or infinity
    raise RecordError unless allow_nonfinite or the record's "nonfinite" metadata names them.
    """
    where = "record %r" % (path,)
    with _open(path) as f:
        reader = safetensors.Reader(f)
        validate.check_format(reader.metadata, where)
        declared = validate.declared_nonfinite(reader.metadata, where)
        if expected is not None:
            _check_expected(path, reader, expected)
        out = {}
        for name in reader.names():
            info = reader.info(name)
            dtype = _TENSOR_DTYPE[info.dtype]
            values = reader.read(name)
            if dtype is dtypes.float32:
                validate.check_finite(name, values, where, allow_nonfinite or name in declared)
            if keep_dtypes and info.dtype in _STORED_AS:
                dtype = _STORED_AS[info.dtype]
                if dtype not in backend.storage_dtypes:
                    raise DTypeError("read_tensors: %r does not hold %r tensors (%s in %r); read "
                                     "without keep_dtypes" % (backend, dtype, name, path))
            out[name] = Tensor(backend, backend.from_flat(values, info.shape, dtype), info.shape, dtype)
        return reader.metadata, out


def _check_expected(path, reader, expected):
    have = {}
    for name in reader.names():
        info = reader.info(name)
        have[name] = (info.shape, _TENSOR_DTYPE[info.dtype])
    check_match(path, have, expected)


def check_match(where, have, expected):
    """Raise RecordError listing every difference between two {name: (shape, dtype)} tables."""
    problems = []
    missing = [n for n in expected if n not in have]
    unexpected = [n for n in have if n not in expected]
    if missing:
        problems.append("missing tensors: " + ", ".join(missing))
    if unexpected:
        problems.append("unexpected tensors: " + ", ".join(unexpected))
    for name, (shape, dtype) in expected.items():
        if name not in have:
            continue
        got_shape, got_dtype = have[name]
        if tuple(got_shape) != tuple(shape):
            problems.append("%s: shape %s in the file, %s in the model" % (name, tuple(got_shape), tuple(shape)))
        elif got_dtype is not dtype:
            problems.append("%s: %r in the file, %r in the model" % (name, got_dtype, dtype))
    if problems:
        raise RecordError("record %r does not match the model: %s" % (where, "; ".join(problems)))


def spec_of(state):
    """{name: (shape, dtype)} of a state_dict, what check_match compares."""
    return {n: (t.shape, t.dtype) for n, t in state.items()}


# ---------------------------------------------------------------- modules

def save(model, path, dtype=dtypes.float32, metadata=None):
    """model.save(path, dtype): its state_dict plus the metadata that rebuilds it."""
    dtype = _storage_dtype(dtype)
    meta = model_metadata(model, dtype)
    if metadata:
        meta.update(metadata)
    save_tensors(path, model.state_dict(), meta, dtype)
    return path


def backend_of(state):
    for t in state.values():
        return t.backend
    from ..tensor import default_backend
    return default_backend()


def load_into(model, path, allow_nonfinite=False):
    """model.load(path): replace the model's tensors with the record's, all or nothing."""
    metadata, _ = read_header(path)  # RecordError for a missing, bad or too new file
    if metadata.get("quantization"):  # int8 records (`cinders quantize`) load dequantized to float32
        from ..micro.quantize import load_into as load_quantized
        return load_quantized(model, path, allow_nonfinite=allow_nonfinite)
    state = model.state_dict()
    _, tensors = read_tensors(path, backend_of(state), spec_of(state), allow_nonfinite)
    model.load_state_dict(tensors)
    return model


def read_metadata(path):
    return read_header(path)[0]


def build_model(cls, metadata, path, backend=None, table=None):
    """cls(**model_config) from the record's metadata, moved to backend.

    With the file's header `table` ({name: (dtype code, shape)}), the config is first checked
    (types, then a build on shapes only against the file's tensors), so a config that would
    allocate more than the file holds is refused before anything is allocated.
    """
    where = "record %r" % (path,)
    try:
        config = json.loads(metadata.get("model_config", "{}"))
    except (ValueError, RecursionError):
        raise RecordError("%s: model_config is not JSON" % (where,)) from None
    validate.check_config(cls, config, where)
    if table is not None:
        validate.plan_model(cls, config, validate.file_spec(table, metadata), where)
    try:
        model = cls(**config)
    except (CindersError, TypeError, ValueError) as e:
        raise RecordError("%s: model_config %s does not fit %s (%s)"
                          % (where, metadata.get("model_config"), class_path(cls), e)) from None
    return model.to(backend) if backend is not None else model


def load_model(path, backend=None, allow=(), allow_nonfinite=False):
    """Rebuild the model a record describes (class and config from its metadata) and load it.

    The class is looked up, never imported (`registry.resolve_class`): Cinders' own models,
    classes registered with `cn.register_model`, and the classes (or modules) in `allow`.
    """
    from ..nn import Module
    metadata, table = read_header(path)
    if metadata.get("kind") == "checkpoint":
        raise RecordError("%r is a training checkpoint, not a model record: get the model out with "
                          "`cinders extract-model %s --out MODEL.safetensors` (or "
                          "cinders.train.extract_model)" % (path, path))
    name = metadata.get("model_class")
    if not name:
        raise RecordError("record %r names no model_class; load it into a model with model.load()" % (path,))
    cls = resolve_class(name, allow, "record %r" % (path,))
    if not (isinstance(cls, type) and issubclass(cls, Module)):
        raise RecordError("record %r: %s is not a cinders.nn.Module" % (path, name))
    model = load_into(build_model(cls, metadata, path, backend, table), path, allow_nonfinite)
    if metadata.get("input_shape"):  # kept for the next save (what exporters feed the model)
        try:
            model._input_shape = validate.input_shape(metadata["input_shape"], "record %r" % (path,))
        except CindersError:
            pass  # metadata for exporters only: a bad one is their error to report
    return model


def load_as(cls, path, backend=None, allow_nonfinite=False):
    """Model.load(path) on the class: a new `cls` from the record's config, then its tensors."""
    metadata, table = read_header(path)
    return load_into(build_model(cls, metadata, path, backend, table), path, allow_nonfinite)


class LoadMethod:
    """Module.load: `Model.load(path, backend=None)` on the class builds a new model from the
    record's config; `model.load(path)` on an instance loads in place and returns the model.
    Both take allow_nonfinite=True to accept NaN/infinite weights."""

    def __get__(self, model, cls):
        if model is None:
            def load(path, backend=None, allow_nonfinite=False):
                return load_as(cls, path, backend, allow_nonfinite)
        else:
            def load(path, allow_nonfinite=False):
                return load_into(model, path, allow_nonfinite)
        load.__doc__ = LoadMethod.__doc__
        return load
