"""cn.capture on cn.Wasm(): a replay is one run_commands call and equals uncaptured runs."""

import numpy as np
import pytest

import cinders as cn
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


def test_addresses_past_two_gib_run_and_replay():
    """wasm32 memory runs to 4 GiB: tensors placed past 2 GiB (a large detector's activations)
    go through the int32 command list and a capture's program as negative words."""
    import resource
    from cinders.wasm.engines import WasmtimeEngine
    backend = cn.Wasm(WasmtimeEngine())  # a module of its own: nothing freed below to reuse
    heap = backend.heap
    filler = heap.alloc(max(0, (1 << 31) - heap.top + 4096))  # untouched: no resident memory
    try:
        x = cn.tensor(np.arange(6, dtype=np.float32).reshape(2, 3), backend=backend)
        assert x.handle.ptr >= 1 << 31
        fast = cn.capture(lambda t: (t * 2.0 + 1.0).sum(1))
        for _ in range(4):
            np.testing.assert_allclose(fast(x).numpy(), [9.0, 27.0])
        assert fast.replays == 1
    finally:
        heap.release(*filler)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss < 4 << 20  # KiB: not 2 GiB touched
