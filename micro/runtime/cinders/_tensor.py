"""The board's tensor: flat row-major float32 data of one engine plus a shape.

`slot` says which of the array engine's two reusable activation buffers holds the data (None
for a tensor of its own); a layer writes its output into the other one, so a chain of layers
runs in a fixed amount of RAM after the first call. The price: a layer output lives until the
next-but-one layer runs. `gen` remembers which use of the slot a tensor belongs to, so reading
one whose buffer was reused raises an error instead of giving another layer's numbers
(`cinders.tensor(t)` keeps a copy).

Methods and operators (`x.tanh()`, `a + b`, `a @ b`, `x.tolist()`, ...) live in _ops.py: a
model that only chains layers never holds their code (on a 64 KB heap every KB counts). It
loads on the first method call, on any cinders.tensor() call, and in predict.py when
export-micro found operators in the model; loading it gives Tensor its operators.
"""
from array import array

GENS = [0, 0]  # how often each activation slot has been handed out (see _array._buffer)


def empty(typecode, n):
    """An array of n items for the caller to overwrite. Built from range(n) because MicroPython
    sizes an array from anything with a len() in one allocation, where array(tc, bytes(k))
    would first need a second, temporary k bytes (a 50 KB activation would need 100 KB).
    Byte-sized arrays take zeros (range would overflow them on CPython)."""
    return array(typecode, range(n)) if typecode == "f" else array(typecode, bytes(n))


def live(t):
    """Raise if t's activation buffer has been reused by a later layer."""
    if t.slot is not None and t.gen != GENS[t.slot]:
        # A layer output lives until the next-but-one layer (or an in-place activation).
        raise RuntimeError("tensor %s was overwritten by a later layer; keep a copy: "
                           "cinders.tensor(t)" % (t.shape,))


class Tensor:
    dtype = "float32"

    def __init__(self, data, shape, slot=None):
        self.data = data
        self.shape = shape
        self.slot = slot
        self.gen = GENS[slot] if slot is not None else 0

    def numel(self):
        n = 1
        for d in self.shape:
            n *= d
        return n

    def __getattr__(self, name):  # tanh, sigmoid, exp, relu, softmax, reshape, sum, T, ndim, ...
        from cinders import _ops
        return _ops.attribute(self, name)

    def __repr__(self):
        return "Tensor(shape=%s)" % (self.shape,)
