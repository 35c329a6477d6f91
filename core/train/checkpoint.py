"""Training checkpoints: model + optimizer state + progress in one safetensors file.

Tensors: "model/<state key>" for the model, "optim/<parameter path>/<name>" for optimizer
state tensors (Adam's moments...). Metadata: the model record's keys (class, config,
version), plus
    kind="checkpoint", progress (JSON: epoch, batch, history, metric sums, early-stopping state),
    optimizer (JSON: step count and the numeric entries of the optimizer state).
Written atomically (temp file + os.replace), so an interrupted write leaves the previous one;
the temp file a killed write leaves behind is removed by the next save or resume.
"""

import json

from .. import record
from ..dtypes import float32
from ..errors import RecordError
from ..tensor import Tensor


def _inner(backend):
    return backend.inner if backend.differentiable else backend


def save_checkpoint(path, model, optimizer, progress):
    tensors = {"model/" + k: v for k, v in model.state_dict().items()}
    saved = optimizer.state_dict()
    numbers = {}
    for param_path, entries in saved["state"].items():
        for name, value in entries.items():
            if isinstance(value, Tensor):
                tensors["optim/%s/%s" % (param_path, name)] = value
            else:
                numbers.setdefault(param_path, {})[name] = value
    meta = record.model_metadata(model, float32)
    if getattr(model, "_input_shape", None):  # what extract_model's record gives exporters
        meta["input_shape"] = json.dumps(list(model._input_shape))
    meta.update({"kind": "checkpoint", "progress": json.dumps(progress),
                 "optimizer": json.dumps({"class": type(optimizer).__name__,
                                          "steps": saved["steps"], "numbers": numbers})})
    record.save_tensors(path, tensors, meta)


def load_checkpoint(path, model, optimizer):
    """Restore model and optimizer from a checkpoint, all or nothing; returns its progress.
    Temporary files of checkpoint writes that were killed are removed."""
    record.remove_stale_temporaries(path)
    state = model.state_dict()
    backend = record.backend_of(state)
    metadata, tensors = record.read_tensors(path, _inner(backend))
    if metadata.get("kind") != "checkpoint":
        raise RecordError("%r is not a training checkpoint (a model record? load it with model.load)" % (path,))
    progress = _json_object(path, metadata, "progress")
    opt_meta = _json_object(path, metadata, "optimizer")
    _check_progress(path, progress)
    if opt_meta.get("class") != type(optimizer).__name__:
        raise RecordError("checkpoint %r holds %s state, not %s" % (path, opt_meta.get("class"),
                                                                    type(optimizer).__name__))
    steps, numbers = opt_meta.get("steps"), opt_meta.get("numbers", {})
    if type(steps) is not int or steps < 0:
        raise RecordError("checkpoint %r: optimizer steps %r is not a count" % (path, steps))
    if not isinstance(numbers, dict) or not all(
            isinstance(v, dict) and all(_is_number(x) for x in v.values()) for v in numbers.values()):
        raise RecordError("checkpoint %r: optimizer numbers must be {parameter: {name: number}}" % (path,))
    model_tensors = {k[len("model/"):]: v for k, v in tensors.items() if k.startswith("model/")}
    record.check_match(path, record.spec_of(model_tensors), record.spec_of(state))
    opt_state = {p: dict(entries) for p, entries in numbers.items()}
    params = {p: t.shape for p, t in model.named_parameters()}
    unknown = [p for p in numbers if p not in params]
    if unknown:
        raise RecordError("checkpoint %r: optimizer numbers for unknown parameters %s" % (path, ", ".join(unknown)))
    for key, value in tensors.items():
        if key.startswith("optim/"):
            param_path, _, name = key[len("optim/"):].rpartition("/")
            if param_path not in params:
                raise RecordError("checkpoint %r: optimizer state for unknown parameter %r" % (path, param_path))
            if value.shape != params[param_path]:  # moments and momenta have their parameter's shape
                raise RecordError("checkpoint %r: optimizer state %r has shape %s, its parameter %s"
                                  % (path, key, value.shape, params[param_path]))
            opt_state.setdefault(param_path, {})[name] = value
        elif not key.startswith("model/"):
            raise RecordError("checkpoint %r: unexpected tensor %r" % (path, key))
    model.load_state_dict(model_tensors)  # validated above: cannot fail half-way
    optimizer.load_state_dict({"steps": steps, "state": opt_state})
    return progress


def _is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) != float("inf")


def _json_object(path, metadata, key):
    try:
        value = json.loads(metadata[key])
    except KeyError:
        raise RecordError("checkpoint %r has no %s metadata" % (path, key)) from None
    except (ValueError, RecursionError) as e:
        raise RecordError("checkpoint %r: %s metadata is not JSON (%s)" % (path, key, e)) from None
    if not isinstance(value, dict):
        raise RecordError("checkpoint %r: %s metadata is not a JSON object" % (path, key))
    return value


def _check_progress(path, progress):
    """The progress the Learner writes (epoch, batch, elapsed, history, metrics, early_stopping),
    checked before anything is loaded, so a resume cannot fail half-way."""
    def bad(what):
        return RecordError("checkpoint %r: progress %s" % (path, what))
    for key in ("epoch", "batch"):
        if key in progress and (type(progress[key]) is not int or progress[key] < 0):
            raise bad("%s %r is not a count" % (key, progress[key]))
    if "elapsed" in progress and not _is_number(progress["elapsed"]):
        raise bad("elapsed %r is not a number" % (progress["elapsed"],))
    if not isinstance(progress.get("history", []), list) or not all(isinstance(h, dict) for h in progress.get("history", [])):
        raise bad("history is not a list of objects")
    for state in progress.get("metrics", []) if isinstance(progress.get("metrics", []), list) else [None]:
        if not (isinstance(state, dict) and _is_number(state.get("total")) and type(state.get("count")) is int):
            raise bad("metrics are not a list of {total, count}")
    stopping = progress.get("early_stopping")
    if stopping is not None and not (isinstance(stopping, dict) and _is_number(stopping.get("best", 0))
                                     and type(stopping.get("bad_epochs", 0)) is int):
        raise bad("early_stopping is not {best, bad_epochs}")


def extract_model(checkpoint_path, out_path):
    """Write the model record inside a Learner checkpoint (its "model/..." tensors and the
    model's class, config and input shape) to out_path; returns the record's metadata. Nothing
    is built: the tensors are copied as they are, so any model's checkpoint works."""
    with open(checkpoint_path, "rb") as f:
        meta = record.safetensors.Reader(f).metadata
    if meta.get("kind") != "checkpoint":
        raise RecordError("%s is not a training checkpoint (no kind=checkpoint in its metadata)"
                          % (checkpoint_path,))
    from ..backends.python_backend import Python
    _, tensors = record.read_tensors(checkpoint_path, Python())
    model = {k[len("model/"):]: v for k, v in tensors.items() if k.startswith("model/")}
    if not model:
        raise RecordError("%s holds no model tensors" % (checkpoint_path,))
    kept = {k: v for k, v in meta.items() if k not in ("kind", "progress", "optimizer")}
    record.save_tensors(out_path, model, kept, meta.get("dtype", "float32"))
    return kept
