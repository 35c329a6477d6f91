"""Issue 10, the demo server: GET/HEAD of the demo files and nothing else. Bad paths get 400
(a %00 used to kill the handler thread with a traceback), idle connections are closed, folders
are never listed, "file/" is not the file, other methods get 405."""

import http.client
import socket
import time

import pytest

from cinders.web.server import DemoServer


@pytest.fixture
def server(tmp_path):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "index.html").write_text("<p>root</p>")
    (tmp_path / "site" / "app.js").write_text("export {};")
    (tmp_path / "site" / "sub").mkdir()
    (tmp_path / "site" / "sub" / "index.html").write_text("<p>sub</p>")
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "x.wasm").write_bytes(b"\0asm")
    (tmp_path / "lib" / "inner").mkdir()
    with DemoServer(port=0, mounts=[("/lib/", str(tmp_path / "lib")), ("/", str(tmp_path / "site"))],
                    idle_timeout=0.5) as s:
        yield s


def request(server, method, path):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        conn.putheader("Host", "127.0.0.1")
        conn.endheaders()
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        conn.close()


@pytest.mark.parametrize("path", ["/app.js%00", "/%00", "/lib/x.wasm%00.txt", "/app%0a.js", "/%ff%fe",
                                  "/lib%5c..%5capp.js", "/app.js%7f", "app.js", "*"])
def test_invalid_paths_get_400(server, path, capfd):
    status, _, _ = request(server, "GET", path)
    assert status == 400, path
    assert request(server, "HEAD", path)[0] == 400
    assert "Traceback" not in capfd.readouterr().err


def test_files_still_served(server):
    assert request(server, "GET", "/app.js")[2] == b"export {};"
    assert request(server, "GET", "/lib/x.wasm?v=1")[2] == b"\0asm"
    status, headers, body = request(server, "HEAD", "/app.js")
    assert status == 200 and body == b"" and headers["Content-Length"] == "10"
    assert request(server, "GET", "/sub/")[2] == b"<p>sub</p>"       # a folder's index.html
    assert request(server, "GET", "/sub")[0] == 301                   # -> /sub/, so links resolve


def test_no_directory_listings(server):
    for path in ("/lib/", "/lib/inner/", "/lib", "/lib/inner"):
        status, _, body = request(server, "GET", path)
        assert status in (301, 404) and b"x.wasm" not in body and b"Directory listing" not in body, path
    assert request(server, "GET", "/lib/inner/")[0] == 404


def test_trailing_slash_on_a_file_is_404(server):
    assert request(server, "GET", "/app.js/")[0] == 404
    assert request(server, "GET", "/lib/x.wasm/")[0] == 404


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE"])
def test_only_get_and_head(server, method):
    status, headers, _ = request(server, method, "/app.js")
    assert status == 405 and headers["Allow"] == "GET, HEAD"


def test_idle_connections_are_closed(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        started = time.monotonic()
        s.settimeout(5)
        assert s.recv(100) == b""       # the server hung up on a connection that said nothing
        assert time.monotonic() - started < 4
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(b"GET /app.js HTTP/1.1\r\nHost: x\r\n")  # headers never finished
        s.settimeout(5)
        assert s.recv(1000) == b""
    assert request(server, "GET", "/app.js")[0] == 200  # and it still serves
