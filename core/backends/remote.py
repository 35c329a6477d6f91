"""cn.Remote(url, token=): a backend whose primitives run on a server (`cinders serve-backend`).

    remote = cn.Remote("ws://127.0.0.1:8765", token="...")   # or CINDERS_REMOTE_TOKEN
    x = cn.tensor(data, backend=remote)
    y = (x @ x.T).softmax(axis=-1)        # sent, not waited for
    y.tolist()                            # the one round trip

Only the backend protocol's primitives cross the wire, as data (core/backends/remote_wire.py:
JSON headers, raw little-endian buffers): composites, Autodiff (`cn.Autodiff(cn.Remote(...))`)
and user kernels (their reference in primitives) run here and send primitives. Ops are
pipelined: each returns a handle at once (the client knows its shape and dtype), and queued ops
go out in batches when a value is read, `synchronize()` is called, or the batch is large.
Handles the client drops are freed on the server with the next batch; a disconnect frees
everything the client held. `cn.capture` of a Remote forward is refused (CaptureError): a
recording replays GPU launches, and a Remote has none here to record.
"""

import collections
import itertools
import os
import threading
import weakref

from .. import dtypes
from ..backend import Backend, SIGNATURES, split_call
from ..errors import ArgumentError, RemoteError, SizeLimitError
from .remote_wire import (ERRORS, encode_values, decode_values, nbytes, pack, unpack,
                          result_meta, to_json)

BATCH_OPS = 256            # queued ops sent in one frame at the latest
BATCH_BYTES = 4 << 20      # ... or once their buffers reach this size
_connections = itertools.count()  # each Remote is its own session: its handles are its own


class RemoteHandle:
    """A tensor on the server: its id there, shape and dtype. Dropping it frees it there."""

    __slots__ = ("id", "shape", "dtype", "_freed", "__weakref__")

    def __init__(self, id, shape, dtype, freed):
        self.id, self.shape, self.dtype, self._freed = id, shape, dtype, freed

    def __del__(self):
        self._freed.append(self.id)  # deque.append is atomic: safe from any thread or the GC


class Remote(Backend):
    """A backend on a `cinders serve-backend` server, over a WebSocket (see the module docstring).

    url: ws://host:port; token: the server's token (default: $CINDERS_REMOTE_TOKEN);
    timeout: seconds to wait for the connection and for each read."""

    name = "remote"
    capture_refused = ("its ops run on a server, one message per batch; a recording replays GPU "
                       "kernel launches, and the server's are not recorded from here (run fn uncaptured)")

    def __init__(self, url, token=None, timeout=30.0):
        from websockets.sync.client import connect
        token = token if token is not None else os.environ.get("CINDERS_REMOTE_TOKEN")
        if not token:
            raise ArgumentError("cn.Remote(%r): give the server's token (token= or CINDERS_REMOTE_TOKEN)" % (url,))
        self.url, self.timeout = url, timeout
        self._key = ("Remote", url, next(_connections))
        try:
            self._ws = connect(url, compression=None, max_size=None, open_timeout=timeout, legacy=True)
        except Exception as e:  # noqa: BLE001  (OSError, and websockets' handshake errors)
            raise RemoteError("cn.Remote: cannot connect to %s: %s" % (url, e)) from None
        self._ws.send(pack({"hello": 1, "token": token}))
        reply = self._receive()
        if "limits" not in reply:
            raise RemoteError("cn.Remote: %s refused the connection: %s" % (url, reply.get("fatal", reply)))
        self.limits = reply["limits"]
        self._lock = threading.Lock()
        self._next_id = 0
        self._ops, self._buffers, self._buffered = [], [], 0
        self._freed = collections.deque()  # ids of dropped handles, freed with the next batch
        weakref.finalize(self, self._ws.close)

    def device_key(self):
        return self._key

    def __repr__(self):
        return "cn.Remote(%r)" % (self.url,)

    def shape(self, h):
        return h.shape

    def dtype(self, h):
        return h.dtype

    def close(self):
        """Disconnect (the server frees everything this client held)."""
        self._ws.close()

    # -- the wire ------------------------------------------------------------------------------

    def _receive(self):
        try:
            frame = self._ws.recv(timeout=self.timeout)
        except TimeoutError:
            raise RemoteError("cn.Remote: %s did not answer within %s s" % (self.url, self.timeout)) from None
        except Exception as e:  # noqa: BLE001  (closed connections)
            raise RemoteError("cn.Remote: the connection to %s is closed: %s" % (self.url, e)) from None
        header, data = unpack(frame)
        if "fatal" in header:
            raise RemoteError("cn.Remote: %s closed the connection: %s" % (self.url, header["fatal"]))
        header["data"] = data
        return header

    def _queue_frees(self):
        """Queue a free of the handles dropped so far, here in the op stream: no later op can
        read them, and the server gets their memory back before running the next ones."""
        freed = []
        while self._freed:  # popleft is atomic: a handle dropped meanwhile goes next time
            freed.append(self._freed.popleft())
        if freed:
            self._ops.append({"op": "free", "in": freed})

    def _flush(self):
        """Send the queued ops (caller holds the lock)."""
        self._queue_frees()
        if not self._ops:
            return
        frame = pack({"ops": self._ops}, self._buffers)
        self._ops, self._buffers, self._buffered = [], [], 0
        try:
            self._ws.send(frame)
        except Exception as e:  # noqa: BLE001
            raise RemoteError("cn.Remote: the connection to %s is closed: %s" % (self.url, e)) from None

    def _op(self, primitive, handles, args, buffer=None):
        shape, dtype = result_meta(primitive, args, [(h.shape, h.dtype) for h in handles])
        size = nbytes(shape, dtype)
        if size // dtype.itemsize > self.limits["max_elements"]:
            raise SizeLimitError("cn.Remote %s: a result of shape %s has more than the %d elements %s "
                                 "allows per tensor" % (primitive, shape, self.limits["max_elements"], self.url))
        with self._lock:
            self._queue_frees()
            self._next_id += 1
            op = {"op": primitive, "out": self._next_id, "in": [h.id for h in handles],
                  "args": to_json(primitive, args)}
            if buffer is not None:
                op["nbytes"] = len(buffer)
                self._buffers.append(buffer)
                self._buffered += len(buffer)
            self._ops.append(op)
            handle = RemoteHandle(self._next_id, tuple(shape), dtype, self._freed)
            if len(self._ops) >= BATCH_OPS or self._buffered >= BATCH_BYTES:
                self._flush()
        return handle

    def synchronize(self):
        """Send what is queued (the server computes it in order)."""
        with self._lock:
            self._flush()

    # -- the primitives -------------------------------------------------------------------------

    def from_flat(self, values, shape, dtype):
        return self._op("from_flat", [], [tuple(shape), dtype], encode_values(values, dtype))

    def to_flat(self, h):
        with self._lock:
            self._ops.append({"op": "read", "in": [h.id]})
            self._flush()
            reply = self._receive()
        if reply.get("read") != h.id:
            raise RemoteError("cn.Remote: %s answered %r to a read of tensor %d" % (self.url, reply, h.id))
        if "error" in reply:
            raise ERRORS.get(reply.get("type"), RemoteError)(reply["error"])
        return decode_values(reply["data"], dtypes.from_name(reply["dtype"]))


def _primitive(name):
    def method(self, *call):
        handles, args = split_call(name, call)
        return self._op(name, handles, args)
    method.__name__ = name
    method.__doc__ = "The %s primitive, sent to the server." % name
    return method


for _name in SIGNATURES:
    if _name not in ("from_flat", "to_flat"):
        setattr(Remote, _name, _primitive(_name))
