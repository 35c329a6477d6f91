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
    return backend.inner if hasattr(backend, "to_inner") else backend


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
    try:
        progress = json.loads(metadata["progress"])
        opt_meta = json.loads(metadata["optimizer"])
    except (KeyError, ValueError) as e:
        raise RecordError("checkpoint %r: bad progress/optimizer metadata (%s)" % (path, e)) from None
    if opt_meta.get("class") != type(optimizer).__name__:
        raise RecordError("checkpoint %r holds %s state, not %s" % (path, opt_meta.get("class"),
                                                                    type(optimizer).__name__))
    model_tensors = {k[len("model/"):]: v for k, v in tensors.items() if k.startswith("model/")}
    record.check_match(path, record.spec_of(model_tensors), record.spec_of(state))
    opt_state = {p: dict(entries) for p, entries in opt_meta.get("numbers", {}).items()}
    params = set(p for p, _ in model.named_parameters())
    for key, value in tensors.items():
        if key.startswith("optim/"):
            param_path, _, name = key[len("optim/"):].rpartition("/")
            if param_path not in params:
                raise RecordError("checkpoint %r: optimizer state for unknown parameter %r" % (path, param_path))
            opt_state.setdefault(param_path, {})[name] = value
        elif not key.startswith("model/"):
            raise RecordError("checkpoint %r: unexpected tensor %r" % (path, key))
    model.load_state_dict(model_tensors)  # validated above: cannot fail half-way
    optimizer.load_state_dict({"steps": opt_meta["steps"], "state": opt_state})
    return progress
