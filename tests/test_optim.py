"""Optimizer trajectories, schedules and clipping against torch.optim over a few steps."""

import math

import numpy as np
import pytest
import torch

import backends as registry
import cinders as cn
from cinders import nn, optim

AUTODIFF = [n for n in registry.selected_names() if n.startswith("autodiff-")]


@pytest.fixture(scope="module", params=AUTODIFF)
def ad(request):
    return registry.BACKENDS[request.param]()


class Tiny(nn.Module):
    def __init__(self, backend):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(4, 5, backend=backend, seed=1), nn.Tanh(),
                                    nn.Linear(5, 3, backend=backend, seed=3))

    def forward(self, x):
        return self.layers(x)


def _torch_twin(model):
    twin = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    twin.load_state_dict({k.split(".", 1)[1]: torch.tensor(v.numpy()) for k, v in model.state_dict().items()})
    return twin


OPTIMIZERS = [
    ("sgd", lambda: optim.SGD(0.1), lambda p: torch.optim.SGD(p, 0.1)),
    ("sgd_momentum_wd", lambda: optim.SGD(0.1, momentum=0.9, weight_decay=0.01),
     lambda p: torch.optim.SGD(p, 0.1, momentum=0.9, weight_decay=0.01)),
    ("sgd_nesterov_dampening", lambda: optim.SGD(0.05, momentum=0.8, nesterov=True),
     lambda p: torch.optim.SGD(p, 0.05, momentum=0.8, nesterov=True)),
    ("sgd_dampening", lambda: optim.SGD(0.05, momentum=0.8, dampening=0.3),
     lambda p: torch.optim.SGD(p, 0.05, momentum=0.8, dampening=0.3)),
    ("adam", lambda: optim.Adam(0.01), lambda p: torch.optim.Adam(p, 0.01)),
    ("adam_wd_betas", lambda: optim.Adam(0.02, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1),
     lambda p: torch.optim.Adam(p, 0.02, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)),
    ("adamw", lambda: optim.AdamW(0.01, weight_decay=0.1), lambda p: torch.optim.AdamW(p, 0.01, weight_decay=0.1)),
]


@pytest.mark.parametrize("case", OPTIMIZERS, ids=[c[0] for c in OPTIMIZERS])
def test_trajectory_matches_torch(ad, case):
    _, make, make_torch = case
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 4)).astype(np.float32)
    y = rng.integers(0, 3, 6).astype(np.int32)
    model = Tiny(ad)
    twin = _torch_twin(model)
    opt, topt = make(), make_torch(twin.parameters())
    xs, ys = cn.tensor(x, backend=ad), cn.tensor(y, backend=ad)
    for _ in range(4):
        grads = nn.cross_entropy(model(xs), ys).backward()
        returned = opt.step(model, grads)
        assert returned is model
        topt.zero_grad()
        torch.nn.functional.cross_entropy(twin(torch.tensor(x)), torch.tensor(y, dtype=torch.long)).backward()
        topt.step()
        for (name, p), (tname, tp) in zip(model.named_parameters(), twin.named_parameters()):
            assert name.split(".", 1)[1] == tname
            np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), rtol=1e-4, atol=1e-5, err_msg=name)
    # parameters stay trainable leaves after the updates
    assert all(ad.requires_grad(p) for p in model.parameters())


def test_state_is_keyed_by_path_and_round_trips(ad):
    model = Tiny(ad)
    opt = optim.Adam(0.01)
    xs = cn.random((3, 4), backend=ad, seed=5)
    opt.step(model, model(xs).sum().backward())
    assert sorted(opt.state) == sorted(k for k, _ in model.named_parameters())
    saved = opt.state_dict()
    other = optim.Adam(0.01)
    other.load_state_dict(saved)
    assert other.steps == 1 and other.state["layers.0.weight"]["step"] == 1


def test_step_on_plain_backend_explains_fix():
    model = Tiny(cn.NumPy())
    with pytest.raises(cn.NotDifferentiableError, match=r"cn\.Autodiff"):
        optim.SGD(0.1).step(model, None)


def test_params_without_gradient_are_left_alone(ad):
    model = Tiny(ad)
    before = model.layers[2].weight
    x = cn.random((2, 4), backend=ad, seed=1)
    grads = model.layers[0](x).sum().backward()  # only the first layer takes part
    optim.SGD(0.1).step(model, grads)
    assert model.layers[2].weight is before
    assert model.layers[0].weight is not before


def _torch_lrs(make_sched, steps, lr=0.1):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr)
    sched = make_sched(opt)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


@pytest.mark.parametrize("name", ["step", "cosine", "warmup", "warmup_then_cosine"])
def test_schedules_match_torch(name):
    S = torch.optim.lr_scheduler
    if name == "step":
        ours, theirs = optim.StepLR(0.1, 3, 0.5), lambda o: S.StepLR(o, 3, 0.5)
    elif name == "cosine":
        ours, theirs = optim.CosineAnnealing(0.1, 8, 0.01), lambda o: S.CosineAnnealingLR(o, 8, 0.01)
    elif name == "warmup":
        ours, theirs = optim.LinearWarmup(0.1, 4, 0.25), lambda o: S.LinearLR(o, 0.25, 1.0, 4)
    else:
        ours = optim.LinearWarmup(optim.CosineAnnealing(0.1, 10), 3, 0.1)
        theirs = lambda o: S.ChainedScheduler([S.LinearLR(o, 0.1, 1.0, 3), S.CosineAnnealingLR(o, 10)])
    # 9 steps: past T_max torch's cosine rises again, ours stays at the minimum (documented)
    np.testing.assert_allclose([ours(s) for s in range(9)], _torch_lrs(theirs, 9), rtol=1e-6)


def test_optimizer_follows_schedule(ad):
    opt = optim.SGD(optim.StepLR(1.0, 1, 0.5))
    model = Tiny(ad)
    x = cn.random((2, 4), backend=ad, seed=1)
    lrs = []
    for _ in range(3):
        lrs.append(opt.lr)
        opt.step(model, model(x).sum().backward())
    assert lrs == [1.0, 0.5, 0.25]


def test_clip_grad_norm_matches_torch(ad):
    model = Tiny(ad)
    twin = _torch_twin(model)
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32) * 5
    grads = (model(cn.tensor(x, backend=ad)) ** 2.0).sum().backward()
    (twin(torch.tensor(x)) ** 2).sum().backward()
    norm = torch.nn.utils.clip_grad_norm_(twin.parameters(), 0.5)
    clipped, our_norm = optim.clip_grad_norm(grads, 0.5)
    assert math.isclose(our_norm, float(norm), rel_tol=1e-4)
    for (_, p), (_, tp) in zip(model.named_parameters(), twin.named_parameters()):
        np.testing.assert_allclose(p.grad(clipped).numpy(), tp.grad.numpy(), rtol=1e-4, atol=1e-6)
    same, _ = optim.clip_grad_norm(grads, 1e9)
    assert same is grads


def test_fused_adam_matches_the_composed_update_and_spares_handed_out_state():
    """cn.NumPy's fused_adam updates the moments in place: it must give exactly the composed
    (cn.Python) trajectory, and state handed out by state_dict() must never change afterwards,
    nor state that load_state_dict() took in."""
    fused, composed = cn.Autodiff(cn.NumPy()), cn.Autodiff(cn.Python())
    models = {b: Tiny(b) for b in (fused, composed)}
    opts = {b: optim.Adam(0.05, weight_decay=0.01) for b in models}
    snapshot = None
    for step in range(4):
        for b, model in models.items():
            xs = cn.random((3, 4), backend=b, seed=7 + step)
            opts[b].step(model, (model(xs) ** 2).sum().backward())
        if step == 1:
            saved = opts[fused].state_dict()
            snapshot = {(p, k): v.numpy().copy() for p, s in saved["state"].items()
                        for k, v in s.items() if isinstance(v, cn.Tensor)}
            loaded = optim.Adam(0.05)
            loaded.load_state_dict(saved)
    for (p, k), before in snapshot.items():
        np.testing.assert_array_equal(saved["state"][p][k].numpy(), before, err_msg="%s %s" % (p, k))
    mine, reference = models[fused].state_dict(), models[composed].state_dict()
    for name in mine:
        np.testing.assert_allclose(mine[name].numpy(), reference[name].numpy(), rtol=1e-5, atol=1e-6,
                                   err_msg=name)
    # taking in loaded state and stepping from it leaves the loaded tensors alone too
    model = Tiny(fused)
    loaded.step(model, model(cn.random((3, 4), backend=fused, seed=1)).sum().backward())
    for (p, k), before in snapshot.items():
        np.testing.assert_array_equal(saved["state"][p][k].numpy(), before)
