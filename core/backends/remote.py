"""cn.Remote(url, token=): a backend whose primitives run on a server (`cinders serve-backend`).

    remote = cn.Remote("ws://127.0.0.1:8765", token="...")   # or CINDERS_REMOTE_TOKEN
    x = cn.tensor(data, backend=remote)
    y = (x @ x.T).softmax(axis=-1)        # sent, not waited for
    y.tolist()                            # the one round trip
    # in a page (Pyodide): remote = await cn.Remote.open(url, token=...); await y.to_data_async()

Only the backend protocol's primitives cross the wire, as data (core/backends/remote_wire.py:
JSON headers, raw little-endian buffers): composites, Autodiff (`cn.Autodiff(cn.Remote(...))`)
and user kernels (their reference in primitives) run here and send primitives. Ops are
pipelined: each returns a handle at once (the client knows its shape and dtype), and queued ops
go out in batches when a value is read, `synchronize()` is called, or the batch is large.
Handles the client drops are freed on the server with the next batch; a disconnect frees
everything the client held. `cn.capture(fn)` records the ops fn sends and, once two calls
sent the same ones, defines them as a program on the server: a replay is one message (the
server runs the ops, checked like any others), with no Python per op here.
"""

import collections
import itertools
import os
import secrets
import sys
import threading
import weakref

from .. import dtypes
from ..backend import Backend, SIGNATURES, split_call
from ..errors import ArgumentError, RemoteError, SizeLimitError
from .remote_socket import BrowserSocket, DesktopSocket
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
    records_ops = True  # cn.capture records the op stream and replays it on the server
    sends_to_peers = True  # send_to(handles, other Remote): server to server (core/backend.py)

    def __init__(self, url, token=None, timeout=30.0):
        if sys.platform == "emscripten":
            raise RemoteError("cn.Remote in the browser: `remote = await cn.Remote.open(url, token=...)` "
                              "(the page's WebSocket opens asynchronously)")
        token = self._token_for(url, token)   # before connecting: a server never sees a client without one
        self._start(url, token, timeout, DesktopSocket(url, timeout))
        self._accept(self._receive())

    @classmethod
    async def open(cls, url, token=None, timeout=30.0):
        """cn.Remote(url, token=) where connecting is awaited: in the browser (Pyodide, on the
        page's own WebSocket; read values with `await t.to_data_async()`); elsewhere the same
        as the constructor."""
        if sys.platform != "emscripten":
            return cls(url, token, timeout)
        remote = cls.__new__(cls)
        token = cls._token_for(url, token)
        remote._start(url, token, timeout, await BrowserSocket.open(url, timeout))
        remote._accept(await remote._receive_async())
        return remote

    @staticmethod
    def _token_for(url, token):
        """token, else $CINDERS_REMOTE_TOKEN; ArgumentError without either."""
        token = token if token is not None else os.environ.get("CINDERS_REMOTE_TOKEN")
        if not token:
            raise ArgumentError("cn.Remote(%r): give the server's token (token= or CINDERS_REMOTE_TOKEN)" % (url,))
        return token

    def _start(self, url, token, timeout, socket):
        self.url, self.timeout, self._socket, self._token = url, timeout, socket, token
        self._key = ("Remote", url, next(_connections))
        self._lock = threading.Lock()
        self._next_id = 0
        self._ops, self._buffers, self._buffered = [], [], 0
        self._freed = collections.deque()  # ids of dropped handles, freed with the next batch
        self._recording = None             # cn.capture: [(op, buffer, input handles)] being recorded
        self._programs = itertools.count(1)
        # Transfer keys (send_to): unguessable by other clients of the receiving server.
        self._transfers = ("%s-%%d" % secrets.token_hex(16), itertools.count())
        weakref.finalize(self, socket.close)
        socket.send(pack({"hello": 1, "token": token}))

    def _accept(self, reply):
        if "limits" not in reply:
            raise RemoteError("cn.Remote: %s refused the connection: %s" % (self.url, reply))
        self.limits = reply["limits"]

    def device_key(self):
        return self._key

    def __repr__(self):
        return "cn.Remote(%r)" % (self.url,)

    def shape(self, h):
        return h.shape

    def dtype(self, h):
        return h.dtype

    @property
    def bytes_received(self):
        """Bytes this client has received from its server so far (replies to reads)."""
        return self._socket.received

    def close(self):
        """Disconnect (the server frees everything this client held)."""
        self._socket.close()

    # -- the wire ------------------------------------------------------------------------------

    def _receive(self):
        return self._header(self._socket.receive(self.timeout))

    async def _receive_async(self):
        return self._header(await self._socket.receive_async(self.timeout))

    def _header(self, frame):
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
        self._socket.send(frame)

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
            if self._recording is not None:
                self._recording.append((op, buffer, handles))
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
        if self._socket.awaits:
            raise RemoteError("cn.Remote in the browser: read with `await t.to_data_async()` (a page "
                              "cannot wait for the network without awaiting)")
        with self._lock:  # one read in flight per thread at a time: its reply is the next frame
            self._send_read(h)
            return self._values(h, self._receive())

    async def to_flat_async(self, h):
        """to_flat, awaiting the reply (the browser's way: `await t.to_data_async()`)."""
        if not self._socket.awaits:
            return self.to_flat(h)
        with self._lock:
            self._send_read(h)
        # Replies come in the order of the reads, and awaiting readers get them in that order.
        return self._values(h, await self._receive_async())

    def _send_read(self, h):
        """Queue a read of h and send the batch (caller holds the lock)."""
        if self._recording is not None:
            from ..capture import reading_while_recording
            raise reading_while_recording()
        self._ops.append({"op": "read", "in": [h.id]})
        self._flush()

    def _values(self, h, reply):
        if reply.get("read") != h.id:
            raise RemoteError("cn.Remote: %s answered %r to a read of tensor %d" % (self.url, reply, h.id))
        if "error" in reply:
            raise ERRORS.get(reply.get("type"), RemoteError)(reply["error"])
        return decode_values(reply["data"], dtypes.from_name(reply["dtype"]))

    # -- tensors sent from this server to another's (core/remote_peers.py) ---------------------

    def send_to(self, handles, target):
        """Handles on `target` (another cn.Remote) holding these handles' values, sent by this
        server to target's server: no bytes come here. Pipelined: the send goes out now (target's
        server waits for it), the take with target's next batch."""
        if not target.sends_to_peers or target == self:
            raise ArgumentError("send_to: %r sends to another cn.Remote, not %r" % (self, target))
        if self._recording is not None or target._recording is not None:
            from ..capture import CaptureError
            raise CaptureError("cn.capture: tensors sent between servers inside fn cannot be replayed")
        key = self._transfers[0] % next(self._transfers[1])
        with self._lock:
            self._queue_frees()
            self._ops.append({"op": "send", "in": [h.id for h in handles], "key": key, "peer": target.url,
                              "token": target._token})
            self._flush()
        with target._lock:
            target._queue_frees()
            outs = []
            for h in handles:
                target._next_id += 1
                outs.append(RemoteHandle(target._next_id, h.shape, h.dtype, target._freed))
            target._ops.append({"op": "take", "key": key, "outs": [h.id for h in outs],
                                "metas": [[list(h.shape), h.dtype.name] for h in handles]})
            if len(target._ops) >= BATCH_OPS:
                target._flush()
        return outs

    # -- cn.capture: a recorded op stream becomes a program the server replays --------------------

    def start_recording(self, inputs):
        self._recording = []
        self._recording_inputs = [h.id for h in inputs]

    def stop_recording(self):
        recording = _Recording(self._recording, self._recording_inputs)
        self._recording = None
        return recording

    def compare_recordings(self, first, second):
        """CaptureError at the first difference between two recordings of one signature."""
        from ..capture import CaptureError
        a, b = first.canonical(), second.canonical()
        if any(x["op"] == "random" for x, _ in b):
            raise CaptureError("cn.capture: fn draws random numbers on %r; a replay on the server would "
                               "draw the same ones every call" % (self,))
        for k, ((x, xb), (y, yb)) in enumerate(zip(a, b)):
            if x == y and xb == yb:
                continue
            if x["op"] == y["op"] and x["args"] == y["args"] and [r[0] for r in x["in"]] == [r[0] for r in y["in"]] \
                    and "s" in [r[0] for r in x["in"]] and x["in"] != y["in"]:
                raise CaptureError("cn.capture: op #%d (%s) reads a tensor that fn replaced between calls "
                                   "(a replay would keep reading the old one)" % (k, x["op"]))
            what = "%s, was %s" % (y["op"], x["op"]) if x["op"] != y["op"] else "%s with other arguments" % y["op"]
            raise CaptureError("cn.capture: the second call of fn sent other ops than the first: op #%d is "
                               "%s (fn's Python must run the same ops with the same constants every call)"
                               % (k, what))
        if len(a) != len(b):
            raise CaptureError("cn.capture: the second call of fn sent other ops than the first: %d ops, "
                               "then %d" % (len(a), len(b)))

    def define_program(self, recording, inputs, outputs):
        """Send the recording as a program (its ops, with the tensors it reads from before the
        call kept alive here) and return what `replay` takes."""
        ops = recording.canonical()
        refs = recording.refs()
        program = RemoteProgram(next(self._programs), len(ops), [(h.shape, h.dtype) for h in outputs],
                                recording.state_handles())
        with self._lock:
            self._queue_frees()
            self._ops.append({"op": "program", "program": program.id, "ops": [op for op, _ in ops],
                              "outputs": [refs(h.id) for h in outputs]})
            for _, buffer in ops:
                if buffer:
                    self._buffers.append(buffer)
            self._flush()
        return program

    def replay(self, program, inputs):
        """The program run on the server for these inputs: handles of its outputs (not waited for)."""
        with self._lock:
            self._queue_frees()
            outs = []
            for shape, dtype in program.outputs:
                self._next_id += 1
                outs.append(RemoteHandle(self._next_id, shape, dtype, self._freed))
            self._ops.append({"op": "replay", "program": program.id, "in": [h.id for h in inputs],
                              "outs": [h.id for h in outs]})
            if len(self._ops) >= BATCH_OPS:
                self._flush()
        return outs


class RemoteProgram:
    """A program on the server: its id, op count, outputs' (shape, dtype), and the handles it
    reads that existed before the recorded call (kept alive, so never freed under it). It lives
    as long as the connection."""

    def __init__(self, id, ops, outputs, state):
        self.id, self.ops, self.outputs, self.state = id, ops, outputs, state


class _Recording:
    """The ops one call of fn sent, seen as a program: each handle it reads is ("w", k) the
    result of its own op k, ("i", k) fn's tensor argument k, or ("s", id) a tensor made before."""

    def __init__(self, entries, inputs):
        self.entries = [e for e in entries if e[0]["op"] != "free"]
        self.inputs = {id: k for k, id in enumerate(inputs)}
        self.made = {op["out"]: k for k, (op, _, _) in enumerate(self.entries)}

    def refs(self):
        def ref(id):
            if id in self.made:
                return ["w", self.made[id]]
            return ["i", self.inputs[id]] if id in self.inputs else ["s", id]
        return ref

    def canonical(self):
        """[(op with references in place of ids, buffer)]: equal for two calls that did the same."""
        ref = self.refs()
        out = []
        for op, buffer, _ in self.entries:
            entry = {"op": op["op"], "in": [ref(i) for i in op["in"]], "args": op["args"]}
            if buffer is not None:
                entry["nbytes"] = len(buffer)
            out.append((entry, buffer))
        return out

    def state_handles(self):
        return [h for _, _, handles in self.entries for h in handles
                if h.id not in self.made and h.id not in self.inputs]


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
