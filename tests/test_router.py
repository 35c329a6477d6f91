"""cn.Router: placement, explicit moves, DeviceError on mixing, fallback for declared gaps (with
its warning and profile count), Autodiff and cn.capture over it. Op-by-op conformance runs in
test_conformance.py through the router rows of tests/backends.py."""

import warnings

import numpy as np
import pytest

import cinders as cn
from cinders.backends.python_backend import Python
from cinders.models.mnist import MnistCNN


class PythonWithoutErf(Python):
    """The reference backend with a declared gap: erf (and pad) have no kernel here. Calling
    them is a test failure, so a fallback that does not happen cannot pass."""

    unsupported_ops = {"erf": "no erf kernel on this device", "pad": "no pad kernel on this device"}

    def unary(self, op, x):
        assert op != "erf", "erf reached the member that declared it unsupported"
        return super().unary(op, x)

    def pad(self, x, pads, value):
        raise AssertionError("pad reached the member that declared it unsupported")


def test_tensors_live_on_the_device_they_were_put_on():
    router = cn.Router(cn.NumPy(), cn.Python())
    a = cn.tensor([[1.0, -2.0], [3.0, 4.0]], backend=router)
    b = cn.tensor([[1.0, -2.0], [3.0, 4.0]], backend=router, device=1)
    assert a.backend is router and b.backend is router.device(1)
    assert router.device(0) is router and router.device(1) is router.device(1)
    # Each op's handles are its member's own: NumPy arrays on device 0, Python's on device 1.
    assert isinstance((a @ a).relu().handle, np.ndarray)
    assert not isinstance((b @ b).relu().handle, np.ndarray)
    np.testing.assert_allclose((b @ b).relu().numpy(), (a @ a).relu().numpy())
    assert repr(router.device(1)) == "cn.Router(cn.NumPy(), cn.Python()).device(1)"


def test_mixing_devices_raises_device_error_naming_both_until_moved():
    router = cn.Router(cn.NumPy(), cn.Python())
    a = cn.tensor([1.0, 2.0], backend=router)
    b = cn.tensor([3.0, 4.0], backend=router, device=1)
    with pytest.raises(cn.DeviceError) as e:
        a + b
    assert "cn.Router(cn.NumPy(), cn.Python())" in str(e.value) and ".device(1)" in str(e.value)
    moved = a.to(router.device(1))
    assert moved.backend is router.device(1)
    assert (moved + b).tolist() == [4.0, 6.0]
    with pytest.raises(cn.ArgumentError, match="devices 0..1"):
        router.device(2)
    with pytest.raises(cn.ArgumentError, match="one device"):
        cn.tensor([1.0], backend=cn.NumPy(), device=1)


def test_declared_gap_falls_back_to_the_next_member_and_warns_once():
    router = cn.Router(PythonWithoutErf(), cn.NumPy())
    x = cn.tensor([[-1.0, 0.25], [0.5, 2.0]], backend=router)
    want = cn.tensor(x.tolist(), backend=cn.NumPy()).erf().numpy()
    with pytest.warns(RuntimeWarning, match="erf is not supported on device 0.*runs on device 1"):
        with cn.profile(router) as p:
            y = x.erf()
    assert y.backend is router  # the result came back to where its input lives
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-6)
    assert p.moves == 2  # the input there, the result back
    assert [e["kind"] for e in p.events].count("move") == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once: a second erf is silent
        z = x.erf() + x.exp()
    np.testing.assert_allclose(z.numpy(), want + np.exp(x.numpy()), rtol=1e-6)
    # A primitive can be a declared gap too: pad (cn.pad, and conv padding) runs on NumPy.
    with pytest.warns(RuntimeWarning, match="pad is not supported"):
        padded = cn.pad(x, (1, 1), value=3.0)
    np.testing.assert_allclose(padded.numpy(), np.pad(x.numpy(), ((0, 0), (1, 1)), constant_values=3.0))
    # What no member supports stays unsupported, and the router says so.
    assert cn.Router(cn.NumPy(), PythonWithoutErf()).unsupported_ops == {}
    assert set(cn.Router(PythonWithoutErf(), PythonWithoutErf()).unsupported_ops) == {"erf", "pad"}


def test_fallback_on_the_second_device_wraps_around_to_the_first():
    router = cn.Router(cn.NumPy(), PythonWithoutErf())
    x = cn.tensor([0.3, -0.7], backend=router, device=1)
    with pytest.warns(RuntimeWarning, match="device 1 .*runs on device 0"):
        y = x.erf()
    assert y.backend is router.device(1)
    np.testing.assert_allclose(y.numpy(), cn.tensor([0.3, -0.7]).erf().numpy(), rtol=1e-6)


def test_autodiff_over_a_router_device_matches_numpy():
    rng = np.random.default_rng(0)
    xs, ws = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((3, 2)).astype(np.float32)

    def grads(backend):
        x = cn.tensor(xs, backend=backend)
        w = cn.tensor(ws, backend=backend).require_grad()
        loss = ((x @ w).gelu().softmax(axis=-1) * 3.0).log().mean()
        return loss.item(), w.grad(loss.backward())

    router = cn.Router(cn.NumPy(), PythonWithoutErf())
    want_loss, want = grads(cn.Autodiff(cn.NumPy()))
    with pytest.warns(RuntimeWarning, match="erf"):  # gelu's erf falls back from device 1
        got_loss, got = grads(cn.Autodiff(router).device(1))
    assert got.backend is router.device(1)  # the gradient lives with its tensor
    assert got_loss == pytest.approx(want_loss, rel=1e-6)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-7)


def test_capture_over_a_router_replays_on_its_gpu_member():
    from cinders.wgpu import Wgpu
    router = cn.Router(cn.NumPy(), Wgpu(autotune=False))
    gpu = router.device(1)
    cn.manual_seed(0)
    model = MnistCNN().to(gpu).eval()
    fast = cn.capture(model)
    rng = np.random.default_rng(1)
    for _ in range(5):
        x = cn.tensor(rng.random((2, 1, 28, 28), dtype=np.float32), backend=gpu)
        np.testing.assert_allclose(fast(x).numpy(), model(x).numpy(), rtol=1e-5, atol=1e-6)
    assert (fast.captures, fast.replays) == (1, 2)
    assert fast(x).backend is gpu
    # On the CPU member there is nothing to record: capture calls the model.
    cpu_model = MnistCNN().to(router).eval()
    x = cn.tensor(rng.random((2, 1, 28, 28), dtype=np.float32), backend=router)
    slow = cn.capture(cpu_model)
    for _ in range(4):
        np.testing.assert_allclose(slow(x).numpy(), cpu_model(x).numpy(), rtol=1e-6)
    assert slow.replays == 0


def test_a_fallback_inside_a_captured_function_is_refused():
    from cinders.wgpu import Wgpu

    class WgpuWithoutErf(Wgpu):
        unsupported_ops = {"erf": "no erf kernel on this device"}

    router = cn.Router(WgpuWithoutErf(autotune=False), cn.NumPy())
    x = cn.tensor([[0.5, -1.0]], backend=router)
    fast = cn.capture(lambda t: (t * 2.0).erf() + 1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        fast(x)  # the warm-up call runs fn as it is
        with pytest.raises(cn.CaptureError, match="reads a tensor's value"):
            fast(x)
