"""The optional normalisation primitives (core/backend.py softmax, layer_norm): on every
registered backend against torch, a kernel where the backend declares `normalization_kernels`
(NumPy) with the same bits as the composition it replaces, and the composition elsewhere (under
Autodiff too, where gradients flow through it)."""

import numpy as np
import pytest
import torch

import cinders as cn
import cinders.functional as F
import cinders.nn.functional as NF
from backends import BACKENDS, selected_names


def _inputs(seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((3, 5, 16)) * 4 + 1).astype(np.float32)
    x[0, 0, :3] = -np.inf   # masked attention scores: softmax gives 0 there
    x[1, 1] = -np.inf       # a row masked entirely: NaN, as in torch
    y = (rng.standard_normal((3, 5, 16)) * 3 - 2).astype(np.float32)
    w, b = rng.standard_normal((2, 16)).astype(np.float32)
    return x, y, w, b


@pytest.mark.parametrize("name", selected_names())
def test_softmax_and_layer_norm_match_torch_on_every_backend(name):
    backend = BACKENDS[name]()
    x, y, w, b = _inputs(0)
    t = lambda v: cn.tensor(v, backend=backend)  # noqa: E731
    for axis in (-1, 1):
        want = torch.softmax(torch.from_numpy(x), axis).numpy()
        np.testing.assert_allclose(F.softmax(t(x), axis).numpy(), want, rtol=2e-6, atol=1e-7)
    for weight, bias in ((w, b), (w, None), (None, None)):
        want = torch.nn.functional.layer_norm(torch.from_numpy(y), (16,), None if weight is None else torch.from_numpy(weight),
                                              None if bias is None else torch.from_numpy(bias), 1e-5).numpy()
        got = NF.layer_norm(t(y), 16, None if weight is None else t(weight), None if bias is None else t(bias), 1e-5)
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)


def test_numpy_kernels_give_the_compositions_bits():
    x, y, w, b = _inputs(1)
    kernel, composed = cn.NumPy(), cn.NumPy()
    composed.normalization_kernels = False    # this instance composes, as other backends do
    assert kernel.normalization_kernels and not cn.Python().normalization_kernels
    assert not cn.Autodiff(cn.NumPy()).normalization_kernels

    def run(backend):
        t = lambda v: cn.tensor(v, backend=backend)  # noqa: E731
        return [F.softmax(t(x), -1), F.softmax(t(x), 0), NF.layer_norm(t(y), 16, t(w), t(b), 1e-5),
                NF.layer_norm(t(y), 16, None, None, 1e-12)]
    for got, want in zip(run(kernel), run(composed)):
        assert np.array_equal(got.numpy().view(np.int32), want.numpy().view(np.int32))


def test_gradients_flow_through_the_composition_under_autodiff():
    _, y, w, b = _inputs(2)
    backend = cn.Autodiff(cn.NumPy())
    tx, tw, tb = (cn.tensor(v, backend=backend).require_grad() for v in (y, w, b))
    loss = (F.softmax(NF.layer_norm(tx, 16, tw, tb), -1) * tx).sum()
    grads = loss.backward()
    ty, rw, rb = (torch.tensor(v, requires_grad=True) for v in (y, w, b))
    (torch.softmax(torch.nn.functional.layer_norm(ty, (16,), rw, rb), -1) * ty).sum().backward()
    for ours, theirs in ((tx, ty), (tw, rw), (tb, rb)):
        np.testing.assert_allclose(ours.grad(grads).numpy(), theirs.grad.numpy(), rtol=1e-4, atol=1e-5)
