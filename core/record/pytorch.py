"""PyTorch checkpoints (`torch.save` files) read without PyTorch and without running their code.

    state = cinders.record.load_pytorch("resnet18.pth")      # {name: cn.Tensor}
    model.load_state_dict(state, remap=[(r"^module\\.", "")])
    state.notes    # e.g. ["layer1.0.bn1.num_batches_tracked: int64 stored, loaded as int32 (range checked)"]
    state.other    # what else the file holds, e.g. {"optimizer": "dict with 2 entries", "epoch": "int 12"}

Formats: the zip archive of torch >= 1.6 (`<name>/data.pkl` + one entry per storage
`<name>/data/<key>`), the legacy stream (`_use_new_zipfile_serialization=False`: magic number,
protocol, sys_info, the object pickle, the list of storage keys, then each storage as an int64
element count and its bytes), and plain pickles of tensors (`pickle.dump`), whose storages are
legacy streams inside `torch.storage._load_from_bytes`.

The pickles run on pickle_vm (no code: allowlisted globals, each mapped to a function here that
builds an inert reference). Tensors are materialised only for the chosen state dict, after every
size, offset and stride has been checked against the bytes actually present, one storage at a
time. float16/bfloat16/float64 become float32 and int64/int16/int8/uint8 become int32 (range
checked): `state.notes` lists where that changed a dtype.
"""

import io
import os
import struct
import sys
import zipfile
import zlib
from array import array

from .. import dtypes
from ..backend import is_row_major, numel
from ..errors import RecordError
from ..files import open_regular
from ..limits import check_elements, element_bytes
from ..tensor import Tensor
from .pickle_vm import Allowed, TruncatedPickle, Unpickler, hashable
from .halves import bf16_to_float32, f16_to_float32

try:
    import numpy as _np
except ImportError:  # Pyodide without NumPy, MicroPython: the array path below
    _np = None

LEGACY_MAGIC = 0x1950a86a20f9469cfc6c
LEGACY_PROTOCOL = 1001
MAX_PICKLE_BYTES = 64 << 20       # data.pkl / legacy pickles (a checkpoint of 10k tensors takes ~2 MB)
MAX_ZIP_ENTRIES = 100000
MAX_CENTRAL_DIRECTORY = 16 << 20  # bytes: zipfile builds one object per entry up front
MAX_INFLATE_RATIO = 64            # deflated entries may grow at most this much (zip bombs)
MAX_NDIM = 64
MAX_NESTING = 64                  # levels walked when looking for the state dict
VIEW_SLACK = 1 << 24              # elements views may add beyond 2x the storages (stride-0 views)

# torch dtype: (itemsize, array typecode of the stored bits, NumPy dtype of the stored bits,
#               cinders dtype it loads as)
_DTYPES = {
    "float32": (4, "f", "f4", dtypes.float32),
    "float64": (8, "d", "f8", dtypes.float32),
    "float16": (2, "H", "f2", dtypes.float32),
    "bfloat16": (2, "H", "u2", dtypes.float32),
    "int64": (8, "q", "i8", dtypes.int32),
    "int32": (4, "i", "i4", dtypes.int32),
    "int16": (2, "h", "i2", dtypes.int32),
    "int8": (1, "b", "i1", dtypes.int32),
    "uint8": (1, "B", "u1", dtypes.int32),
    "bool": (1, "B", "u1", dtypes.bool_),
}
_STORAGE_TYPES = {
    "FloatStorage": "float32", "DoubleStorage": "float64", "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16", "LongStorage": "int64", "IntStorage": "int32",
    "ShortStorage": "int16", "CharStorage": "int8", "ByteStorage": "uint8", "BoolStorage": "bool",
}
_TORCH_DTYPES = {"float32": "float32", "float": "float32", "float64": "float64", "double": "float64",
                 "float16": "float16", "half": "float16", "bfloat16": "bfloat16", "int64": "int64",
                 "long": "int64", "int32": "int32", "int": "int32", "int16": "int16", "short": "int16",
                 "int8": "int8", "uint8": "uint8", "bool": "bool"}
_STATE_KEYS = ("state_dict", "model_state_dict", "model", "module", "net", "network", "ema",
               "model_ema", "params", "weights")


# -- inert values the pickles build ----------------------------------------------------------------

class StorageRef:
    """One storage: `numel` elements of torch dtype `dtype`; `fetch()` returns exactly its bytes
    (checked against the archive before anything is allocated)."""

    def __init__(self, key, dtype, numel, fetch):
        self.key, self.dtype, self.numel, self.fetch = key, dtype, numel, fetch

    @property
    def nbytes(self):
        return self.numel * _DTYPES[self.dtype][0]


class TensorRef:
    """A tensor as the pickle describes it: a strided view of a storage (nothing read yet)."""

    def __init__(self, storage, offset, size, stride):
        self.storage, self.offset, self.size, self.stride = storage, offset, size, stride
        self.numel = numel(size)


class OrderedDictValue(dict):
    """collections.OrderedDict() as built by a pickle: a dict whose BUILD state (torch keeps
    `_metadata` there) is kept aside, inert."""

    def pickle_build(self, state):
        self.pickle_state = state


class _Value(Allowed):
    """An allowlisted global that is a value, not a function (a storage type, a dtype, a tensor
    class): it can be passed around, and REDUCE/NEWOBJ on it are refused (no call/new)."""

    def __init__(self, kind, name):
        super().__init__(name)
        self.kind = kind


class PyTorchState(dict):
    """{name: cn.Tensor} plus what the reader noticed: `notes` (dtype changes, skipped values),
    `other` ({top-level key: description} of what else the file holds) and `key` (the top-level
    key the state dict came from, or None)."""

    def __init__(self, items=(), notes=(), other=None, key=None):
        super().__init__(items)
        self.notes = list(notes)
        self.other = dict(other or {})
        self.key = key


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _int_tuple(what, value):
    if not isinstance(value, tuple) or len(value) > MAX_NDIM or not all(_is_int(v) and 0 <= v < 1 << 48 for v in value):
        raise RecordError("checkpoint: tensor %s must be a tuple of at most %d non-negative ints, got %s"
                          % (what, MAX_NDIM, _describe(value)))
    return value


# -- the allowlist: each permitted global and the inert thing it builds ---------------------------

def _rebuild_tensor(storage, offset, size, stride, *_ignored):
    """torch._utils._rebuild_tensor(_v2): a view of `storage`, bounds-checked here."""
    if not isinstance(storage, StorageRef):
        raise RecordError("checkpoint: a tensor is rebuilt from %s, not a storage" % (_describe(storage),))
    if not _is_int(offset) or offset < 0:
        raise RecordError("checkpoint: tensor storage offset %s is not a non-negative int" % (_describe(offset),))
    size, stride = _int_tuple("size", size), _int_tuple("stride", stride)
    if len(size) != len(stride):
        raise RecordError("checkpoint: tensor size %s and stride %s differ in length" % (size, stride))
    ref = TensorRef(storage, offset, size, stride)
    last = offset + sum((n - 1) * s for n, s in zip(size, stride)) if ref.numel else offset - 1
    if offset > storage.numel or last >= storage.numel:
        raise RecordError("checkpoint: tensor of size %s, stride %s at offset %d reads past storage %r of %d "
                          "elements" % (size, stride, offset, storage.key, storage.numel))
    return ref


def _rebuild_parameter(data, *_ignored):
    if not isinstance(data, TensorRef):
        raise RecordError("checkpoint: a parameter is rebuilt from %s, not a tensor" % (_describe(data),))
    return data


def _rebuild_from_type(func, new_type, args, state):
    """torch._tensor._rebuild_from_type_v2: a Tensor/Parameter with attributes; the attributes
    are dropped, the tensor rebuilt by the allowlisted `func`."""
    if not (isinstance(func, Allowed) and func.call in (_rebuild_tensor, _rebuild_parameter)
            and isinstance(new_type, _Value) and new_type.kind == "tensor class" and isinstance(args, tuple)):
        raise RecordError("checkpoint: _rebuild_from_type_v2 with %s / %s refused"
                          % (_describe(func), _describe(new_type)))
    return func.call(*args)


def _latin1_encode(text, encoding="latin1"):
    """_codecs.encode(str, "latin1"): how protocol 2 spells a bytes object."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise RecordError("checkpoint: _codecs.encode(%s, %r) refused (only latin1 text is bytes)"
                          % (_describe(text), encoding))
    return text.encode("latin-1")


def _allowlist(load_from_bytes=None):
    allowed = {}

    def add(name, call=None, new=None):
        allowed[name] = Allowed(name, call, new)

    add("torch._utils._rebuild_tensor", _rebuild_tensor)
    add("torch._utils._rebuild_tensor_v2", _rebuild_tensor)
    add("torch._utils._rebuild_parameter", _rebuild_parameter)
    add("torch._utils._rebuild_parameter_with_state", _rebuild_parameter)
    add("torch._tensor._rebuild_from_type_v2", _rebuild_from_type)
    add("collections.OrderedDict",
        lambda *a: OrderedDictValue(*a[:1]) if not a or isinstance(a[0], dict) else _bad("OrderedDict", a))
    add("torch.Size",
        lambda dims=(): _int_tuple("torch.Size", tuple(dims) if isinstance(dims, (tuple, list)) else dims))
    add("torch.device", lambda *a: ":".join(str(v) for v in a if isinstance(v, (str, int))))
    add("_codecs.encode", _latin1_encode)
    for name in ("builtins.set", "__builtin__.set"):
        add(name, lambda items=(): ({hashable(v) for v in items} if isinstance(items, (list, tuple))
                                    else _bad("set", items)))
    for name in _STORAGE_TYPES:
        allowed["torch." + name] = _Value("storage type", name)
    for name in _TORCH_DTYPES:
        allowed["torch." + name] = _Value("dtype", "torch." + name)
    for name in ("torch.Tensor", "torch.nn.parameter.Parameter"):
        allowed[name] = _Value("tensor class", name)
    if load_from_bytes is not None:
        add("torch.storage._load_from_bytes", load_from_bytes)
    return allowed


def _bad(what, args):
    raise RecordError("checkpoint: %s(%s) refused" % (what, _describe(args)))


def _storage_dtype(storage_type):
    if isinstance(storage_type, _Value) and storage_type.kind == "storage type":
        return _STORAGE_TYPES[storage_type.name]
    raise RecordError("checkpoint: storage type %s is not one of torch's typed storages" % (_describe(storage_type),))


class _Storages:
    """Persistent ids -> StorageRef, one per key (views share it)."""

    def __init__(self, fetch_for):
        self.by_key = {}
        self.fetch_for = fetch_for  # (key, nbytes) -> callable returning the bytes

    def ref(self, key, storage_type, numel):
        if not isinstance(key, str) or not _is_int(numel) or numel < 0:
            raise RecordError("checkpoint: storage id (%s, %s) is malformed" % (_describe(key), _describe(numel)))
        dtype = _storage_dtype(storage_type)
        old = self.by_key.get(key)
        if old is not None:
            if (old.dtype, old.numel) != (dtype, numel):
                raise RecordError("checkpoint: storage %r is named as %s[%d] and as %s[%d]"
                                  % (key, old.dtype, old.numel, dtype, numel))
            return old
        ref = StorageRef(key, dtype, numel, None)
        ref.fetch = self.fetch_for(key, ref.nbytes)
        self.by_key[key] = ref
        return ref

    def zip_pid(self, pid):
        """('storage', storage_type, key, location, numel)"""
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise RecordError("checkpoint: persistent id %s is not a storage" % (_describe(pid),))
        return self.ref(pid[2], pid[1], pid[4])

    def legacy_pid(self, pid):
        """('storage', storage_type, root_key, location, numel, view_metadata)"""
        if not (isinstance(pid, tuple) and len(pid) == 6 and pid[0] == "storage"):
            raise RecordError("checkpoint: persistent id %s is not a storage" % (_describe(pid),))
        if pid[5] is not None:
            raise RecordError("checkpoint: storage views of torch < 0.4 (legacy view_metadata) are not supported")
        return self.ref(pid[2], pid[1], pid[4])


# -- the three file layouts -------------------------------------------------------------------------

def _read_all(f):
    data = f.read()
    return data if isinstance(data, (bytes, bytearray)) else bytes(data)


def _zip_limits(f, size):
    """Entry count and central-directory size from the end record, before zipfile reads them."""
    tail = min(size, 22 + 65535)
    f.seek(size - tail)
    end = f.read(tail)
    at = end.rfind(b"PK\x05\x06")
    if at < 0 or len(end) - at < 22:
        raise RecordError("checkpoint: zip end record missing (truncated archive?)")
    entries, cd_size = struct.unpack("<10xHI6x", end[at:at + 22])[0:2]
    if entries == 0xFFFF or cd_size == 0xFFFFFFFF:  # zip64: the real numbers are in its end record
        loc = at - 20
        if loc < 0 or end[loc:loc + 4] != b"PK\x06\x07":
            raise RecordError("checkpoint: zip64 end locator missing")
        (offset,) = struct.unpack("<Q", end[loc + 8:loc + 16])
        if offset + 56 > size:
            raise RecordError("checkpoint: zip64 end record offset %d past the end (%d bytes)" % (offset, size))
        f.seek(offset)
        rec = f.read(56)
        if rec[:4] != b"PK\x06\x06":
            raise RecordError("checkpoint: zip64 end record missing at offset %d" % offset)
        entries, cd_size = struct.unpack("<Q", rec[32:40])[0], struct.unpack("<Q", rec[40:48])[0]
    if entries > MAX_ZIP_ENTRIES or cd_size > MAX_CENTRAL_DIRECTORY:
        raise RecordError("checkpoint: zip with %d entries / %d-byte directory (limits %d / %d)"
                          % (entries, cd_size, MAX_ZIP_ENTRIES, MAX_CENTRAL_DIRECTORY))
    f.seek(0)


def _buffer(n):
    """A writable n-byte buffer that is not zeroed first (bytearray(n) writes n zeros: a third of
    the load time of a large checkpoint, for bytes that are overwritten at once)."""
    return _np.empty(n, _np.uint8) if _np is not None else bytearray(n)


class _CrcChecks:
    """CRC-32 checks of storage entries, run on a helper thread while the next entry is read
    (zlib.crc32 and readinto both release the GIL: the check costs about as much as the read),
    inline where no thread can start (Pyodide). verify() before any tensor is handed out."""

    def __init__(self):
        self.pending, self.pool = [], None

    def add(self, name, buf, crc):
        if self.pool is None and self.pending is not None:
            from concurrent.futures import ThreadPoolExecutor
            self.pool = ThreadPoolExecutor(1, thread_name_prefix="cinders-crc")
        if self.pool is not None:
            try:
                self.pending.append((name, crc, self.pool.submit(zlib.crc32, buf)))
                return
            except RuntimeError:  # no threads here: check inline from now on
                self.pool.shutdown()
                self.pool, self.pending = None, None
        if zlib.crc32(buf) != crc:
            raise _crc_error(name)

    def verify(self):
        for name, crc, future in self.pending or ():
            if future.result() != crc:
                raise _crc_error(name)

    def close(self):
        if self.pool is not None:
            self.pool.shutdown(wait=True)


def _crc_error(name):
    return RecordError("checkpoint: entry %r fails its CRC check (corrupt file)" % (name,))


class _ZipArchive:
    def __init__(self, f, size, checks):
        _zip_limits(f, size)
        self.f, self.size, self.checks = f, size, checks
        self.unread = size  # archive bytes not yet handed out: entries pointing at one region are read once
        try:
            self.zip = zipfile.ZipFile(f)
            infos = self.zip.infolist()
        except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, struct.error, EOFError,
                UnicodeDecodeError, NotImplementedError) as e:
            raise RecordError("checkpoint: not a readable zip archive (%s)" % (e,)) from None
        if len(infos) > MAX_ZIP_ENTRIES:
            raise RecordError("checkpoint: zip with %d entries (limit %d)" % (len(infos), MAX_ZIP_ENTRIES))
        self.entries = {i.filename: i for i in infos}
        pkl = [n for n in self.entries if n.endswith("data.pkl") and n.count("/") == 1]
        if len(pkl) != 1:
            raise RecordError("checkpoint: zip holds %d '<name>/data.pkl' entries, torch.save writes one "
                              "(entries: %s)" % (len(pkl), ", ".join(sorted(self.entries)[:10])))
        self.prefix = pkl[0][:-len("data.pkl")]
        order = self.entry_bytes(self.prefix + "byteorder", 16, missing_ok=True)
        order = None if order is None else bytes(order)
        if order not in (None, b"little", b"big"):
            raise RecordError("checkpoint: byteorder entry says %r" % (bytes(order[:16]),))
        self.big_endian = order == b"big"

    def entry_bytes(self, name, expected_max, exact=None, missing_ok=False, defer_crc=False):
        """The bytes of one entry (a writable buffer), read only after its sizes are checked.
        defer_crc: the CRC check joins self.checks (verified before load_pytorch returns)."""
        info = self.entries.get(name)
        if info is None:
            if missing_ok:
                return None
            raise RecordError("checkpoint: the archive has no entry %r (a storage the pickle names)" % (name,))
        if exact is not None and info.file_size != exact:
            raise RecordError("checkpoint: entry %r holds %d bytes, the pickle needs %d"
                              % (name, info.file_size, exact))
        if info.file_size > expected_max:
            raise RecordError("checkpoint: entry %r is %d bytes (at most %d expected)"
                              % (name, info.file_size, expected_max))
        if info.flag_bits & 0x1:
            raise RecordError("checkpoint: entry %r is encrypted (torch.save never encrypts)" % (name,))
        if info.compress_size > self.unread:
            raise RecordError("checkpoint: entry %r (%d bytes) and the entries read before it need more bytes "
                              "than the %d-byte archive holds: entries share data" % (name, info.compress_size, self.size))
        self.unread -= info.compress_size
        if info.compress_type == zipfile.ZIP_STORED:
            return self._stored(info, defer_crc)
        if info.file_size > MAX_INFLATE_RATIO * info.compress_size + (1 << 20):
            raise RecordError("checkpoint: entry %r inflates %d bytes to %d (zip bomb?)"
                              % (name, info.compress_size, info.file_size))
        try:
            with self.zip.open(info) as stream:
                data = stream.read(info.file_size + 1)
        except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError, zlib.error) as e:
            raise RecordError("checkpoint: entry %r cannot be read (%s)" % (name, e)) from None
        if len(data) != info.file_size:
            raise RecordError("checkpoint: entry %r gave %d bytes, its header says %d"
                              % (name, len(data), info.file_size))
        return bytearray(data)

    def _stored(self, info, defer_crc):
        """An uncompressed entry straight from the file into one buffer (no second copy)."""
        f = self.f
        if not 0 <= info.header_offset <= self.size - 30:
            raise RecordError("checkpoint: entry %r has its header at offset %d, outside the %d-byte archive"
                              % (info.filename, info.header_offset, self.size))
        f.seek(info.header_offset)
        header = f.read(30)
        if len(header) != 30 or header[:4] != b"PK\x03\x04":
            raise RecordError("checkpoint: entry %r has no local header at offset %d"
                              % (info.filename, info.header_offset))
        name_len, extra_len = struct.unpack("<HH", header[26:30])
        start = info.header_offset + 30 + name_len + extra_len
        if info.compress_size != info.file_size or start + info.file_size > self.size:
            raise RecordError("checkpoint: entry %r (%d bytes at offset %d) runs past the end of the %d-byte archive"
                              % (info.filename, info.file_size, start, self.size))
        f.seek(start)
        buf = _buffer(info.file_size)
        if f.readinto(buf) != info.file_size:
            raise RecordError("checkpoint: entry %r is truncated" % (info.filename,))
        if defer_crc:
            self.checks.add(info.filename, buf, info.CRC)
        elif zlib.crc32(buf) != info.CRC:
            raise _crc_error(info.filename)
        return buf

    def load(self):
        data = self.entry_bytes(self.prefix + "data.pkl", MAX_PICKLE_BYTES)

        def fetch_for(key, nbytes):
            return lambda: self.entry_bytes(self.prefix + "data/" + key, nbytes, exact=nbytes, defer_crc=True)

        storages = _Storages(fetch_for)
        obj = Unpickler(data, _allowlist(), storages.zip_pid, what="data.pkl").load()
        return obj, self.big_endian


class _Bytes:
    """Random access to a checkpoint's bytes: an open file (storages read on demand, straight
    into their own buffers) or bytes in memory (a legacy stream inside a plain pickle)."""

    def __init__(self, f=None, size=None, data=None):
        self.f, self.data = f, data
        self.size = len(data) if data is not None else size

    def read(self, offset, n):
        if offset < 0 or n < 0 or offset + n > self.size:
            raise RecordError("checkpoint is truncated: %d bytes needed at offset %d of %d" % (n, offset, self.size))
        if self.data is not None:
            return memoryview(self.data)[offset:offset + n]
        self.f.seek(offset)
        buf = _buffer(n)
        if self.f.readinto(buf) != n:
            raise RecordError("checkpoint is truncated at offset %d" % (offset,))
        return buf


def _legacy_pickles(src, pos, storages):
    """The four pickles after the magic number: protocol, sys_info, the object, the storage keys.
    They are read from a prefix of the file, grown until they fit (storages are not read)."""
    what = "legacy checkpoint"
    chunk = 1 << 20
    while True:
        data = bytes(src.read(0, min(src.size, pos + chunk)))
        try:
            u = Unpickler(data, _allowlist(), pos=pos, what=what)
            values = []
            for persistent in (None, None, storages.legacy_pid, None):
                u.persistent_load = persistent
                values.append(u.load())
            return values, u.pos
        except TruncatedPickle:
            if len(data) >= src.size:
                raise
            if chunk >= MAX_PICKLE_BYTES:
                raise RecordError("%s: its pickles run past %d bytes (at most %d)"
                                  % (what, pos + chunk, MAX_PICKLE_BYTES)) from None
            storages.by_key.clear()
            chunk *= 4


def _load_legacy(src, pos, nested):
    """The legacy stream of `src` (a _Bytes) from `pos`, just after its magic number."""
    what = "legacy checkpoint"
    located = {}

    def fetch_for(key, nbytes):
        return lambda: src.read(located[key], nbytes)

    storages = _Storages(fetch_for)
    (protocol, info, obj, keys), pos = _legacy_pickles(src, pos, storages)
    if protocol != LEGACY_PROTOCOL:
        raise RecordError("%s: protocol version is not %d" % (what, LEGACY_PROTOCOL))
    if not isinstance(info, dict):
        raise RecordError("%s: sys_info is %s, not a dict" % (what, _describe(info)))
    big_endian = info.get("little_endian", True) is False
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise RecordError("%s: the storage key list is %s" % (what, _describe(keys)))
    for key in keys:
        ref = storages.by_key.get(key)
        if ref is None:
            raise RecordError("%s: storage %r is stored but no tensor names it" % (what, key))
        (numel,) = struct.unpack(">q" if big_endian else "<q", bytes(src.read(pos, 8)))
        if numel != ref.numel:
            raise RecordError("%s: storage %r holds %d elements, the pickle says %d" % (what, key, numel, ref.numel))
        if pos + 8 + ref.nbytes > src.size:
            raise RecordError("%s: storage %r needs %d bytes at offset %d, %d present"
                              % (what, key, ref.nbytes, pos + 8, src.size - pos - 8))
        located[key] = pos + 8
        pos += 8 + ref.nbytes
    missing = [k for k in storages.by_key if k not in located]
    if missing:
        raise RecordError("%s: storages %s are named but not stored" % (what, ", ".join(missing[:5])))
    if nested and not isinstance(obj, StorageRef):
        raise RecordError("%s: _load_from_bytes holds %s, not a storage" % (what, _describe(obj)))
    return obj, big_endian


def _magic_end(data):
    """Offset after the legacy magic-number pickle, or None if `data` does not start with one."""
    try:  # the magic number's pickle is ~16 bytes: never run a whole file through this probe
        u = Unpickler(bytes(data[:64]), {}, what="legacy header")
        return u.pos if u.load() == LEGACY_MAGIC else None
    except RecordError:
        return None


def _load_pickle(data):
    """A plain pickle (pickle.dump of tensors): storages arrive as nested legacy streams."""
    endian, loaded = [], {}

    def load_from_bytes(blob):
        if not isinstance(blob, (bytes, bytearray)):
            raise RecordError("checkpoint: _load_from_bytes(%s) refused" % (_describe(blob),))
        if id(blob) in loaded:  # one bytes object (a memo entry) named again: the same storage
            return loaded[id(blob)][1]
        pos = _magic_end(blob)
        if pos is None:
            raise RecordError("checkpoint: _load_from_bytes holds no legacy torch stream")
        storage, big = _load_legacy(_Bytes(data=blob), pos, nested=True)
        endian.append(big)
        loaded[id(blob)] = (blob, storage)  # the blob is kept so its id stays its own
        return storage

    obj = Unpickler(data, _allowlist(load_from_bytes), what="pickle").load()
    if len(set(endian)) > 1:
        raise RecordError("checkpoint: storages of both byte orders in one file")
    return obj, bool(endian and endian[0])


def _open(source):
    """A binary file for a path, bytes or an open binary file (the caller closes what it opened)."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return io.BytesIO(source)
    if isinstance(source, (str, os.PathLike)):
        return open_regular(source, RecordError, "checkpoint")
    if not hasattr(source, "read") or not hasattr(source, "seek"):
        raise RecordError("load_pytorch needs a path, bytes or a seekable binary file, got %s"
                          % type(source).__name__)
    return source


def _read(f, checks):
    """(object graph with TensorRefs, big_endian) from a seekable binary file. Storages are
    read later, through StorageRef.fetch, while `f` is still open; their CRC checks go to
    `checks`."""
    f.seek(0, 2)
    size = f.tell()
    f.seek(0)
    head = f.read(4)
    f.seek(0)
    if head == b"PK\x03\x04":
        return _ZipArchive(f, size, checks).load()
    if head[:1] != b"\x80":
        raise RecordError("checkpoint: neither a torch.save zip archive nor a pickle (starts with %r)" % (bytes(head),))
    pos = _magic_end(f.read(64))
    if pos is not None:
        return _load_legacy(_Bytes(f, size), pos, nested=False)
    f.seek(0)
    return _load_pickle(_read_all(f))


# -- choosing the state dict and making tensors ---------------------------------------------------

def _describe(value):
    """A short, bounded description of a pickled value (never its repr: it may be huge or cyclic)."""
    if isinstance(value, TensorRef):
        return "tensor %s %s" % (value.storage.dtype, list(value.size))
    if isinstance(value, Allowed):
        return value.name
    if isinstance(value, bool) or value is None:
        return str(value)
    if _is_int(value):
        return "int %d" % value if value.bit_length() < 64 else "int of %d bits" % value.bit_length()
    if isinstance(value, float):
        return "float %r" % value
    if isinstance(value, str):
        return "str %r" % (value[:40] + ("..." if len(value) > 40 else ""))
    if isinstance(value, dict):
        tensors = _tensor_count(value)
        deeper = _nested_tensor_count(value) - tensors
        return "dict with %d entries (%d tensors%s)" % (len(value), tensors,
                                                        "; %d more nested deeper" % deeper if deeper else "")
    if isinstance(value, (list, tuple, set, frozenset)):
        return "%s of %d items" % (type(value).__name__, len(value))
    return type(value).__name__


def _tensor_count(value):
    return sum(1 for v in value.values() if isinstance(v, TensorRef)) if isinstance(value, dict) else 0


def _nested_tensor_count(value, depth=0, budget=None):
    """Tensors in `value` and the dicts, lists and tuples below it (an optimizer state keeps its
    tensors a level or two down), bounded in depth and in values visited (a pickle may be cyclic)."""
    budget = budget if budget is not None else [100000]
    if isinstance(value, TensorRef):
        return 1
    if depth >= MAX_NESTING or not isinstance(value, (dict, list, tuple)):
        return 0
    count = 0
    for v in (value.values() if isinstance(value, dict) else value):
        budget[0] -= 1
        if budget[0] < 0:
            break
        count += _nested_tensor_count(v, depth + 1, budget)
    return count


def _choose_state(obj, top_level_key):
    """(state dict, its key or None, {other key: description})."""
    if not isinstance(obj, dict):
        raise RecordError("checkpoint holds %s, not a dict of tensors" % (_describe(obj),))
    others = lambda skip: {str(k)[:80]: _describe(v) for k, v in obj.items() if k != skip}  # noqa: E731
    if top_level_key is not None:
        dotted = isinstance(top_level_key, str) and top_level_key not in obj
        path = top_level_key.split(".") if dotted else [top_level_key]
        state = obj
        for i, part in enumerate(path):
            if not isinstance(state, dict) or part not in state or i >= MAX_NESTING:
                raise RecordError("checkpoint has no key %r; its top level holds: %s"
                                  % (top_level_key, "; ".join("%s: %s" % kv for kv in list(others(None).items())[:20])))
            state = state[part]
        if not _tensor_count(state):
            raise RecordError("checkpoint key %r holds %s, not a dict of tensors" % (top_level_key, _describe(state)))
        return state, top_level_key, others(path[0])
    if _tensor_count(obj):
        return obj, None, {}
    candidates = [k for k, v in obj.items() if _tensor_count(v)]
    for key in _STATE_KEYS:
        if key in candidates:
            return obj[key], key, others(key)
    if len(candidates) == 1:
        return obj[candidates[0]], candidates[0], others(candidates[0])
    raise RecordError("checkpoint: cannot tell which entry is the state dict (%s); name it with "
                      "top_level_key= (cinders convert: --key) (the file holds: %s)" % ("candidates: %s" % candidates if candidates else "none holds tensors",
                                                 "; ".join("%s: %s" % kv for kv in list(others(None).items())[:20])))


def _np_values(buf, ref, big_endian, shared):
    """A NumPy array of the tensor's values in its cinders dtype (one copy at most)."""
    itemsize, _, code, target = _DTYPES[ref.storage.dtype]
    stored = _np.frombuffer(buf, dtype=_np.dtype(code).newbyteorder(">" if big_endian else "<"))
    whole = (not memoryview(buf).readonly and not shared and ref.offset == 0 and ref.numel == ref.storage.numel
             and is_row_major(ref.size, ref.stride))
    if whole:
        view = stored.reshape(ref.size)
    else:
        view = _np.lib.stride_tricks.as_strided(stored[ref.offset:], shape=ref.size,
                                                strides=tuple(s * itemsize for s in ref.stride), writeable=False)
    if ref.storage.dtype == "bfloat16":
        return (view.astype(_np.uint32) << 16).view(_np.float32)
    if ref.storage.dtype == "int64" and ref.numel:
        low, high = int(view.min()), int(view.max())
        if low < -2 ** 31 or high >= 2 ** 31:
            raise RecordError("checkpoint: int64 tensor has values in [%d, %d], outside int32" % (low, high))
    np_target = {dtypes.float32: _np.float32, dtypes.int32: _np.int32, dtypes.bool_: _np.bool_}[target]
    if target is dtypes.bool_:
        return _np.ascontiguousarray(view != 0)
    out = _np.ascontiguousarray(view, dtype=_np.dtype(np_target))
    return out if whole or out.base is None else out.copy()


def _array_storage(buf, dtype, big_endian):
    """A storage's values as an array (or tuple) of Python numbers, without NumPy."""
    stored = array(_DTYPES[dtype][1])
    stored.frombytes(buf)
    if big_endian != (sys.byteorder == "big"):
        stored.byteswap()
    if dtype in ("float16", "bfloat16"):  # widened from little-endian bytes, a chunk at a time
        if sys.byteorder == "big":
            stored.byteswap()
        return (f16_to_float32 if dtype == "float16" else bf16_to_float32)(stored.tobytes())
    return stored


def _array_values(stored, ref):
    """One tensor's values in its cinders dtype from its decoded storage, without NumPy."""
    target = _DTYPES[ref.storage.dtype][3]
    if is_row_major(ref.size, ref.stride):
        flat = stored[ref.offset:ref.offset + ref.numel]
    else:
        index = [ref.offset]
        for n, s in zip(ref.size, ref.stride):
            index = [i + k * s for i in index for k in range(n)]
        flat = [stored[i] for i in index]
    if target is dtypes.float32:
        return array("f", flat)
    if target is dtypes.bool_:
        return [v != 0 for v in flat]
    if ref.storage.dtype == "int64" and any(not -2 ** 31 <= v < 2 ** 31 for v in flat):
        raise RecordError("checkpoint: int64 tensor has values outside int32")
    return array("i", flat)


def _innermost(backend):
    while getattr(backend, "inner", None) is not None:
        backend = backend.inner
    return backend


def _materialise(refs, backend, big_endian):
    """{name: Tensor} from {name: TensorRef}, one storage read at a time."""
    storages = {}
    for ref in refs.values():
        storages.setdefault(id(ref.storage), ref.storage)
    total = sum(s.numel for s in storages.values())
    wanted = sum(r.numel for r in refs.values())
    if wanted > 2 * total + VIEW_SLACK:
        raise RecordError("checkpoint: its tensors would hold %d elements from %d stored ones (views repeat "
                          "data more than 2x)" % (wanted, total))
    check_elements("load_pytorch", wanted, element_bytes=element_bytes(_innermost(backend)))
    users = {}
    for name, ref in refs.items():
        users.setdefault(id(ref.storage), []).append(name)
    to_numpy = _np is not None
    keep_numpy = to_numpy and getattr(_innermost(backend), "name", "") == "numpy"
    out = {}
    for sid, names in users.items():
        storage = storages[sid]
        buf = storage.fetch()
        if len(buf) != storage.nbytes:
            raise RecordError("checkpoint: storage %r has %d bytes, needs %d" % (storage.key, len(buf), storage.nbytes))
        if not to_numpy:
            buf = _array_storage(buf, storage.dtype, big_endian)
        for name in names:
            ref = refs[name]
            target = _DTYPES[storage.dtype][3]
            if to_numpy:
                values = _np_values(buf, ref, big_endian, shared=len(names) > 1)
                if not keep_numpy:
                    values = _flat_array(values, target)
            else:
                values = _array_values(buf, ref)
            out[name] = Tensor(backend, backend.from_flat(values, ref.size, target), ref.size, target)
        del buf
    return {name: out[name] for name in refs}


def _flat_array(values, target):
    code = {dtypes.float32: "f", dtypes.int32: "i", dtypes.bool_: "B"}[target]
    flat = array(code)
    flat.frombytes(values.astype({"f": "=f4", "i": "=i4", "B": "u1"}[code]).tobytes())  # native, as array is
    return flat


def _notes(refs):
    notes = []
    for name, ref in refs.items():
        stored = ref.storage.dtype
        if stored in ("float16", "bfloat16", "float64"):
            notes.append("%s: %s stored, loaded as float32" % (name, stored))
        elif stored in ("int64", "int16", "int8", "uint8"):
            checked = " (range checked)" if stored == "int64" else ""
            notes.append("%s: %s stored, loaded as int32%s" % (name, stored, checked))
    return notes


def load_pytorch(path_or_file, *, top_level_key=None, backend=None):
    """{name: cn.Tensor} of the state dict in a `torch.save` file (path, binary file or bytes).

    The state dict is the file's top-level dict when it holds tensors, else the entry named by
    `top_level_key` ("state_dict", or a dotted path "model.backbone"), else the one entry that
    holds tensors (preferring the usual names: state_dict, model_state_dict, model, ...).
    Returns a PyTorchState: a dict with `.notes` (dtype changes, skipped values), `.other` (what
    else the top level holds) and `.key`. Raises cinders.RecordError on anything it refuses;
    no code the file names is imported or run, and nothing but the returned tensors is created.
    """
    if backend is None:
        from ..tensor import default_backend
        backend = default_backend()
    f = _open(path_or_file)
    checks = _CrcChecks()
    try:
        obj, big_endian = _read(f, checks)
        state, key, other = _choose_state(obj, top_level_key)
        refs, notes = {}, []
        for name, value in state.items():
            if not isinstance(name, str):
                raise RecordError("checkpoint: state dict key %s is not a string" % (_describe(name),))
            if isinstance(value, TensorRef):
                refs[name] = value
            else:
                notes.append("%s: skipped %s (not a tensor)" % (name, _describe(value)))
        tensors = _materialise(refs, backend, big_endian)
        checks.verify()
    finally:
        checks.close()
        if f is not path_or_file:
            f.close()
    return PyTorchState(tensors, _notes(refs) + notes, other, key)


# -- cinders convert --------------------------------------------------------------------------------

def _model_class(name):
    """A model class of cinders.models named on the command line ("cinders.models.vision.ResNet"):
    only that package is searched, so the name cannot import anything else."""
    import importlib
    import re
    from ..nn import Module
    m = re.match(r"^cinders\.models\.([a-z_][a-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*)$", name)
    if not m:
        raise RecordError("--model-class must name a class of cinders.models, e.g. cinders.models.vision.ResNet; "
                          "got %r" % (name,))
    try:
        cls = getattr(importlib.import_module("cinders.models." + m.group(1)), m.group(2))
    except (ImportError, AttributeError):
        raise RecordError("--model-class %r: no such class in cinders.models" % (name,)) from None
    if not (isinstance(cls, type) and issubclass(cls, Module)):
        raise RecordError("--model-class %r is not a cinders.nn.Module" % (name,))
    return cls


def convert_pytorch(src, out, *, top_level_key=None, remap=(), model_class=None, model_config=None,
                    progress=None):
    """Write the state dict of a torch.save file as a safetensors file (the official `safetensors`
    library reads it). With `model_class` (a cinders.models class path, or a Module class the
    caller already holds: the user's, from `--model-source`) the tensors are loaded
    into that model first (strict: every key and shape must match, after `remap`) and the file
    is a cinders record that cn.load_model and `cinders export-micro` rebuild. Returns the
    PyTorchState that was read (its notes say what changed)."""
    from . import save_tensors
    from ..backends.python_backend import Python
    from ..nn.module import remap_keys
    say = progress or (lambda text: None)
    backend = None
    try:
        from ..backends.numpy_backend import NumPy
        backend = NumPy()
    except ImportError:
        backend = Python()
    state = load_pytorch(src, top_level_key=top_level_key, backend=backend)
    say("read %d tensors from %s%s" % (len(state), src, " (key %r)" % state.key if state.key else ""))
    tensors = remap_keys(state, remap) if remap else dict(state)
    if model_class is None:
        save_tensors(out, tensors, {"source": os.path.basename(str(src)), "converted_by": "cinders convert"})
    else:
        cls = model_class if isinstance(model_class, type) else _model_class(model_class)
        model = cls(**(model_config or {}))
        model.to(backend).load_state_dict(tensors)
        model.save(out, metadata={"source": os.path.basename(str(src))})
    say("wrote %s" % out)
    return state


def is_checkpoint(path):
    """True when `path` looks like a torch.save file (a zip archive, or a pickle that is not a
    safetensors file: those start with an 8-byte header length and then "{")."""
    try:
        with open(path, "rb") as f:
            head = f.read(9)
    except OSError:
        return False
    return head[:4] == b"PK\x03\x04" or (head[:1] == b"\x80" and 2 <= head[1:2][0] <= 5 and head[8:9] != b"{")


class converted_record:
    """`with converted_record(pt, model_class, config) as path:` a temporary cinders record of
    the checkpoint loaded into `model_class` (what export-micro bundles), removed afterwards."""

    def __init__(self, src, model_class, model_config=None):
        if not model_class:
            raise RecordError("%s is a PyTorch checkpoint: pass --model-class (a cinders.models class whose "
                              "state dict it holds, e.g. cinders.models.mnist.MnistCNN)" % (src,))
        self.src, self.model_class, self.model_config = src, model_class, model_config

    def __enter__(self):
        import tempfile
        fd, self.path = tempfile.mkstemp(suffix=".safetensors")
        os.close(fd)
        convert_pytorch(self.src, self.path, model_class=self.model_class, model_config=self.model_config)
        return self.path

    def __exit__(self, *exc):
        os.remove(self.path)
