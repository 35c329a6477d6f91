"""Data-parallel training (Learner(devices=[...])) equals single-device training on the same
global batches, to float tolerance: two NumPy devices, NumPy + Python, uneven shards, a Router's
two devices, two wgpu devices (lavapipe), two Remote servers that exchange weights and
gradients between themselves (the client's received bytes counted), and a whole Learner.fit on
real digits, locally and over two servers."""

import random

import numpy as np
import pytest

import cinders as cn
from cinders.data import DataLoader, Subset
from cinders.data.mnist import MnistBatcher, MnistDigits
from cinders.models.mnist import MnistMLP
from cinders.nn import functional as F
from cinders.train import Accuracy, Learner, Loss
from cinders.train.data_parallel import DataParallel, shard_sizes

HOME = cn.Autodiff(cn.NumPy())


class Net(cn.nn.Module):
    def __init__(self, hidden=8, activation=cn.Tensor.gelu):
        super().__init__()
        self.a = cn.nn.Linear(6, hidden)
        self.b = cn.nn.Linear(hidden, 3)
        self.activation = activation

    def forward(self, x):
        return self.b(self.activation(self.a(x)))


def batches(count, rows, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((rows, 6)).astype(np.float32), rng.integers(0, 3, rows).astype(np.int32))
            for _ in range(count)]


def train(data, devices=None, optimizer=None, home=HOME):
    cn.manual_seed(0)
    model = Net().to(home)
    opt = optimizer or cn.optim.Adam(1e-2)
    step = DataParallel(model, devices) if devices else None
    losses = []
    for x, y in data:
        x, y = cn.tensor(x, backend=home), cn.tensor(y, backend=home)
        if step is None:
            loss = F.cross_entropy(model(x), y)
            model = opt.step(model, loss.backward())
        else:
            model, output, loss = step.step(model, opt, F.cross_entropy, x, y)
            assert output.shape == (x.shape[0], 3) and output.backend is home
        losses.append(loss.item())
    return {k: v.numpy() for k, v in model.state_dict().items()}, losses


def assert_same_training(got, want):
    (gw, gl), (ww, wl) = got, want
    np.testing.assert_allclose(gl, wl, rtol=1e-5, atol=1e-6)
    for k in ww:
        np.testing.assert_allclose(gw[k], ww[k], rtol=1e-4, atol=1e-5, err_msg=k)
    assert not np.allclose(gw["a.weight"], train([], None)[0]["a.weight"])  # it did train


def test_shard_sizes_cover_the_batch_evenly():
    assert shard_sizes(8, 2) == [4, 4] and shard_sizes(7, 3) == [3, 2, 2] and shard_sizes(1, 2) == [1, 0]


@pytest.mark.parametrize("devices", [
    lambda: [cn.Autodiff(cn.NumPy()), cn.Autodiff(cn.NumPy())],
    lambda: [cn.Autodiff(cn.NumPy()), cn.Autodiff(cn.Python())],
    lambda: [cn.Autodiff(cn.Python()), cn.Autodiff(cn.NumPy()), cn.Autodiff(cn.NumPy())],
    lambda: [cn.Autodiff(cn.Python()), cn.Autodiff(cn.Python())],  # the model's own device computes nothing
], ids=["numpy+numpy", "numpy+python", "python+numpy+numpy", "python+python"])
def test_two_devices_train_like_one(devices):
    data = batches(6, 16)
    assert_same_training(train(data, devices()), train(data))


def test_uneven_shards_are_weighted_by_size():
    # 7 rows over 2 devices (4 + 3), and a last batch of 1 row (the second device idles).
    data = batches(4, 7) + batches(1, 1, seed=5)
    devices = [cn.Autodiff(cn.NumPy()), cn.Autodiff(cn.Python())]
    assert_same_training(train(data, devices, cn.optim.SGD(0.1)), train(data, None, cn.optim.SGD(0.1)))


def test_the_devices_of_a_router():
    router = cn.Router(cn.NumPy(), cn.Python())
    devices = [cn.Autodiff(router), cn.Autodiff(router).device(1)]
    data = batches(4, 10)
    assert_same_training(train(data, devices), train(data))


def test_two_wgpu_devices_train_like_one():
    # Two wgpu devices of one adapter stand for two GPUs of one model: their adapters describe
    # themselves alike, yet a buffer of one must never reach a kernel of the other (wgpu's
    # "Buffer ... doesn't match Device" GPUValidationError, seen with --adapters 0,1).
    first, second = cn.Wgpu(autotune=False), cn.Wgpu(autotune=False, instance=1)
    assert first.device is not second.device and first != second and cn.Wgpu(autotune=False) == first
    home = cn.Autodiff(first)
    data = batches(4, 10)
    got = train(data, [home, cn.Autodiff(second)], home=home)
    assert_same_training(got, train(data, home=home))
    assert_same_training(got, train(data))  # and the NumPy run's numbers


def test_a_remote_device_trains_like_a_local_one():
    from remote_support import start_server, url_of
    server, token = start_server(cn.Python())
    try:
        devices = [cn.Autodiff(cn.NumPy()), cn.Autodiff(cn.Remote(url_of(server), token=token))]
        data = batches(3, 8)
        assert_same_training(train(data, devices), train(data))
        assert next(iter(server.sessions)).ops > 100  # the second shard really ran there
    finally:
        server.stop()


def wide():
    """Gradients of 5 KB a step: many times what reading the losses costs."""
    return Net(hidden=128, activation=cn.Tensor.relu)


def test_remote_devices_exchange_gradients_between_their_servers():
    from remote_support import start_server, url_of
    servers = [start_server(cn.NumPy()) for _ in range(2)]
    try:
        remotes = [cn.Remote(url_of(server), token=token) for server, token in servers]
        home, other = cn.Autodiff(remotes[0]), cn.Autodiff(remotes[1])
        data = batches(4, 12)

        def fit(devices, home, received=None):
            cn.manual_seed(0)
            model = wide().to(home)
            step, opt = DataParallel(model, devices), cn.optim.Adam(1e-2)
            for i, (x, y) in enumerate(data):
                before = [r.bytes_received for r in remotes]
                model, _, loss = step.step(model, opt, F.cross_entropy, cn.tensor(x, backend=home),
                                           cn.tensor(y, backend=home))
                if received is not None:
                    received.append(sum(r.bytes_received - b for r, b in zip(remotes, before)))
            return {k: v.numpy() for k, v in model.state_dict().items()}, loss.item()

        received = []
        weights, loss = fit([home, other], home, received)
        cn.manual_seed(0)  # the oracle: one local device, no DataParallel
        model, opt = wide().to(HOME), cn.optim.Adam(1e-2)
        for x, y in data:
            want_loss = F.cross_entropy(model(cn.tensor(x, backend=HOME)), cn.tensor(y, backend=HOME))
            model = opt.step(model, want_loss.backward())
        want, want_loss = {k: v.numpy() for k, v in model.state_dict().items()}, want_loss.item()
        assert loss == pytest.approx(want_loss, rel=1e-5)
        for k in want:
            np.testing.assert_allclose(weights[k], want[k], rtol=1e-4, atol=1e-5, err_msg=k)
        gradient_bytes = sum(w.size * 4 for w in want.values())
        assert gradient_bytes > 3000
        # Per step the client reads two losses (a reply header and 4 bytes each), nothing more:
        # the shards, gradients, weights and outputs went from server to server.
        assert len(received) == 4 and max(received) < 400, received
        assert all(max(c.ops for c in s.sessions) > 100 for s, _ in servers)  # both computed
        # Through the host instead (the model here, both shards on the servers), the same
        # gradients come to this machine: the count above is what is saved.
        through_host = []
        fit([cn.Autodiff(remotes[0]), cn.Autodiff(remotes[1])], HOME, through_host)
        assert min(through_host) > gradient_bytes
    finally:
        for server, _ in servers:
            server.stop()


def test_tensors_sent_between_servers_and_their_failures():
    from remote_support import start_server, url_of
    from cinders.remote_peers import Mailbox, Peers
    (a, ta), (b, tb) = start_server(cn.NumPy()), start_server(cn.NumPy())
    try:
        ra, rb = cn.Remote(url_of(a), token=ta), cn.Remote(url_of(b), token=tb)
        x = cn.tensor([[1.0, 2.0, 3.0]], backend=ra)
        i = cn.tensor([[0, 2]], backend=ra)
        hello = ra.bytes_received
        got = ra.send_to([x.handle, i.handle], rb)
        assert [cn.Tensor(rb, h, h.shape, h.dtype).tolist() for h in got] == [[[1.0, 2.0, 3.0]], [[0, 2]]]
        assert ra.bytes_received == hello  # nothing came back from A
        # A value A cannot compute arrives at B as its error, raised when read there.
        bad = x.gather(1, cn.tensor([[7]], backend=ra))
        (h,) = ra.send_to([bad.handle], rb)
        with pytest.raises(cn.IndexingError):
            cn.Tensor(rb, h, h.shape, h.dtype).tolist()
        with pytest.raises(cn.ArgumentError, match="another cn.Remote"):
            ra.send_to([x.handle], cn.NumPy())
        # Servers present the receiver's token like any client, and a wrong one is refused;
        # they send to this machine's servers and to the --peer URLs they were given only.
        with pytest.raises(cn.RemoteError, match="refused"):
            a.peers.deliver(url_of(b), "not-the-token", "k-1", [])
        with pytest.raises(cn.ArgumentError, match="not one of this server's --peer URLs"):
            a.peers.deliver("ws://10.1.2.3:8765", tb, "k-2", [])
        with pytest.raises(cn.ArgumentError, match="ws:// URL"):
            a.peers.deliver("http://127.0.0.1:1/", tb, "k-3", [])
        assert Peers(["ws://10.1.2.3:8765"]).check("ws://10.1.2.3:8765") is None
    finally:
        a.stop()
        b.stop()
    mailbox = Mailbox(1 << 20, timeout=0.05)
    with pytest.raises(cn.RemoteError, match="nothing was delivered"):
        mailbox.take("never-sent")
    mailbox.put("twice", [])
    mailbox.put("twice", [])
    assert mailbox.take("twice") == (None, ("RemoteError", "delivery 'twice' arrived twice"))


def test_devices_must_record_gradients():
    with pytest.raises(cn.ArgumentTypeError, match="does not record gradients"):
        DataParallel(Net().to(HOME), [cn.NumPy()])


def fit_digits(devices, home=HOME):
    """Learner.fit of a small MLP on 192 real digits, two epochs: (history, weights)."""
    digits = MnistDigits("train")
    pick = sorted(random.Random(0).sample(range(len(digits)), 192))
    cn.manual_seed(0)
    model = MnistMLP(hidden=16).to(home)
    loader = DataLoader(Subset(digits, pick), 48, shuffle=True, seed=0, batcher=MnistBatcher(home))
    learner = Learner(model, cn.optim.Adam(3e-3), F.cross_entropy, metrics=[Accuracy(), Loss()],
                      dashboard=None, devices=devices)
    history = learner.fit(loader, epochs=2)
    return history, {k: v.numpy() for k, v in learner.model.state_dict().items()}


def assert_same_fit(got, want):
    (h2, w2), (h1, w1) = got, want
    assert h2[-1]["train_loss"] < h2[0]["train_loss"]
    for a, b in zip(h1, h2):
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-4)
        assert b["train_accuracy"] == a["train_accuracy"]
    for k in w1:
        np.testing.assert_allclose(w2[k], w1[k], rtol=1e-4, atol=1e-5, err_msg=k)


def test_learner_fit_on_two_devices_equals_one_device():
    assert_same_fit(fit_digits([cn.Autodiff(cn.NumPy()), cn.Autodiff(cn.Python())]), fit_digits(None))


def test_learner_fit_on_two_servers_equals_one_device():
    from remote_support import start_server, url_of
    servers = [start_server(cn.NumPy()) for _ in range(2)]
    try:
        remotes = [cn.Remote(url_of(server), token=token) for server, token in servers]
        home = cn.Autodiff(remotes[0])
        before = sum(r.bytes_received for r in remotes)
        got = fit_digits([home, cn.Autodiff(remotes[1])], home)
        # 8 steps of a 51 KB model: besides the weights read once at the end (for the
        # comparison), the client read the losses and the metrics' values only.
        weight_bytes = sum(w.size * 4 for w in got[1].values())
        assert weight_bytes > 50000
        assert sum(r.bytes_received for r in remotes) - before - weight_bytes < 4096
        assert_same_fit(got, fit_digits(None))
    finally:
        for server, _ in servers:
            server.stop()
