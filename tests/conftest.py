"""Shared pytest fixtures. `backend` runs a test once per backend of tests/backends.py."""

import os
import sys
import traceback

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # so tests can `import backends`

import backends as backend_registry  # noqa: E402

_made = {}


@pytest.fixture(scope="session", params=backend_registry.selected_names())
def backend_name(request):
    return request.param


@pytest.fixture(scope="session")
def backend(backend_name):
    """A backend instance (one per session); a factory that raises fails every test using it."""
    if backend_name not in _made:
        try:
            _made[backend_name] = backend_registry.BACKENDS[backend_name]()
        except Exception:  # noqa: BLE001  (any failure to build the backend is a test failure)
            _made[backend_name] = traceback.format_exc()
    made = _made[backend_name]
    if isinstance(made, str):
        pytest.fail("backend %r could not be created:\n%s" % (backend_name, made), pytrace=False)
    return made


def pytest_sessionfinish(session, exitstatus):
    import remote_support
    remote_support.stop_all()  # the cn.Remote rows' servers (tests/backends.py)
