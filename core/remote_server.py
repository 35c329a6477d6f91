"""`cinders serve-backend`: a backend served over WebSocket to cn.Remote clients.

    cinders serve-backend --backend numpy --port 8765 --token SECRET     # 127.0.0.1 only

What it trusts: nothing a client sends is code. Each frame is parsed as data (remote_wire.py);
every op's arguments are checked (`from_json`, `result_meta`) before the backend sees them;
every result is checked against the limits before it is computed: `max_elements` per tensor
and `max_bytes` held per client (SizeLimitError on the client when it reads that value).
An op that fails makes an error value (the client sees it when it reads); a frame that is not
the wire format, a handle id that does not exist, or a missing/wrong token closes that one
connection. Clients never see each other's handles; a client that disconnects, cleanly or
not, has everything it held freed. The token is compared in constant time (hmac); one log line
per client when it leaves (or is refused): address, ops, reads, peak bytes, why it ended.
Backend calls are serialised by one lock: one device, several clients.
Servers send tensors to each other when a client asks (remote_peers.py: "send" and "take"
ops, "deliver" frames between servers, token-checked like any client).
"""

import hmac
import sys
import threading
import time

from .backend import SIGNATURES, join_call
from .backends.remote_wire import (decode_values, encode_values, from_json, nbytes, pack, result_meta,
                                   unpack)
from .errors import ArgumentError, RemoteError, SizeLimitError, WireError
from .remote_peers import Mailbox, Peers, check_key, delivery

DEFAULT_MAX_ELEMENTS = 1 << 26     # 256 MiB of float32 per tensor
DEFAULT_MAX_BYTES = 1 << 30        # held per client
HELLO_TIMEOUT = 10.0
MAX_PROGRAMS = 64          # captured programs one client may define
MAX_PROGRAM_OPS = 1 << 16


class _Value:
    __slots__ = ("handle", "shape", "dtype", "nbytes", "error")

    def __init__(self, handle, shape, dtype, size, error=None):
        self.handle, self.shape, self.dtype, self.nbytes, self.error = handle, shape, dtype, size, error


class Session:
    """One client's handles and counters."""

    def __init__(self, server, peer):
        self.server, self.peer = server, peer
        self.values = {}
        self.programs = {}  # id -> (steps, output references, number of inputs)
        self.bytes = self.peak = 0
        self.ops = self.reads = 0

    def _store(self, out, value):
        if not isinstance(out, int) or isinstance(out, bool) or out in self.values:
            raise WireError("op output %r is not a new handle id" % (out,))
        self.values[out] = value
        self.bytes += value.nbytes
        self.peak = max(self.peak, self.bytes)

    def free(self, ids):
        for i in ids:
            value = self.values.pop(i, None) if isinstance(i, int) else None
            if value is not None:
                self.bytes -= value.nbytes

    def frame(self, header, data):
        """Run one frame's ops; returns the reply frames (one per read)."""
        if "deliver" in header:  # another server's tensors, for a take of some client
            values, error = delivery(header, data, self.server.backend, self.server.lock)
            self.server.mailbox.put(check_key(header["deliver"]), values, error)
            return []
        ops = header.get("ops")
        if not isinstance(ops, list):
            raise WireError("a frame after hello carries {\"ops\": [...]}")
        replies, offset = [], 0
        for op in ops:
            if not isinstance(op, dict) or not isinstance(op.get("in", []), list):
                raise WireError("an op is {\"op\", \"out\", \"in\", \"args\"}")
            if op.get("op") == "free":
                self.free(op["in"])
                continue
            if op.get("op") == "program":
                offset = self._define(op, data, offset)
                continue
            if op.get("op") == "replay":
                self._replay(op)
                continue
            if op.get("op") == "take":
                self._take(op)
                continue
            inputs = []
            for i in op.get("in", []):
                if not isinstance(i, int) or i not in self.values:
                    raise WireError("op %r reads handle %r, which this client does not hold" % (op.get("op"), i))
                inputs.append(self.values[i])
            if op.get("op") == "send":
                self._send(op, inputs)
                continue
            if op.get("op") == "read":
                if len(inputs) != 1:
                    raise WireError("read takes one handle")
                replies.append(self._read(op["in"][0], inputs[0]))
                continue
            size = op.get("nbytes", 0)
            if not isinstance(size, int) or size < 0 or offset + size > len(data):
                raise WireError("op %r: nbytes %r overruns the frame's buffers" % (op.get("op"), size))
            buffer = data[offset:offset + size]
            offset += size
            self._store(op.get("out"), self._run(op.get("op"), op.get("args"), inputs, buffer))
            self.ops += 1
        return replies

    # -- programs (cn.capture): a recorded op stream, run again for new inputs -----------------

    def _define(self, op, data, offset):
        """Store a program: its ops (references instead of ids: ("w", k) the result of its op
        k, ("i", k) input k, ("s", id) a tensor this client holds) and their buffers."""
        pid, ops, outputs = op.get("program"), op.get("ops"), op.get("outputs")
        if not isinstance(pid, int) or pid in self.programs or len(self.programs) >= MAX_PROGRAMS:
            raise WireError("program id %r is not new (or more than %d programs)" % (pid, MAX_PROGRAMS))
        if not isinstance(ops, list) or not isinstance(outputs, list) or len(ops) > MAX_PROGRAM_OPS:
            raise WireError("a program is {\"ops\": [...], \"outputs\": [...]}, at most %d ops" % MAX_PROGRAM_OPS)
        steps, inputs = [], 0
        for k, entry in enumerate(ops + [{"op": "outputs", "in": outputs}]):
            if not isinstance(entry, dict) or not isinstance(entry.get("in"), list):
                raise WireError("program op #%d is not {\"op\", \"in\", \"args\"}" % k)
            for ref in entry["in"]:
                if not (isinstance(ref, list) and len(ref) == 2 and ref[0] in ("w", "i", "s")
                        and isinstance(ref[1], int) and not isinstance(ref[1], bool)
                        and (0 <= ref[1] < k if ref[0] == "w" else 0 <= ref[1] < 1024 if ref[0] == "i"
                             else ref[1] in self.values)):
                    raise WireError("program op #%d reads %r, which is not an earlier op, an input or "
                                    "a tensor this client holds" % (k, ref))
                if ref[0] == "i":
                    inputs = max(inputs, ref[1] + 1)
            size = entry.get("nbytes", 0)
            if not isinstance(size, int) or size < 0 or offset + size > len(data):
                raise WireError("program op #%d: nbytes %r overruns the frame's buffers" % (k, size))
            steps.append((entry.get("op"), entry.get("args"), entry["in"], bytes(data[offset:offset + size])))
            offset += size
        self.programs[pid] = (steps[:-1], outputs, inputs)
        self.bytes += sum(len(step[3]) for step in steps)
        return offset

    def _replay(self, op):
        program = self.programs.get(op.get("program"))
        ins, outs = op.get("in"), op.get("outs")
        if program is None or not isinstance(ins, list) or not isinstance(outs, list):
            raise WireError("replay names no program of this client")
        steps, outputs, inputs = program
        if len(ins) < inputs or len(outs) != len(outputs) or any(i not in self.values for i in ins):
            raise WireError("replay: %d inputs held, %d outputs (the program takes %d and makes %d)"
                            % (len(ins), len(outs), inputs, len(outputs)))
        made = []
        missing = _Value(None, (), None, 0, ("ArgumentError", "replay: a tensor the program reads was freed"))

        def value(ref):
            kind, k = ref
            return made[k] if kind == "w" else self.values[ins[k]] if kind == "i" else self.values.get(k, missing)

        try:
            for primitive, args, refs, buffer in steps:
                made.append(self._run(primitive, args, [value(r) for r in refs], memoryview(buffer)))
                self.bytes += made[-1].nbytes
                self.peak = max(self.peak, self.bytes)
            self.ops += len(steps)
        finally:
            self.bytes -= sum(v.nbytes for v in made)
        for ref, out in zip(outputs, outs):
            v = value(ref)
            self._store(out, _Value(v.handle, v.shape, v.dtype, v.nbytes, v.error))

    # -- tensors sent to another server, and taken from one (remote_peers.py) ------------------

    def _send(self, op, inputs):
        """Deliver the inputs' values to the server op["peer"] under op["key"]. Nothing is
        answered: if this fails, the take there gets no delivery and its outputs fail."""
        key, url, token = check_key(op.get("key")), op.get("peer"), op.get("token")
        if not isinstance(url, str) or not isinstance(token, str):
            raise WireError("send names a \"peer\" URL and its \"token\"")
        failed = next((v.error for v in inputs if v.error is not None), None)
        try:
            values = []
            if failed is None:
                with self.server.lock:
                    values = [(self.server.backend.to_flat(v.handle), v.shape, v.dtype) for v in inputs]
            self.server.peers.deliver(url, token, key, values, failed)
        except Exception as e:  # noqa: BLE001  (a device error, or the peer is unreachable)
            self.server.log("serve-backend: %s: send to %s failed: %s" % (self.peer, url, e))
        self.ops += 1

    def _take(self, op):
        """The outputs op["outs"] are the tensors delivered under op["key"], once they arrive."""
        key, outs, metas = check_key(op.get("key")), op.get("outs"), op.get("metas")
        if not isinstance(outs, list) or not isinstance(metas, list) or len(outs) != len(metas):
            raise WireError("take is {\"key\", \"outs\": [ID], \"metas\": [[shape, dtype]]}")
        try:
            values, error = self.server.mailbox.take(key)
        except RemoteError as e:
            values, error = None, ("RemoteError", str(e))
        if error is None and [[list(v[1]), v[2].name] for v in values] != metas:
            error = ("RemoteError", "take %r: the delivered tensors are %s, not %s"
                     % (key, [[list(v[1]), v[2].name] for v in values], metas))
        if error is None and self.bytes + sum(v[3] for v in values) > self.server.limits["max_bytes"]:
            error = ("SizeLimitError", "take: this client would hold more than the server's %d bytes"
                     % self.server.limits["max_bytes"])
        for k, out in enumerate(outs):
            self._store(out, _Value(None, (), None, 0, error) if error is not None else _Value(*values[k]))
        self.ops += 1

    def _run(self, primitive, args, inputs, buffer):
        """The value of one op, or an error value (never raises for a bad argument)."""
        failed = next((v for v in inputs if v.error is not None), None)
        if failed is not None:
            return _Value(None, (), None, 0, failed.error)
        try:
            if primitive not in SIGNATURES or primitive == "to_flat":
                raise ArgumentError("remote: %r is not a primitive of the backend protocol" % (primitive,))
            args = from_json(primitive, args)
            shape, dtype = result_meta(primitive, args, [(v.shape, v.dtype) for v in inputs])
            size = nbytes(shape, dtype)
            limits = self.server.limits
            if size // dtype.itemsize > limits["max_elements"]:
                raise SizeLimitError("remote %s: a result of shape %s has more than the server's %d "
                                     "elements per tensor" % (primitive, shape, limits["max_elements"]))
            if self.bytes + size > limits["max_bytes"]:
                raise SizeLimitError("remote %s: this client would hold %d bytes, over the server's %d "
                                     "per client (free tensors first)" % (primitive, self.bytes + size,
                                                                         limits["max_bytes"]))
            backend = self.server.backend
            with self.server.lock:
                if primitive == "from_flat":
                    if len(buffer) != size:
                        raise ArgumentError("remote from_flat: %d bytes for shape %s %s (%d expected)"
                                            % (len(buffer), shape, dtype.name, size))
                    handle = backend.from_flat(decode_values(buffer, dtype), shape, dtype)
                else:
                    handle = getattr(backend, primitive)(*join_call(primitive, [v.handle for v in inputs], args))
            return _Value(handle, shape, dtype, size)
        except Exception as e:  # noqa: BLE001  (any failure is this value's, reported on read)
            return _Value(None, (), None, 0, (type(e).__name__, str(e)))

    def _read(self, id, value):
        self.reads += 1
        if value.error is not None:
            kind, message = value.error
            return pack({"read": id, "error": message, "type": kind})
        try:
            with self.server.lock:
                flat = self.server.backend.to_flat(value.handle)
            raw = encode_values(flat, value.dtype)
        except Exception as e:  # noqa: BLE001  (a device error: this value's, not the server's)
            return pack({"read": id, "error": str(e), "type": type(e).__name__})
        return pack({"read": id, "shape": list(value.shape), "dtype": value.dtype.name, "nbytes": len(raw)}, [raw])


class BackendServer:
    """Serves `backend` to cn.Remote clients (see the module docstring). `start()` runs it in a
    thread (returns self; `port` is then the bound port), `serve_forever()` in this one."""

    def __init__(self, backend, token, host="127.0.0.1", port=0, max_elements=DEFAULT_MAX_ELEMENTS,
                 max_bytes=DEFAULT_MAX_BYTES, max_clients=16, log=None, peers=()):
        if not isinstance(token, str) or len(token) < 8:
            raise ArgumentError("serve-backend: a token of at least 8 characters is required "
                                "(--token or CINDERS_REMOTE_TOKEN); clients present it to connect")
        self.backend, self.host = backend, host
        self._token = token.encode()
        self.limits = {"max_elements": int(max_elements), "max_bytes": int(max_bytes)}
        self.max_clients = max_clients
        self.lock = threading.Lock()
        self.mailbox = Mailbox(int(max_bytes))  # tensors other servers sent, until taken
        self.peers = Peers(peers)                # connections to servers this one sends to
        self.sessions = set()
        self._sessions_lock = threading.Lock()
        self.log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        from websockets.sync.server import serve
        # A frame holds at most one client's bytes plus its headers.
        self._server = serve(self._handle, host, port, compression=None,
                             max_size=int(max_bytes) + (16 << 20))
        self.port = self._server.socket.getsockname()[1]
        self._thread = None

    def held_bytes(self):
        """Bytes held by all connected clients together (what a disconnect gives back)."""
        with self._sessions_lock:
            return sum(s.bytes for s in self.sessions)

    def start(self):
        self._thread = threading.Thread(target=self._server.serve_forever, name="cinders-serve-backend",
                                        daemon=True)
        self._thread.start()
        return self

    def serve_forever(self):
        self._server.serve_forever()

    def stop(self):
        self.peers.close()
        self._server.shutdown()
        if self._thread is not None:
            self._thread.join(10)

    # -- one client ---------------------------------------------------------------------------

    def _hello(self, ws):
        """True when the client's first frame carries the token."""
        try:
            header, _ = unpack(ws.recv(timeout=HELLO_TIMEOUT))
        except TimeoutError:
            raise RemoteError("no hello within %d s" % HELLO_TIMEOUT) from None
        token = header.get("token")
        if header.get("hello") != 1 or not isinstance(token, str):
            raise RemoteError("no token: the first frame is {\"hello\": 1, \"token\": ...}")
        if not hmac.compare_digest(token.encode(), self._token):
            raise RemoteError("wrong token")
        with self._sessions_lock:
            if len(self.sessions) >= self.max_clients:
                raise RemoteError("server full (%d clients)" % self.max_clients)

    def _handle(self, ws):
        peer = "%s:%s" % tuple(ws.remote_address[:2])
        started = time.time()
        try:
            self._hello(ws)
        except (RemoteError, WireError) as e:
            self._close(ws, str(e))
            self.log("serve-backend: %s refused: %s" % (peer, e))
            return
        except Exception as e:  # noqa: BLE001  (the socket closed during the handshake)
            self.log("serve-backend: %s refused: %s" % (peer, type(e).__name__))
            return
        session = Session(self, peer)
        with self._sessions_lock:
            self.sessions.add(session)
        why = "disconnected"
        try:
            ws.send(pack({"hello": 1, "limits": self.limits}))
            for frame in ws:
                try:
                    replies = session.frame(*unpack(frame))
                except WireError as e:
                    why = "malformed frame: %s" % (e,)
                    self._close(ws, why)
                    break
                for reply in replies:
                    ws.send(reply)
        except Exception as e:  # noqa: BLE001  (a dropped connection ends this client only)
            why = "dropped (%s)" % (type(e).__name__,)
        finally:
            with self._sessions_lock:
                self.sessions.discard(session)
            session.values.clear()
            session.programs.clear()
            self.log("serve-backend: %s: %d ops, %d reads, peak %d bytes, %.1f s, %s"
                     % (peer, session.ops, session.reads, session.peak, time.time() - started, why))

    @staticmethod
    def _close(ws, why):
        try:
            ws.send(pack({"fatal": why}))
            ws.close(1008, why[:120])
        except Exception:  # noqa: BLE001  (already closed)
            pass


def main(backend_name, port, token, host="127.0.0.1", max_elements=DEFAULT_MAX_ELEMENTS,
         max_bytes=DEFAULT_MAX_BYTES, adapter=None, peers=()):
    """What `cinders serve-backend` runs: serve until interrupted. adapter: the wgpu adapter
    (an index or a description substring; one server per GPU); peers: URLs of servers other
    than this machine's that clients may have this one send tensors to."""
    import cinders as cn
    if adapter is not None and backend_name != "wgpu":
        raise ArgumentError("serve-backend: --adapter picks a GPU of --backend wgpu, not of %s" % backend_name)
    if isinstance(adapter, str) and adapter.isdigit():
        adapter = int(adapter)
    backend = {"numpy": lambda: cn.NumPy(), "python": lambda: cn.Python(),
               "wgpu": lambda: cn.Wgpu(adapter=adapter)}[backend_name]()
    server = BackendServer(backend, token, host, port, max_elements, max_bytes, peers=peers or ())
    print("serving %r on ws://%s:%d (token required)" % (backend, host, server.port), flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0
