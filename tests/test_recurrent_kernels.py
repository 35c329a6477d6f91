"""The optional recurrent primitives (core/backend.py lstm_cell, gru_cell): on every registered
backend, a kernel where the backend declares `recurrent_kernels` (NumPy, Wasm) and the composition
elsewhere, against torch's LSTM and GRU cells; gradients through the composition under Autodiff;
and onnx's own LSTM/GRU node cases on the backends with kernels."""

import numpy as np
import pytest
import torch

import cinders as cn
import cinders.functional as F
import onnx_node_cases
from backends import BACKENDS, selected_names

B, H = 3, 5


def torch_lstm_cell(gates, c):
    """The LSTM step in ONNX's gate order i, o, f, g (torch.nn.LSTMCell orders i, f, g, o)."""
    i, o, f, g = gates.chunk(4, dim=1)
    i, o, f = torch.sigmoid(i), torch.sigmoid(o), torch.sigmoid(f)
    new_c = f * c + i * torch.tanh(g)
    return o * torch.tanh(new_c), new_c


def torch_gru_cell(gx, gh, h):
    """torch.nn.GRUCell after its two matmuls, in ONNX's order z, r, n."""
    z = torch.sigmoid(gx[:, :H] + gh[:, :H])
    r = torch.sigmoid(gx[:, H:2 * H] + gh[:, H:2 * H])
    n = torch.tanh(gx[:, 2 * H:] + r * gh[:, 2 * H:])
    return (1 - z) * n + z * h


def _inputs(seed):
    rng = np.random.default_rng(seed)
    # spread over sigmoid's and tanh's whole useful range, both saturations included
    return [(rng.standard_normal(s) * 4).astype(np.float32) for s in ((B, 4 * H), (B, H), (B, 3 * H), (B, 3 * H), (B, H))]


@pytest.mark.parametrize("name", selected_names())
def test_cells_match_torch_on_every_backend(name):
    backend = BACKENDS[name]()
    gates, c, gx, gh, h = _inputs(0)
    want_h, want_c = torch_lstm_cell(torch.from_numpy(gates), torch.from_numpy(c))
    got_h, got_c = F.lstm_cell(cn.tensor(gates, backend=backend), cn.tensor(c, backend=backend))
    np.testing.assert_allclose(got_h.numpy(), want_h.numpy(), rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(got_c.numpy(), want_c.numpy(), rtol=2e-6, atol=2e-6)
    want = torch_gru_cell(*map(torch.from_numpy, (gx, gh, h)))
    got = F.gru_cell(*(cn.tensor(v, backend=backend) for v in (gx, gh, h)))
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=2e-6, atol=2e-6)


def test_kernels_where_declared_and_the_composition_elsewhere():
    """NumPy and Wasm run one primitive per step; Autodiff differentiates the composition."""
    assert cn.NumPy().recurrent_kernels and cn.Wasm().recurrent_kernels
    assert not cn.Python().recurrent_kernels and not cn.Autodiff(cn.NumPy()).recurrent_kernels
    backend = cn.Wasm()
    gates, c = (cn.tensor(v, backend=backend) for v in _inputs(1)[:2])
    before = backend.commands.launches
    F.lstm_cell(gates, c)
    assert backend.commands.launches - before == 1


@pytest.mark.parametrize("inner", ["numpy", "wasm"])
def test_gradients_through_the_cells_match_torch(inner):
    backend = cn.Autodiff(BACKENDS[inner]())
    gates, c, gx, gh, h = _inputs(2)
    tensors = [cn.tensor(v, backend=backend).require_grad() for v in (gates, c, gx, gh, h)]
    new_h, new_c = F.lstm_cell(tensors[0], tensors[1])
    loss = (new_h * 1.5 + new_c).sum() + (F.gru_cell(*tensors[2:]) * 0.5).sum()
    grads = loss.backward()
    refs = [torch.from_numpy(v).requires_grad_() for v in (gates, c, gx, gh, h)]
    th, tc = torch_lstm_cell(refs[0], refs[1])
    ((th * 1.5 + tc).sum() + (torch_gru_cell(*refs[2:]) * 0.5).sum()).backward()
    for t, ref in zip(tensors, refs):
        np.testing.assert_allclose(t.grad(grads).numpy(), ref.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_wrong_shapes_are_refused():
    gates, c = cn.tensor(np.zeros((2, 8), np.float32)), cn.tensor(np.zeros((2, 3), np.float32))
    with pytest.raises(cn.ShapeError, match="lstm_cell: needs gates"):
        F.lstm_cell(gates, c)


@pytest.mark.parametrize("backend_name", ["NumPy", "Wasm", "Python"])
def test_onnx_lstm_and_gru_node_cases(backend_name):
    cases = [case for case in onnx_node_cases.collect() if case[0].startswith(("test_lstm", "test_gru"))]
    results = onnx_node_cases.run(cases, getattr(cn, backend_name)())
    assert len(results) >= 8
    assert all(status == "pass" for status, _ in results.values()), results
