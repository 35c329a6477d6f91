"""Buffer donation (wgpu_backend/pool.py, "In-place results"): an elementwise op writes its
result into the buffer of an input that died before the next launch, and never into one that a
variable, a view or the Autodiff tape can still read, however the op was reached. Counted with
cn.Wgpu().memory_stats()["inplace"] on real wgpu (lavapipe in CI)."""

import functools
import math
import operator

import numpy as np
import pytest

import cinders as cn
from cinders.tensor import Tensor



@pytest.fixture(scope="module")
def gpu():
    return cn.Wgpu(autotune=False)


def inplace(backend):
    return backend.memory_stats()["inplace"]


def values(n=8):
    return np.arange(n, dtype=np.float32)


def test_held_tensor_is_never_overwritten(gpu):
    x = cn.tensor(values(), backend=gpu)
    before = inplace(gpu)
    y = x + 1
    z = y * 2
    w = (y.exp() + x) - y        # y, x held: only the temporary y.exp() may be reused
    assert inplace(gpu) - before == 2
    np.testing.assert_array_equal(y.numpy(), values() + 1)
    np.testing.assert_array_equal(z.numpy(), (values() + 1) * 2)
    np.testing.assert_allclose(w.numpy(), np.exp(values() + 1) + values() - values() - 1, rtol=1e-5)
    np.testing.assert_array_equal(x.numpy(), values())


def test_temporary_chain_reuses_its_buffer(gpu):
    x = cn.tensor(values(), backend=gpu)
    before = inplace(gpu)
    out = ((x + 1) * 2).exp()    # `* 2` and `exp` both write into the buffer of `x + 1`
    assert inplace(gpu) - before == 2
    np.testing.assert_allclose(out.numpy(), np.exp((values() + 1) * 2), rtol=1e-6)
    before = inplace(gpu)
    out = 3.0 - x * (x + 1)      # the right operand and a reflected op donate too
    assert inplace(gpu) - before == 2
    np.testing.assert_allclose(out.numpy(), 3.0 - values() * (values() + 1))
    np.testing.assert_array_equal(x.numpy(), values())


def test_views_of_a_held_tensor_are_not_donated(gpu):
    x = cn.tensor(values(), backend=gpu)
    y = x + 1
    before = inplace(gpu)
    a = y.reshape(2, 4) * 2             # a temporary view, but y shares its storage
    b = y.reshape(2, 4).permute(1, 0) + 1
    c = y[2:].exp()
    assert inplace(gpu) == before
    np.testing.assert_array_equal(y.numpy(), values() + 1)
    np.testing.assert_array_equal(a.numpy(), ((values() + 1) * 2).reshape(2, 4))
    np.testing.assert_array_equal(b.numpy(), (values() + 2).reshape(2, 4).T)
    np.testing.assert_allclose(c.numpy(), np.exp(values()[2:] + 1), rtol=1e-6)
    # A view of a temporary is the storage's only owner once the temporary is gone.
    before = inplace(gpu)
    d = (x + 1).reshape(2, 4) * 2
    assert inplace(gpu) - before == 1
    np.testing.assert_array_equal(d.numpy(), ((values() + 1) * 2).reshape(2, 4))


def test_a_temporary_tensor_around_a_held_handle_is_not_donated(gpu):
    # What Autodiff's backward rules do: wrap a handle the tape saved in a fresh Tensor.
    x = cn.tensor(values(), backend=gpu)
    saved = (x + 1).handle
    before = inplace(gpu)
    out = Tensor(gpu, saved, (8,), cn.float32) * 2
    assert inplace(gpu) == before
    np.testing.assert_array_equal(np.asarray(gpu.to_flat(saved)), values() + 1)
    np.testing.assert_array_equal(out.numpy(), (values() + 1) * 2)


def test_autodiff_never_donates_what_the_tape_saved(gpu):
    backend = cn.Autodiff(gpu)
    ref = cn.Autodiff(cn.NumPy())
    grads = {}
    for b in (backend, ref):
        w = cn.tensor(values() / 8, backend=b).require_grad()
        before = inplace(gpu)
        y = ((w * 2).exp() * (w + 1)).sqrt()     # exp and sqrt save their outputs
        loss = (y * y).sum()
        if b is backend:
            # Only the two values the tape did not save give their buffers: `w * 2` (exp keeps
            # its output) and the product (sqrt keeps its output). `w + 1` and exp's output
            # are the product's saved operands.
            assert inplace(gpu) - before == 2
        grads[b] = (loss.item(), w.grad(loss.backward()).numpy())
    assert math.isclose(grads[backend][0], grads[ref][0], rel_tol=1e-5)
    np.testing.assert_allclose(grads[backend][1], grads[ref][1], rtol=1e-4, atol=1e-6)


def test_donation_does_not_depend_on_how_the_op_is_reached(gpu):
    x = cn.tensor(values(), backend=gpu)
    before = inplace(gpu)
    out = (lambda t: t * 2)(x + 1)                       # one more frame holds the temporary
    out = functools.reduce(operator.add, [out, x, x])    # C code between caller and op
    assert inplace(gpu) - before == 2
    np.testing.assert_array_equal(out.numpy(), (values() + 1) * 2 + 2 * values())
    # Containers hold their elements: nothing a NumPy object array holds is ever overwritten.
    held = np.empty(2, dtype=object)
    held[0], held[1] = x + 1, x + 2
    before = inplace(gpu)
    doubled = held * 2
    assert inplace(gpu) == before
    np.testing.assert_array_equal(held[0].numpy(), values() + 1)
    np.testing.assert_array_equal(doubled[1].numpy(), (values() + 2) * 2)


def test_a_donor_read_again_is_kept(gpu):
    x = cn.tensor(values(), backend=gpu)
    t = x + 1
    y = t * 2          # t is read again below: not y's buffer
    before = inplace(gpu)
    z = t.exp()        # ... but after `del t` nothing reads it: z's buffer
    del t
    w = x - 1          # the next launch places z into t's buffer; w never gets that buffer
    assert inplace(gpu) - before == 1
    np.testing.assert_array_equal(y.numpy(), (values() + 1) * 2)
    np.testing.assert_allclose(z.numpy(), np.exp(values() + 1), rtol=1e-6)
    np.testing.assert_array_equal(w.numpy(), values() - 1)
    np.testing.assert_array_equal(x.numpy(), values())


def test_cpu_backends_compute_the_same():
    x = cn.tensor(values(), backend=cn.NumPy())
    np.testing.assert_array_equal((((x + 1) * 2) - 1).numpy(), (values() + 1) * 2 - 1)
    np.testing.assert_array_equal(x.numpy(), values())


@pytest.mark.parametrize("n", [1024, 1023])   # vec4 and scalar fused kernels
def test_a_fused_group_writes_into_a_dead_leaf(gpu, n):
    fusion = cn.Fusion(gpu)
    data = values(n) / n
    x = cn.tensor(data, backend=fusion)
    t = fusion.realize(x * 2)           # a computed leaf of the next group
    held = fusion.realize(x * 3)
    before = inplace(gpu)
    u = (t + 1).exp() * held            # one fused kernel reading t and held
    del t                               # ... t dies before it runs: u takes t's buffer
    got = u.numpy()
    assert inplace(gpu) - before == 1
    np.testing.assert_allclose(got, np.exp(data * 2 + 1) * data * 3, rtol=1e-5)
    np.testing.assert_allclose(held.numpy(), data * 3, rtol=1e-6)
    np.testing.assert_array_equal(x.numpy(), data)


def test_a_failed_placement_loses_only_its_own_result(gpu, monkeypatch):
    # Finding the result's buffer can fail (out of device memory): that launch is dropped and
    # says so when its tensor is used; the rest of its batch runs, and the pool stays whole.
    n = 3001
    gpu.empty_cache()                          # no pooled buffer of any size class: y needs a new one
    x = cn.tensor(values(n), backend=gpu)
    earlier = x - 1                            # recorded before, in the same batch
    y = x * 2                                  # x is held: y needs a new buffer when placed

    def out_of_memory(nbytes):
        raise MemoryError("no device memory left (simulated)")

    monkeypatch.setattr(gpu.device, "_create_buffer", out_of_memory)
    with pytest.raises(MemoryError):
        y.numpy()
    monkeypatch.undo()
    with pytest.raises(cn.CindersError, match="never ran"):
        y.numpy()
    with pytest.raises(cn.CindersError, match="never ran"):
        y + 1
    np.testing.assert_array_equal(earlier.numpy(), values(n) - 1)
    np.testing.assert_array_equal((x * 3).numpy(), values(n) * 3)
    stats, pool = gpu.memory_stats(), gpu.pool   # (stats drains what died)
    assert stats["allocated_bytes"] == sum(raw.size for raw in pool._held.values())
    assert stats["pooled_bytes"] == sum(raw.size for free in pool._free.values() for raw in free)
