"""cn.capture's replay fast path on cn.Wasm(): the last signature is checked argument by argument
(core/capture.py _LastCall), and a replay writes its program block only when an address in it
changed (wasm_backend/capture.py). Anything else takes the generic path: never a stale program."""

import struct

import numpy as np
import pytest

import cinders as cn
from cinders import nn


def _linear(backend, seed=0):
    cn.manual_seed(seed)
    lin = nn.Linear(6, 3).to(backend)
    return lin, cn.capture(lambda x: lin(x).relu())


def _x(backend, rng, shape=(2, 6), dtype=np.float32):
    return cn.tensor(rng.standard_normal(shape).astype(dtype), backend=backend)


def test_fast_path_replays_the_last_signature_and_equals_eager():
    backend = cn.Wasm()
    lin, fast = _linear(backend)
    rng = np.random.default_rng(0)
    for _ in range(3):
        fast(_x(backend, rng))
    held = []  # inputs kept alive: each replay binds a new address
    for _ in range(4):
        x = _x(backend, rng)
        held.append(x)
        np.testing.assert_allclose(fast(x).numpy(), lin(x).relu().numpy(), rtol=1e-6, atol=1e-7)
    assert fast.fast_path and (fast.captures, fast.replays) == (1, 4)


@pytest.mark.parametrize("other", ["shape", "dtype", "backend", "kwargs", "view", "offset"])
def test_another_signature_after_the_fast_path_is_not_replayed_from_it(other):
    """A call that differs from the last replay in shape, dtype, backend object, keywords,
    layout or offset goes through the generic key: it captures (or replays) its own program, with
    fn's own result, and never reuses the last one's."""
    backend = cn.Wasm()
    cn.manual_seed(1)
    lin = nn.Linear(6, 3).to(backend)

    def fn(x, scale=None):
        y = lin(x.float() if x.dtype is not cn.float32 else x)
        return y if scale is None else y * scale

    fast = cn.capture(fn)
    rng = np.random.default_rng(1)
    for _ in range(4):
        fast(_x(backend, rng))
    assert fast.replays == 1 and fast.fast_path
    if other == "shape":
        x, kwargs = _x(backend, rng, (5, 6)), {}
    elif other == "dtype":
        x, kwargs = cn.tensor(rng.integers(-3, 3, (2, 6)).astype(np.int32), backend=backend), {}
    elif other == "backend":  # another cn.Wasm() object on the same engine
        x, kwargs = cn.Tensor(cn.Wasm(backend.engine), _x(backend, rng).handle, (2, 6), cn.float32), {}
    elif other == "kwargs":
        x, kwargs = _x(backend, rng), {"scale": cn.tensor(2.0, backend=backend)}
    elif other == "view":  # the same shape and dtype, read through a transposed view
        x, kwargs = _x(backend, rng, (6, 2)).permute(1, 0), {}
    else:  # contiguous rows that start 24 bytes into their buffer
        x, kwargs = _x(backend, rng, (4, 6))[1:3], {}
    want = fn(x, **kwargs).numpy()
    for _ in range(4):
        got = fast(x, **kwargs)
        assert got.shape == want.shape
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=1e-6)
    # ... and the first signature still replays its own program
    x0 = _x(backend, rng)
    np.testing.assert_allclose(fast(x0).numpy(), fn(x0).numpy(), rtol=1e-6, atol=1e-7)


def test_a_replay_at_the_same_addresses_writes_nothing(monkeypatch):
    backend = cn.Wasm()
    lin, fast = _linear(backend, 2)
    x = _x(backend, np.random.default_rng(2))
    for _ in range(4):
        fast(x).numpy()  # (the output is freed: the next one takes its block)
    engine = backend.engine
    writes, real = [], type(engine).write
    monkeypatch.setattr(type(engine), "write", lambda self, ptr, data: writes.append(ptr) or real(self, ptr, data))
    y = fast(x)
    assert writes == []
    monkeypatch.undo()
    np.testing.assert_allclose(y.numpy(), lin(x).relu().numpy(), rtol=1e-6, atol=1e-7)


def test_replays_stay_right_after_the_constant_cache_starts_over():
    """The output copy's descriptor lives in the backend's constant cache, which starts over at
    1024 blocks: a later replay must not run a program pointing at a released descriptor."""
    backend = cn.Wasm()
    lin, fast = _linear(backend, 3)
    rng = np.random.default_rng(3)
    x = _x(backend, rng)
    for _ in range(4):
        fast(x)
    blocks = backend.engine.constant_blocks
    for n in range(1, 1100):  # a fresh 16-byte descriptor each (elementwise over n values)
        cn.tensor(np.zeros(n, np.float32), backend=backend).exp()
    assert len(blocks) < 1024  # (it started over)
    # the released blocks are taken again and filled with other values
    junk = [cn.tensor(np.full(4, 7.0, np.float32), backend=backend) for _ in range(2048)]
    backend.synchronize()
    np.testing.assert_allclose(fast(x).numpy(), lin(x).relu().numpy(), rtol=1e-6, atol=1e-7)
    assert len(junk) == 2048 and fast.replays >= 2


# ---- a host's own replays (what the page's JS does: wasm/cinders.js Replay) -------------------
OWNER = 7


def _plan(backend, fast, x):
    program = fast.replayable()
    assert program is not None
    recorder = backend.capture_recorder()
    assert recorder.standalone(program, [x.handle], OWNER)
    return recorder.plan_address()


def _host_replay(engine, plan, values):
    """What wasm/cinders.js Replay.run does, through the engine: None when the plan block's
    owner word says no plan of ours holds, else the output after writing `values` as the input."""
    owner, commands, count, input_at, input_bytes, output_at, output_bytes = \
        struct.unpack("<7I", engine.read(plan, 28))
    if owner != OWNER:
        return None
    data = np.asarray(values, np.float32).tobytes()
    assert len(data) == input_bytes
    engine.write(input_at, data)
    engine.call("run_commands", commands - (1 << 32) if commands >= 1 << 31 else commands, count)
    return np.frombuffer(engine.read(output_at, output_bytes), np.float32)


def _captured_linear():
    backend = cn.Wasm()
    lin, fast = _linear(backend, 4)
    x = _x(backend, np.random.default_rng(4))
    for _ in range(4):  # warm, two recordings, then a replay
        fast(x)
    return backend, lin, fast, x


def test_a_host_replays_the_plan_with_the_answers_of_python():
    backend, lin, fast, x = _captured_linear()
    rng = np.random.default_rng(5)
    values = [rng.standard_normal((2, 6)).astype(np.float32) for _ in range(3)]
    inputs = [cn.tensor(v, backend=backend) for v in values]
    eager = [lin(t).relu().numpy() for t in inputs]
    python = [fast(t).numpy() for t in inputs]
    fast(x)  # (the plan is of the call just replayed)
    plan = _plan(backend, fast, x)
    for v, want, replayed in zip(values, eager, python):
        got = _host_replay(backend.engine, plan, v).reshape(2, 3)
        np.testing.assert_array_equal(got, replayed)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("change", ["replaced weight", "weight written in place", "kernels queued",
                                    "other input", "another owner"])
def test_the_plan_stops_holding_when_python_changes_what_it_replays(change):
    """The plan block's owner word is zeroed (the host then goes through Python) when the
    program goes stale, its commands are rebound, or kernels are queued that must run first."""
    from cinders.capture import assign
    backend, lin, fast, x = _captured_linear()
    plan = _plan(backend, fast, x)
    values = np.ones((2, 6), np.float32)
    assert _host_replay(backend.engine, plan, values) is not None
    new_bias = cn.tensor(np.arange(3, dtype=np.float32), backend=backend)
    if change == "replaced weight":
        lin.replace_tensors({"bias": new_bias})   # (the old tensor is retired)
    elif change == "weight written in place":
        assign(lin.bias, new_bias)   # a queued copy into the state buffer
    elif change == "kernels queued":
        (x + 1)  # noqa: B018  (queued, never read)
    elif change == "other input":
        fast(_x(backend, np.random.default_rng(6)))
    else:  # another model's plan (the page's other Predictor): one plan at a time
        assert backend.capture_recorder().standalone(fast.replayable(), [x.handle], OWNER + 1)
    assert _host_replay(backend.engine, plan, values) is None
    # Python's path answers with the change, and a new plan replays it
    x1 = cn.tensor(values, backend=backend)
    want = lin(x1).relu().numpy()
    for _ in range(4):
        got = fast(x1)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(_host_replay(backend.engine, _plan(backend, fast, x1), values).reshape(2, 3),
                               want, rtol=1e-6, atol=1e-7)


def test_programs_that_need_python_per_call_are_not_handed_to_a_host():
    """Random kernels (their seeds are patched per call) and gather (its indices are checked
    between commands) keep every replay in Python."""
    backend = cn.Wasm()
    rng = np.random.default_rng(7)
    noisy = cn.capture(lambda x: x + cn.random(x.shape, backend=backend))
    x = _x(backend, rng)
    for _ in range(4):
        noisy(x)
    assert noisy.replays == 1 and noisy.replayable() is None
    table = _x(backend, rng, (5, 3))
    pick = cn.capture(lambda i: table.gather(0, i))
    index = cn.tensor(np.array([[0, 1, 2], [4, 3, 0]], np.int32), backend=backend)
    for _ in range(4):
        pick(index)
    program = pick.replayable()
    assert program is not None and not backend.capture_recorder().standalone(program, [index.handle], OWNER)


def test_no_plan_for_a_handle_the_commands_do_not_read_or_an_output_that_is_an_input():
    """A plan writes the page's input where the program's commands read it: not for a handle
    its last replay did not bind, nor for a program of two inputs (the second unused), nor where
    the output is the input itself (no kernel writes it: it is in the caller's buffer each call)."""
    backend = cn.Wasm()
    lin, fast = _linear(backend, 4)
    rng = np.random.default_rng(9)
    a, b = _x(backend, rng), _x(backend, rng)
    recorder = backend.capture_recorder()
    first_only = cn.capture(lambda a, b: lin(a).relu())
    itself = cn.capture(lambda x: x.reshape(-1))
    for _ in range(4):
        fast(a), first_only(a, b), itself(a)
    assert not recorder.standalone(fast.replayable(), [b.handle], OWNER)
    assert not recorder.standalone(first_only.replayable(), [a.handle], OWNER)
    assert not recorder.standalone(itself.replayable(), [a.handle], OWNER)
    assert recorder.standalone(fast.replayable(), [a.handle], OWNER)   # (the handle it reads)
