"""Records: our pure-Python safetensors reader/writer against the format's spec, the official
`safetensors` package, NumPy's float16, the real MicroPython interpreter, and corrupt files."""

import json
import os
import shutil
import struct
import subprocess

import numpy as np
import pytest

import cinders as cn
from cinders import nn, record
from cinders.models.mnist import MnistMLP, MnistCNN
from cinders.record import safetensors as st
from cinders.record import safetensors_write as stw

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MICROPYTHON = shutil.which("micropython") or os.path.join(REPO, ".venv", "bin", "micropython")


def state_arrays(model):
    return {k: v.numpy().copy() for k, v in model.state_dict().items()}


def assert_same_state(a, b):
    assert list(a) == list(b)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


# ---------------------------------------------------------------- round trips

@pytest.mark.parametrize("backend", [cn.NumPy(), cn.Python()], ids=["numpy", "python"])
def test_float32_round_trip_is_exact(tmp_path, backend):
    cn.manual_seed(1)
    model = MnistMLP(hidden=8).to(backend)
    path = str(tmp_path / "mlp.safetensors")
    model.save(path)
    other = MnistMLP(hidden=8).to(backend)
    assert not np.array_equal(other.state_dict()["layers.1.weight"].numpy(),
                              model.state_dict()["layers.1.weight"].numpy())
    other.load(path)
    assert_same_state(state_arrays(model), state_arrays(other))
    assert other.state_dict()["layers.1.weight"].backend == backend


def test_float16_storage_rounds_like_numpy_and_halves_the_file(tmp_path):
    model = MnistCNN(channels1=4, channels2=4, hidden=8)
    p32, p16 = str(tmp_path / "a32.safetensors"), str(tmp_path / "a16.safetensors")
    model.save(p32)
    model.save(p16, dtype=cn.float16)
    loaded = MnistCNN.load(p16)
    assert loaded.config() == model.config()
    for k, v in model.state_dict().items():
        want = v.numpy().astype(np.float16).astype(np.float32)
        np.testing.assert_array_equal(loaded.state_dict()[k].numpy(), want, err_msg=k)
        assert loaded.state_dict()[k].dtype is cn.float32  # storage only; compute stays float32
    data32 = os.path.getsize(p32) - 8 - struct.unpack("<Q", open(p32, "rb").read(8))[0]
    data16 = os.path.getsize(p16) - 8 - struct.unpack("<Q", open(p16, "rb").read(8))[0]
    assert data16 * 2 == data32


def test_metadata_names_class_config_version_and_dtype(tmp_path):
    path = str(tmp_path / "cnn.safetensors")
    MnistCNN(channels1=4, channels2=6, hidden=10).save(path, dtype=cn.float16)
    meta = record.read_metadata(path)
    assert meta["format"] == "cinders"
    assert meta["cinders_version"] == cn.__version__
    assert meta["model_class"] == "cinders.models.mnist.MnistCNN"
    assert json.loads(meta["model_config"]) == {"channels1": 4, "channels2": 6, "hidden": 10}
    assert meta["dtype"] == "float16"
    model = record.load_model(path, backend=cn.Python())
    assert type(model) is MnistCNN and model.config()["channels2"] == 6
    assert model.state_dict()["layers.0.weight"].backend == cn.Python()


def test_float16_overflow_is_a_clear_error(tmp_path):
    model = MnistMLP(hidden=4)
    model.layers[3].bias = cn.tensor([1e5] + [0.0] * 9)
    with pytest.raises(cn.RecordError, match="does not fit float16"):
        model.save(str(tmp_path / "x.safetensors"), dtype=cn.float16)
    assert not os.listdir(tmp_path)  # the atomic write left nothing behind


# ---------------------------------------------------------------- the format itself

def test_interoperates_with_the_official_safetensors_package(tmp_path):
    from safetensors.numpy import load_file, save_file
    rng = np.random.default_rng(0)
    arrays = {
        "f32": rng.standard_normal((3, 5)).astype(np.float32),
        "f16": rng.standard_normal((7,)).astype(np.float16),
        "i32": rng.integers(-1000, 1000, (2, 2, 2)).astype(np.int32),
        "i8": rng.integers(-128, 127, (4,)).astype(np.int8),
        "u8": rng.integers(0, 255, (4,)).astype(np.uint8),
        "flag": np.array([True, False, True]),
        "scalar": np.array(3.5, dtype=np.float32),
        "empty": np.zeros((0, 3), dtype=np.float32),
    }
    theirs = str(tmp_path / "theirs.safetensors")
    save_file(arrays, theirs, metadata={"who": "official"})
    meta, tensors = st.read_file(theirs)
    assert meta == {"who": "official"}
    for name, a in arrays.items():
        dtype, shape, values = tensors[name]
        assert shape == a.shape
        np.testing.assert_array_equal(np.asarray(list(values), dtype=np.float64).reshape(a.shape),
                                      a.astype(np.float64), err_msg=name)
    ours = str(tmp_path / "ours.safetensors")
    stw.write_file(ours, {n: (dtype, shape, list(values)) for n, (dtype, shape, values) in tensors.items()},
                  {"who": "cinders"})
    back = load_file(ours)
    for name, a in arrays.items():
        assert back[name].dtype == (np.uint8 if name == "flag" else a.dtype) or a.dtype == np.bool_
        np.testing.assert_array_equal(back[name].astype(a.dtype), a, err_msg=name)


def test_writer_follows_the_spec_byte_for_byte():
    # Built by hand from the spec: u64 header size, JSON header, then little-endian data.
    entries = [("a", "F32", (2,), struct.pack("<2f", 1.5, -2.0)), ("b", "I32", (), struct.pack("<i", 7))]

    class Sink:
        data = b""

        def write(self, b):
            self.data += bytes(b)

    sink = Sink()
    stw.write(sink, entries, {"k": "v"})
    n = struct.unpack("<Q", sink.data[:8])[0]
    assert (8 + n) % 8 == 0  # data starts 8-byte aligned, like the reference writer
    header = json.loads(sink.data[8:8 + n].decode("utf-8"))
    assert header == {"__metadata__": {"k": "v"},
                      "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                      "b": {"dtype": "I32", "shape": [], "data_offsets": [8, 12]}}
    assert sink.data[8 + n:] == struct.pack("<2fi", 1.5, -2.0, 7)


def hand_built(header, data):
    text = json.dumps(header).encode("utf-8")
    return struct.pack("<Q", len(text)) + text + data


def test_reads_a_hand_built_file_with_padding_and_any_tensor_order(tmp_path):
    header = {"w": {"dtype": "F16", "shape": [2], "data_offsets": [4, 8]},
              "v": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}}
    text = json.dumps(header).encode("utf-8") + b"     "  # trailing spaces are allowed
    data = bytes([1, 2, 3, 250]) + struct.pack("<2H", 0x3C00, 0xC000)  # 1.0, -2.0 in binary16
    path = tmp_path / "h.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    meta, tensors = st.read_file(str(path))
    assert meta == {}
    assert list(tensors["v"][2]) == [1, 2, 3, 250]
    assert list(tensors["w"][2]) == [1.0, -2.0]


def test_float16_bit_conversion_matches_numpy_in_both_directions():
    bits = np.arange(65536, dtype=np.uint16)
    want = bits.view(np.float16).astype(np.float32)
    got = np.array([st.f16_bits_to_float(int(b)) for b in bits], dtype=np.float32)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_array_equal(got[ok].view(np.uint32), want[ok].view(np.uint32))  # signed zeros too

    rng = np.random.default_rng(0)
    values = np.concatenate([
        rng.standard_normal(2000) * 10.0 ** rng.integers(-9, 5, 2000),  # subnormal .. large
        want[ok & (np.abs(want) < 65504)].astype(np.float64) * (1 + 2.0 ** -11),  # exact ties
        [0.0, -0.0, 65504.0, 65519.99, 2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -26, 1e-9, np.inf, -np.inf],
    ]).astype(np.float32)
    for v in values:
        b32 = int(np.array(v, dtype=np.float32).view(np.uint32))
        assert stw.f32_bits_to_f16_bits(b32) == int(np.array(v).astype(np.float16).view(np.uint16)), v


def test_the_manual_float16_path_matches_struct(monkeypatch):
    values = [0.0, -0.0, 1.0, 3.14159, -65504.0, 6e-8, 1e-5, 0.333, float("inf")]
    with_struct = stw.encode(values, "F16")
    monkeypatch.setattr(st, "_STRUCT_F16", False)  # what a board without struct 'e' runs
    monkeypatch.setattr(stw, "_STRUCT_F16", False)
    assert stw.encode(values, "F16") == with_struct
    assert st.decode(with_struct, "F16") == list(struct.unpack("<9e", with_struct))
    with pytest.raises(cn.RecordError, match="does not fit float16"):
        stw.encode([1.0, -70000.0], "F16", "big")


def test_micropython_streams_a_record_written_by_cpython(tmp_path):
    """The micro runtime reuses safetensors.py as is: run it in the real MicroPython."""
    model = MnistMLP(hidden=4)
    path = str(tmp_path / "m.safetensors")
    model.save(path, dtype=cn.float16)
    shutil.copy(st.__file__, tmp_path / "safetensors_format.py")
    (tmp_path / "check.py").write_text(
        "import safetensors_format as st\n"
        "from array import array\n"
        "st._STRUCT_F16 = False\n"  # exercise the bit-twiddling path boards use
        "f = open('m.safetensors', 'rb')\n"
        "r = st.Reader(f)\n"
        "out = {}\n"
        "for name in r.names():\n"
        "    t = r.info(name)\n"
        "    raw = bytearray(t.nbytes)\n"
        "    r.read_into(name, raw)\n"
        "    out[name] = [st.f16_bits_to_float(raw[2*i] | (raw[2*i+1] << 8)) for i in range(len(raw)//2)]\n"
        "    assert out[name] == r.read(name)\n"
        "import json\n"
        "print(json.dumps({'meta': r.metadata, 'sums': {k: sum(v) for k, v in out.items()}}))\n"
        "try:\n"
        "    st.Reader(open('check.py', 'rb'))\n"
        "except st.RecordError as e:\n"
        "    print('rejected')\n")
    run = subprocess.run([MICROPYTHON, "check.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr + run.stdout
    lines = run.stdout.strip().splitlines()
    got = json.loads(lines[0])
    assert lines[1] == "rejected"
    assert got["meta"]["model_class"] == "cinders.models.mnist.MnistMLP"
    for k, v in model.state_dict().items():
        assert got["sums"][k] == pytest.approx(float(v.numpy().astype(np.float16).astype(np.float64).sum()), abs=1e-3)


# ---------------------------------------------------------------- corrupt files

def good_bytes():
    return hand_built({"__metadata__": {"format": "cinders"},
                       "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
                       "b": {"dtype": "F32", "shape": [2], "data_offsets": [16, 24]}},
                      struct.pack("<6f", 1, 2, 3, 4, 5, 6))


def raw_header(text, data):
    return struct.pack("<Q", len(text)) + text + data


def a(begin, end, dtype="F32", shape=(2, 2)):
    return {"dtype": dtype, "shape": list(shape), "data_offsets": [begin, end]}


CORRUPT = {
    "empty file": (b"", "too short"),
    "header size past the end": (struct.pack("<Q", 1000) + b"{}", "does not fit"),
    "absurd header size": (struct.pack("<Q", 2 ** 40) + b"{}" * 10, "larger than the limit"),
    "not JSON": (struct.pack("<Q", 5) + b"{abc}", "not valid JSON"),
    "not an object": (struct.pack("<Q", 2) + b"[]", "does not start with"),
    "duplicate key": (raw_header(b'{"a":%s,"a":%s}' % ((json.dumps(a(0, 16)).encode(),) * 2), bytes(16)),
                      "appears twice"),
    "unknown dtype": (hand_built({"a": a(0, 16, "F64", (2,))}, bytes(16)), "not supported"),
    "size disagrees with shape": (hand_built({"a": a(0, 12)}, bytes(12)), "needs 16 bytes"),
    "offsets overlap": (hand_built({"a": a(0, 16), "b": a(8, 24)}, bytes(24)), "overlap"),
    "offsets leave a hole": (hand_built({"a": a(0, 16), "b": a(20, 36)}, bytes(36)), "hole"),
    "offset past the end": (hand_built({"a": a(0, 16)}, bytes(10)), "past the end"),
    "trailing bytes": (hand_built({"a": a(0, 16)}, bytes(20)), "cover 16 bytes"),
    "negative shape": (hand_built({"a": a(0, 0, "F32", (-1, 0))}, b""), "non-negative"),
    "metadata not strings": (hand_built({"__metadata__": {"x": 1}}, b""), "not a string"),
    "truncated data": (good_bytes()[:-3], "past the end"),
    "truncated header": (good_bytes()[:40], "does not fit"),
}


@pytest.mark.parametrize("case", list(CORRUPT))
def test_corrupt_files_raise_record_error_with_the_reason(tmp_path, case):
    data, reason = CORRUPT[case]
    path = tmp_path / "bad.safetensors"
    path.write_bytes(data)
    with pytest.raises(cn.RecordError, match=reason):
        st.read_file(str(path))


def model_file_variants(path):
    """Broken versions of a valid record of MnistMLP(hidden=4)."""
    good = open(path, "rb").read()
    n = struct.unpack("<Q", good[:8])[0]
    header = json.loads(good[8:8 + n])
    data = good[8 + n:]
    renamed = dict(header)
    renamed["layers.1.weights"] = renamed.pop("layers.1.weight")
    missing = dict(header)
    dropped = missing.pop("layers.3.bias")
    missing_data = data[:dropped["data_offsets"][0]] + data[dropped["data_offsets"][1]:]
    for v in missing.values():
        if isinstance(v, dict) and "data_offsets" in v and v["data_offsets"][0] >= dropped["data_offsets"][1]:
            v["data_offsets"] = [o - 40 for o in v["data_offsets"]]
    reshaped = json.loads(json.dumps(header))
    reshaped["layers.3.weight"]["shape"] = [4, 10]
    return {
        "truncated": (good[:-100], "past the end"),
        "renamed key": (hand_built(renamed, data), "missing tensors: layers.1.weight; unexpected tensors: layers.1.weights"),
        "missing key": (hand_built(missing, missing_data), "missing tensors: layers.3.bias"),
        "wrong shape": (hand_built(reshaped, data), r"layers.3.weight: shape \(4, 10\) in the file, \(10, 4\)"),
        "flipped header byte": (good[:20] + b"\x00" + good[21:], "corrupt header"),
    }


def test_a_bad_record_leaves_the_model_unchanged(tmp_path):
    path = str(tmp_path / "good.safetensors")
    MnistMLP(hidden=4).save(path)
    target = MnistMLP(hidden=4)
    before = state_arrays(target)
    for case, (data, reason) in model_file_variants(path).items():
        bad = tmp_path / ("bad-%s.safetensors" % case.replace(" ", "-"))
        bad.write_bytes(data)
        with pytest.raises(cn.RecordError, match=reason):
            target.load(str(bad))
        assert_same_state(before, state_arrays(target))
    with pytest.raises(cn.RecordError, match="does not match"):
        MnistMLP(hidden=5).load(path)
    with pytest.raises(cn.RecordError, match="cannot open"):
        target.load(str(tmp_path / "nope.safetensors"))
    with pytest.raises(cn.RecordError, match="cannot open"):
        cn.load_model(str(tmp_path / "nope.safetensors"))


class Outside(nn.Module):
    def __init__(self, n=3):
        super().__init__()
        self.w = cn.zeros(n)

    def config(self):
        return {"n": self.w.shape[0]}


def class_name(cls):
    return cls.__module__ + "." + cls.__qualname__


def test_load_model_resolves_classes_only_from_the_registry(tmp_path):
    path = str(tmp_path / "outside.safetensors")
    Outside(5).save(path)
    with pytest.raises(cn.RecordError, match="was not allowed"):
        record.load_model(path)
    model = record.load_model(path, allow=[Outside])
    assert type(model) is Outside and model.w.shape == (5,)
    assert Outside.load(path).w.shape == (5,)
    # A record naming a cinders function is not a registered model: refused before anything runs.
    meta_path = str(tmp_path / "evil.safetensors")
    record.save_tensors(meta_path, {"w": cn.zeros(5)}, {"model_class": "cinders.record.save_tensors"})
    with pytest.raises(cn.RecordError, match="was not allowed"):
        record.load_model(meta_path)
    record.save_tensors(meta_path, {"w": cn.zeros(5)}, {"model_class": class_name(Outside),
                                                          "model_config": '{"width": 5}'})
    with pytest.raises(cn.RecordError, match="'width' is not an argument of Outside"):
        record.load_model(meta_path, allow=[Outside])
    record.save_tensors(meta_path, {"w": cn.zeros(5)}, {"model_class": "os.system", "model_config": "{}"})
    with pytest.raises(cn.RecordError, match="was not allowed"):
        record.load_model(meta_path)