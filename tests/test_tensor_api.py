"""Tensor-layer behaviour beyond single ops: fused-kernel hooks, NumPy interop, autodiff hooks."""

import numpy as np

import cinders as cn


class FusedSoftmaxNumPy(cn.NumPy):
    """A NumPy backend with a fused softmax/gelu kernel, counting how often the layer uses them."""

    def __init__(self):
        self.calls = []

    def fused_softmax(self, x, axis):
        self.calls.append(("softmax", axis))
        e = np.exp(x - x.max(axis, keepdims=True))
        return e / e.sum(axis, keepdims=True)

    def fused_gelu(self, x):
        self.calls.append(("gelu",))
        return self.binary("mul", x, self.full(x.shape, 0.0, cn.float32))  # recognisably not gelu


def test_fused_kernels_replace_composites():
    backend = FusedSoftmaxNumPy()
    x = cn.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]], backend=backend)
    out = x.softmax(-1)
    assert backend.calls == [("softmax", 1)]
    np.testing.assert_allclose(out.numpy(), cn.tensor(x.numpy(), backend=cn.NumPy()).softmax(-1).numpy(), rtol=1e-6)
    assert cn.gelu(x).tolist() == [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    assert backend.calls[-1] == ("gelu",)
    # Autodiff does not expose the inner backend's fused kernels: gradients need the composite.
    x.backend.calls.clear()
    ad = cn.Autodiff(backend)
    cn.tensor([1.0, 2.0], backend=ad).require_grad().softmax(-1)
    assert backend.calls == []


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
