"""Hand-made hostile checkpoints: each must raise cinders.RecordError naming what was refused,
and the canary file its payload would create must not exist afterwards. Payloads are tried as a
plain pickle, as the data.pkl of a torch.save zip archive and as a legacy torch stream."""

import io
import os
import pickle
import struct
import subprocess
import sys
import zipfile

import pytest
import torch

import cinders as cn
from cinders.record import load_pytorch


# -- building pickles byte by byte -----------------------------------------------------------------

def g(module, name):
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def s(text):
    data = text.encode()
    return b"X" + struct.pack("<I", len(data)) + data


def call(func, *args):
    return func + b"(" + b"".join(args) + b"tR"


P2 = b"\x80\x02"


def _zip_with(pickle_bytes, tmp_path):
    """A real torch.save archive whose data.pkl is replaced (CRC recomputed by zipfile)."""
    clean = tmp_path / "clean.pt"
    torch.save({"w": torch.ones(2)}, clean)
    out = io.BytesIO()
    with zipfile.ZipFile(clean) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            data = pickle_bytes if info.filename.endswith("/data.pkl") else src.read(info)
            dst.writestr(info.filename, data)
    return out.getvalue()


def _legacy_with(pickle_bytes):
    """A legacy torch stream whose object pickle is `pickle_bytes` (and no storages)."""
    head = pickle.dumps(0x1950a86a20f9469cfc6c, 2) + pickle.dumps(1001, 2) + pickle.dumps(
        {"protocol_version": 1001, "little_endian": True, "type_sizes": {"short": 2, "int": 4, "long": 4}}, 2)
    return head + pickle_bytes + pickle.dumps([], 2)


def _variants(payload, tmp_path):
    return {"plain": payload, "zip": _zip_with(payload, tmp_path), "legacy": _legacy_with(payload)}


@pytest.fixture
def canary(tmp_path):
    path = tmp_path / "canary"
    yield str(path)
    assert not path.exists(), "a payload ran: %s exists" % path


def _refused(data, match):
    with pytest.raises(cn.RecordError, match=match):
        load_pytorch(io.BytesIO(data))


PAYLOADS = {
    "os.system": lambda c: P2 + call(g("os", "system"), s("touch " + c)) + b".",
    "posix.system": lambda c: P2 + call(g("posix", "system"), s("touch " + c)) + b".",
    "builtins.eval": lambda c: P2 + call(g("builtins", "eval"), s("open(%r, 'w')" % c)) + b".",
    "builtins.exec": lambda c: P2 + call(g("builtins", "exec"), s("open(%r, 'w')" % c)) + b".",
    "__builtin__.eval": lambda c: P2 + call(g("__builtin__", "eval"), s("open(%r, 'w')" % c)) + b".",
    "subprocess.Popen": lambda c: P2 + call(g("subprocess", "Popen"), b"(" + s("touch") + s(c) + b"t") + b".",
    "stack_global os.system": lambda c: b"\x80\x04" + s("os") + s("system") + b"\x93(" + s("touch " + c) + b"tR.",
    # torch.load gadgets from published advisories: recursing into torch.load, getattr chains,
    # NumPy's array reconstructor, TorchScript loaders
    "torch.load": lambda c: P2 + call(g("torch", "load"), s(c)) + b".",
    "torch.serialization.load": lambda c: P2 + call(g("torch.serialization", "load"), s(c)) + b".",
    "getattr chain": lambda c: P2 + call(g("builtins", "getattr"), call(g("builtins", "__import__"), s("os")),
                                         s("system")) + b"(" + s("touch " + c) + b"tR.",
    "numpy _reconstruct": lambda c: P2 + call(g("numpy.core.multiarray", "_reconstruct"), s(c)) + b".",
    "torch.jit.load": lambda c: P2 + call(g("torch.jit", "load"), s(c)) + b".",
    "copyreg _reconstructor": lambda c: P2 + call(g("copyreg", "_reconstructor"), g("os", "system")) + b".",
    "rebuild_tensor around os.system": lambda c: P2 + call(g("torch._utils", "_rebuild_tensor_v2"),
                                                          call(g("os", "system"), s("touch " + c))) + b".",
    "rebuild_from_type_v2 with eval": lambda c: P2 + call(g("torch._tensor", "_rebuild_from_type_v2"),
                                                         g("builtins", "eval"), g("torch", "Tensor"),
                                                         b"(" + s("open(%r,'w')" % c) + b"t", b"}") + b".",
}


@pytest.mark.parametrize("layout", ["plain", "zip", "legacy"])
@pytest.mark.parametrize("name", list(PAYLOADS))
def test_forbidden_globals_are_refused(tmp_path, canary, name, layout):
    data = _variants(PAYLOADS[name](canary), tmp_path)[layout]
    _refused(data, "refused global")


class _Reduces:
    def __init__(self, fn, args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


@pytest.mark.parametrize("fn", [open, os.system, exec, subprocess.call], ids=["open", "os.system", "exec", "call"])
def test_reduce_returning_a_callable(tmp_path, canary, fn):
    args = (canary, "w") if fn is open else ("open(%r, 'w')" % canary,) if fn is exec else \
        (["touch", canary],) if fn is subprocess.call else ("touch " + canary,)
    payload = pickle.dumps({"w": _Reduces(fn, args)}, protocol=2)
    for data in _variants(payload, tmp_path).values():
        _refused(data, "refused global")


def test_torch_save_of_a_whole_module_is_refused_naming_the_class(tmp_path):
    path = tmp_path / "model.pt"
    torch.save(torch.nn.Linear(2, 2), path)
    with pytest.raises(cn.RecordError, match="refused global torch.nn.modules.linear.Linear"):
        load_pytorch(path)


@pytest.mark.parametrize("payload, match", [
    (lambda c: P2 + b"(" + s("touch " + c) + b"ios\nsystem\n.", "refused opcode INST"),
    (lambda c: P2 + b"(" + g("collections", "OrderedDict") + b"o.", "refused opcode OBJ"),
    (lambda c: P2 + b"(" + g("os", "system") + s("touch " + c) + b"o.", "refused global os.system"),
    (lambda c: b"(S'touch x'\nios\nsystem\n.", "refused opcode STRING|nor a pickle"),  # protocol 0
    (lambda c: P2 + g("collections", "OrderedDict") + b")\x81.", "refused NEWOBJ of collections.OrderedDict"),
    (lambda c: P2 + g("torch", "FloatStorage") + b")R.", "refused REDUCE on FloatStorage"),
    (lambda c: P2 + b"}" + b"}" + b"b.", "refused BUILD on a value of type dict"),
    (lambda c: P2 + g("collections", "OrderedDict") + b")R}" + s("x") + call(g("os", "system"), s("touch " + c))
     + b"sb.", "refused global os.system"),
    (lambda c: P2 + b"\x82\x01.", "refused opcode EXT1"),
    (lambda c: b"\x80\x05\x97.", "refused opcode NEXT_BUFFER"),
    (lambda c: P2 + b"\xff.", "unknown opcode 0xff"),
    (lambda c: b"\x80\x09N.", "pickle protocol 9"),
], ids=["INST", "OBJ", "OBJ os.system", "protocol0", "NEWOBJ", "REDUCE storage type", "BUILD dict",
        "BUILD state with os.system", "EXT1", "NEXT_BUFFER", "unknown opcode", "protocol 9"])
def test_forbidden_opcodes(tmp_path, canary, payload, match):
    for layout, data in _variants(payload(canary), tmp_path).items():
        _refused(data, match)


def test_nested_load_from_bytes_is_refused(tmp_path, canary):
    """A plain pickle may hold storages as legacy streams (_load_from_bytes); those may not nest."""
    inner = _legacy_with(P2 + call(g("torch.storage", "_load_from_bytes"), b"C\x00") + b".")
    payload = P2 + call(g("torch.storage", "_load_from_bytes"), b"B" + struct.pack("<I", len(inner)) + inner) + b"."
    _refused(payload, "refused global torch.storage._load_from_bytes")
    _refused(_zip_with(payload, tmp_path), "refused global torch.storage._load_from_bytes")


# -- resource bombs ----------------------------------------------------------------------------------

def test_memo_bomb():
    payload = b"\x80\x04N" + b"\x94" * 1000001 + b"."
    _refused(payload, "more than 1000000 memo entries")


def test_billion_laughs_is_not_expanded(tmp_path):
    """Ten levels of lists each holding the level below 1000 times: 10^30 leaves as a tree, ten
    thousand references as a graph. Nothing walks it; the tensor beside it loads."""
    build = s("leaf") + b"q\x00" + b"0"
    for level in range(1, 11):
        build += b"](" + (b"h" + bytes([level - 1])) * 1000 + b"eq" + bytes([level]) + b"0"
    _refused(P2 + build + b"}(" + s("lol") + b"h\x0au.", "cannot tell which entry")
    data = _zip_with(P2 + build + b"}(" + s("lol") + b"h\x0a" + s("w") + _ZIP_TENSOR + b"u.", tmp_path)
    state = load_pytorch(io.BytesIO(data))
    assert list(state) == ["w"] and state.notes == ["lol: skipped list of 1000 items (not a tensor)"]


# the tensor of the archive _zip_with starts from: torch.ones(2) in storage "0"
_ZIP_TENSOR = call(g("torch._utils", "_rebuild_tensor_v2"),
                   b"(" + s("storage") + g("torch", "FloatStorage") + s("0") + s("cpu") + b"K\x02tQ",
                   b"K\x00", b"K\x02\x85", b"K\x01\x85", b"\x89", g("collections", "OrderedDict") + b")R")


def test_deep_nesting():
    _refused(P2 + b"(" * 1001 + b".", "more than 1000 nested MARKs")
    # 50,000 nested lists built with a constant stack (memo slot 0 reused): built, never walked
    deep = P2 + b"]q\x01q\x000" + b"h\x00]q\x00a0" * 50000 + b"h\x01."
    _refused(deep, "holds list of 1 items, not a dict")
    nested_tuple = P2 + b")" + b"\x85" * 50000 + b"."         # ((((),),),) 50,000 deep
    _refused(nested_tuple, "holds tuple of 1 items, not a dict")
    as_key = P2 + b"}" + b")" + b"\x85" * 50000 + b"Ns."      # hashing it would overflow CPython's C stack
    _refused(as_key, "a tuple as a dict key")
    # 200,000 one-byte TUPLE1s build 9.6 MB of tuples from 200 KB: over the memory budget first
    _refused(P2 + b"}" + b")" + b"\x85" * 200000 + b"Ns.", "would cost more than 32 times")


def _zip_bytes(entries, compression=zipfile.ZIP_STORED):
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression) as z:
        for name, data in entries:
            z.writestr(name, data)
    return bytearray(out.getvalue())


def _storage_pickle(numel):
    return P2 + b"}" + s("w") + call(g("torch._utils", "_rebuild_tensor_v2"),
                                     b"(" + s("storage") + g("torch", "FloatStorage") + s("0") + s("cpu")
                                     + b"J" + struct.pack("<i", numel) + b"tQ",
                                     b"K\x00", b"J" + struct.pack("<i", numel) + b"\x85", b"K\x01\x85",
                                     b"\x89", g("collections", "OrderedDict") + b")R") + b"s."


def test_zip_bomb():
    """64 MB of zeros deflated to 64 KB: refused from the sizes in the headers, before inflating."""
    bomb = _zip_bytes([("a/data.pkl", _storage_pickle(16 << 20)), ("a/data/0", bytes(64 << 20))], zipfile.ZIP_DEFLATED)
    assert len(bomb) < 1 << 20
    _refused(bytes(bomb), "inflates .*zip bomb")


def test_zip_entry_that_inflates_past_its_declared_size():
    """Headers that claim 16 bytes for an entry that inflates to 1 MB: at most 17 bytes are read."""
    data = _zip_bytes([("a/data.pkl", _storage_pickle(4)), ("a/data/0", bytes(1 << 20))], zipfile.ZIP_DEFLATED)
    with zipfile.ZipFile(io.BytesIO(bytes(data))) as z:
        info = z.getinfo("a/data/0")
    central = data.find(b"PK\x01\x02", data.find(b"a/data/0") + 8)
    data[info.header_offset + 22:info.header_offset + 26] = struct.pack("<I", 16)   # local header
    data[central + 24:central + 28] = struct.pack("<I", 16)                           # central directory
    _refused(bytes(data), "gave 17 bytes, its header says 16|cannot be read")


def test_zip_entry_count_and_directory_caps():
    data = _zip_bytes([("a/data.pkl", P2 + b"}.")])
    end = data.rfind(b"PK\x05\x06")
    lying = bytearray(data)
    lying[end + 10:end + 12] = struct.pack("<H", 0xFFFE)   # more entries than the cap... of 100000?
    lying[end + 12:end + 16] = struct.pack("<I", 64 << 20)  # a 64 MB central directory
    _refused(bytes(lying), "directory")


def test_data_pkl_pointing_at_missing_storage(tmp_path):
    pkl = P2 + b"}" + s("w") + _ZIP_TENSOR.replace(s("0"), s("7")) + b"s."
    data = _zip_with(pkl, tmp_path)
    _refused(data, "no entry 'clean/data/7'")


@pytest.mark.parametrize("edit, match", [
    (lambda t: t.replace(b"K\x02tQ", b"J\x00\x00\x00\x10tQ"), "holds 8 bytes, the pickle needs 1073741824"),
    (lambda t: t.replace(b"K\x00", b"K\x01", 1), "reads past storage"),
    (lambda t: t.replace(b"K\x02\x85", b"K\x03\x85", 1), "reads past storage"),
    (lambda t: t.replace(b"K\x01\x85", b"J\xff\xff\xff\xff\x85", 1), "non-negative ints"),
], ids=["storage larger than entry", "offset past end", "size past end", "negative stride"])
def test_sizes_are_checked_against_the_bytes_present(tmp_path, edit, match):
    data = _zip_with(P2 + b"}" + s("w") + edit(_ZIP_TENSOR) + b"s.", tmp_path)
    _refused(data, match)


def test_stride_zero_view_cannot_multiply_memory(tmp_path):
    huge = _ZIP_TENSOR.replace(b"K\x02\x85", b"J" + struct.pack("<i", 1 << 30) + b"\x85", 1).replace(
        b"K\x01\x85", b"K\x00\x85", 1)
    _refused(_zip_with(P2 + b"}" + s("w") + huge + b"s.", tmp_path), "views repeat data")


@pytest.mark.parametrize("layout", ["zip", "legacy", "plain"])
def test_truncated_files(tmp_path, layout):
    path = tmp_path / "t.pt"
    sample = {"w": torch.arange(64.0), "b": torch.ones(3, dtype=torch.int64)}
    if layout == "plain":
        path.write_bytes(pickle.dumps(sample, 2))
    else:
        torch.save(sample, path, _use_new_zipfile_serialization=layout == "zip")
    data = path.read_bytes()
    assert list(load_pytorch(io.BytesIO(data))) == ["w", "b"]
    for cut in sorted({1, 2, 10, len(data) // 3, len(data) // 2, len(data) - 30, len(data) - 1}):
        with pytest.raises(cn.RecordError):
            load_pytorch(io.BytesIO(data[:cut]))


def test_corrupt_storage_bytes_fail_the_crc(tmp_path):
    path = tmp_path / "c.pt"
    torch.save({"w": torch.arange(64.0)}, path)
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as z:
        info = z.getinfo("c/data/0")
    at = info.header_offset + 30 + len(info.filename) + len(info.extra) + 20
    data[at] ^= 0xFF
    _refused(bytes(data), "CRC")


def test_nothing_is_imported(tmp_path):
    """In a fresh interpreter, loading a hostile file after a clean one imports no module at all:
    nothing a file names gets imported."""
    hostile = tmp_path / "h.pt"
    hostile.write_bytes(_zip_with(P2 + call(g("this", "x"), s("y")) + b".", tmp_path))
    clean = tmp_path / "clean2.pt"   # the same zip writer as the hostile file, a torch data.pkl
    torch.save({"w": torch.ones(2)}, tmp_path / "t.pt")
    with zipfile.ZipFile(tmp_path / "t.pt") as z:
        clean.write_bytes(_zip_with(z.read("t/data.pkl"), tmp_path))
    code = ("import sys, cinders.record as r\nr.load_pytorch(sys.argv[2])\nbefore = set(sys.modules)\n"
            "try:\n    r.load_pytorch(sys.argv[1])\nexcept r.RecordError as e:\n    print('refused', e)\n"
            "print(sorted(set(sys.modules) - before))\n")
    out = subprocess.run([sys.executable, "-c", code, str(hostile), str(clean)], capture_output=True, text=True,
                         check=True).stdout
    assert "refused global this.x" in out and out.strip().endswith("[]")


def test_lengths_beyond_the_file_are_refused_before_allocating():
    """A 4 GB string claimed by a few bytes: refused from the lengths, in every layout."""
    payload = P2 + b"B" + struct.pack("<I", 2 ** 32 - 1) + b"\0" * 64
    _refused(payload, "truncated: 4294967295 bytes needed")
    _refused(_legacy_with(payload), "truncated")
    _refused(P2 + b"\x8e" + struct.pack("<Q", 2 ** 62) + b".", "truncated")
