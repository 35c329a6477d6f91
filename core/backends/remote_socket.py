"""cn.Remote's two ways to hold a WebSocket: `websockets` (desktop, blocking reads) and the
browser's own WebSocket under Pyodide (sends never block; frames arrive on the page's event
loop, so reads are awaited: `await t.to_data_async()`). Both carry whole binary frames."""

from ..errors import RemoteError


class DesktopSocket:
    awaits = False  # reads block here

    def __init__(self, url, timeout):
        from websockets.sync.client import connect
        self.url = url
        self.received = 0  # bytes of the frames received (cn.Remote.bytes_received)
        try:
            self._ws = connect(url, compression=None, max_size=None, open_timeout=timeout, legacy=True)
        except Exception as e:  # noqa: BLE001  (OSError, and websockets' handshake errors)
            raise RemoteError("cn.Remote: cannot connect to %s: %s" % (url, e)) from None

    def send(self, frame):
        try:
            self._ws.send(frame)
        except Exception as e:  # noqa: BLE001
            raise RemoteError("cn.Remote: the connection to %s is closed: %s" % (self.url, e)) from None

    def receive(self, timeout):
        try:
            frame = self._ws.recv(timeout=timeout)
        except TimeoutError:
            raise RemoteError("cn.Remote: %s did not answer within %s s" % (self.url, timeout)) from None
        except Exception as e:  # noqa: BLE001  (closed connections)
            raise RemoteError("cn.Remote: the connection to %s is closed: %s" % (self.url, e)) from None
        self.received += len(frame)
        return frame

    async def receive_async(self, timeout):
        return self.receive(timeout)

    def close(self):
        self._ws.close()


class BrowserSocket:
    awaits = True  # the page cannot block: reads are awaited

    @classmethod
    async def open(cls, url, timeout):
        import asyncio
        import js
        from pyodide.ffi import create_proxy
        self = cls()
        self.url = url
        self.received = 0
        self._frames = asyncio.Queue()  # getters are served in order: each read gets its reply
        opened = asyncio.get_event_loop().create_future()

        def on_open(event):
            if not opened.done():
                opened.set_result(None)

        def on_error(event):
            if not opened.done():
                opened.set_exception(RemoteError("cn.Remote: cannot connect to %s" % (url,)))

        def on_message(event):
            self._frames.put_nowait(js.Uint8Array.new(event.data).to_bytes())

        def on_close(event):
            self._frames.put_nowait(None)

        self._ws = js.WebSocket.new(url)
        self._ws.binaryType = "arraybuffer"
        # The page's WebSocket calls these until it closes: proxies that live as long as it.
        self._handlers = [create_proxy(f) for f in (on_open, on_error, on_message, on_close)]
        self._ws.onopen, self._ws.onerror, self._ws.onmessage, self._ws.onclose = self._handlers
        try:
            await asyncio.wait_for(opened, timeout)
        except asyncio.TimeoutError:
            raise RemoteError("cn.Remote: %s did not open within %s s" % (url, timeout)) from None
        return self

    def send(self, frame):
        import js
        data = js.Uint8Array.new(len(frame))
        data.assign(frame)
        self._ws.send(data)

    async def receive_async(self, timeout):
        import asyncio
        try:
            frame = await asyncio.wait_for(self._frames.get(), timeout)
        except asyncio.TimeoutError:
            raise RemoteError("cn.Remote: %s did not answer within %s s" % (self.url, timeout)) from None
        if frame is None:
            raise RemoteError("cn.Remote: the connection to %s is closed" % (self.url,))
        self.received += len(frame)
        return frame

    def close(self):
        self._ws.close()
