"""Inference-only layers with the desktop `cinders.nn` constructors, attribute names and
state_dict names, so a model file written for the desktop imports unchanged on the board.

Parameters start as None and are bound by `cinders.record.load` from a safetensors record
(`layers.1.weight`, ...). Activations work in place on a layer's output (see _array._own).
Batches of any size: Linear takes the whole batch at once on the array engine; the image layers
run sample by sample (their scratch memory is that of one sample).

The image layers (Conv1d, Conv2d, MaxPool2d, AvgPool2d, BatchNorm2d) live in _nn_image.py, the
others (LayerNorm, Dropout) and the batch helper in _nn_more.py; each is imported when
a model first names one (module __getattr__): an MLP never holds their code.
"""

from cinders import engine

_IMAGE_LAYERS = ("Conv1d", "Conv2d", "MaxPool2d", "AvgPool2d", "BatchNorm2d")
_MORE_LAYERS = ("LayerNorm", "Dropout")


def __getattr__(name):
    if name in _IMAGE_LAYERS:
        from cinders import _nn_image
        return getattr(_nn_image, name)
    if name in _MORE_LAYERS:
        from cinders import _nn_more
        return getattr(_nn_more, name)
    raise AttributeError("cinders.nn on the board has no %r" % (name,))


def _need(cond, layer, msg, shape):
    if not cond:
        raise ValueError("%s: %s, got input of shape %s" % (layer, msg, shape))


class Module:
    """Base of every layer and model. Sub-modules are found among the attributes."""

    _params = ()
    _streamed = ("weight",)  # the parameters record.load may leave in the file (read row by row)

    def __init__(self):
        pass

    def __call__(self, *args):
        return self.forward(*args)

    def forward(self, x):
        raise NotImplementedError("%s has no forward()" % type(self).__name__)

    def config(self):
        return {}

    def children(self):
        """(name, module) below this one, named like the desktop's state_dict: attributes,
        and the items of lists/tuples of modules as "name.i"; "_" names are private."""
        found = []
        d = self.__dict__
        for k in d:
            v = d[k]
            if k[0] == "_":
                continue
            if isinstance(v, Module):
                found.append((k, v))
            elif isinstance(v, (list, tuple)):
                for i, m in enumerate(v):
                    if isinstance(m, Module):
                        found.append((k + "." + str(i), m))
        return found

    def named_modules(self, prefix=""):
        yield prefix, self
        for name, m in self.children():
            yield from m.named_modules(prefix + name + ".")

    def param_shapes(self):
        """{parameter name: shape} that the record must provide for this layer."""
        return {}

    def loaded(self):
        """Called once the record's tensors are bound (BatchNorm folds itself here)."""

    def eval(self):
        return self

    def __repr__(self):
        return type(self).__name__ + "()"


class Sequential(Module):
    def __init__(self, *layers):
        super().__init__()
        if len(layers) == 1 and isinstance(layers[0], (list, tuple)):
            layers = layers[0]
        self._layers = list(layers)

    def __getitem__(self, i):
        return self._layers[i]

    def __len__(self):
        return len(self._layers)

    def __iter__(self):
        return iter(self._layers)

    def children(self):
        return [(str(i), m) for i, m in enumerate(self._layers)]

    def forward(self, x):
        steps = self.__dict__.get("_steps")
        if steps is None:
            steps = self._layers
            if any(getattr(layer, "_fusable", False) for layer in steps):
                from cinders._nn_image import fuse
                steps = fuse(steps)
            self._steps = steps
        for step in steps:
            x = step(x)
        return x


class Linear(Module):
    def __init__(self, in_features, out_features, bias=True, **desktop_only):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = None
        self.bias = None
        self._params = ("weight", "bias") if bias else ("weight",)

    def param_shapes(self):
        return {"weight": (self.out_features, self.in_features), "bias": (self.out_features,)}

    def forward(self, x):
        _need(len(x.shape) >= 2 and x.shape[-1] == self.in_features,
              "Linear(%d, %d)" % (self.in_features, self.out_features),
              "expects (..., %d)" % self.in_features, x.shape)
        if getattr(engine, "BATCHED", False) or len(x.shape) == 2 and x.shape[0] == 1:
            return engine.linear(x, self.weight, self.bias, self.out_features)
        from cinders._nn_more import per_sample
        return per_sample(lambda xb: engine.linear(xb, self.weight, self.bias, self.out_features), x)


class _Unary(Module):
    _op = None

    def forward(self, x):
        return engine.unary(self._op, x)


class ReLU(_Unary):
    _op = "relu"


class GELU(_Unary):
    _op = "gelu"

    def __init__(self, approximate="none"):
        super().__init__()
        self.approximate = approximate
        if approximate == "tanh":
            self._op = "gelu_tanh"


class Sigmoid(_Unary):
    _op = "sigmoid"


class Tanh(_Unary):
    _op = "tanh"


class Softmax(Module):
    def __init__(self, dim=-1):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        if self.dim not in (-1, len(x.shape) - 1):
            from cinders import _ops_more
            return _ops_more.softmax(x, self.dim)
        if getattr(engine, "BATCHED", False):
            return engine.softmax_last(x)
        from cinders._nn_more import per_sample
        return per_sample(engine.softmax_last, x)


class Flatten(Module):
    def __init__(self, start_dim=1, end_dim=-1):
        super().__init__()
        self.start_dim = start_dim
        self.end_dim = end_dim

    def forward(self, x):
        s = x.shape
        a = self.start_dim % len(s)
        b = self.end_dim % len(s)
        n = 1
        for d in s[a:b + 1]:
            n *= d
        return engine.reshape(x, s[:a] + (n,) + s[b + 1:])
