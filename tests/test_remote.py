"""cn.Remote against a real `cinders serve-backend` server on 127.0.0.1: results equal local
ones, ops are pipelined, tokens are required, limits hold, dropped handles and dropped clients
give their memory back, malformed frames (fuzzed) close only their own connection, and the
server keeps serving everyone else. Op-by-op conformance runs in test_conformance.py through
the remote rows of tests/backends.py."""

import gc
import os
import random
import re
import signal
import struct
import subprocess
import sys
import time

import numpy as np
import pytest
from websockets.sync.client import connect

import cinders as cn
from cinders.backends.remote_wire import pack, unpack
from cinders.models.mnist import MnistCNN
from cinders.remote_server import BackendServer
from remote_support import start_server, url_of

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def served():
    """A NumPy server of this test's own (127.0.0.1, free port), its token and its log lines."""
    lines = []
    server, token = start_server(cn.NumPy())
    server.log = lines.append
    yield server, token, lines
    server.stop()


def wait_for(condition, seconds=10.0):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def raw_client(server, token=None):
    ws = connect(url_of(server), compression=None, open_timeout=5, legacy=True)
    if token is not None:
        ws.send(pack({"hello": 1, "token": token}))
        header, _ = unpack(ws.recv(timeout=5))
        assert header["limits"]["max_bytes"] == server.limits["max_bytes"]
    return ws


def test_a_model_forward_and_backward_equal_local_numpy(served):
    server, token, _ = served
    remote = cn.Remote(url_of(server), token=token)
    rng = np.random.default_rng(0)
    images = rng.random((2, 1, 28, 28), dtype=np.float32)
    results = {}
    for name, backend in (("local", cn.Autodiff(cn.NumPy())), ("remote", cn.Autodiff(remote))):
        cn.manual_seed(0)
        model = MnistCNN().to(backend)
        x = cn.tensor(images, backend=backend)
        loss = cn.nn.functional.cross_entropy(model(x), cn.tensor([3, 7], backend=backend))
        grads = loss.backward()
        results[name] = [loss.item()] + [p.grad(grads).numpy() for p in model.parameters()]
    assert results["remote"][0] == pytest.approx(results["local"][0], rel=1e-6)
    for got, want in zip(results["remote"][1:], results["local"][1:]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def test_ops_are_pipelined_until_a_value_is_read(served):
    server, token, _ = served
    remote = cn.Remote(url_of(server), token=token)
    x = cn.tensor([1.0, 2.0, 3.0], backend=remote)
    for _ in range(40):
        x = (x * 1.5 - 0.5).relu()
    session = next(iter(server.sessions))
    time.sleep(0.1)
    # Nothing sent yet (a batch goes out when read or full): the client knows every shape.
    assert session.ops == 0
    want = np.array([1.0, 2.0, 3.0], np.float32)
    for _ in range(40):
        want = np.maximum(want * np.float32(1.5) - np.float32(0.5), 0)
    np.testing.assert_allclose(x.numpy(), want, rtol=1e-5)
    assert session.ops >= 120 and session.reads == 1


def test_two_connections_are_two_devices(served):
    server, token, _ = served
    a, b = cn.Remote(url_of(server), token=token), cn.Remote(url_of(server), token=token)
    x, y = cn.ones(2, backend=a), cn.ones(2, backend=b)
    with pytest.raises(cn.DeviceError, match="cn.Remote"):
        x + y  # each connection's handles are its own on the server
    assert (x + y.to(a)).tolist() == [2.0, 2.0]


def test_tokens_are_required_and_compared(served, monkeypatch):
    server, token, lines = served
    with pytest.raises(cn.RemoteError, match="wrong token"):
        cn.Remote(url_of(server), token="not-the-token")
    monkeypatch.delenv("CINDERS_REMOTE_TOKEN", raising=False)
    with pytest.raises(cn.ArgumentError, match="token"):
        cn.Remote(url_of(server))
    ws = raw_client(server)  # a frame without a token, then one that is not even the format
    ws.send(pack({"hello": 1}))
    assert "no token" in unpack(ws.recv(timeout=5))[0]["fatal"]
    ws = raw_client(server)
    ws.send(b"\x00\x01")
    assert "fatal" in unpack(ws.recv(timeout=5))[0]
    # each bad client refused and logged with its reason (the one without a token never connected)
    reasons = ("wrong token", "no token", "a frame is binary")
    assert wait_for(lambda: all(any(r in line for line in lines) for r in reasons)), lines
    assert sum("refused" in line for line in lines) == 3, lines
    with pytest.raises(cn.ArgumentError, match="token"):
        BackendServer(cn.NumPy(), None)
    monkeypatch.setenv("CINDERS_REMOTE_TOKEN", token)  # the environment is the default
    assert cn.Remote(url_of(server)).limits == server.limits


def test_limits_per_tensor_and_per_client():
    server, token = start_server(cn.NumPy(), max_elements=1 << 16, max_bytes=1 << 20)
    try:
        check_limits(cn.Remote(url_of(server), token=token))
    finally:
        server.stop()


def check_limits(remote):
    with pytest.raises(cn.SizeLimitError, match="65536 elements"):
        cn.zeros(300, 300, backend=remote)  # refused here, before anything is sent
    held = [cn.ones(200, 300, backend=remote) for _ in range(4)]  # 4 x 240 kB < 1 MiB
    over = held[0] * 2.0  # the fifth would pass the client's 1 MiB: the server refuses it
    with pytest.raises(cn.SizeLimitError, match="per client"):
        over.tolist()
    with pytest.raises(cn.SizeLimitError):  # and so does everything computed from it
        (over + 1.0).sum().item()
    del held, over
    gc.collect()
    assert (cn.ones(200, 300, backend=remote) * 2.0).sum().item() == 120000.0  # freed: room again


def test_dropped_handles_and_closed_clients_free_their_memory(served):
    server, token, lines = served
    remote = cn.Remote(url_of(server), token=token)
    keep = cn.tensor([5.0, 6.0], backend=remote)
    big = [cn.ones(100, 100, backend=remote) + float(i) for i in range(5)]
    remote.synchronize()
    assert wait_for(lambda: server.held_bytes() >= 5 * 40000)
    del big
    gc.collect()
    remote.synchronize()
    assert wait_for(lambda: server.held_bytes() < 40000), server.held_bytes()
    assert keep.tolist() == [5.0, 6.0]
    remote.close()
    assert wait_for(lambda: server.held_bytes() == 0 and not server.sessions)
    assert wait_for(lambda: any(re.search(r"127\.0\.0\.1:\d+: \d+ ops, 1 reads, peak \d+ bytes", line)
                                for line in lines)), lines


CLIENT = r"""
import sys, cinders as cn
remote = cn.Remote(sys.argv[1], token=sys.argv[2])
held = []
for i in range(1000000):
    held.append(cn.ones(64, 64, backend=remote) * float(i))
    held = held[-8:]
    if i == 20:
        remote.synchronize(); print("streaming", flush=True)
"""


def test_a_client_killed_mid_stream_leaves_others_serving(served):
    server, token, lines = served
    other = cn.Remote(url_of(server), token=token)
    mine = cn.tensor([[1.0, 2.0], [3.0, 4.0]], backend=other)
    mine.tolist()  # a round trip: the server holds it now
    before = server.held_bytes()
    child = subprocess.Popen([sys.executable, "-c", CLIENT, url_of(server), token],
                             stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=REPO))
    try:
        assert child.stdout.readline().strip() == "streaming"
        assert wait_for(lambda: len(server.sessions) == 2 and server.held_bytes() > before)
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
    finally:
        child.kill()
        child.stdout.close()
    assert wait_for(lambda: len(server.sessions) == 1), lines
    assert server.held_bytes() == before  # the killed client's tensors are gone, ours are not
    assert (mine @ mine).tolist() == [[7.0, 10.0], [15.0, 22.0]]
    assert any("dropped" in line or "disconnected" in line for line in lines), lines


def _fuzz_frames(rng, ids):
    """Frames that break the format, or follow it with wrong contents."""
    good = {"op": "full", "out": 10**6 + rng.randrange(1000), "in": [], "args": [[2], 1.0, "float32"]}
    choices = [
        lambda: bytes(rng.randrange(256) for _ in range(rng.randrange(12))),
        lambda: struct.pack("<I", rng.randrange(1 << 32)) + b"{}",
        lambda: struct.pack("<I", 5) + b"{nope",
        lambda: struct.pack("<I", 100000) + b"[" * 100000,  # nested past the parser's recursion limit
        lambda: pack([1, 2, 3]),
        lambda: pack({"ops": "all"}),
        lambda: pack({"ops": [good, dict(good)]}),  # one id twice
        lambda: pack({"ops": [{"op": "unary", "out": 7, "in": [12345], "args": ["exp"]}]}),
        lambda: pack({"ops": [{"op": "from_flat", "out": 8, "in": [], "args": [[4], "float32"], "nbytes": 999}]}),
        lambda: pack({"ops": [{"op": "read", "in": [4242]}]}),
        lambda: pack({"ops": [{"op": "free", "in": "x"}]}),
        lambda: pack({"ops": [{"op": "program", "program": 1, "ops": "x", "outputs": []}]}),
        lambda: pack({"ops": [{"op": "program", "program": 2, "ops": [{"op": "unary", "in": [["s", 999999]],
                                                                       "args": ["exp"]}], "outputs": []}]}),
        lambda: pack({"ops": [{"op": "program", "program": 3, "ops": [{"op": "unary", "in": [["w", 0]],
                                                                       "args": ["exp"]}], "outputs": []}]}),
        lambda: pack({"ops": [{"op": "replay", "program": 77, "in": [1], "outs": [5]}]}),
        # Server-to-server transfers (core/remote_peers.py).
        lambda: pack({"deliver": 5, "tensors": []}),
        lambda: pack({"deliver": "k", "tensors": [{"shape": [2], "dtype": "float32"}]}),  # no buffer
        lambda: pack({"deliver": "k", "tensors": [{"shape": [-1], "dtype": "float64"}]}),
        lambda: pack({"deliver": "k", "error": "x"}),
        lambda: pack({"ops": [{"op": "take", "key": "k", "outs": "x", "metas": []}]}),
        lambda: pack({"ops": [{"op": "take", "key": "k" * 500, "outs": [9], "metas": [[[2], "float32"]]}]}),
        lambda: pack({"ops": [{"op": "send", "in": [1], "key": 3, "peer": "ws://127.0.0.1:1", "token": "t"}]}),
        lambda: pack({"ops": [{"op": "send", "in": [1], "key": "k", "peer": None, "token": "t"}]}),
        lambda: "text, not binary",
    ]
    # Well-formed frames with wrong arguments: error values, the connection stays.
    soft = [
        {"op": "full", "args": [[1 << 40], 1.0, "float32"]},
        {"op": "full", "args": [[-3], 1.0, "float32"]},
        {"op": "full", "args": [[2], "x", "float32"]},
        {"op": "reshape", "in": ids[:1], "args": [[7, 7]]},
        {"op": "unary", "in": ids[:1], "args": ["__import__"]},
        {"op": "unary", "in": ids[1:2], "args": ["exp"]},  # exp of int32: the tensor layer casts first
        {"op": "exec", "args": ["print(1)"]},
        {"op": "matmul", "in": ids[:2], "args": []},  # float32 @ int32
        {"op": "unfold2d", "in": ids[:1], "args": [[0, 0], [0, 0], [0, 0], [0, 0], 0]},
        {"op": "gather", "in": ids[:2], "args": [5]},
    ]
    if rng.random() < 0.5:
        op = dict(rng.choice(soft))
        op.setdefault("in", [])
        op["out"] = rng.randrange(1000, 10**6)
        return False, pack({"ops": [op, {"op": "read", "in": [op["out"]]}]})
    return True, rng.choice(choices)()


def test_fuzzed_frames_close_only_their_connection(served):
    server, token, lines = served
    other = cn.Remote(url_of(server), token=token)
    mine = cn.tensor([1.0, -1.0, 2.0], backend=other)
    mine.tolist()
    baseline = server.held_bytes()
    rng = random.Random(0)
    started, closed, errors = time.time(), 0, 0
    ws = None
    for _ in range(150):
        if ws is None:
            ws = raw_client(server, token)
            ws.send(pack({"ops": [{"op": "full", "out": 1, "in": [], "args": [[2, 2], 1.5, "float32"]},
                                  {"op": "full", "out": 2, "in": [], "args": [[2, 2], 0, "int32"]}]}))
        fatal, frame = _fuzz_frames(rng, [1, 2])
        ws.send(frame)
        header, _ = unpack(ws.recv(timeout=5))
        if fatal:
            assert "fatal" in header, (frame, header)
            ws.close()
            ws, closed = None, closed + 1
        else:
            assert "error" in header and header["type"], header
            errors += 1
    if ws is not None:
        ws.close()
    assert closed > 30 and errors > 30
    assert time.time() - started < 60
    assert wait_for(lambda: len(server.sessions) == 1 and server.held_bytes() == baseline)
    assert (mine * 2.0).tolist() == [2.0, -2.0, 4.0]  # the well-behaved client never noticed
    assert sum("malformed frame" in line for line in lines) == closed


def test_a_captured_forward_replays_on_the_server_in_one_message(served):
    server, token, _ = served
    remote = cn.Remote(url_of(server), token=token)
    cn.manual_seed(0)
    model = MnistCNN().to(remote).eval()
    fast = cn.capture(model)
    rng = np.random.default_rng(1)
    for _ in range(5):
        x = cn.tensor(rng.random((2, 1, 28, 28), dtype=np.float32), backend=remote)
        np.testing.assert_allclose(fast(x).numpy(), model(x).numpy(), rtol=1e-6, atol=1e-7)
    assert (fast.captures, fast.replays) == (1, 2)
    session = next(iter(server.sessions))
    x.tolist()
    before = session.ops
    with cn.profile(remote) as p:
        y = fast(x)
    assert y.backend is remote and y.shape == (2, 10)
    assert [e["kind"] for e in p.events] == ["replay"] and p.kernel_launches > 20
    np.testing.assert_allclose(y.numpy(), fast(x).numpy(), rtol=0, atol=0)
    # The server ran the program's ops for each replay; the client sent one op per call.
    assert session.ops - before == 2 * p.kernel_launches


def test_capture_guards_on_a_remote(served):
    server, token, _ = served
    remote = cn.Remote(url_of(server), token=token)
    x = cn.tensor([0.5, -1.0], backend=remote)
    calls = [0]

    def branches(t):
        calls[0] += 1
        return t.exp() if calls[0] % 2 else t.tanh()

    def reads(t):
        return t * float((t * 2.0).sum().item())

    def draws(t):
        return t + cn.random((2,), backend=remote)

    state = {"w": cn.tensor([1.0, 2.0], backend=remote)}

    def replaces(t):
        out = t * state["w"]
        state["w"] = state["w"] + 1.0  # a new tensor: the replay would read the old one
        return out

    for fn, message in ((branches, "other ops than the first"), (reads, "reads a tensor's value"),
                        (draws, "draws random numbers"), (replaces, "replaced between calls")):
        fast = cn.capture(fn)
        with pytest.raises(cn.CaptureError, match=message):
            for _ in range(3):
                fast(x)
    # A guarded call still returned its result (the Learner falls back on it).
    fast = cn.capture(branches)
    fast(x), fast(x)
    with pytest.raises(cn.CaptureError) as e:
        fast(x)
    assert e.value.result.shape == (2,)


def test_the_cli_serves_on_127_0_0_1_and_insists_on_a_token():
    env = dict(os.environ, PYTHONPATH=REPO)
    env.pop("CINDERS_REMOTE_TOKEN", None)
    cli = [sys.executable, "-m", "cinders", "serve-backend", "--backend", "python", "--port", "0"]
    refused = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "token" in refused.stderr
    not_a_gpu = subprocess.run(cli + ["--token", "cli-test-token", "--adapter", "0"], env=env,
                               capture_output=True, text=True, timeout=60)
    assert not_a_gpu.returncode == 1 and "--adapter picks a GPU of --backend wgpu" in not_a_gpu.stderr
    server = subprocess.Popen(cli + ["--token", "cli-test-token"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline()
        url = re.search(r"ws://127\.0\.0\.1:\d+", line).group(0)
        remote = cn.Remote(url, token="cli-test-token")
        assert (cn.tensor([[1.0, 2.0]], backend=remote) @ cn.tensor([[3.0], [4.0]], backend=remote)).item() == 11.0
        remote.close()
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(10)
    log = server.stderr.read()
    server.stdout.close()
    server.stderr.close()
    assert re.search(r"serve-backend: 127\.0\.0\.1:\d+: \d+ ops, 1 reads", log), log


def test_a_stopped_server_is_a_clear_error_on_the_client():
    server, token = start_server(cn.NumPy())
    remote = cn.Remote(url_of(server), token=token)
    x = cn.ones(3, backend=remote)
    assert x.tolist() == [1.0, 1.0, 1.0]
    server.stop()
    with pytest.raises(cn.RemoteError, match="closed"):
        (x + 1.0).tolist()
    with pytest.raises(cn.RemoteError, match="cannot connect"):
        cn.Remote(url_of(server), token=token, timeout=5)
