"""The Learner on real MNIST digits: it learns, resumes exactly, stops early, logs, draws, and
a Ctrl-C (a real SIGINT to a real `cinders train` process) leaves a valid checkpoint."""

import io
import json
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import cinders as cn
from cinders.data import DataLoader, Subset
from cinders.data.mnist import MnistBatcher, MnistDigits
from cinders.models.mnist import MnistMLP
from cinders.nn import functional as F
from cinders.train import Accuracy, EarlyStopping, Learner, Loss, load_checkpoint
from cinders.train.dashboard import PlainDashboard, RichDashboard, SilentDashboard

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BACKEND = cn.Autodiff(cn.NumPy())


@pytest.fixture(scope="module")
def loaders():
    train = MnistDigits("train")
    heldout = MnistDigits("heldout")
    pick = sorted(random.Random(0).sample(range(len(train)), 1024))
    return (DataLoader(Subset(train, pick), 64, shuffle=True, seed=0, batcher=MnistBatcher(BACKEND)),
            DataLoader(Subset(heldout, range(0, 1996, 4)), 250, batcher=MnistBatcher(BACKEND)))


def make_learner(out_dir=None, lr=2e-3, **kw):
    cn.manual_seed(0)
    model = MnistMLP(hidden=32).to(BACKEND)
    return Learner(model, cn.optim.Adam(lr), F.cross_entropy, metrics=[Accuracy(), Loss()],
                   out_dir=out_dir, dashboard=None, **kw)


def weights(model):
    return {k: v.numpy() for k, v in model.state_dict().items()}


def test_a_short_run_learns_the_digits_and_writes_logs_and_plot(tmp_path, loaders):
    train, valid = loaders
    learner = make_learner(str(tmp_path))
    before = learner.evaluate(valid)
    history = learner.fit(train, valid, epochs=3)
    assert [row["epoch"] for row in history] == [1, 2, 3]
    assert before["accuracy"] < 0.3
    assert history[-1]["valid_accuracy"] > 0.8  # 1,024 digits, 48 steps (chance: 0.1)
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    rows = (tmp_path / "metrics.csv").read_text().splitlines()
    assert rows[0].split(",")[:5] == ["epoch", "train_accuracy", "train_loss", "valid_accuracy", "valid_loss"]
    assert len(rows) == 4
    assert json.loads((tmp_path / "metrics.json").read_text()) == history
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    progress = load_checkpoint(str(tmp_path / "checkpoint.safetensors"), make_learner().model,
                               cn.optim.Adam(1e-3))
    assert progress["epoch"] == 3 and progress["batch"] == 0


def test_resume_continues_exactly_where_the_run_stopped(tmp_path, loaders):
    train, valid = loaders
    straight = make_learner(str(tmp_path / "a"))
    straight.fit(train, valid, epochs=2)
    first = make_learner(str(tmp_path / "b"))
    first.fit(train, valid, epochs=1)
    resumed = make_learner(str(tmp_path / "b"))  # a fresh process would build exactly this
    history = resumed.fit(train, valid, epochs=2, resume=True)
    assert [row["epoch"] for row in history] == [1, 2]
    assert resumed.optimizer.steps == straight.optimizer.steps == 2 * len(train)
    a, b = weights(straight.model), weights(resumed.model)
    for k in a:
        np.testing.assert_allclose(b[k], a[k], rtol=0, atol=1e-6, err_msg=k)
    assert history[1]["valid_accuracy"] == pytest.approx(straight.history[1]["valid_accuracy"])


class InterruptAt(SilentDashboard):
    """Sends this process a real SIGINT after a given batch, as a person pressing Ctrl-C would."""

    def __init__(self, epoch, batch):
        super().__init__()
        self.at = (epoch, batch)

    def batch(self, index, metrics, lr):
        if (self.epoch, index) == self.at:
            os.kill(os.getpid(), signal.SIGINT)


def test_sigint_mid_epoch_checkpoints_that_step_and_resume_is_exact(tmp_path, loaders):
    train, valid = loaders
    straight = make_learner(str(tmp_path / "a"))
    straight.fit(train, valid, epochs=2)
    stopped = make_learner(str(tmp_path / "b"))
    stopped.dashboard_kind = InterruptAt(epoch=1, batch=4)
    with pytest.raises(KeyboardInterrupt):
        stopped.fit(train, valid, epochs=2)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handler restored
    resumed = make_learner(str(tmp_path / "b"))
    progress = load_checkpoint(str(tmp_path / "b" / "checkpoint.safetensors"), resumed.model, resumed.optimizer)
    assert (progress["epoch"], progress["batch"]) == (1, 5)
    assert resumed.optimizer.steps == len(train) + 5
    resumed = make_learner(str(tmp_path / "b"))
    history = resumed.fit(train, valid, epochs=2, resume=True)
    a, b = weights(straight.model), weights(resumed.model)
    for k in a:
        np.testing.assert_allclose(b[k], a[k], rtol=0, atol=1e-6, err_msg=k)
    # The resumed epoch's train metrics include the 5 batches run before the stop.
    assert history[1]["train_loss"] == pytest.approx(straight.history[1]["train_loss"], rel=1e-5)


def test_early_stopping_stops_when_the_monitored_metric_stalls(tmp_path, loaders):
    train, valid = loaders
    learner = make_learner(str(tmp_path), lr=0.0, early_stopping=EarlyStopping("valid_loss", patience=2))
    history = learner.fit(train, valid, epochs=10)
    assert len(history) == 3  # epoch 1 sets the best; 2 and 3 do not improve on it


def test_dashboards_show_metrics_and_progress():
    rows = {"epoch": 1, "train_loss": 0.5, "valid_accuracy": 0.9}
    out = io.StringIO()
    plain = PlainDashboard(out, progress_seconds=0)  # a progress line after every batch
    plain.start(2, 0, "demo")
    plain.start_epoch(0, 8, 0)
    for i in range(8):
        plain.batch(i, {"loss": 1.0 / (i + 1)}, 1e-3)
    plain.end_epoch(rows)
    text = out.getvalue()
    assert "epoch 1/2  batch 2/8" in text and "batch 8/8" in text and "valid_accuracy 0.9" in text
    # by default (a log, not a terminal): fast epochs give one line each, no batch lines
    out = io.StringIO()
    quiet = PlainDashboard(out)
    quiet.start(2, 0, "demo")
    for epoch in range(2):
        quiet.start_epoch(epoch, 8, 0)
        for i in range(8):
            quiet.batch(i, {"loss": 1.0}, 1e-3)
        quiet.end_epoch(dict(rows, epoch=epoch + 1))
    assert out.getvalue().splitlines()[1:] == [
        "epoch 1/2 done  train_loss 0.5  valid_accuracy 0.9", "epoch 2/2 done  train_loss 0.5  valid_accuracy 0.9"]
    from rich.console import Console
    console = Console(file=io.StringIO(), force_terminal=True, width=120)
    rich = RichDashboard(console)
    rich.start(2, 0, "demo")
    rich.start_epoch(0, 8, 0)
    rich.batch(3, {"loss": 0.25}, 1e-3)
    rich.end_epoch(rows)
    rich.close()
    screen = console.file.getvalue()
    assert "valid_accuracy" in screen and "train" in screen and "loss 0.25" in screen


def test_ctrl_c_writes_a_valid_checkpoint_and_training_resumes(tmp_path):
    run_dir = str(tmp_path / "run")
    out = str(tmp_path / "mlp.safetensors")
    cmd = [sys.executable, "-m", "cinders", "train", "--dataset", "mnist", "--model", "mlp", "--epochs", "40",
           "--train-limit", "640", "--run-dir", run_dir, "--out", out, "--dashboard", "plain"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=str(tmp_path))
    lines = []
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            line = proc.stdout.readline()
            lines.append(line)
            if "epoch 1/40 done" in line:  # the first epoch has finished (a log shows no batch lines)
                proc.send_signal(signal.SIGINT)
                break
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    output = "".join(lines) + rest
    assert proc.returncode == 130, output
    assert "checkpoint written" in output and "--resume" in output
    assert not os.path.exists(out)
    cn.manual_seed(0)
    progress = load_checkpoint(os.path.join(run_dir, "checkpoint.safetensors"), MnistMLP().to(BACKEND),
                               cn.optim.AdamW())
    assert progress["epoch"] >= 1 and len(progress["history"]) == progress["epoch"]
    assert [n for n in os.listdir(run_dir) if ".tmp" in n] == []
    done = subprocess.run(cmd[:cmd.index("--epochs") + 1] + [str(progress["epoch"] + 1)] +
                          cmd[cmd.index("--epochs") + 2:] + ["--resume"],
                          capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert os.path.exists(out) and "held-out accuracy" in done.stdout
