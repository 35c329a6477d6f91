"""Captured training on every capturable stack: a replayed step (forward, backward, optimizer)
equals the uncaptured step, and Learner captures its step on its own and says so."""

import numpy as np
import pytest

import cinders as cn
import cinders.nn.functional as F
from cinders import nn
from cinders.models.mnist import MnistCNN
from cinders.wgpu import Wgpu

TRAINING_STACKS = {
    "autodiff-fusion-wgpu": lambda: cn.Autodiff(cn.Fusion(Wgpu())),
    "autodiff-wasm": lambda: cn.Autodiff(cn.Wasm()),
}

OPTIMIZERS = {
    "sgd-momentum": lambda: cn.optim.SGD(lr=0.05, momentum=0.9),
    # a schedule and Adam's bias corrections: Python numbers that change every step
    "adamw-schedule": lambda: cn.optim.AdamW(lr=cn.optim.LinearWarmup(
        cn.optim.CosineAnnealing(2e-3, total_steps=10), warmup_steps=3), weight_decay=1e-4),
}


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("stack", sorted(TRAINING_STACKS))
def test_training_step_replays_match_uncaptured_steps(stack, optimizer):
    def train(captured):
        cn.manual_seed(0)
        backend = TRAINING_STACKS[stack]()
        model = MnistCNN().to(backend)
        opt = OPTIMIZERS[optimizer]()

        def step(x, y):  # (cross_entropy gathers: a host-checked call inside the replay)
            loss = F.cross_entropy(model(x), y)
            opt.step(model, loss.backward())
            return loss

        run = cn.capture(step) if captured else step
        rng = np.random.default_rng(3)
        losses = []
        for _ in range(6):
            x = cn.tensor(rng.random((4, 1, 28, 28), dtype=np.float32), backend=backend)
            y = cn.tensor(rng.integers(0, 10, 4).astype(np.int32), backend=backend)
            losses.append(run(x, y).item())
        return losses, run, model, opt

    want, _, plain, plain_opt = train(False)
    got, fast, model, opt = train(True)
    assert (fast.captures, fast.replays) == (1, 3)
    assert opt.steps == plain_opt.steps == 6 and opt.lr == plain_opt.lr
    np.testing.assert_allclose(got, want, rtol=1e-5)
    np.testing.assert_allclose(model.layers[0].weight.numpy(), plain.layers[0].weight.numpy(),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("stack", sorted(TRAINING_STACKS))
def test_learner_captures_the_step_and_says_so(stack, capsys):
    from cinders.train import Learner

    def fit(capture):
        cn.manual_seed(0)
        backend = TRAINING_STACKS[stack]()
        model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3)).to(backend)
        rng = np.random.default_rng(5)
        batches = [(cn.tensor(rng.standard_normal((8, 6)).astype(np.float32), backend=backend),
                    cn.tensor(rng.integers(0, 3, 8).astype(np.int32), backend=backend))
                   for _ in range(5)]
        learner = Learner(model, cn.optim.SGD(lr=0.1, momentum=0.9), F.cross_entropy,
                          dashboard="plain", capture=capture)
        history = learner.fit(batches, epochs=2)
        return history, learner, model

    want, _, plain = fit(False)
    assert "captured" not in capsys.readouterr().out
    got, learner, model = fit("auto")
    assert "training step captured" in capsys.readouterr().out
    assert learner._captured.replays == 7  # 10 steps: 3 run as they are, then replays
    assert got[-1]["train_loss"] == pytest.approx(want[-1]["train_loss"], rel=1e-5)
    np.testing.assert_allclose(model[0].weight.numpy(), plain[0].weight.numpy(), rtol=1e-5,
                               atol=1e-6)
