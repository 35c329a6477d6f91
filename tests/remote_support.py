"""Backend servers for tests: `cinders serve-backend`'s server started in this process on
127.0.0.1 and a free port, stopped when the test session ends (conftest's pytest_sessionfinish
calls stop_all) or by the fixture that started it."""

import secrets

import cinders as cn
from cinders.remote_server import BackendServer

_servers = {}


def start_server(backend, **limits):
    """A running server of `backend` (bound to 127.0.0.1, free port) and its token."""
    token = secrets.token_hex(16)
    server = BackendServer(backend, token, host="127.0.0.1", port=0, log=lambda line: None, **limits)
    return server.start(), token


def url_of(server):
    return "ws://127.0.0.1:%d" % server.port


def remote(served):
    """A cn.Remote connected to this session's server of `served` ("numpy" or "python")."""
    if served not in _servers:
        server, token = start_server({"numpy": cn.NumPy, "python": cn.Python}[served]())
        _servers[served] = server, token
    server, token = _servers[served]
    return cn.Remote(url_of(server), token=token)


def stop_all():
    """Stop the servers `remote` started."""
    while _servers:
        server, _ = _servers.popitem()[1]
        server.stop()
