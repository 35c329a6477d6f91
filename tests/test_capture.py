"""cn.capture on lavapipe: replays equal uncaptured runs, guards, counters, submits."""

import numpy as np
import pytest

import cinders as cn
from cinders import nn
from cinders.capture import assign
from cinders.models.mnist import MnistCNN
from cinders.wgpu import Wgpu

STACKS = {"wgpu": lambda: Wgpu(), "fusion-wgpu": lambda: cn.Fusion(Wgpu())}


def _images(rng, batch):
    return rng.random((batch, 1, 28, 28), dtype=np.float32)


@pytest.mark.parametrize("stack", sorted(STACKS))
def test_forward_replay_matches_uncaptured_with_one_submit(stack):
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
    with cn.profile(backend) as p:
        y = fast(x)
    assert p.submits == 1, p
    assert p.kernel_launches >= 5
    assert y.backend is backend and y.shape == (2, 10)
    # A replay's output is a fresh tensor: the next replay does not overwrite it.
    before = y.numpy()
    fast(cn.tensor(_images(rng, 2), backend=backend))
    np.testing.assert_array_equal(y.numpy(), before)


def test_new_shape_captures_again():
    backend = Wgpu()
    lin = nn.Linear(8, 3).to(backend)
    fast = cn.capture(lambda x: lin(x).relu())
    rng = np.random.default_rng(2)
    for batch in (4, 4, 4, 4, 7, 7, 7, 7, 4):
        x = cn.tensor(rng.standard_normal((batch, 8)).astype(np.float32), backend=backend)
        np.testing.assert_allclose(fast(x).numpy(), lin(x).relu().numpy(), rtol=1e-5, atol=1e-6)
    assert (fast.captures, fast.replays) == (2, 3)


def test_parameter_changed_in_place_is_seen_by_the_next_replay():
    backend = cn.Fusion(Wgpu())
    lin = nn.Linear(4, 2).to(backend)
    fast = cn.capture(lambda x: lin(x) * 2.0)
    x = cn.tensor(np.ones((3, 4), np.float32), backend=backend)
    for _ in range(3):
        fast(x)
    assign(lin.weight, lin.weight * 0.0 + 1.0)
    got = fast(x).numpy()
    np.testing.assert_allclose(got, (np.full((3, 2), 4.0) + lin.bias.numpy()) * 2.0, rtol=1e-6)
    assert fast.replays == 1


def test_different_second_recording_raises():
    backend = Wgpu()
    calls = [0]

    def fn(x):
        calls[0] += 1
        return x.exp() if calls[0] % 2 else x.tanh()  # a branch on Python state

    fast = cn.capture(fn)
    x = cn.tensor([1.0, 2.0], backend=backend)
    fast(x)
    fast(x)
    with pytest.raises(cn.CaptureError, match="different kernel sequence"):
        fast(x)


def test_changing_python_constant_raises():
    backend = Wgpu()
    scale = [1.0]

    def fn(x):
        scale[0] += 1.0
        return x * scale[0]

    fast = cn.capture(fn)
    x = cn.tensor([1.0, 2.0], backend=backend)
    fast(x)
    fast(x)
    with pytest.raises(cn.CaptureError, match="other constants"):
        fast(x)


def test_reading_a_value_inside_fn_names_the_line():
    backend = Wgpu()

    def fn(x):
        if x.sum().item() > 0:  # the offending line
            return x * 2.0
        return x

    fast = cn.capture(fn)
    x = cn.tensor([1.0, 2.0], backend=backend)
    fast(x)
    with pytest.raises(cn.CaptureError, match="the offending line"):
        fast(x)


def test_replaced_state_raises():
    backend = Wgpu()
    holder = {"w": cn.tensor([1.0, 2.0], backend=backend)}

    def fn(x):
        holder["w"] = holder["w"] + x  # out of place: a replay would keep reading the old one
        return holder["w"] * 1.0

    fast = cn.capture(fn)
    x = cn.tensor([1.0, 1.0], backend=backend)
    fast(x)
    fast(x)
    with pytest.raises(cn.CaptureError, match="replaced"):
        fast(x)


# Every capturable stack, GPU and Wasm, for the tests whose point is the same on each.
CAPTURABLE = {**STACKS, "wasm": lambda: cn.Wasm(), "autodiff-wasm": lambda: cn.Autodiff(cn.Wasm())}


@pytest.mark.parametrize("stack", sorted(CAPTURABLE))
def test_random_draws_fresh_numbers_like_uncaptured(stack):
    backend = CAPTURABLE[stack]()

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


def test_cpu_backends_just_call_fn():
    backend = cn.NumPy()
    fast = cn.capture(lambda x: x * 2.0)
    for _ in range(4):
        assert fast(cn.tensor([1.0], backend=backend)).tolist() == [2.0]
    assert (fast.captures, fast.replays) == (0, 0)




def test_workspace_is_one_calls_buffers_and_returns_to_the_pool():
    import gc
    backend = cn.Fusion(Wgpu())
    pool = backend.inner.pool
    model = MnistCNN().to(backend).eval()
    x = cn.tensor(_images(np.random.default_rng(4), 2), backend=backend)
    model(x).numpy()
    gc.collect()
    pool.empty_cache()
    before = pool.stats()
    model(x).numpy()                     # from an empty pool: the buffers one call needs
    gc.collect()
    after = pool.stats()
    one_call = after["reserved_bytes"] - before["reserved_bytes"]
    # A recording writes every result into a buffer of its own (it binds the buffers it saw),
    # where an uncaptured call may write an elementwise result into a dead input's buffer.
    one_call += after["inplace_bytes"] - before["inplace_bytes"]
    fast = cn.capture(model)
    for _ in range(4):
        fast(x).numpy()
    gc.collect()
    workspace = pool.stats()["captured_bytes"] - before["captured_bytes"]
    assert 0 < workspace <= one_call
    del fast
    gc.collect()
    assert pool.stats()["captured_bytes"] == before["captured_bytes"]


def test_capture_state_is_per_thread():
    """A capture in one thread neither records nor flags the launches of another (a data loader
    computing beside the step): that thread's values are its own, and it is not `capturing()`."""
    import threading
    from cinders.capture import capturing
    backend = Wgpu(autotune=False)
    seen = {}

    def loader():
        seen["capturing"] = capturing()
        y = cn.tensor([1.0, 2.0, 3.0], backend=backend) * 3.0
        seen["values"] = y.tolist()  # a read: would raise inside the recording thread

    def step(x):
        worker = threading.Thread(target=loader)
        worker.start()
        worker.join()
        assert capturing()
        return (x + 1.0).exp()

    fast = cn.capture(step)
    x = cn.tensor(np.zeros(4, np.float32), backend=backend)
    for call in range(4):
        seen.clear()
        np.testing.assert_allclose(fast(x).numpy(), np.full(4, np.e, np.float32), rtol=1e-6)
        # calls 1-3 run step (the 2nd and 3rd recording); the 4th is a replay, no Python
        assert seen == ({"capturing": False, "values": [3.0, 6.0, 9.0]} if call < 3 else {})
    assert fast.captures == 1 and fast.replays == 1


@pytest.mark.parametrize("stack", sorted(STACKS))
def test_a_tensor_made_from_a_list_inside_fn_keeps_its_values_in_every_replay(stack):
    """Gather indices made with cn.tensor inside fn (as ONNX Pad's reflect mode does) are
    uploaded once, while recording; a replay runs only the kernels. After the index tensor dies,
    a later result of the same size must not take its buffer, or the next replay gathers with
    that result's numbers (Silero VAD's replays drifted so)."""
    backend = STACKS[stack]()
    x = cn.tensor(np.arange(256, dtype=np.float32), backend=backend)

    def f(x):
        y = x[cn.tensor(list(range(255, -1, -1)), backend=backend, dtype=cn.int32)]   # 1 KB, like y
        return (y * 2.0 + 1.0) * 3.0

    want = f(x).numpy()
    replayed = cn.capture(f)
    for _ in range(5):
        assert np.array_equal(replayed(x).numpy(), want)
    assert replayed.replays == 2


def test_programs_of_the_least_recently_used_signatures_are_dropped(monkeypatch):
    """Inputs of ever new shapes (text lines of every width) keep at most MAX_SIGNATURES
    programs; the workspace of one pushed out goes back to the pool."""
    import gc
    import importlib
    monkeypatch.setattr(importlib.import_module("cinders.capture"), "MAX_SIGNATURES", 2)
    backend = Wgpu()
    pool = backend.pool
    fast = cn.capture(lambda x: (x * 2.0).exp())

    def run(width):
        x = cn.tensor(np.ones((2, width), np.float32), backend=backend)
        for _ in range(4):
            np.testing.assert_allclose(fast(x).numpy(), np.exp(2.0 * np.ones((2, width))), rtol=1e-6)
        gc.collect()
        return pool.stats()["captured_bytes"]
    one = run(4)                     # widths 4, 5 and 6 fall in one buffer size class
    assert one > 0 and run(5) == 2 * one
    assert run(6) == 2 * one         # width 4's program and workspace went
    assert len(fast._entries) == 2 and fast.captures == 3
    run(4)                           # captured again, pushing out width 5
    assert fast.captures == 4 and pool.stats()["captured_bytes"] == 2 * one


REPLACEMENTS = {
    # each gives a state tensor that a captured fn reads a new buffer, outside fn
    "optimizer step": lambda model, x: cn.optim.SGD(lr=0.5).step(model, model(x).sum().backward()),
    "load_state_dict": lambda model, x: model.load_state_dict(
        {k: v.numpy() * 2.0 for k, v in model.state_dict().items()}),
    "setitem": lambda model, x: _write_under_no_grad(model[0].weight, (0, 0), 100.0),
}


def _write_under_no_grad(t, key, value):
    with cn.no_grad():
        t[key] = value


@pytest.mark.parametrize("backend_name", ["wgpu", "fusion-wgpu", "wasm"])
@pytest.mark.parametrize("replacement", sorted(REPLACEMENTS))
def test_state_replaced_outside_fn_records_again_instead_of_replaying_old_values(backend_name, replacement):
    """Uncaptured training, load_state_dict or `w[i] = v` give a parameter a new buffer; a captured
    forward recorded before must answer with the new values (it records again), never the old."""
    inner = cn.Wasm() if backend_name == "wasm" else STACKS[backend_name]()
    backend = cn.Autodiff(inner)
    cn.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)).to(backend)
    x = cn.tensor(np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4), backend=backend)
    fast = cn.capture(lambda x: model(x))
    for _ in range(4):
        fast(x)
    assert fast.replays >= 1
    REPLACEMENTS[replacement](model, x)
    want = model(x).numpy()
    for _ in range(4):   # the recording calls and the replays after them
        np.testing.assert_allclose(fast(x).numpy(), want, rtol=1e-5, atol=1e-6)
    assert fast.captures == 2


@pytest.mark.parametrize("backend_name", ["wgpu", "fusion-wgpu", "wasm"])
@pytest.mark.parametrize("fn", [lambda x: x.reshape(-1), lambda x: (x.relu(), x[1]), lambda x: x[0]],
                         ids=["input reshaped", "a computed output and a row of the input", "a row of the input"])
def test_an_output_that_is_the_input_or_a_view_of_it_is_each_calls_own(backend_name, fn):
    """No kernel writes an output that is (a view of) an input: a replay reads it out of that
    call's input, never out of the buffer the recording call's input had."""
    backend = cn.Wasm() if backend_name == "wasm" else STACKS[backend_name]()
    fast = cn.capture(fn)
    for i in range(6):
        x = cn.tensor(np.full((2, 3), float(i), np.float32) + np.arange(3, dtype=np.float32), backend=backend)
        got, want = fn(x), fast(x)
        for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
            np.testing.assert_array_equal(w.numpy(), g.numpy())
    assert fast.replays >= 2


def test_a_list_argument_does_not_break_the_last_call_check():
    backend = Wgpu()
    w = cn.tensor([2.0, 3.0], backend=backend)
    fast = cn.capture(lambda x, ys: x * w + ys[0])
    x, y = cn.tensor([1.0, 1.0], backend=backend), cn.tensor([1.0, 2.0], backend=backend)
    for _ in range(6):
        np.testing.assert_allclose(fast(x, [y]).numpy(), [3.0, 5.0])


STORAGE_STACKS = {"wgpu": lambda: Wgpu(), "wgpu-packed": lambda: Wgpu(shader_f16=False),
                  "fusion-wgpu": lambda: cn.Fusion(Wgpu()), "wasm": lambda: cn.Wasm()}


@pytest.mark.parametrize("backend_name", list(STORAGE_STACKS))
@pytest.mark.parametrize("dtype", [cn.float16, cn.int8, cn.uint8], ids=repr)
def test_storage_dtype_outputs_replay_at_their_size(backend_name, dtype):
    """An output stored 1 or 2 bytes a value (float16 in either layout, int8, uint8) is copied out
    of the workspace by its own words (a replay copied 4 bytes a value, past the buffer's end),
    with the answer of the uncaptured call; a row of one, and views that start inside a packed
    word (copied to a word of their own: buffer copies move whole words), of a computed output
    and of a storage-dtype input."""
    backend = STORAGE_STACKS[backend_name]()
    fn = lambda x, q: ((x * 2).cast(dtype), x.cast(dtype)[1], x.cast(dtype).reshape(-1)[3:], q[3:])  # noqa: E731
    fast = cn.capture(fn)
    for i in range(5):
        values = np.arange(8 * 64, dtype=np.float32).reshape(8, 64) % 50 + i
        x, q = cn.tensor(values, backend=backend), cn.tensor(values[0], backend=backend, dtype=dtype)
        got, want = fast(x, q), fn(x, q)
        for g, w in zip(got, want):
            assert g.dtype is dtype
            np.testing.assert_array_equal(g.numpy(), w.numpy())
    assert fast.replays >= 2
