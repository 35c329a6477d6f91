"""Record the backend primitives an op makes on the desktop, to replay them in the browser.

The conformance table (tests/test_conformance.py) writes each op with cinders' tensor API. Running
a case on `Recorder(cn.NumPy())` yields the exact primitive calls the tensor layer made (the
tensor layer is the same pure Python in both places), as JSON; the browser replays them on its
WebGPU device (replay_in_browser.py) and returns the result's values, which must match the
desktop's NumPy values.

JSON of a call: [primitive name, args]; a handle argument is {"h": index of the call that made it},
a dtype {"dtype": name}; tuples become lists.
"""
import math

from cinders import dtypes
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
