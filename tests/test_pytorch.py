"""cinders.record.load_pytorch against files torch.save writes (every layout, protocol and dtype),
Module.load_state_dict's remap/strict rules, and torchvision's resnet18 / mobilenet_v2 loaded
into cinders.models and compared with torch's logits."""

import collections
import io
import pickle

import numpy as np
import pytest
import torch

import backends as registry
import cinders as cn
import pytorch_twins
from cinders import models, nn
from cinders.record import load_pytorch


def _sample():
    """A state dict with every dtype, views over one storage, non-contiguous strides, a scalar,
    an empty tensor and a Parameter."""
    torch.manual_seed(0)
    base = torch.randn(4, 6)
    return collections.OrderedDict([
        ("f32", base), ("row_view", base[1]), ("col_view", base[:, 2]), ("transposed", base.t()),
        ("strided", base[::2, 1::3]), ("scalar", torch.tensor(2.5)), ("empty", torch.zeros(0, 3)),
        ("param", torch.nn.Parameter(torch.randn(3))),
        ("f16", torch.randn(5).half()), ("bf16", torch.randn(5).bfloat16()), ("f64", torch.randn(5).double()),
        ("i64", torch.tensor([-(2 ** 31), 0, 2 ** 31 - 1])), ("i32", torch.tensor([1, -2], dtype=torch.int32)),
        ("i8", torch.tensor([-128, 127], dtype=torch.int8)), ("u8", torch.tensor([0, 255], dtype=torch.uint8)),
        ("bool", torch.tensor([True, False])), ("num_batches_tracked", torch.tensor(7)),
    ])


def _expected(t):
    t = t.detach()
    return t.numpy() if t.dtype is torch.bool else t.float().numpy() if t.is_floating_point() else t.int().numpy()


def _assert_state(state, sample):
    assert list(state) == list(sample)
    for name, t in sample.items():
        got = state[name]
        assert isinstance(got, cn.Tensor)
        want = _expected(t)
        assert got.shape == tuple(t.shape), name
        assert got.dtype is (cn.bool if t.dtype is torch.bool else cn.float32 if t.is_floating_point() else cn.int32)
        np.testing.assert_array_equal(got.numpy(), want, err_msg=name)


def _save(path, obj, layout, protocol):
    if layout == "zip":
        torch.save(obj, path, pickle_protocol=protocol)
    elif layout == "legacy":
        torch.save(obj, path, pickle_protocol=protocol, _use_new_zipfile_serialization=False)
    else:
        with open(path, "wb") as f:
            pickle.dump(obj, f, protocol=protocol)
    return path


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
@pytest.mark.parametrize("layout", ["zip", "legacy", "plain"])
def test_every_layout_protocol_and_dtype(tmp_path, layout, protocol):
    sample = _sample()
    path = _save(tmp_path / "sample.pt", sample, layout, protocol)
    state = load_pytorch(path, backend=cn.NumPy())
    _assert_state(state, sample)
    assert "f64: float64 stored, loaded as float32" in state.notes
    assert "bf16: bfloat16 stored, loaded as float32" in state.notes
    assert "i64: int64 stored, loaded as int32 (range checked)" in state.notes
    assert not any(n.startswith("f32:") for n in state.notes)


@pytest.mark.parametrize("layout", ["zip", "legacy", "plain"])
def test_pure_python_path_without_numpy(tmp_path, monkeypatch, layout):
    """What Pyodide without NumPy runs: array/struct decoding and strided gathers in Python."""
    import cinders.record.pytorch as reader
    monkeypatch.setattr(reader, "_np", None)
    sample = _sample()
    state = load_pytorch(_save(tmp_path / "s.pt", sample, layout, 2), backend=cn.Python())
    assert all(t.backend.name == "python" for t in state.values())
    _assert_state(state, sample)


@pytest.mark.parametrize("name", registry.selected_names())
def test_every_backend_gets_the_same_tensors(tmp_path, name):
    backend = registry.BACKENDS[name]()
    sample = _sample()
    state = load_pytorch(_save(tmp_path / "s.pt", sample, "zip", 2), backend=backend)
    assert all(t.backend is backend for t in state.values())
    _assert_state(state, sample)


def test_sources_path_file_and_bytes(tmp_path):
    sample = {"w": torch.arange(6.0).reshape(2, 3)}
    path = _save(tmp_path / "w.pt", sample, "zip", 2)
    data = path.read_bytes()
    for source in (str(path), path, io.BytesIO(data), data):
        assert load_pytorch(source, backend=cn.NumPy())["w"].tolist() == [[0, 1, 2], [3, 4, 5]]
    state = load_pytorch(path, backend=cn.Python())
    assert state["w"].backend.name == "python"


def test_checkpoint_dict_finds_the_state_dict_and_lists_the_rest(tmp_path):
    model_state = {"fc.weight": torch.ones(2, 2), "fc.bias": torch.zeros(2)}
    optimizer = {"state": {0: {"momentum_buffer": torch.ones(2)}}, "param_groups": [{"lr": 0.1, "params": [0]}]}
    checkpoint = {"epoch": 12, "model": model_state, "optimizer": optimizer, "best": 0.9}
    path = _save(tmp_path / "ck.pt", checkpoint, "zip", 2)
    state = load_pytorch(path)
    assert list(state) == ["fc.weight", "fc.bias"] and state.key == "model"
    assert state.other["epoch"] == "int 12" and state.other["best"] == "float 0.9"
    assert state.other["optimizer"].startswith("dict with 2 entries")
    assert list(load_pytorch(path, top_level_key="model")) == ["fc.weight", "fc.bias"]
    with pytest.raises(cn.RecordError, match="no key 'weights'.*epoch: int 12"):
        load_pytorch(path, top_level_key="weights")
    with pytest.raises(cn.RecordError, match="not a dict of tensors"):
        load_pytorch(path, top_level_key="epoch")
    nested = _save(tmp_path / "n.pt", {"model": {"backbone": model_state}, "other": {"x": torch.ones(1)}}, "zip", 2)
    assert list(load_pytorch(nested, top_level_key="model.backbone")) == ["fc.weight", "fc.bias"]
    ambiguous = _save(tmp_path / "a.pt", {"a": model_state, "b": model_state}, "zip", 2)
    with pytest.raises(cn.RecordError, match=r"cannot tell which entry.*'a', 'b'.*top_level_key= \(cinders convert: --key\)"):
        load_pytorch(ambiguous)


def test_non_tensor_values_in_a_state_dict_are_skipped_with_a_note(tmp_path):
    path = _save(tmp_path / "x.pt", {"w": torch.ones(2), "version": 3}, "zip", 2)
    state = load_pytorch(path)
    assert list(state) == ["w"] and "version: skipped int 3 (not a tensor)" in state.notes


def test_int64_out_of_int32_range_is_refused(tmp_path):
    path = _save(tmp_path / "big.pt", {"ids": torch.tensor([2 ** 40])}, "zip", 2)
    with pytest.raises(cn.RecordError, match="outside int32"):
        load_pytorch(path)


def test_tensors_with_python_attributes_load_without_them(tmp_path):
    """torch pickles those through _rebuild_from_type_v2 / _rebuild_parameter_with_state."""
    t = torch.arange(3.0)
    t.note = "kept by torch, dropped here"
    p = torch.nn.Parameter(torch.ones(2))
    p.tag = 1
    state = load_pytorch(_save(tmp_path / "attr.pt", {"t": t, "p": p}, "zip", 2))
    assert state["t"].tolist() == [0, 1, 2] and state["p"].tolist() == [1, 1]


def test_big_endian_archives(tmp_path, monkeypatch):
    """byteorder "big" (torch.save on a big-endian machine): storages are byte-swapped back."""
    import zipfile
    src = _save(tmp_path / "le.pt", {"w": torch.tensor([1.5, -2.0]), "n": torch.tensor([7, -9])}, "zip", 2)
    out = tmp_path / "be.pt"
    with zipfile.ZipFile(src) as z, zipfile.ZipFile(out, "w") as w:
        for info in z.infolist():
            data = z.read(info)
            if info.filename.endswith("/byteorder"):
                data = b"big"
            elif "/data/" in info.filename:
                itemsize = 4 if info.filename.endswith("/0") else 8
                data = np.frombuffer(data, dtype="<u%d" % itemsize).byteswap().tobytes()
            w.writestr(info.filename.replace("le/", "be/"), data)
    for backend in (cn.NumPy(), cn.Python()):
        state = load_pytorch(out, backend=backend)
        assert state["w"].tolist() == [1.5, -2.0] and state["n"].tolist() == [7, -9]
    import cinders.record.pytorch as reader
    monkeypatch.setattr(reader, "_np", None)
    state = load_pytorch(out, backend=cn.Python())
    assert state["w"].tolist() == [1.5, -2.0] and state["n"].tolist() == [7, -9]


# -- Module.load_state_dict: remap and strict -------------------------------------------------------

class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
        self.norm = nn.BatchNorm2d(2)


def _torch_net_state():
    torch.manual_seed(1)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    state = {"module.features." + k: v for k, v in net.state_dict().items()}
    bn = torch.nn.BatchNorm2d(2)
    state.update({"module.bn." + k: v for k, v in bn.state_dict().items()})
    return state


def test_remap_rules_rename_keys_in_order(tmp_path):
    path = _save(tmp_path / "dp.pt", _torch_net_state(), "zip", 2)
    net = _Net()
    with pytest.raises(cn.RecordError, match="missing keys: body.0.weight.*unexpected keys: module.features.0.weight"):
        net.load_state_dict(load_pytorch(path))
    result = net.load_state_dict(load_pytorch(path), remap=[(r"^module\.", ""), (r"^features\.", "body."),
                                                            (r"^bn\.", "norm.")])
    assert result.missing_keys == [] and result.unexpected_keys == []
    assert net.norm.num_batches_tracked.dtype is cn.int32
    twin = _torch_net_state()
    np.testing.assert_array_equal(net.body[2].bias.numpy(), twin["module.features.2.bias"].numpy())


def test_remap_collisions_and_bad_rules_are_errors():
    net = _Net()
    state = {k: v.numpy() for k, v in _torch_net_state().items()}
    with pytest.raises(cn.RecordError, match="remap sends both"):
        net.load_state_dict(state, remap=[(r"^module\.(features|bn)\..*", "x")])
    with pytest.raises(cn.RecordError, match="remap rule"):
        net.load_state_dict(state, remap=[("(", "x")])


def test_strict_false_reports_missing_and_unexpected_and_loads_the_rest():
    net = _Net()
    before = net.norm.weight.numpy().copy()
    state = {"body.0.weight": np.full((4, 3), 0.5, np.float32), "head.weight": np.ones((1, 1), np.float32)}
    result = net.load_state_dict(state, strict=False)
    assert result.unexpected_keys == ["head.weight"]
    assert "body.0.bias" in result.missing_keys and "norm.num_batches_tracked" in result.missing_keys
    assert (net.body[0].weight.numpy() == 0.5).all()
    np.testing.assert_array_equal(net.norm.weight.numpy(), before)


def test_shape_mismatches_are_listed_and_nothing_loads():
    net = _Net()
    before = net.body[0].weight.numpy().copy()
    state = {k: v.numpy() for k, v in _torch_net_state().items()}
    state["module.features.0.weight"] = np.zeros((5, 3), np.float32)
    state["module.bn.running_mean"] = np.zeros(3, np.float32)
    with pytest.raises(cn.RecordError) as info:
        net.load_state_dict(state, strict=False, remap=[(r"^module\.features\.", "body."), (r"^module\.bn\.", "norm.")])
    assert "body.0.weight: expected shape (4, 3), got (5, 3)" in str(info.value)
    assert "norm.running_mean: expected shape (2,), got (3,)" in str(info.value)
    np.testing.assert_array_equal(net.body[0].weight.numpy(), before)


# -- torchvision architectures: torch's weights, cinders' forward, torch's logits -------------------

@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2"])
def test_torchvision_models_give_torchs_logits(tmp_path, name):
    twin = pytorch_twins.seeded(pytorch_twins.ResNet18() if name == "resnet18" else pytorch_twins.MobileNetV2())
    path = tmp_path / (name + ".pth")
    torch.save(twin.state_dict(), path)
    backend = cn.NumPy()
    model = getattr(models, name)(backend=backend).eval()
    assert list(model.state_dict()) == list(twin.state_dict())
    state = load_pytorch(path, backend=backend)
    assert model.load_state_dict(state) == ([], [])
    assert model.layer1[0].bn1.num_batches_tracked.item() == 1000 if name == "resnet18" else True
    x = np.random.default_rng(0).standard_normal((2, 3, 64, 64)).astype(np.float32)
    with torch.no_grad():
        want = twin(torch.tensor(x)).numpy()
    got = model(cn.tensor(x, backend=backend)).numpy()
    assert got.shape == (2, 1000)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


# -- cinders convert and export-micro with a .pt input --------------------------------------------------

def test_cli_convert_writes_safetensors_the_official_library_reads(tmp_path, capsys):
    from safetensors.numpy import load_file
    from cinders.cli import main
    torch.manual_seed(0)
    weights = {"module.fc.weight": torch.randn(2, 3), "module.fc.bias": torch.randn(2),
               "module.bn.num_batches_tracked": torch.tensor(4), "half": torch.randn(3).half()}
    src = tmp_path / "ck.pth"
    torch.save({"state_dict": weights, "epoch": 7}, src)
    out = tmp_path / "ck.safetensors"
    assert main(["convert", str(src), "--out", str(out), "--key", "state_dict", "--remap", r"^module\.="]) == 0
    printed = capsys.readouterr().out
    assert "read 4 tensors" in printed and "also in the file (not converted): epoch: int 7" in printed
    assert "note: float16 stored, loaded as float32: half" in printed
    got = load_file(str(out))
    assert sorted(got) == ["bn.num_batches_tracked", "fc.bias", "fc.weight", "half"]
    np.testing.assert_array_equal(got["fc.weight"], weights["module.fc.weight"].numpy())
    assert got["bn.num_batches_tracked"].dtype == np.int32 and got["bn.num_batches_tracked"] == 4
    np.testing.assert_array_equal(got["half"], weights["half"].float().numpy())


def test_cli_convert_refuses_hostile_files_and_bad_rules(tmp_path, capsys):
    from cinders.cli import main
    evil = tmp_path / "evil.pt"
    evil.write_bytes(b"\x80\x02cos\nsystem\n(X\x05\x00\x00\x00touchtR.")
    assert main(["convert", str(evil), "--out", str(tmp_path / "x.safetensors")]) == 1
    assert "refused global os.system" in capsys.readouterr().err
    assert not (tmp_path / "x.safetensors").exists()
    torch.save({"w": torch.ones(1)}, tmp_path / "ok.pt")
    assert main(["convert", str(tmp_path / "ok.pt"), "--out", str(tmp_path / "y.safetensors"), "--remap", "nope"]) == 1
    assert "REGEX=REPLACEMENT" in capsys.readouterr().err


def test_export_micro_accepts_a_pytorch_checkpoint(tmp_path, monkeypatch):
    """A .pt state dict -> `cinders export-micro --model-class` -> the MicroPython unix port gives
    torch's logits."""
    import json
    import shutil
    import subprocess
    import sys
    from cinders.cli import main
    micropython = shutil.which("micropython") or str(__import__("pathlib").Path(sys.executable).parent / "micropython")
    torch.manual_seed(3)
    twin = pytorch_twins.TorchMLP().eval()
    src = tmp_path / "mlp.pt"
    torch.save(twin.state_dict(), src)
    bundle = tmp_path / "bundle"
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(scratch))
    with pytest.raises(cn.RecordError, match="pass --model-class"):
        from cinders.micro.export import export_micro
        export_micro(str(src), str(bundle))
    assert main(["export-micro", str(src), "--out", str(bundle), "--model-class", "cinders.models.mnist.MnistMLP"]) == 0
    pixels = np.random.default_rng(0).random(784).astype(np.float32)
    (tmp_path / "x.json").write_text(json.dumps(pixels.tolist()))
    run = subprocess.run([micropython, "-X", "heapsize=160K", "predict.py", str(tmp_path / "x.json")], cwd=bundle,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout.strip().splitlines()[-1])
    with torch.no_grad():
        want = twin(torch.tensor(pixels).reshape(1, 1, 28, 28))[0].numpy()
    np.testing.assert_allclose(got["logits"], want, rtol=1e-4, atol=1e-4)
    assert (bundle / "model.safetensors").exists() and not list(scratch.iterdir())  # converted, then removed
