"""The `cinders` command on the committed MNIST records: eval meets the targets, predict
classifies real held-out digits, bad input gets a clear error."""

import json
import os
import subprocess
import sys

import pytest

from cinders import cli, record
from cinders.data.mnist import MnistDigits

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(REPO, "web_demos", "models")
RECORDS = {"mlp": os.path.join(MODELS, "mnist-mlp.safetensors"),
           "cnn": os.path.join(MODELS, "mnist-cnn.safetensors")}
TARGETS = {"mlp": 0.955, "cnn": 0.980}  # held-out accuracy the default recipe must beat


@pytest.fixture(scope="module")
def heldout():
    return MnistDigits("heldout")


def run_cli(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_committed_records_describe_their_models():
    for name, path in RECORDS.items():
        meta = record.read_metadata(path)
        assert meta["model_class"] == "cinders.models.mnist.Mnist" + name.upper()
        assert meta["dtype"] == "float32" and meta["format"] == "cinders"


def torch_heldout_accuracy(name, heldout):
    """The record's accuracy computed by PyTorch (weights read by the official safetensors
    package): an oracle independent of cinders' layers and reader."""
    import numpy as np
    import torch
    from safetensors.torch import load_file
    nn = torch.nn
    if name == "mlp":
        model = nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))
    else:
        model = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                              nn.Linear(1568, 128), nn.ReLU(), nn.Linear(128, 10))
    model.load_state_dict({k[len("layers."):]: v for k, v in load_file(RECORDS[name]).items()})
    with torch.no_grad():
        logits = model(torch.from_numpy(np.asarray(heldout.images)).reshape(-1, 1, 28, 28))
    return (logits.argmax(1).numpy() == np.asarray(heldout.labels)).mean()


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_eval_prints_heldout_accuracy_that_beats_the_target(name, heldout):
    run = subprocess.run([sys.executable, "-m", "cinders", "eval", RECORDS[name], "--dataset", "mnist"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert out.startswith("accuracy: ") and len(out.strip().split(" ")[1]) == 6  # e.g. 0.9871
    accuracy = float(out.split()[1])
    assert accuracy >= TARGETS[name], "%s reaches %.4f, target %.3f" % (name, accuracy, TARGETS[name])
    assert accuracy == pytest.approx(torch_heldout_accuracy(name, heldout), abs=1.5 / 1996)


def test_predict_classifies_heldout_digits(capsys, tmp_path, heldout):
    right = 0
    picks = range(0, 1996, 100)
    for i in picks:
        image, label = heldout[i]
        path = tmp_path / ("digit-%d.json" % i)
        path.write_text(json.dumps([float(v) for v in image]))
        code, out, _ = run_cli(capsys, "predict", RECORDS["cnn"], str(path))
        assert code == 0
        lines = out.strip().splitlines()
        assert len(lines) == 1
        result = json.loads(lines[0])
        assert sorted(result) == ["class", "logits"] and len(result["logits"]) == 10
        assert result["class"] == max(range(10), key=lambda k: result["logits"][k])
        right += result["class"] == label
    assert right >= len(picks) - 1


def test_python_m_cinders_predict_agrees_across_backends(tmp_path, heldout):
    image, label = heldout[7]
    path = tmp_path / "digit.json"
    path.write_text(json.dumps([float(v) for v in image]))
    results = []
    for backend in ("numpy", "python"):
        run = subprocess.run([sys.executable, "-m", "cinders", "predict", RECORDS["mlp"], str(path),
                              "--backend", backend], capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        results.append(json.loads(run.stdout))
    assert results[0]["class"] == results[1]["class"] == label
    assert results[0]["logits"] == pytest.approx(results[1]["logits"], abs=1e-4)


def test_bad_input_gets_a_clear_error(capsys, tmp_path):
    short = tmp_path / "short.json"
    short.write_text(json.dumps([0.5] * 10))
    code, _, err = run_cli(capsys, "predict", RECORDS["mlp"], str(short))
    assert code == 1 and "784 numbers" in err and "10 items" in err
    bright = tmp_path / "bright.json"
    bright.write_text(json.dumps([255.0] * 784))
    code, _, err = run_cli(capsys, "predict", RECORDS["mlp"], str(bright))
    assert code == 1 and "[0, 1]" in err
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(open(RECORDS["mlp"], "rb").read()[:1000])
    code, _, err = run_cli(capsys, "eval", str(broken), "--dataset", "mnist")
    assert code == 1 and "truncated" in err
    with pytest.raises(SystemExit):
        cli.main(["predict"])  # argparse: missing arguments


def test_every_subcommand_is_registered_in_the_table():
    parser = cli.build_parser()
    for name in ("train", "eval", "predict"):
        assert name in cli.COMMANDS
        assert parser.parse_args([name] + {"train": ["--dataset", "mnist", "--out", "x"], "eval": ["r", "--dataset", "mnist"],
                                           "predict": ["r", "i"]}[name]).run is cli.COMMANDS[name][2]
