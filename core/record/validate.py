"""Checks a record passes before anything is built from it or loaded out of it.

* `check_format`: the metadata's `format` is one this version reads and `cinders_version` is not
  newer than this one.
* `check_config`: each `model_config` value has the type the class's constructor expects.
* `plan_model`: the model a config describes is built first on a shape-only backend
  (`MetaBackend`: handles hold a shape and a dtype, no values), with a budget of elements tied
  to the tensors the file holds, and its state is compared with the file's header. Only a
  config that builds exactly the file's tensors is then built for real: a 400 KB record can
  never make the loader allocate gigabytes.
* `check_finite`, `check_quantized`: values and int8 scales that would silently give wrong
  results.
Every failure is a RecordError that names the file and the key or tensor at fault.
"""

import inspect
import json
import math

from .. import dtypes
from ..backend import Backend, broadcast_shape, numel as _numel
from ..ops import result_dtype
from ..errors import RecordError

FORMAT = "cinders"
# The `format` other safetensors writers put in the metadata: their files hold plain tensors.
FOREIGN_FORMATS = ("pt", "np", "tf", "flax", "mlx", "torch", "numpy")

# What each stored dtype becomes in memory (float16 is storage only; tensors compute in float32).
TENSOR_DTYPE = {"F32": dtypes.float32, "F16": dtypes.float32, "I32": dtypes.int32,
                "I8": dtypes.int32, "U8": dtypes.int32, "BOOL": dtypes.bool_}
QUANTIZED_SCHEME = "int8-per-channel-symmetric"
SCALE_SUFFIX = ".scale"


# ---------------------------------------------------------------- metadata

def _version_tuple(text, where):
    parts = text.split(".") if isinstance(text, str) else ()
    try:
        numbers = tuple(int(p) for p in parts[:3])
    except ValueError:
        numbers = ()
    if len(numbers) != 3 or any(n < 0 for n in numbers):
        raise RecordError("%s: cinders_version %r is not a version like '0.1.0'" % (where, text))
    return numbers


def check_format(metadata, where):
    """Refuse a `format` this version does not read and a record written by a newer cinders."""
    from .. import __version__
    fmt = metadata.get("format")
    if fmt is not None and fmt != FORMAT and fmt not in FOREIGN_FORMATS:
        raise RecordError("%s: metadata format %r is not one this cinders reads (%r records, or plain "
                          "safetensors tensors: %s)" % (where, fmt, FORMAT, ", ".join(FOREIGN_FORMATS)))
    written = metadata.get("cinders_version")
    if written is not None and _version_tuple(written, where) > _version_tuple(__version__, where):
        raise RecordError("%s was written by cinders %s, newer than this cinders %s: upgrade cinders "
                          "to load it" % (where, written, __version__))


# ---------------------------------------------------------------- values

def _first_nonfinite(values):
    for i, v in enumerate(values):
        if not math.isfinite(v):
            return i, v
    return None


def all_finite(values):
    # One C-speed pass: the double sum of float32 values cannot overflow, so it is finite
    # exactly when every value is.
    total = math.fsum(values) if not isinstance(values, (list, tuple)) else sum(values)
    return math.isfinite(total) or _first_nonfinite(values) is None


def declared_nonfinite(metadata, where):
    """The tensor names a record's "nonfinite" metadata (a JSON list) declares as holding NaN or
    infinity on purpose (import-onnx writes it for constants such as a -inf attention mask)."""
    text = metadata.get("nonfinite")
    if text is None:
        return frozenset()
    try:
        names = json.loads(text)
    except ValueError:
        names = None
    if not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
        raise RecordError("%s: metadata nonfinite must be a JSON list of tensor names" % (where,))
    return frozenset(names)


def check_finite(name, values, where, allow_nonfinite=False):
    """RecordError if float `values` hold NaN or infinity (unless allow_nonfinite)."""
    if allow_nonfinite or not len(values) or all_finite(values):
        return
    bad = _first_nonfinite(values)
    if bad is not None:
        raise RecordError("%s: tensor %r holds %r at flat index %d (NaN or infinite weights give "
                          "wrong results; pass allow_nonfinite=True to load them anyway)"
                          % (where, name, bad[1], bad[0]))


def check_quantized(metadata, table, where):
    """int8 records: every I8 tensor has a float32 `<name>.scale` of shape (rows,), and every
    scale belongs to one. table: {name: (dtype code, shape)}."""
    scheme = metadata.get("quantization")
    if not scheme:
        return
    if scheme != QUANTIZED_SCHEME:
        raise RecordError("%s: unknown quantization %r (this cinders reads %r)"
                          % (where, scheme, QUANTIZED_SCHEME))
    for name, (code, shape) in table.items():
        if name.endswith(SCALE_SUFFIX):
            base = table.get(name[:-len(SCALE_SUFFIX)])
            if base is None or base[0] != "I8":
                raise RecordError("%s: %r is a scale without an int8 tensor %r"
                                  % (where, name, name[:-len(SCALE_SUFFIX)]))
        if code != "I8":
            continue
        scale = table.get(name + SCALE_SUFFIX)
        if scale is None:
            raise RecordError("%s: int8 tensor %r has no %r" % (where, name, name + SCALE_SUFFIX))
        if not shape:
            raise RecordError("%s: int8 tensor %r is a scalar; int8 tensors have one scale per row"
                              % (where, name))
        if scale[0] != "F32":
            raise RecordError("%s: %r is %s; int8 scales are F32" % (where, name + SCALE_SUFFIX, scale[0]))
        if tuple(scale[1]) != (shape[0],):
            raise RecordError("%s: %r has shape %s; %r has %d rows, so it needs shape (%d,)"
                              % (where, name + SCALE_SUFFIX, tuple(scale[1]), name, shape[0], shape[0]))


def check_scales(name, values, where):
    """int8 scales must be positive and finite (quantize writes max|row| / 127, or 1)."""
    for i, s in enumerate(values):
        if not (s > 0.0 and math.isfinite(s)):
            raise RecordError("%s: %r[%d] = %r; int8 scales are positive and finite" % (where, name, i, s))


def file_spec(table, metadata):
    """{name: (shape, dtype)} the file's tensors load as (int8 records: dequantized, scales
    folded in), what a model's spec_of(state_dict()) must equal. table: {name: (code, shape)}."""
    quantized = bool(metadata.get("quantization"))
    spec = {}
    for name, (code, shape) in table.items():
        if quantized and name.endswith(SCALE_SUFFIX) and name[:-len(SCALE_SUFFIX)] in table:
            continue
        dtype = dtypes.float32 if quantized and code == "I8" else TENSOR_DTYPE[code]
        spec[name] = (tuple(shape), dtype)
    return spec


# ---------------------------------------------------------------- config

_KINDS = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
          list: "a list", tuple: "a list"}


def _fits(value, kind):
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is str:
        return isinstance(value, str)
    if kind in (list, tuple):
        return isinstance(value, list)
    return True


def _check_json_numbers(key, value, where, depth=0):
    if depth > 20:
        raise RecordError("%s: model_config[%r] is nested too deeply" % (where, key))
    if isinstance(value, float) and not math.isfinite(value):
        raise RecordError("%s: model_config[%r] holds %r; config values must be finite" % (where, key, value))
    if isinstance(value, list):
        for v in value:
            _check_json_numbers(key, v, where, depth + 1)
    elif isinstance(value, dict):
        for v in value.values():
            _check_json_numbers(key, v, where, depth + 1)


def _signature(cls):
    try:
        return inspect.signature(cls).parameters
    except (TypeError, ValueError):  # a constructor Python cannot describe: no type checks
        return None


def check_config(cls, config, where):
    """Each key is an argument of cls(...), and each value has the type of that argument's
    annotation (int, float, bool, str, list) or else of its default (an int where the default
    is an int...). Raises RecordError naming the key."""
    if not isinstance(config, dict):
        raise RecordError("%s: model_config is not a JSON object" % (where,))
    params = _signature(cls)
    for key, value in config.items():
        _check_json_numbers(key, value, where)
    if params is None:
        return
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    named = {k: p for k, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    for key, value in config.items():
        p = named.get(key)
        if p is None:
            if takes_any:
                continue
            raise RecordError("%s: model_config key %r is not an argument of %s (it takes: %s)"
                              % (where, key, cls.__qualname__, ", ".join(named) or "none"))
        default = p.default
        kind = p.annotation if p.annotation in _KINDS else type(default)  # `x: float = 0` is a float
        if kind not in _KINDS:
            continue
        if not _fits(value, kind) and not (value is None and default is None):
            raise RecordError("%s: model_config[%r] is %r; %s.%s takes %s (default %r)"
                              % (where, key, value, cls.__qualname__, key, _KINDS[kind], default))
    missing = [k for k, p in named.items() if p.default is p.empty and k not in config]
    if missing:
        raise RecordError("%s: model_config lacks %s, which %s needs"
                          % (where, ", ".join(repr(k) for k in missing), cls.__qualname__))


# ---------------------------------------------------------------- building on shapes only

class _Unsupported(Exception):
    """The model's constructor did something a shape-only backend cannot answer (read values)."""


class _OverBudget(Exception):
    pass


class _MetaHandle:
    __slots__ = ("backend", "shape", "dtype", "n", "__weakref__")

    def __init__(self, backend, shape, dtype):
        self.backend, self.shape, self.dtype = backend, tuple(shape), dtype
        self.n = _numel(self.shape)

    def __del__(self):
        self.backend.live -= self.n


class MetaBackend(Backend):
    """Handles are (shape, dtype) with no data: building a model on it costs no memory. Counts
    the elements alive at once and stops the build (with _OverBudget) past `limit`."""

    name = "meta"
    shares_constants = False

    def __init__(self, limit):
        self.limit = limit
        self.live = 0

    def device_key(self):
        return ("meta", id(self))

    def _new(self, shape, dtype):
        for d in shape:
            if not isinstance(d, int) or d < 0:
                raise _Unsupported("shape %r" % (shape,))
        h = _MetaHandle(self, shape, dtype)
        self.live += h.n
        if self.live > self.limit:
            raise _OverBudget()
        return h

    def shape(self, h):
        return h.shape

    def dtype(self, h):
        return h.dtype

    def from_flat(self, values, shape, dtype):
        return self._new(shape, dtype)

    def full(self, shape, value, dtype):
        return self._new(shape, dtype)

    def random(self, shape, distribution, seed, dtype):
        return self._new(shape, dtype)

    def to_flat(self, h):
        raise _Unsupported("the constructor reads tensor values")

    def unary(self, op, x):
        return self._new(x.shape, result_dtype(op, x.dtype))

    def binary(self, op, a, b):
        return self._new(broadcast_shape(a.shape, b.shape), result_dtype(op, a.dtype))

    def where(self, cond, a, b):
        return self._new(broadcast_shape(cond.shape, a.shape, b.shape), a.dtype)

    def cast(self, x, dtype):
        return self._new(x.shape, dtype)

    def reduce(self, op, x, axis, keepdim):
        shape = list(x.shape)
        if keepdim:
            shape[axis] = 1
        else:
            del shape[axis]
        return self._new(shape, result_dtype(op, x.dtype))

    def matmul(self, a, b):
        return self._new(broadcast_shape(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1]), a.dtype)

    def reshape(self, x, shape):
        return self._new(shape, x.dtype)

    def permute(self, x, dims):
        return self._new([x.shape[d] for d in dims], x.dtype)

    def expand(self, x, shape):
        return self._new(shape, x.dtype)

    def slice(self, x, starts, stops, steps):
        return self._new([len(range(a, b, s)) for a, b, s in zip(starts, stops, steps)], x.dtype)

    def cat(self, xs, axis):
        shape = list(xs[0].shape)
        shape[axis] = sum(x.shape[axis] for x in xs)
        return self._new(shape, xs[0].dtype)

    def pad(self, x, pads, value):
        return self._new([d + a + b for d, (a, b) in zip(x.shape, pads)], x.dtype)

    def gather(self, x, axis, index):
        return self._new(index.shape, x.dtype)

    def scatter_add(self, x, axis, index, src):
        return self._new(x.shape, x.dtype)

    def unfold2d(self, x, kernel, stride, padding, dilation, pad_value):
        from ..backend import unfold2d_output_size
        n, c, h, w = x.shape
        oh, ow = unfold2d_output_size(h, w, kernel, stride, padding, dilation)
        return self._new((n, c * kernel[0] * kernel[1], max(oh, 0) * max(ow, 0)), x.dtype)

    def fold2d(self, cols, size, kernel, stride, padding, dilation):
        n, ck, _ = cols.shape
        return self._new((n, ck // (kernel[0] * kernel[1]), size[0], size[1]), cols.dtype)


def _meta_build(cls, config, limit):
    """The state spec of cls(**config) built on a MetaBackend, or None when a shape-only build
    cannot tell (the constructor reads tensor values). The seeds cn.random draws
    when given none are put back, so checking a record does not change later random tensors."""
    from .. import creation
    from ..tensor import default_backend_here
    from . import spec_of
    seeds = creation._seed_counter[0]
    try:
        with default_backend_here(MetaBackend(limit)):
            return spec_of(cls(**config).state_dict())
    except _Unsupported:
        return None
    finally:
        creation._seed_counter[0] = seeds


def _builds(cls, config, limit):
    try:
        _meta_build(cls, config, limit)
        return True
    except Exception:  # noqa: BLE001  (any failure: this value is not the fix)
        return False


def _culprits(cls, config, limit):
    """Keys whose value, put back to the constructor's default, makes the build succeed."""
    params = _signature(cls) or {}
    found = []
    for key, value in config.items():
        p = params.get(key)
        if p is None or p.default is p.empty or p.default == value:
            continue
        trial = dict(config)
        trial[key] = p.default
        if _builds(cls, trial, limit):
            found.append(key)
    return found


def _blame(cls, config, limit):
    keys = _culprits(cls, config, limit)
    return "".join("; model_config[%r] = %r is the value at fault" % (k, config[k]) for k in keys)


def plan_model(cls, config, spec, where):
    """Check, without allocating, that cls(**config) (config already through check_config)
    builds exactly the tensors `spec` ({name: (shape, dtype)} of the file) describes. Returns
    True when checked, False when the constructor cannot run on shapes alone (it reads tensor
    values). Any exception of the constructor becomes a RecordError: the file chose the values."""
    from . import check_match
    elements = sum(_numel(shape) for shape, _ in spec.values())
    limit = 3 * elements + (1 << 20)  # parameters plus the temporaries of initialising one of them
    try:
        built = _meta_build(cls, config, limit)
    except _OverBudget:
        raise RecordError("%s: model_config %s builds a model larger than the file's %d elements%s "
                          "(nothing was allocated)" % (where, _short(config), elements,
                                                       _blame(cls, config, limit))) from None
    except RecordError:
        raise
    except Exception as e:  # noqa: BLE001  (whatever the constructor raises for these values)
        raise RecordError("%s: model_config %s does not build a %s (%s: %s)%s"
                          % (where, _short(config), cls.__qualname__, type(e).__name__, e,
                             _blame(cls, config, limit))) from None
    if built is None:
        return False
    check_match(where, spec, built)
    return True


def _short(config):
    import json
    text = json.dumps(config, sort_keys=True)
    return text if len(text) <= 200 else text[:200] + "..."


MAX_INPUT_RANK = 8


def input_shape(value, where):
    """One sample's shape from a record's `input_shape` (JSON text or a list): a tuple of at
    most MAX_INPUT_RANK positive ints whose product cn.limits allows. [1e400], [0], ["a"] or a
    billion-element shape are a RecordError here, not an OverflowError or ZeroDivisionError
    (or gigabytes) later in predict or an exporter."""
    from ..limits import check_shape
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise RecordError("%s: input_shape %s is not JSON" % (where, ascii(value[:80]))) from None
    if not (isinstance(value, (list, tuple)) and 0 < len(value) <= MAX_INPUT_RANK
            and all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in value)):
        raise RecordError("%s: input_shape %s is not a list of 1 to %d positive integers"
                          % (where, ascii(str(value)[:80]), MAX_INPUT_RANK))
    check_shape("%s: input_shape" % where, tuple(value))
    return tuple(value)
