"""Tensor-layer behaviour beyond single ops: NumPy interop, autodiff hooks."""

import numpy as np

import cinders as cn


def test_numpy_scalars_and_arrays_mix_with_tensors():
    t = cn.tensor([1.0, 2.0], backend=cn.NumPy())
    for out in (np.float32(2) * t, t * np.float32(2), t * np.int64(3) - t + np.float64(0.0)):
        assert isinstance(out, cn.Tensor) and out.tolist() == [2.0, 4.0]
    assert (cn.tensor([1, 2], backend=cn.NumPy()) * np.int32(3)).dtype is cn.int32
    assert np.asarray(t).tolist() == [1.0, 2.0]


def test_autodiff_hooks_delegate_to_the_backend():
    w = cn.tensor([[1.0, -2.0]], backend=cn.Autodiff(cn.NumPy())).require_grad()
    loss = (w * w).sum()
    grads = loss.backward()
    assert w.grad(grads).tolist() == [[2.0, -4.0]]
    assert w.detach().backend == w.backend


def test_tensors_hash_by_identity():
    a, b = cn.zeros(2), cn.zeros(2)
    assert len({a: 1, b: 2}) == 2
