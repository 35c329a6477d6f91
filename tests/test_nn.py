"""cn.nn against torch.nn: state-dict names, layer outputs with the same weights, loading
rules and errors, initialisation, modes."""

import math

import numpy as np
import pytest
import torch

import backends as registry
import cinders as cn
from cinders import nn
from cinders.models.mnist import MnistCNN, MnistMLP
from pytorch_twins import TorchCNN, TorchMLP

AUTODIFF = [n for n in registry.selected_names() if n.startswith("autodiff-")]


@pytest.fixture(scope="module", params=AUTODIFF)
def ad(request):
    return registry.BACKENDS[request.param]()


def _torch_state(module):
    return {k: torch.tensor(v.numpy()) for k, v in module.state_dict().items()}


def _close(ours, theirs, rtol=1e-4, atol=1e-5):
    np.testing.assert_allclose(ours.numpy(), theirs.detach().numpy(), rtol=rtol, atol=atol)


@pytest.mark.parametrize("ours, theirs", [(MnistMLP, TorchMLP), (MnistCNN, TorchCNN)], ids=["mlp", "cnn"])
def test_mnist_models_load_torch_weights_1to1(ours, theirs):
    backend = cn.Autodiff(cn.NumPy())
    torch.manual_seed(0)
    twin = theirs()
    model = ours().to(backend)
    assert list(model.state_dict()) == list(twin.state_dict())
    assert model.num_params() == sum(p.numel() for p in twin.parameters())
    model.load_state_dict(twin.state_dict())  # torch tensors load directly
    x = np.random.default_rng(0).random((3, 1, 28, 28)).astype(np.float32)
    _close(model(cn.tensor(x, backend=backend)), twin(torch.tensor(x)))
    assert all(backend.requires_grad(p) for p in model.parameters())


def _layer_cases():
    T = torch.nn
    return [
        ("linear", lambda b: nn.Linear(5, 3, backend=b), lambda: T.Linear(5, 3), (2, 5)),
        ("linear_3d_no_bias", lambda b: nn.Linear(4, 2, bias=False, backend=b), lambda: T.Linear(4, 2, bias=False), (2, 3, 4)),
        ("conv2d", lambda b: nn.Conv2d(2, 4, 3, stride=2, padding=1, backend=b),
         lambda: T.Conv2d(2, 4, 3, stride=2, padding=1), (2, 2, 5, 5)),
        ("conv2d_groups_dilation", lambda b: nn.Conv2d(4, 2, (2, 3), dilation=2, groups=2, backend=b),
         lambda: T.Conv2d(4, 2, (2, 3), dilation=2, groups=2), (1, 4, 6, 7)),
        ("maxpool", lambda b: nn.MaxPool2d(2), lambda: T.MaxPool2d(2), (1, 2, 4, 4)),
        ("avgpool", lambda b: nn.AvgPool2d(3, 2, 1), lambda: T.AvgPool2d(3, 2, 1), (1, 2, 5, 5)),
        ("layernorm", lambda b: nn.LayerNorm(4, backend=b), lambda: T.LayerNorm(4), (2, 3, 4)),
        ("relu", lambda b: nn.ReLU(), T.ReLU, (2, 3)),
        ("gelu", lambda b: nn.GELU(), T.GELU, (2, 3)),
        ("sigmoid", lambda b: nn.Sigmoid(), T.Sigmoid, (2, 3)),
        ("tanh", lambda b: nn.Tanh(), T.Tanh, (2, 3)),
        ("softmax", lambda b: nn.Softmax(1), lambda: T.Softmax(1), (2, 3)),
        ("flatten", lambda b: nn.Flatten(), T.Flatten, (2, 3, 2)),
        ("dropout_eval", lambda b: nn.Dropout(0.5).eval(), lambda: T.Dropout(0.5).eval(), (2, 3)),
        ("sequential", lambda b: nn.Sequential(nn.Linear(3, 4, backend=b), nn.GELU(), nn.Linear(4, 2, backend=b)),
         lambda: T.Sequential(T.Linear(3, 4), T.GELU(), T.Linear(4, 2)), (2, 3)),
    ]


@pytest.mark.parametrize("case", _layer_cases(), ids=[c[0] for c in _layer_cases()])
def test_layer_matches_torch_with_same_weights(ad, case):
    _, make, make_torch, shape = case
    torch.manual_seed(0)
    twin = make_torch()
    layer = make(ad)
    assert list(layer.state_dict()) == list(twin.state_dict())
    # perturb torch's constant inits (LayerNorm ones/zeros) so the weights really matter
    with torch.no_grad():
        for p in twin.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    layer.load_state_dict(twin.state_dict())
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    _close(layer(cn.tensor(x, backend=ad)), twin(torch.tensor(x)))


def test_batchnorm_train_eval_and_running_stats(ad):
    torch.manual_seed(0)
    twin = torch.nn.BatchNorm2d(3)
    with torch.no_grad():
        twin.weight.add_(torch.randn(3))
        twin.bias.add_(torch.randn(3))
    layer = nn.BatchNorm2d(3, backend=ad)
    assert list(layer.state_dict()) == list(twin.state_dict())
    assert [k for k, _ in layer.named_parameters()] == ["weight", "bias"]
    assert [k for k, _ in layer.named_buffers()] == ["running_mean", "running_var", "num_batches_tracked"]
    layer.load_state_dict(twin.state_dict())
    rng = np.random.default_rng(2)
    for _ in range(2):
        x = rng.standard_normal((4, 3, 2, 2)).astype(np.float32) * 2 + 1
        _close(layer(cn.tensor(x, backend=ad)), twin(torch.tensor(x)))
    _close(layer.running_mean, twin.running_mean)
    _close(layer.running_var, twin.running_var)
    assert layer.num_batches_tracked.item() == 2
    assert not ad.requires_grad(layer.running_mean)
    layer.eval(), twin.eval()
    x = rng.standard_normal((2, 3, 2, 2)).astype(np.float32)
    _close(layer(cn.tensor(x, backend=ad)), twin(torch.tensor(x)))


def test_embedding_matches_torch(ad):
    twin = torch.nn.Embedding(6, 3)
    layer = nn.Embedding(6, 3, backend=ad)
    layer.load_state_dict(twin.state_dict())
    idx = np.array([[0, 5, 2], [2, 2, 1]], np.int32)
    _close(layer(cn.tensor(idx, backend=ad)), twin(torch.tensor(idx, dtype=torch.long)))


@pytest.mark.parametrize("batch_first", [False, True])
def test_multi_head_attention_matches_torch(ad, batch_first):
    torch.manual_seed(0)
    twin = torch.nn.MultiheadAttention(8, 2, batch_first=batch_first)
    with torch.no_grad():  # torch zero-inits the biases; make them matter
        twin.in_proj_bias.add_(torch.randn(24) * 0.1)
        twin.out_proj.bias.add_(torch.randn(8) * 0.1)
    layer = nn.MultiHeadAttention(8, 2, batch_first=batch_first, backend=ad)
    assert list(layer.state_dict()) == list(twin.state_dict())
    layer.load_state_dict(twin.state_dict())
    rng = np.random.default_rng(3)
    shape_q, shape_kv = ((2, 3, 8), (2, 4, 8)) if batch_first else ((3, 2, 8), (4, 2, 8))
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in (shape_q, shape_kv, shape_kv))
    pad = np.array([[False, False, False, True], [False, True, False, False]])
    mask = np.triu(np.ones((3, 4), bool), 2)
    ours = layer(*(cn.tensor(a, backend=ad) for a in (q, k, v)), key_padding_mask=cn.tensor(pad, backend=ad),
                 attn_mask=cn.tensor(mask, backend=ad))
    theirs = twin(*(torch.tensor(a) for a in (q, k, v)), key_padding_mask=torch.tensor(pad),
                  attn_mask=torch.tensor(mask))
    _close(ours[0], theirs[0])
    _close(ours[1], theirs[1])


@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_encoder_layer_matches_torch(ad, norm_first):
    torch.manual_seed(0)
    twin = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, activation="gelu", batch_first=True,
                                            norm_first=norm_first)
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, activation="gelu", batch_first=True,
                                       norm_first=norm_first, backend=ad)
    assert list(layer.state_dict()) == list(twin.state_dict())
    layer.load_state_dict(twin.state_dict())
    x = np.random.default_rng(4).standard_normal((2, 3, 8)).astype(np.float32)
    twin.eval()  # torch's fast path and ours agree; dropout is 0 anyway
    _close(layer(cn.tensor(x, backend=ad), is_causal=True),
           twin(torch.tensor(x), src_mask=torch.nn.Transformer.generate_square_subsequent_mask(3), is_causal=True))


# -- state dict rules ----------------------------------------------------------------------------

class Blocks(nn.Module):
    """Lists of modules and private attributes, like a user's model."""

    def __init__(self, backend):
        super().__init__()
        self.blocks = [nn.Linear(2, 2, backend=backend, seed=i) for i in range(2)]
        self.norm = nn.BatchNorm2d(2, backend=backend)
        self._scratch = cn.zeros(3, backend=backend)  # private: not state
        self.width = 2

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


def test_state_names_of_lists_buffers_and_private(ad):
    model = Blocks(ad)
    assert list(model.state_dict()) == [
        "blocks.0.weight", "blocks.0.bias", "blocks.1.weight", "blocks.1.bias", "norm.weight", "norm.bias",
        "norm.running_mean", "norm.running_var", "norm.num_batches_tracked"]
    assert [k for k, _ in model.named_parameters()] == list(model.state_dict())[:6]
    assert model.num_params() == 2 * 6 + 4


def test_tied_weights_are_one_parameter_and_stay_tied(ad):
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(5, 3, backend=ad, seed=0)
            self.head = nn.Linear(3, 5, bias=False, backend=ad)
            self.head.weight = self.embed.weight

        def forward(self, i):
            return self.head(self.embed(i))

    model = Tied()
    assert list(model.state_dict()) == ["embed.weight", "head.weight"]  # torch keeps both keys
    assert [k for k, _ in model.named_parameters()] == ["embed.weight"]
    opt = cn.optim.SGD(0.1)
    idx = cn.tensor([1, 3], backend=ad)
    opt.step(model, model(idx).sum().backward())
    assert model.head.weight is model.embed.weight


def test_state_dict_round_trip(ad):
    a, b = Blocks(ad), Blocks(ad)
    a.blocks[1].weight = a.blocks[1].weight * 3.0
    b.load_state_dict(a.state_dict())
    x = cn.random((3, 2), backend=ad, seed=9)
    assert b(x).tolist() == a(x).tolist()
    assert ad.requires_grad(b.blocks[1].weight)


def test_load_errors_name_keys_and_shapes_and_load_nothing(ad):
    model = Blocks(ad)
    before = {k: v.tolist() for k, v in model.state_dict().items()}
    bad = dict(model.state_dict())
    del bad["blocks.0.bias"]
    bad["extra.weight"] = cn.zeros(1, backend=ad)
    bad["blocks.1.weight"] = cn.zeros(3, 2, backend=ad)
    bad["blocks.0.weight"] = cn.ones(2, 2, backend=ad)  # valid, must not be applied either
    with pytest.raises(cn.RecordError) as err:
        model.load_state_dict(bad)
    message = str(err.value)
    assert "missing keys: blocks.0.bias" in message
    assert "unexpected keys: extra.weight" in message
    assert "blocks.1.weight: expected shape (2, 2), got (3, 2)" in message
    assert {k: v.tolist() for k, v in model.state_dict().items()} == before


def test_to_moves_between_plain_and_autodiff():
    model = MnistMLP()
    assert model.layers[1].weight.backend == cn.default_backend()
    ad = cn.Autodiff(cn.NumPy())
    model.to(ad)
    assert all(p.backend == ad and ad.requires_grad(p) for p in model.parameters())
    model.to(cn.NumPy())
    assert all(p.backend == cn.NumPy() for p in model.parameters())


def test_train_eval_reach_nested_modules():
    model = Blocks(cn.NumPy())
    model.eval()
    assert not model.training and not model.blocks[1].training and not model.norm.training
    model.train()
    assert model.norm.training


def test_init_matches_torch_bounds_and_is_seeded(ad):
    layer = nn.Conv2d(4, 6, 3, groups=2, backend=ad, seed=7)
    bound = 1 / math.sqrt(2 * 3 * 3)
    w = layer.weight.numpy()
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.8 * bound
    assert np.abs(layer.bias.numpy()).max() <= bound
    assert nn.Conv2d(4, 6, 3, groups=2, backend=ad, seed=7).weight.tolist() == layer.weight.tolist()
    cn.manual_seed(3)
    first = nn.Linear(3, 3, backend=ad).weight.tolist()
    cn.manual_seed(3)
    assert nn.Linear(3, 3, backend=ad).weight.tolist() == first


def test_dropout_is_seeded_and_scaled(ad):
    x = cn.ones(20, 20, backend=ad)
    out = nn.Dropout(0.25, seed=1)(x).numpy()
    kept = out != 0
    assert 0.6 < kept.mean() < 0.9
    np.testing.assert_allclose(out[kept], 1 / 0.75, rtol=1e-6)
    assert (nn.Dropout(0.25, seed=1)(x).numpy() == out).all()


def test_sequential_indexing():
    seq = nn.Sequential(nn.ReLU(), nn.Linear(2, 3), nn.Tanh())
    assert len(seq) == 3 and isinstance(seq[1], nn.Linear) and isinstance(seq[-1], nn.Tanh)
    assert [type(m).__name__ for m in seq] == ["ReLU", "Linear", "Tanh"]
    assert list(seq[1:].state_dict()) == ["0.weight", "0.bias"]


def test_losses_reject_bad_targets(ad):
    logits = cn.random((3, 4), backend=ad)
    with pytest.raises(cn.ShapeError, match="targets of shape"):
        nn.cross_entropy(logits, cn.tensor([1, 2], backend=ad))
    with pytest.raises(cn.ShapeError, match="mse_loss"):
        nn.mse_loss(logits, cn.zeros(4, backend=ad))


def test_training_reduces_loss(ad):
    """A few Adam steps on a tiny MLP fit a fixed batch: the whole stack working together."""
    model = nn.Sequential(nn.Linear(4, 8, backend=ad, seed=0), nn.ReLU(), nn.Linear(8, 3, backend=ad, seed=2))
    opt = cn.optim.Adam(0.05)
    x = cn.random((8, 4), backend=ad, seed=1, distribution="normal")
    y = cn.tensor([0, 1, 2, 0, 1, 2, 0, 1], backend=ad)
    losses = []
    for _ in range(15):
        loss = nn.cross_entropy(model(x), y)
        losses.append(loss.item())
        model = opt.step(model, loss.backward())
    assert losses[-1] < 0.5 * losses[0]
