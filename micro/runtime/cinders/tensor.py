"""The board's tensor: flat row-major data of one engine plus a shape (batch of one).

`slot` says which of the engine's two reusable activation buffers holds the data (None for a
tensor the caller made); a layer writes its output into the other one, so a chain of layers
runs in a fixed amount of RAM after the first call.
"""
from array import array


def empty(typecode, n):
    """An array of n items for the caller to overwrite. Built from range(n) because MicroPython
    sizes an array from anything with a len() in one allocation, where array(tc, bytes(k))
    would first need a second, temporary k bytes (a 50 KB activation would need 100 KB).
    Byte-sized arrays take zeros (range would overflow them on CPython)."""
    return array(typecode, range(n)) if typecode == "f" else array(typecode, bytes(n))


class Tensor:
    def __init__(self, data, shape, slot=None):
        self.data = data
        self.shape = shape
        self.slot = slot

    def numel(self):
        n = 1
        for d in self.shape:
            n *= d
        return n

    def tolist(self):
        """Flat list of the values (the logits of a batch of one)."""
        from cinders import engine
        return engine.to_list(self.data)

    def __repr__(self):
        return "Tensor(shape=%s)" % (self.shape,)
