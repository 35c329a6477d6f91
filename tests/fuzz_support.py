"""What the in-process fuzz tests share: every case must answer within a time limit, and the
whole run may grow the process by at most a memory cap (peak RSS)."""

import contextlib
import resource
import signal

import pytest


class Hang(BaseException):
    """A case ran past its time limit. A BaseException, so that a case's own
    `except Exception` (which fails on every unexpected error type) lets it through."""


def _alarm(signum, frame):
    raise Hang()


def peak_rss():
    """The most memory this process has held so far (bytes; Linux reports KB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class Bounds:
    """with Bounds(seconds, cap) as bounds: ... with bounds.case(label): <one case>"""

    def __init__(self, case_seconds, memory_cap):
        self.case_seconds, self.memory_cap = case_seconds, memory_cap

    def __enter__(self):
        self._old_handler = signal.signal(signal.SIGALRM, _alarm)
        self._rss_start = peak_rss()
        return self

    def __exit__(self, *exc):
        signal.signal(signal.SIGALRM, self._old_handler)

    @contextlib.contextmanager
    def case(self, label):
        signal.setitimer(signal.ITIMER_REAL, self.case_seconds)
        try:
            yield
        except Hang:
            pytest.fail("%s: no answer within %d s" % (label, self.case_seconds))
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        grown = peak_rss() - self._rss_start
        assert grown < self.memory_cap, "%s: the process grew by %d bytes" % (label, grown)
