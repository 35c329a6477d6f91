"""cn.capture on cn.Wasm(): a replay is one run_commands call and equals uncaptured runs."""

import numpy as np
import pytest

import cinders as cn
import cinders.nn.functional as F
from cinders import nn
from cinders.capture import assign
from cinders.models.mnist import MnistCNN

STACKS = {"wasm": lambda: cn.Wasm(), "autodiff-wasm": lambda: cn.Autodiff(cn.Wasm())}


def _images(rng, batch):
    return rng.random((batch, 1, 28, 28), dtype=np.float32)


@pytest.mark.parametrize("stack", sorted(STACKS))
def test_forward_replay_matches_uncaptured_in_one_call(stack, monkeypatch):
    backend = STACKS[stack]()
    cn.manual_seed(0)
    model = MnistCNN().to(backend).eval()
    fast = cn.capture(model)
    rng = np.random.default_rng(1)
    for call in range(5):
        x = cn.tensor(_images(rng, 2), backend=backend)
        got, want = fast(x).numpy(), model(x).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert (fast.captures, fast.replays) == (1, 2)
    x = cn.tensor(_images(rng, 2), backend=backend)
    x.numpy()  # (its upload runs before the counting starts)
    engine = cn.Wasm().engine
    calls = []
    real_call = type(engine).call
    monkeypatch.setattr(type(engine), "call", lambda self, name, *a: calls.append(name) or real_call(self, name, *a))
    y = fast(x)
    assert calls == ["run_commands"], calls
    monkeypatch.undo()
    assert y.shape == (2, 10)
    before = y.numpy()
    fast(cn.tensor(_images(rng, 2), backend=backend))  # the next replay does not overwrite y
    np.testing.assert_array_equal(y.numpy(), before)


def test_new_shape_captures_again():
    backend = cn.Wasm()
    lin = nn.Linear(8, 3).to(backend)
    fast = cn.capture(lambda x: lin(x).relu())
    rng = np.random.default_rng(2)
    for batch in (4, 4, 4, 4, 7, 7, 7, 7, 4):
        x = cn.tensor(rng.standard_normal((batch, 8)).astype(np.float32), backend=backend)
        np.testing.assert_allclose(fast(x).numpy(), lin(x).relu().numpy(), rtol=1e-5, atol=1e-6)
    assert (fast.captures, fast.replays) == (2, 3)


def test_sliced_input_and_parameter_changed_in_place():
    backend = cn.Wasm()
    lin = nn.Linear(4, 2).to(backend)
    fast = cn.capture(lambda x: lin(x) * 2.0)
    data = cn.tensor(np.arange(24, dtype=np.float32).reshape(6, 4), backend=backend)
    for _ in range(3):
        fast(data[1:4])
    assign(lin.weight, lin.weight * 0.0 + 1.0)
    got = fast(data[1:4]).numpy()
    want = (np.arange(24, dtype=np.float32).reshape(6, 4)[1:4].sum(1, keepdims=True)
            + lin.bias.numpy()) * 2.0
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert fast.replays == 1


def test_guards_raise_as_on_wgpu():
    backend = cn.Wasm()
    x = cn.tensor([1.0, 2.0], backend=backend)
    calls, scale = [0], [1.0]

    def branch(x):
        calls[0] += 1
        return x.exp() if calls[0] % 2 else x.tanh()

    def constant(x):
        scale[0] += 1.0
        return x * scale[0]

    def reads(x):
        if x.sum().item() > 0:  # the offending line
            return x * 2.0
        return x

    holder = {"w": cn.tensor([1.0, 2.0], backend=backend)}

    def replaces(x):
        holder["w"] = holder["w"] + x
        return holder["w"] * 1.0

    for fn, message, calls_before in ((branch, "different kernel sequence", 2),
                                      (constant, "other constants", 2),
                                      (reads, "the offending line", 1),
                                      (replaces, "replaced", 2)):
        fast = cn.capture(fn)
        for _ in range(calls_before):
            fast(x)
        with pytest.raises(cn.CaptureError, match=message):
            fast(x)


def test_gather_replays_and_still_checks_its_indices():
    backend = cn.Wasm()
    table = cn.tensor(np.arange(6, dtype=np.float32), backend=backend)
    fast = cn.capture(lambda i: (table * 2.0).gather(0, i) + 1.0)
    for values in ([1, 2], [3, 4], [5, 0], [-1, 2], [0, 0]):
        got = fast(cn.tensor(np.array(values, np.int32), backend=backend)).tolist()
        assert got == [2.0 * (v % 6) + 1.0 for v in values]
    assert (fast.captures, fast.replays) == (1, 2)
    with pytest.raises(cn.IndexingError, match="gather: an index is out of bounds .position 1"):
        fast(cn.tensor(np.array([0, 6], np.int32), backend=backend))


@pytest.mark.parametrize("stack", sorted(STACKS))
def test_random_draws_fresh_numbers_like_uncaptured(stack):
    backend = STACKS[stack]()

    def fn(x):
        return x + cn.random((5,), backend=backend)

    def run(f):
        cn.manual_seed(7)
        x = cn.tensor(np.zeros(5, np.float32), backend=backend)
        return [f(x).numpy() for _ in range(6)]

    want, fast = run(fn), cn.capture(fn)
    got = run(fast)
    assert fast.replays == 3
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6)
    assert not np.allclose(got[-1], got[-2])


OPTIMIZERS = {
    "sgd-momentum": lambda: cn.optim.SGD(lr=0.05, momentum=0.9),
    "adamw-schedule": lambda: cn.optim.AdamW(lr=cn.optim.LinearWarmup(
        cn.optim.CosineAnnealing(2e-3, total_steps=10), warmup_steps=3), weight_decay=1e-4),
}


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_training_step_replays_match_uncaptured_steps(optimizer):
    def train(captured):
        cn.manual_seed(0)
        backend = cn.Autodiff(cn.Wasm())
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
            x = cn.tensor(_images(rng, 4), backend=backend)
            y = cn.tensor(rng.integers(0, 10, 4).astype(np.int32), backend=backend)
            losses.append(run(x, y).item())
        return losses, run, model, opt

    want, _, plain, plain_opt = train(False)
    got, fast, model, opt = train(True)
    assert (fast.captures, fast.replays) == (1, 3)
    assert opt.steps == plain_opt.steps == 6
    np.testing.assert_allclose(got, want, rtol=1e-5)
    np.testing.assert_allclose(model.layers[0].weight.numpy(), plain.layers[0].weight.numpy(),
                               rtol=1e-5, atol=1e-6)


def test_learner_captures_the_step_on_wasm(capsys):
    from cinders.train import Learner

    def fit(capture):
        cn.manual_seed(0)
        backend = cn.Autodiff(cn.Wasm())
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
