"""Record the backend primitives an op makes on the desktop, to replay them in the browser.

The conformance table (tests/test_conformance.py) writes each op with cinders' tensor API. Running
a case on `Recorder(cn.NumPy())` yields the exact primitive calls the tensor layer made (the
tensor layer is the same pure Python in both places), as JSON; the browser replays them on its
WebGPU device (replay_in_browser.py) and returns the result's values, which must match the
desktop's NumPy values.

JSON of a call: [primitive name, args]; a handle argument is {"h": index of the call that made it},
a dtype {"dtype": name}; tuples become lists.

replay_conformance_table(page, backend) does the whole round trip on a Pyodide page and says
which ops differ (test_mnist_page.py on plain WebGPU, test_fusion_browser.py on cn.Fusion).
"""
import json
import math
import os
import sys

from cinders import dtypes
from cinders.assets import REPO_ROOT
from cinders.backend import PRIMITIVES, Backend


class Recorder(Backend):
    """A backend that forwards every primitive to `inner` and records it."""

    name = "recorder"

    def __init__(self, inner):
        self._inner = inner
        self.calls = []       # [name, encoded args]
        self._index = {}      # id(handle) -> index of the call that produced it
        self._keep = []       # produced handles, kept alive so their ids stay unique

    def device_key(self):
        return ("Recorder", id(self))

    def shape(self, h):
        return self._inner.shape(h)

    def dtype(self, h):
        return self._inner.dtype(h)

    def _encode(self, value):
        if id(value) in self._index:  # produced handles are kept alive: ids stay unique
            return {"h": self._index[id(value)]}
        if isinstance(value, dtypes.DType):
            return {"dtype": value.name}
        if isinstance(value, (list, tuple)):
            return [self._encode(v) for v in value]
        if isinstance(value, float) and not math.isfinite(value):
            return {"float": repr(value)}
        if isinstance(value, bool) or value is None or isinstance(value, (int, float, str)):
            return value
        if hasattr(value, "item"):  # a NumPy scalar
            return self._encode(value.item())
        raise TypeError("cannot record argument %r" % (value,))

    def _record(self, name, args, result):
        self.calls.append([name, [self._encode(a) for a in args]])
        if name != "to_flat":
            self._index[id(result)] = len(self.calls) - 1
            self._keep.append(result)
        return result

    def index_of(self, handle):
        return self._index[id(handle)]


def _forwarder(name):
    def primitive(self, *args):
        return self._record(name, args, getattr(self._inner, name)(*args))
    primitive.__name__ = name
    return primitive


for _name in PRIMITIVES:
    setattr(Recorder, _name, _forwarder(_name))


def trace_case(case, inner):
    """(calls, index of the result handle, desktop values of the result, dtype name)."""
    import cinders as cn
    recorder = Recorder(inner)
    tensors = [cn.tensor(x, backend=recorder) for x in case.inputs]
    out = case.fn(*tensors)
    values = inner.to_flat(out.handle)
    return {"name": case.name, "calls": recorder.calls, "result": recorder.index_of(out.handle),
            "shape": list(out.shape), "dtype": out.dtype.name, "expected": values}


# -- the conformance table replayed on a page's WebGPU device ------------------------------------
# WGSL's accuracy for sin and cos is an absolute error of 2**-11 (on [-pi, pi]), and SwiftShader
# uses that freedom; everything else is held to the desktop's tolerances.
WGSL_APPROXIMATE = {"sin": 2.0 ** -11, "cos": 2.0 ** -11}
# Rows whose values are long sums of products (a 7x7 window over several channels): their
# float32 rounding depends on the summation order, which the page's kernel and NumPy choose
# differently, and it scales with the terms, not with a result that nearly cancels; their
# bound is relative to the row's largest value.
SUMMED = ("conv2d",)

_REPLAY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "replay_in_browser.py")


def _conformance_cases():
    sys.path.insert(0, os.path.join(REPO_ROOT, "tests"))
    import backends
    import test_conformance
    return test_conformance.CASES, backends.TOLERANCES.get("wgpu")


def _mismatches(got, want, dtype, tol, scale=0.0):
    """[(index, browser value, desktop value)] where they differ beyond tol (NaN equals NaN);
    scale: a magnitude the relative bound takes where a value is smaller (SUMMED rows)."""
    if len(got) != len(want):
        return [("len", len(got), len(want))]
    rtol, atol = tol
    bad = []
    for i, (a, b) in enumerate(zip(got, want)):
        if dtype != "float32" or math.isinf(b):
            same = a == b
        elif math.isnan(b):
            same = math.isnan(a)
        else:
            same = abs(a - b) <= atol + rtol * max(abs(b), scale)
        if not same:
            bad.append((i, a, b))
    return bad


def replay_conformance_table(page, backend):
    """Replay every conformance case, traced on cn.NumPy() here, on the Pyodide page's bridge with
    `backend` (Python source; `_page_backend` is the backend the page runs on) swapped in for
    the replay. Returns (failures: ["op: what differs"], number of cases)."""
    import cinders as cn
    cases, wgpu_tol = _conformance_cases()
    traces = [trace_case(case, cn.NumPy()) for case in cases]
    with open(_REPLAY) as f:
        replay = f.read()
    swap = ("import cinders as cn\nimport cinders.web.bridge as _bridge\n"
            "_page_backend = _bridge._state['backend']\n"
            "_bridge._state['backend'] = %s\n" % backend)
    restore = "\n_bridge._state['backend'] = _page_backend\nRESULT\n"
    results = json.loads(page.evaluate(
        """async ([traces, code]) => {
             const py = window.cindersDemo.model.runtime.pyodide;
             py.globals.set("TRACES", traces);
             return await py.runPythonAsync(code);
           }""", [json.dumps(traces), swap + replay + restore]))
    assert len(results) == len(traces)
    failures = []
    for trace, result in zip(traces, results):
        if "error" in result:
            error = result["error"].strip()
            failures.append("%s: %s" % (trace["name"], error[error.rfind("Error:") - 20:][:400]))
            continue
        tol = wgpu_tol or (1e-5, 1e-6)
        op = trace["name"].split(" ")[0]
        if op in WGSL_APPROXIMATE:
            tol = (tol[0], max(tol[1], WGSL_APPROXIMATE[op]))
        finite = [abs(v) for v in trace["expected"] if isinstance(v, float) and math.isfinite(v)]
        scale = max(finite, default=0.0) if op in SUMMED else 0.0
        bad = _mismatches(result["values"], trace["expected"], trace["dtype"], tol, scale)
        if bad:
            failures.append("%s: (index, browser, desktop) %s" % (trace["name"], bad[:4]))
    return failures, len(traces)
