"""int8 records: per-output-channel symmetric quantization of the weight matrices.

For a weight W of shape (out, ...) (Linear (out, in), Conv2d (out, in, kh, kw)) the record holds
    "<name>"        I8  shape of W       q = round(W[j] / scale[j]), clipped to [-127, 127]
    "<name>.scale"  F32 shape (out,)     scale[j] = max|W[j]| / 127  (1 for an all-zero row)
and its metadata says quantization="int8-per-channel-symmetric". Biases, norms and 1-D tensors
stay float32; activations stay float32 everywhere.

The board keeps q in RAM as int8 and computes scale[j] * (q[j] . x); the desktop dequantizes
once on load (W' = q * scale in float32, exact: an int8 times a float32 fits a double) and runs
the ordinary model, so both compute with the same weights and differ only in rounding order.
Pure Python (array + the shared safetensors module): it runs wherever the core runs.
"""
import os
from array import array

from ..errors import RecordError
from ..files import check_writable_target
from ..record import safetensors, safetensors_write, validate

SCHEME = validate.QUANTIZED_SCHEME
SCALE_SUFFIX = validate.SCALE_SUFFIX


def quantizable(name, shape):
    """Weight matrices and kernels (ndim >= 2) named *weight; everything else stays float."""
    return name.split(".")[-1] == "weight" and len(shape) >= 2


def quantize_rows(values, rows):
    """(int8 array, float32 scales) of flat row-major values with `rows` rows."""
    n = len(values)
    cols = n // rows if rows else 0
    q = array("b", bytes(n))
    scales = array("f", bytes(4 * rows))
    for j in range(rows):
        row = values[j * cols:(j + 1) * cols]
        m = max(abs(v) for v in row) if cols else 0.0
        scale = m / 127.0 if m > 0.0 else 1.0
        scales[j] = scale
        s = scales[j]  # the float32 value the record stores: quantize against it, not the double
        for i in range(cols):
            v = round(row[i] / s)
            q[j * cols + i] = 127 if v > 127 else (-127 if v < -127 else v)
    return q, scales


def quantize_file(src, dst):
    """Write the int8 record of the float record `src` to `dst` (atomically). Returns dst."""
    with open(src, "rb") as f:
        r = safetensors.Reader(f)
        meta = dict(r.metadata)
        if meta.get("quantization"):
            raise RecordError("%s is already quantized (%s)" % (src, meta["quantization"]))
        entries = []
        for name in r.names():
            info = r.info(name)
            if info.dtype not in ("F32", "F16"):
                entries.append((name, info.dtype, info.shape, r.read_bytes(name)))
                continue
            values = r.read(name)
            if quantizable(name, info.shape):
                q, scales = quantize_rows(values, info.shape[0])
                entries.append((name, "I8", info.shape, bytes(q)))
                entries.append((name + SCALE_SUFFIX, "F32", (info.shape[0],), bytes(scales)))
            else:  # float16 storage becomes float32: the board reads F32 and I8 only
                entries.append((name, "F32", info.shape, safetensors_write.encode(values, "F32", name)))
    meta["quantization"] = SCHEME
    meta["dtype"] = "float32"
    check_writable_target(dst, RecordError)
    tmp = "%s.tmp-%d" % (dst, os.getpid())
    try:
        with open(tmp, "wb") as f:
            safetensors_write.write(f, entries, meta)
        os.replace(tmp, dst)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return dst


def dequantize(metadata, tensors, where="the record"):
    """{name: (dtype, shape, values)} of a record -> the float32 tensors the model expects.

    Records without quantization metadata come back unchanged; scales of the wrong dtype,
    shape or value raise RecordError (cinders.record.validate.check_quantized).
    """
    if not metadata.get("quantization"):
        return tensors
    validate.check_quantized(metadata, {n: (t[0], t[1]) for n, t in tensors.items()}, where)
    out = {}
    for name, (dtype, shape, values) in tensors.items():
        if name.endswith(SCALE_SUFFIX) and name[:-len(SCALE_SUFFIX)] in tensors:
            continue
        if dtype == "I8":
            if name + SCALE_SUFFIX not in tensors:
                raise RecordError("int8 tensor %r has no %r" % (name, name + SCALE_SUFFIX))
            scales = tensors[name + SCALE_SUFFIX][2]
            validate.check_scales(name + SCALE_SUFFIX, scales, where)
            rows = shape[0]
            cols = len(values) // rows if rows else 0
            w = array("f", bytes(4 * len(values)))
            for j in range(rows):
                s = scales[j]
                for i in range(j * cols, (j + 1) * cols):
                    w[i] = values[i] * s
            out[name] = ("F32", shape, w)
        else:
            out[name] = (dtype, shape, values)
    return out


def load_into(model, path, allow_nonfinite=False):
    """model.load(path) of an int8 record (cinders.record.load_into calls this when the record's
    metadata names a quantization, so cn.load_model and model.load take int8 records as they
    are): the weights dequantized to float32, checked and loaded all or nothing."""
    from .. import dtypes, record
    from ..tensor import Tensor
    metadata, raw = safetensors.read_file(path)
    state = model.state_dict()
    if not state:
        raise RecordError("%s has no tensors to load from %r" % (type(model).__name__, path))
    be = next(iter(state.values())).backend
    tensors = {}
    for n, (dtype, shape, values) in dequantize(metadata, raw, "record %r" % (path,)).items():
        dt = dtypes.float32 if dtype in ("F32", "F16") else dtypes.int32
        if dt is dtypes.float32:
            validate.check_finite(n, values, "record %r" % (path,), allow_nonfinite)
        tensors[n] = Tensor(be, be.from_flat(values, tuple(shape), dt), tuple(shape), dt)
    record.check_match(path, record.spec_of(tensors), record.spec_of(state))
    model.load_state_dict(tensors)
    return model

