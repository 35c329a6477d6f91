"""Binding a safetensors record to a model on the board, without loading it whole.

Weights stay in the file and are read a row at a time while a layer runs (a 784x128 float layer
is 400 KB: more than an ESP32 has; a layer names the tensors that may stay there in `_streamed`);
only weights up to `resident_bytes` (1 KB by default: more
buys little speed and costs contiguous RAM, the scarce kind) and the small tensors (biases,
scales, norms) are read into RAM once. Pass a larger resident_bytes where RAM is plentiful (the
browser page does).
int8 records (`cinders quantize`) hold "<name>" as I8 and "<name>.scale" as F32, one scale per
output row, and say quantization="int8-per-channel-symmetric" in their metadata: the records the
desktop reads (cinders.record.validate.check_quantized), checked the same way here. Weight
matrices and kernels stay int8 in RAM and are scaled as they are used; other int8 tensors (a
norm's weight, a bias: `cinders quantize` never writes them) are refused, since those layers
read plain floats.
"""

import gc
import json
import sys

from cinders._tensor import empty

RESIDENT_BYTES = 1024
_TYPECODES = {"F32": "f", "I8": "b"}
_SIZES = {"f": 4, "b": 1}
_IGNORED = ("num_batches_tracked",)  # bookkeeping tensors of training, not weights


class Param:
    """One tensor of the record: in RAM (`data`) or in the file, read by `chunks`."""

    def __init__(self, reader, info, resident, scale=None):
        tc = _TYPECODES[info.dtype]  # load has checked it
        self.name = info.name
        self.typecode = tc
        self.rows = info.shape[0] if info.shape else 1
        self.row_len = (info.nbytes // _SIZES[tc]) // max(self.rows, 1)
        self.scale = scale
        self.data = None
        self._f = reader.f
        self._offset = reader.data_start + info.begin
        self._row_bytes = info.nbytes // max(self.rows, 1)
        if resident:
            self.data = reader.read_into(info.name, empty(tc, info.nbytes // _SIZES[tc]))

    def chunks(self, k):
        """Yield (first row, number of rows, flat values of those rows) for k rows at a time."""
        L = self.row_len
        rows = self.rows
        if self.data is not None:
            mv = memoryview(self.data)
            for j in range(0, rows, k):
                n = min(k, rows - j)
                yield j, n, mv[j * L:(j + n) * L]
            return
        gc.collect()  # the scratch wants one contiguous block (8 KB for the CNN's chunks)
        buf = memoryview(empty(self.typecode, L * min(k, rows)))
        f = self._f
        for j in range(0, rows, k):
            n = min(k, rows - j)
            view = buf[:n * L]
            f.seek(self._offset + j * self._row_bytes)
            if f.readinto(view) != n * self._row_bytes:
                from cinders.safetensors import RecordError
                raise RecordError("tensor %r: record file truncated at row %d" % (self.name, j))
            yield j, n, view


def load(model, f, resident_bytes=RESIDENT_BYTES, reader=None):
    """Bind the tensors of the open record file `f` to `model` by state_dict name.

    Every parameter the model declares must be in the record with its shape and dtype (int8
    records checked as the desktop checks them: cinders.record.validate.check_quantized), and
    every tensor of the record must be used; otherwise RecordError names them and nothing is
    half-bound.
    """
    from cinders.safetensors import Reader, RecordError
    r = reader if reader is not None else Reader(f)
    scheme = r.metadata.get("quantization")  # the one of cinders.record.validate
    if scheme not in (None, "int8-per-channel-symmetric"):
        raise RecordError("unknown quantization %r (the board reads int8-per-channel-symmetric)"
                          % (scheme,))
    bound = []
    used = {}
    for prefix, layer in model.named_modules():
        shapes = layer.param_shapes()
        for pname in layer._params:
            name = prefix + pname
            info = r.info(name)
            if info.shape != shapes[pname]:
                raise RecordError("tensor %r: the record has shape %s, %s expects %s"
                                  % (name, info.shape, type(layer).__name__, shapes[pname]))
            scale = None
            # int8 weight matrices and kernels, which Linear and the convolutions scale row by
            # row; other int8 tensors (read as plain floats by their layers) are refused
            if info.dtype == "I8" and scheme and pname == "weight" and len(info.shape) > 1:
                s = r.info(name + ".scale")
                if s.dtype != "F32" or s.shape != (info.shape[0],):
                    raise RecordError("tensor %r: expected F32 of shape (%d,), got %s %s"
                                      % (s.name, info.shape[0], s.dtype, s.shape))
                scale = r.read_into(s.name, empty("f", s.shape[0]))
                for v in scale:
                    if not 0.0 < v < float("inf"):
                        raise RecordError("%r holds %r: scales are positive and finite" % (s.name, v))
                used[s.name] = 1
            elif info.dtype != "F32":
                raise RecordError("tensor %r is %s: the board reads F32, and I8 weight matrices of"
                                  " int8-per-channel-symmetric records" % (name, info.dtype))
            resident = pname not in layer._streamed or info.nbytes <= resident_bytes
            bound.append((layer, pname, Param(r, info, resident, scale)))
            used[name] = 1
    extra = [n for n in r.order if n not in used and n.split(".")[-1] not in _IGNORED]
    if extra:
        raise RecordError("the record holds tensors the model does not use: %s" % ", ".join(extra))
    for layer, pname, param in bound:
        setattr(layer, pname, param)
    for _, layer in model.named_modules():
        layer.loaded()
    gc.collect()
    return model


def _resolve(path, cls_path, allow):
    """The class a record names, found only among the classes the caller allows (like the
    desktop's cn.load_model: a record never makes the board import anything). `allow` is a
    list of classes, or a module whose classes are allowed (the bundle's model.py)."""
    from cinders.nn import Module
    from cinders.safetensors import RecordError
    name = cls_path.split(".")[-1]
    if isinstance(allow, (list, tuple)):
        found = [c for c in allow if getattr(c, "__name__", None) == name]
        cls = found[0] if found else None
    else:
        cls = getattr(allow, name, None)
    if not (isinstance(cls, type) and issubclass(cls, Module)):
        raise RecordError("%s names model class %s, which is not among the allowed classes; pass "
                          "it: record.load_model(path, allow=[%s])" % (path, cls_path, name))
    return cls


def load_model(path, allow=(), resident_bytes=RESIDENT_BYTES):
    """Build the model class named in the record's metadata (one of `allow`) with the record's
    config and bind its weights.

    The file stays open while the model lives: streamed weights are read at every forward.
    """
    from cinders.safetensors import Reader, RecordError
    f = open(path, "rb")
    r = Reader(f)
    meta = r.metadata
    cls_path = meta.get("model_class")
    if not cls_path:
        raise RecordError("%s has no model_class in its metadata: build the model yourself and "
                          "call cinders.record.load(model, file)" % path)
    cls = _resolve(path, cls_path, allow)
    try:
        config = json.loads(meta.get("model_config") or "{}")
    except ValueError:
        raise RecordError("%s: model_config is not JSON" % path)
    if not isinstance(config, dict):
        raise RecordError("%s: model_config is not a JSON object" % path)
    n = f.seek(0, 2)  # numbers beyond the record's bytes would allocate before any weight is checked
    for k in config:
        for v in config[k] if type(config[k]) is list else (config[k],):
            if not (v is None or type(v) in (bool, str) or type(v) in (int, float) and -n <= v <= n):
                raise RecordError("%s: model_config[%r] is not bools, strings, numbers within %d" % (path, k, n))
    if meta.get("tensor_ops") != "0":  # export-micro found no operators in the model: skip
        from cinders import _ops  # noqa: F401  (gives tensors their operators)
    try:
        model = cls(**config)
    except TypeError as e:  # an unknown or missing key: the class's own words
        raise RecordError("%s: model_config does not fit %s: %s" % (path, cls_path, e))
    load(model, f, resident_bytes, r)
    r = None
    forget_reader()
    return model


def input_shape(text):
    """The shape of a record's input_shape ("[1, 28, 28]") or of --input-shape ("1,28,28"): 1 to 8
    positive integers, at most 2 ** 24 elements in all, checked before anything is allocated
    ([1e400], [0] and [1e9] are refused here, as on the desktop); () where none is given."""
    body = text.strip().strip("[]").strip()
    if not body:
        return ()
    shape = []
    n = 1
    for p in body.split(","):
        p = p.strip()
        d = int(p) if p.isdigit() and len(p) < 10 else 0  # not "1e400", "1.5", "-1", '"a"'
        n *= d
        shape.append(d)
    if not (0 < n <= 2 ** 24 and len(shape) <= 8):
        from cinders.safetensors import RecordError
        raise RecordError("input_shape %r is not 1 to 8 positive integers of at most %d "
                          "elements in all" % (text, 2 ** 24))
    return tuple(shape)


def forget_reader():
    """Drop the safetensors module once the weights are bound: its code (~10 KB of RAM on a
    64-bit port) is needed again only to load another record, which re-imports it."""
    sys.modules.pop("cinders.safetensors", None)
    pkg = sys.modules.get("cinders")
    if pkg is not None and "safetensors" in pkg.__dict__:
        del pkg.__dict__["safetensors"]
    gc.collect()
