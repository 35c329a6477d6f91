"""Layers of the board's cinders.nn that few models use (imported on first use, see nn.py),
and the helpers that run a layer sample by sample and read a streamed parameter whole."""
from array import array

from cinders import engine
from cinders.nn import Module, _need
from cinders._tensor import Tensor, empty, live


def _flat(d):
    return d if isinstance(d, (array, memoryview)) else engine.to_array(d)


def per_sample(fn, x):
    """fn(x) for a batch of one; for a batch of B, fn on each sample (1, ...) and the results
    stacked into a tensor of its own (a sample's output is copied out before the next runs:
    the engine reuses its buffers)."""
    live(x)
    B = x.shape[0] if x.shape else 1
    if B == 1:
        return fn(x)
    d = _flat(x.data)
    n = len(d) // B
    one = (1,) + tuple(x.shape[1:])
    out = None
    for b in range(B):
        yb = fn(Tensor(engine.from_flat(array("f", d[b * n:(b + 1) * n]), one), one))
        yd = _flat(yb.data)
        if out is None:
            m = len(yd)
            out = empty("f", B * m)
            shape = (B,) + tuple(yb.shape[1:])
        for i in range(m):
            out[b * m + i] = yd[i]
    return Tensor(engine.from_flat(out, shape), shape)


def resident(param):
    """A parameter's values in RAM (reading a streamed one from the file once), or None."""
    if param is None or param.data is not None:
        return None if param is None else param.data
    out = empty("f", param.rows * param.row_len)
    k = 0
    for _, n, rows in param.chunks(1):
        for v in rows:
            out[k] = v
            k += 1
    return out


class Dropout(Module):
    """Inference: dropout does nothing."""

    def __init__(self, p=0.5, seed=None):
        super().__init__()
        self.p = p

    def forward(self, x):
        return x


class LayerNorm(Module):
    """Normalise over the last dims (biased variance), then weight and bias, like the desktop."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True,
                 **desktop_only):
        super().__init__()
        if isinstance(normalized_shape, int):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(normalized_shape)
        self.eps = eps
        self.weight = self.bias = None
        self._params = (("weight", "bias") if bias else ("weight",)) if elementwise_affine else ()

    def param_shapes(self):
        return {"weight": self.normalized_shape, "bias": self.normalized_shape}

    def loaded(self):
        self._w = resident(self.weight)
        self._b = resident(self.bias)
        self.weight = self.bias = None

    def forward(self, x):
        k = len(self.normalized_shape)
        _need(tuple(x.shape[len(x.shape) - k:]) == self.normalized_shape,
              "LayerNorm(%s)" % (self.normalized_shape,),
              "expects (..., %s)" % ", ".join(str(d) for d in self.normalized_shape), x.shape)
        n = 1
        for d in self.normalized_shape:
            n *= d
        from cinders import _ops_more
        return _ops_more.layer_norm(x, n, self.__dict__.get("_w"), self.__dict__.get("_b"), self.eps)
