"""The `cinders` command with a user's own model, and its option checking.

A model source file in the folder the command runs in, trained and saved with model.save,
then `cinders predict/eval RECORD INPUT --model-source FILE`, `cinders extract-model` on a
Learner checkpoint; every option is validated (the option named in the error, zero never
silently replaced), every option has help, file errors are one line naming the file, and
NaN never reaches the JSON output.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import cinders as cn
from cinders import cli

SPIRAL = '''
from cinders import nn


class SpiralMLP(nn.Module):
    def __init__(self, hidden=32):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(2, hidden), nn.Tanh(), nn.Linear(hidden, 2))

    def forward(self, x):
        return self.layers(x)
'''


def cinders(*argv, cwd=None):
    return subprocess.run([sys.executable, "-m", "cinders"] + [str(a) for a in argv], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def spiral_data(n=64, seed=0):
    rng = np.random.default_rng(seed)
    t = rng.uniform(0.0, 3.0, size=n)
    label = rng.integers(0, 2, size=n)
    r = t / 3.0
    angle = t * 2.5 + np.pi * label
    x = np.stack([r * np.cos(angle), r * np.sin(angle)], 1).astype(np.float32)
    return x, label


@pytest.fixture
def user_folder(tmp_path, monkeypatch):
    """A folder holding spiral_model.py and a trained spiral.safetensors, like a user's."""
    (tmp_path / "spiral_model.py").write_text(SPIRAL)
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib
    sys.modules.pop("spiral_model", None)
    module = importlib.import_module("spiral_model")
    backend = cn.Autodiff(cn.NumPy())
    cn.manual_seed(0)
    model = module.SpiralMLP(hidden=16).to(backend)
    x, y = spiral_data()
    opt = cn.optim.Adam(lr=0.05)
    for _ in range(40):
        loss = cn.nn.functional.cross_entropy(model(cn.tensor(x, backend=backend)),
                                              cn.tensor(y.astype(np.int32), backend=backend))
        opt.step(model, loss.backward())
    model.save(str(tmp_path / "spiral.safetensors"))
    yield tmp_path, module
    sys.modules.pop("spiral_model", None)


def test_predict_and_eval_a_user_model_from_its_folder(user_folder):
    folder, module = user_folder
    x, y = spiral_data(seed=1)
    (folder / "one.json").write_text(json.dumps(x[0].tolist()))
    (folder / "batch.json").write_text(json.dumps(x[:5].tolist()))
    (folder / "data.json").write_text(json.dumps({"inputs": x.tolist(), "labels": y.tolist()}))
    model = cn.load_model(str(folder / "spiral.safetensors"), backend=cn.NumPy(), allow=[module.SpiralMLP])
    assert model.layers[0].out_features == 16  # the constructor argument came back from the record
    want = model(cn.tensor(x, backend=cn.NumPy())).numpy()
    r = cinders("predict", "spiral.safetensors", "one.json", "--model-source", "spiral_model.py", cwd=folder)
    assert r.returncode == 0, r.stderr
    one = json.loads(r.stdout)
    assert one["class"] == int(want[0].argmax())
    np.testing.assert_allclose(one["logits"], want[0], atol=1e-5)
    r = cinders("predict", "spiral.safetensors", "batch.json", "--allow", "spiral_model.SpiralMLP", cwd=folder)
    assert r.returncode == 0, r.stderr
    batch = json.loads(r.stdout)
    assert batch["class"] == [int(k) for k in want[:5].argmax(1)]
    np.testing.assert_allclose(batch["logits"], want[:5], atol=1e-5)
    r = cinders("eval", "spiral.safetensors", "data.json", "--model-source", "spiral_model.py", cwd=folder)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "accuracy: %.4f\n" % np.mean(want.argmax(1) == y)
    # without the source, the advice is about the command line, not Python
    r = cinders("predict", "spiral.safetensors", "one.json", cwd=folder)
    assert r.returncode == 1 and "--model-source" in r.stderr and "allow=[" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_convert_into_a_user_model_class_from_its_source(tmp_path):
    """`convert --model-class NAME --model-source FILE`: a torch checkpoint loaded into the user's
    class, predicted with the same source, gives torch's logits (was: only cinders.models)."""
    import torch
    (tmp_path / "spiral_model.py").write_text(SPIRAL)
    torch.manual_seed(0)
    net = torch.nn.Module()
    net.layers = torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    torch.save({"model": net.state_dict()}, str(tmp_path / "spiral.pt"))
    x, _ = spiral_data(seed=2)
    (tmp_path / "one.json").write_text(json.dumps(x[0].tolist()))
    r = cinders("convert", "spiral.pt", "--out", "spiral.safetensors", "--model-class", "SpiralMLP",
                "--model-config", '{"hidden": 8}', "--model-source", "spiral_model.py", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r = cinders("predict", "spiral.safetensors", "one.json", "--model-source", "spiral_model.py", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    with torch.no_grad():
        want = net.layers(torch.from_numpy(x[:1])).numpy()[0]
    np.testing.assert_allclose(json.loads(r.stdout)["logits"], want, atol=1e-5)
    r = cinders("convert", "spiral.pt", "--out", "x.safetensors", "--model-class", "Nope",
                "--model-source", "spiral_model.py", cwd=tmp_path)
    assert r.returncode == 1 and "Nope" in r.stderr and "SpiralMLP" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_extract_model_from_a_learner_checkpoint(user_folder):
    from cinders.data import DataLoader, ListDataset, Batcher
    from cinders.train import Learner
    folder, module = user_folder
    x, y = spiral_data()
    backend = cn.Autodiff(cn.NumPy())

    class Pairs(Batcher):
        def batch(self, items, rng):
            return (cn.tensor([list(p) for p, _ in items], backend=backend),
                    cn.tensor([int(k) for _, k in items], backend=backend, dtype=cn.int32))

    loader = DataLoader(ListDataset(list(zip(x.tolist(), y.tolist()))), 16, batcher=Pairs())
    model = module.SpiralMLP(hidden=8).to(backend)
    learner = Learner(model, cn.optim.Adam(lr=0.01), cn.nn.functional.cross_entropy,
                      out_dir=str(folder / "run"), dashboard=None)
    learner.fit(loader, epochs=1)
    checkpoint = folder / "run" / "checkpoint.safetensors"
    r = cinders("predict", checkpoint, "x.json", "--model-source", "spiral_model.py", cwd=folder)
    assert r.returncode == 1 and "extract-model" in r.stderr, r.stderr
    with pytest.raises(cn.RecordError, match="extract-model"):
        cn.load_model(str(checkpoint), allow=[module.SpiralMLP])
    r = cinders("extract-model", checkpoint, "--out", "extracted.safetensors", cwd=folder)
    assert r.returncode == 0, r.stderr
    again = cn.load_model(str(folder / "extracted.safetensors"), backend=cn.NumPy(), allow=[module.SpiralMLP])
    np.testing.assert_allclose(again.layers[0].weight.numpy(), learner.model.layers[0].weight.numpy())
    assert cn.record.read_metadata(str(folder / "extracted.safetensors"))["input_shape"] == "[2]"
    assert again._input_shape == (2,)  # kept by load_model: a re-save records it again


@pytest.mark.parametrize("argv, option", [
    (["train", "--out", "x.safetensors", "--lr", "nan"], "--lr"),
    (["train", "--out", "x.safetensors", "--lr", "-1"], "--lr"),
    (["train", "--out", "x.safetensors", "--lr", "0"], "--lr"),
    (["train", "--out", "x.safetensors", "--epochs", "0"], "--epochs"),
    (["train", "--out", "x.safetensors", "--train-limit", "-1"], "--train-limit"),
    (["train", "--out", "x.safetensors", "--train-limit", "0"], "--train-limit"),
    (["train", "--out", "x.safetensors", "--batch-size", "0"], "--batch-size"),
    (["train", "--out", "x.safetensors", "--workers", "two"], "--workers"),
    (["eval", "r.safetensors", "--dataset", "mnist", "--threads", "-3"], "--threads"),
    (["predict", "r.safetensors", "i.json", "--input-shape", "1,0"], "--input-shape"),
    (["demo", "--port", "70000"], "--port"),
])
def test_every_option_is_validated_and_named(capsys, argv, option):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "argument %s" % option in err, err


def test_train_limit_beyond_the_dataset_names_the_option(capsys, tmp_path):
    code = cli.main(["train", "--model", "mlp", "--train-limit", "100000", "--out", str(tmp_path / "x"),
                     "--run-dir", str(tmp_path / "run")])
    assert code == 1 and "--train-limit 100000" in capsys.readouterr().err


def test_every_option_has_help_and_version_prints():
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    missing = []
    for name, p in sub.choices.items():
        for action in p._actions:
            if action.dest != "help" and not action.help:
                missing.append("%s %s" % (name, "/".join(action.option_strings) or action.dest))
    assert missing == []
    r = cinders("--version")
    assert r.returncode == 0 and r.stdout.strip() == "cinders " + cn.__version__


def test_file_errors_are_one_line_naming_the_file(tmp_path):
    for argv in (["quantize", "nonexist.safetensors", "--out", "q.safetensors"],
                 ["predict", "nonexist.safetensors", "in.json"],
                 ["eval", "nonexist.safetensors", "--dataset", "mnist"],
                 ["export-micro", "nonexist.safetensors", "--out", "b"],
                 ["extract-model", "nonexist.safetensors", "--out", "r.safetensors"]):
        r = cinders(*argv, cwd=tmp_path)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 1 and len(lines) == 1 and "nonexist.safetensors" in lines[0], (argv, r.stderr)
        assert "Errno" not in lines[0] and "Traceback" not in r.stderr


def test_nan_output_is_an_error_not_json(tmp_path, user_folder):
    folder, module = user_folder
    model = cn.load_model(str(folder / "spiral.safetensors"), backend=cn.NumPy(), allow=[module.SpiralMLP])
    (folder / "one.json").write_text("[0.5, 0.5]")
    huge = {k: v.numpy() * 0 + 3e38 for k, v in model.state_dict().items()}  # finite weights, inf logits
    model.load_state_dict(huge)
    model(cn.tensor([[0.5, 0.5]], backend=cn.NumPy()))  # logits are inf - inf = NaN
    model.save(str(folder / "huge.safetensors"))
    r = cinders("predict", "huge.safetensors", "one.json", "--model-source", "spiral_model.py", cwd=folder)
    assert r.returncode == 1 and r.stdout == "" and "NaN or infinity" in r.stderr, r.stdout + r.stderr


def test_wgpu_is_quiet_on_stderr(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    r = subprocess.run([sys.executable, "-c", "import cinders as cn; print(cn.tensor([1.0, 2.0], "
                        "backend=cn.Wgpu()).exp().tolist())"], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0 and r.stderr == "", r.stderr


def test_hostile_inputs_get_one_line_errors(tmp_path):
    model = cn.nn.Linear(2, 2).to(cn.NumPy())
    model(cn.tensor([[0.0, 0.0]], backend=cn.NumPy()))
    model.save(str(tmp_path / "lin.safetensors"))
    (tmp_path / "deep.json").write_text("[" * 100000 + "]" * 100000)
    (tmp_path / "text.json").write_text('["a", 1]')
    (tmp_path / "nan.json").write_text("[NaN, 1]")
    for name, expect in (("/dev/zero", "larger than"), ("deep.json", "too deeply"),
                         ("text.json", "must hold numbers"), ("nan.json", "finite")):
        r = cinders("predict", "lin.safetensors", name, cwd=tmp_path)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 1 and len(lines) == 1 and expect in lines[0], (name, r.stderr)


SHIPPED = '''
from cinders import nn


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x):
        return self.fc(x)


class TinyConv(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3)
        self.flat = nn.Flatten()

    def forward(self, x):
        return self.flat(self.conv(x))
'''


def test_a_model_saved_before_it_ran_takes_its_shape_from_the_first_layer(tmp_path, monkeypatch):
    """No recorded input shape: Linear(3, 2) takes 3 numbers, Conv2d(2, ...) takes 2 x 4 x 4 from
    the 32 numbers of the input file (was: "pass --input-shape")."""
    (tmp_path / "shipped.py").write_text(SHIPPED)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("shipped", None)
    import shipped
    rng = np.random.default_rng(0)
    for cls, sample in ((shipped.Tiny, (3,)), (shipped.TinyConv, (2, 4, 4))):
        cn.manual_seed(0)
        model = cls().to(cn.NumPy())
        model.save(str(tmp_path / "m.safetensors"))
        x = rng.standard_normal(sample).astype(np.float32)
        (tmp_path / "x.json").write_text(json.dumps(x.reshape(-1).tolist()))
        r = cinders("predict", "m.safetensors", "x.json", "--model-source", "shipped.py", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        want = model(cn.tensor(x[None], backend=cn.NumPy())).numpy()[0]
        np.testing.assert_allclose(json.loads(r.stdout)["logits"], want, atol=1e-5)
    sys.modules.pop("shipped", None)


def test_export_web_of_a_model_saved_before_it_ran_takes_its_shape_from_the_first_layer(tmp_path, monkeypatch):
    """A first Linear(3, 2) sizes the site's input; a first conv cannot without an input file, so
    the error asks for --input-shape."""
    (tmp_path / "shipped.py").write_text(SHIPPED)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("shipped", None)
    import shipped
    for cls, expect in ((shipped.Tiny, "INPUT_SHAPE = [3];"), (shipped.TinyConv, None)):
        cls().save(str(tmp_path / "m.safetensors"))
        r = cinders("export-web", "m.safetensors", "--model-source", "shipped.py", "--out", "site", cwd=tmp_path)
        if expect:
            assert r.returncode == 0, r.stderr
            assert expect in (tmp_path / "site" / "app.js").read_text()
        else:
            assert r.returncode == 1 and r.stderr.strip().endswith("pass --input-shape A,B,..."), r.stderr
    sys.modules.pop("shipped", None)


@pytest.mark.parametrize("layer, x_shape, words", [
    (lambda: cn.nn.Conv1d(3, 4, 3), (1, 2, 10), ["Conv1d", "3-D", "C = 3", "(1, 2, 10)"]),
    (lambda: cn.nn.Conv1d(3, 4, 3), (1, 3, 2, 10), ["Conv1d", "3-D", "(1, 3, 2, 10)"]),
    (lambda: cn.nn.Conv2d(3, 4, 3), (1, 5, 8, 8), ["Conv2d", "4-D", "C = 3", "(1, 5, 8, 8)"]),
])
def test_conv_layers_report_their_own_name_and_rank(layer, x_shape, words):
    x = cn.tensor(np.zeros(x_shape, np.float32), backend=cn.NumPy())
    with pytest.raises(cn.ShapeError) as e:
        layer().to(cn.NumPy())(x)
    assert all(w in str(e.value) for w in words) and "conv2d" not in str(e.value), str(e.value)


def test_import_onnx_counts_device_reads_by_op_and_export_micro_points_to_import_onnx(tmp_path):
    """Many data-dependent nodes are one short line (names only with --verbose); export-micro of an
    .onnx file says to import it first (was: "corrupt header: declared header size ...")."""
    import onnx
    from onnx import TensorProto, helper
    nodes = [helper.make_node("Reshape", ["x" if i == 0 else "r%d" % (i - 1), "s"], ["r%d" % i], name="reshape_%d" % i)
             for i in range(30)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6]),
                                           helper.make_tensor_value_info("s", TensorProto.INT64, [2])],
                              [helper.make_tensor_value_info("r29", TensorProto.FLOAT, None)])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "m.onnx"))
    r = cinders("import-onnx", "m.onnx", "--out", "imported", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    reads = [line for line in r.stdout.splitlines() if "device values" in line]
    assert len(reads) == 1 and reads[0].startswith("30 node(s)") and reads[0].endswith(": Reshape x30"), r.stdout
    r = cinders("import-onnx", "m.onnx", "--out", "imported", "--verbose", cwd=tmp_path)
    assert r.returncode == 0 and "Reshape 'reshape_29'" in r.stdout.splitlines(), r.stdout
    r = cinders("export-micro", "m.onnx", "--out", "bundle", cwd=tmp_path)
    assert r.returncode == 1 and "import-onnx m.onnx" in r.stderr and "header" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_an_optimizer_state_counts_the_tensors_it_holds_deeper(tmp_path):
    """An optimizer's state dict keeps its tensors a level down: the refusal counts them
    (was: "state: dict with 4 entries (0 tensors)")."""
    import torch
    net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 1))
    opt = torch.optim.Adam(net.parameters())
    net(torch.ones(1, 2)).sum().backward()
    opt.step()
    torch.save(opt.state_dict(), str(tmp_path / "opt.pt"))
    r = cinders("convert", "opt.pt", "--out", "x.safetensors", cwd=tmp_path)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "state: dict with 4 entries (0 tensors; 12 more nested deeper)" in r.stderr, r.stderr


def test_an_imported_model_with_an_inf_constant_loads_with_the_line_import_onnx_prints(tmp_path):
    """A legitimate -inf constant is declared in the record's metadata, so the printed
    `Model.load(...)` takes it (was: refused by the non-finite check); other tensors stay checked."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
    floor = numpy_helper.from_array(np.array([-np.inf, 0.0, -np.inf], np.float32), "floor")
    scale = numpy_helper.from_array(np.array([2.0, 2.0, 2.0], np.float32), "scale")
    graph = helper.make_graph([helper.make_node("Max", ["x", "floor"], ["m"]), helper.make_node("Mul", ["m", "scale"], ["y"])],
                              "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])], [floor, scale])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(tmp_path / "masked.onnx"))
    r = cinders("import-onnx", "masked.onnx", "--out", "out", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    line = [s for s in r.stdout.splitlines() if s.startswith("use it: ")][0]
    command = line[len("use it: "):].split("python -c ")[1].strip('"')
    x = np.array([-1.0, -1.0, 3.0], np.float32)
    code = command + "; import cinders as cn, json; print(json.dumps(m(cn.tensor(%r)).numpy().tolist()))" % (x.tolist(),)
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path / "out", capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_allclose(json.loads(done.stdout), want)
    # a record that declares nothing is still refused on a non-finite weight
    from cinders.record import read_metadata, read_tensors, save_tensors
    meta, tensors = read_tensors(str(tmp_path / "out" / "masked.safetensors"), cn.NumPy())
    assert json.loads(meta["nonfinite"]) == [n for n, t in tensors.items() if not np.isfinite(t.numpy()).all()]
    save_tensors(str(tmp_path / "bare.safetensors"), tensors, {k: v for k, v in meta.items() if k != "nonfinite"})
    with pytest.raises(cn.RecordError, match="allow_nonfinite"):
        read_tensors(str(tmp_path / "bare.safetensors"), cn.NumPy())
    assert "nonfinite" not in read_metadata(str(tmp_path / "bare.safetensors"))


def test_predict_without_numpy_defaults_to_the_python_backend(tmp_path, monkeypatch):
    """A plain install has no NumPy: `cinders predict` computes in pure Python (was: a raw
    ModuleNotFoundError). NumPy is hidden from the child by a finder that refuses it."""
    (tmp_path / "shipped.py").write_text(SHIPPED)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("shipped", None)
    import shipped
    cn.manual_seed(0)
    model = shipped.Tiny().to(cn.NumPy())
    sys.modules.pop("shipped", None)
    x = np.array([[0.5, -1.0, 2.0]], np.float32)
    want = model(cn.tensor(x, backend=cn.NumPy())).numpy()[0]
    model.save(str(tmp_path / "m.safetensors"))
    (tmp_path / "x.json").write_text(json.dumps(x[0].tolist()))
    no_numpy = ("import sys\n"
                "class NoNumPy:\n"
                "    def find_spec(self, name, path=None, target=None):\n"
                "        if name.partition('.')[0] == 'numpy':\n"
                "            raise ModuleNotFoundError(\"No module named 'numpy'\")\n"
                "sys.meta_path.insert(0, NoNumPy())\n"
                "from cinders.cli import main\n"
                "sys.exit(main(['predict', 'm.safetensors', 'x.json', '--model-source', 'shipped.py']))\n")
    r = subprocess.run([sys.executable, "-c", no_numpy], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    np.testing.assert_allclose(json.loads(r.stdout)["logits"], want, atol=1e-5)
