"""Tensors sent from one `cinders serve-backend` server to another, never through the client.

A client holding two cn.Remote connections (servers A and B) moves tensors from A to B with
`remote_a.send_to(handles, remote_b)`: it queues two ops, both plain entries of its op streams
(remote_wire.py):
    to A  {"op": "send", "in": [ID, ...], "key": K, "peer": URL_OF_B, "token": TOKEN_OF_B}
    to B  {"op": "take", "key": K, "outs": [ID, ...], "metas": [[shape, dtype], ...]}
A reads the tensors and delivers them to B over a connection of its own (`Peers`), opened with
B's token like any client's (`{"hello": 1, "token": ...}`, checked in constant time) and kept
for later deliveries; on it, one frame per send:
    A -> B  {"deliver": K, "tensors": [{"shape": [...], "dtype": NAME, "nbytes": N}, ...]} + buffers
            or {"deliver": K, "error": [TYPE, MESSAGE]} when A could not compute them.
A sends only to servers of its own machine (ws://127.0.0.1, localhost, [::1]) and to the URLs
it was started with (`serve-backend --peer URL`): a client cannot point it at other hosts.
B keeps a delivery in its `Mailbox` until the take with the same key claims it (waiting for
it, at most TAKE_TIMEOUT seconds) and gives the tensors to the client's session as the take's
outputs. K is the client's: a random nonce and a counter, so no other client can guess it.
Neither server answers these frames, so nothing comes back to the client: its handles already
have their shapes, and a failure (no delivery in time, other shapes than the take expects)
makes the outputs error values, raised when the client reads one.
"""

import threading
import time

from .backends.remote_wire import decode_values, encode_values, nbytes, pack
from .errors import ArgumentError, RemoteError, WireError
from . import dtypes

TAKE_TIMEOUT = 60.0   # seconds a take waits for its delivery
MAX_KEY = 128         # characters of a transfer key
MAX_WAITING = 1024    # deliveries not yet taken, per server


class Mailbox:
    """Deliveries from other servers waiting for their take: key -> (values, error)."""

    def __init__(self, max_bytes, timeout=TAKE_TIMEOUT):
        self.max_bytes = max_bytes
        self.timeout = timeout  # seconds a take waits for its delivery
        self.bytes = 0
        self._waiting = {}  # key -> (arrived at, [(handle, shape, dtype, nbytes)] or None, error)
        self._changed = threading.Condition()

    def put(self, key, values, error=None):
        size = sum(v[3] for v in values or ())
        with self._changed:
            self._drop_stale()
            if key in self._waiting:
                # A key sent twice (a client's mistake) fails its take; the connection it came
                # on carries other clients' deliveries too, so it stays open.
                _, old, _ = self._waiting.pop(key)
                self.bytes -= sum(v[3] for v in old or ())
                values, size, error = None, 0, ("RemoteError", "delivery %r arrived twice" % (key,))
            elif self.bytes + size > self.max_bytes or len(self._waiting) >= MAX_WAITING:
                values, size = None, 0
                error = ("SizeLimitError", "a delivery from another server would hold more than the "
                         "server's %d bytes of deliveries not yet taken" % self.max_bytes)
            self._waiting[key] = (time.monotonic(), values, error)
            self.bytes += size
            self._changed.notify_all()

    def take(self, key):
        """(values, error) delivered under key, waiting for it; RemoteError when none comes."""
        timeout = self.timeout
        deadline = time.monotonic() + timeout
        with self._changed:
            while key not in self._waiting:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RemoteError("take %r: nothing was delivered from the other server within %g s (its log says why)"
                                      % (key, timeout))
                self._changed.wait(left)
            _, values, error = self._waiting.pop(key)
            self.bytes -= sum(v[3] for v in values or ())
        return values, error

    def _drop_stale(self):
        """Forget deliveries no take claimed in twice the time a take waits (caller holds the lock)."""
        old = time.monotonic() - 2 * self.timeout
        for key in [k for k, (t, _, _) in self._waiting.items() if t < old]:
            _, values, _ = self._waiting.pop(key)
            self.bytes -= sum(v[3] for v in values or ())


def check_key(key):
    if not isinstance(key, str) or not 0 < len(key) <= MAX_KEY:
        raise WireError("a transfer key is a string of 1..%d characters, got %r" % (MAX_KEY, key))
    return key


def delivery(header, data, backend, lock):
    """[(handle, shape, dtype, nbytes)] made on `backend` from a deliver frame (or None) and the
    error it carries (or None)."""
    error = header.get("error")
    if error is not None:
        if not (isinstance(error, list) and len(error) == 2 and all(isinstance(s, str) for s in error)):
            raise WireError("a failed delivery carries \"error\": [TYPE, MESSAGE]")
        return None, (error[0][:64], error[1][:1000])
    tensors = header.get("tensors")
    if not isinstance(tensors, list):
        raise WireError("a delivery carries \"tensors\": [{\"shape\", \"dtype\", \"nbytes\"}, ...]")
    values, offset = [], 0
    for t in tensors:
        shape, name = t.get("shape") if isinstance(t, dict) else None, t.get("dtype") if isinstance(t, dict) else None
        if not (isinstance(shape, list) and len(shape) <= 16 and all(
                isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)) \
                or name not in ("float32", "int32", "bool"):
            raise WireError("a delivered tensor is {\"shape\": [ints], \"dtype\": float32|int32|bool}")
        dtype, shape = dtypes.from_name(name), tuple(shape)
        size = nbytes(shape, dtype)
        if offset + size > len(data):
            raise WireError("delivered tensors overrun the frame's buffers")
        with lock:
            handle = backend.from_flat(decode_values(data[offset:offset + size], dtype), shape, dtype)
        values.append((handle, shape, dtype, size))
        offset += size
    return values, None


LOOPBACK = ("127.0.0.1", "localhost", "::1")


class Peers:
    """This server's connections to other servers, one per URL, opened on first use; `allowed`:
    the URLs of servers on other machines it may send to (loopback ones always)."""

    def __init__(self, allowed=(), timeout=30.0):
        self.allowed = frozenset(allowed)
        self.timeout = timeout
        self._connections = {}  # (url, token) -> [lock, websocket or None]
        self._lock = threading.Lock()

    def deliver(self, url, token, key, values, error=None):
        """Send one delivery (values: [(flat list, shape, dtype)]) to the server at url."""
        self.check(url)
        if error is not None:
            frame = pack({"deliver": key, "error": list(error)})
        else:
            raws = [encode_values(flat, dtype) for flat, _, dtype in values]
            frame = pack({"deliver": key, "tensors": [{"shape": list(shape), "dtype": dtype.name, "nbytes": len(raw)}
                                                      for (_, shape, dtype), raw in zip(values, raws)]}, raws)
        with self._lock:
            entry = self._connections.setdefault((url, token), [threading.Lock(), None])
        with entry[0]:  # one frame at a time per connection; a slow peer holds up only its own sends
            try:
                if entry[1] is None:
                    entry[1] = self._open(url, token)
                entry[1].send(frame)
            except Exception:  # noqa: BLE001  (refused, or gone: forgotten; the take there times out)
                entry[1] = None
                with self._lock:
                    self._connections.pop((url, token), None)
                raise

    def check(self, url):
        """ArgumentError unless url is a ws:// URL of this machine or one of `allowed`."""
        from urllib.parse import urlsplit
        try:
            parts = urlsplit(url)
            host = parts.hostname
        except ValueError:
            parts, host = None, None
        if parts is None or parts.scheme not in ("ws", "wss") or len(url) > 1000:
            raise ArgumentError("send: the peer is a ws:// URL, got %r" % (url[:100],))
        if host not in LOOPBACK and url not in self.allowed:
            raise ArgumentError("send: %s is not this machine's and not one of this server's --peer URLs"
                                % (url,))

    def _open(self, url, token):
        from websockets.sync.client import connect
        from .backends.remote_wire import unpack
        ws = connect(url, compression=None, max_size=None, open_timeout=self.timeout, legacy=True)
        ws.send(pack({"hello": 1, "token": token}))
        reply, _ = unpack(ws.recv(timeout=self.timeout))
        if "limits" not in reply:
            ws.close()
            raise RemoteError("send: %s refused this server: %s" % (url, reply.get("fatal", reply)))
        return ws

    def close(self):
        with self._lock:
            for _, ws in self._connections.values():
                if ws is not None:
                    ws.close()
            self._connections.clear()
