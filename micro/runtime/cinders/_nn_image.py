"""The image layers of the board's cinders.nn (see nn.py: imported on first use), and the
Conv2d -> activation -> pool fusion that Sequential applies to them."""

from cinders import engine
from cinders.nn import Module, _need


def per_sample(fn, x):
    """fn(x); a batch of several samples goes through _nn_more.per_sample (code, and RAM, that a
    batch of one never loads: the CNN on ulab has no KB to spare at 160 KB)."""
    if x.shape[0] == 1:
        return fn(x)
    from cinders._nn_more import per_sample as each
    return each(fn, x)


def _pair(v):
    return (v, v) if isinstance(v, int) else (v[0], v[1])


class Conv2d(Module):
    _fusable = True  # Sequential runs Conv2d [activation] [pool] channel by channel

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 groups=1, bias=True, **desktop_only):
        super().__init__()
        if groups != 1:
            raise NotImplementedError("Conv2d: groups=%d is not supported on the board" % groups)
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = _pair(kernel_size)
        self.stride = _pair(stride)
        self.padding = _pair(padding)
        self.dilation = _pair(dilation)
        self.weight = None
        self.bias = None
        self._params = ("weight", "bias") if bias else ("weight",)

    def param_shapes(self):
        return {"weight": (self.out_channels, self.in_channels) + self.kernel_size,
                "bias": (self.out_channels,)}

    def _check(self, x):
        _need(len(x.shape) == 4 and x.shape[1] == self.in_channels,
              "Conv2d(%d, %d)" % (self.in_channels, self.out_channels),
              "expects (N, %d, H, W)" % self.in_channels, x.shape)

    def forward(self, x):
        self._check(x)
        return per_sample(lambda xb: engine.conv2d(
            xb, self.weight, self.bias, self.out_channels, self.kernel_size, self.stride,
            self.padding, self.dilation), x)


def _one(v, name):
    if isinstance(v, (tuple, list)):
        if len(v) != 1:
            raise ValueError("Conv1d: %s=%r is not one number" % (name, v))
        return v[0]
    return v


class Conv1d(Module):
    """1-D convolution of (N, C, L) signals: the 2-D convolution of (1, C, 1, L) planes with a
    (1, k) kernel, so both engines run it with their conv2d."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 groups=1, bias=True, **desktop_only):
        super().__init__()
        if groups != 1:
            raise NotImplementedError("Conv1d: groups=%d is not supported on the board" % groups)
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = (_one(kernel_size, "kernel_size"),)
        self.stride = (_one(stride, "stride"),)
        self.padding = (_one(padding, "padding"),)
        self.dilation = (_one(dilation, "dilation"),)
        self.weight = None
        self.bias = None
        self._params = ("weight", "bias") if bias else ("weight",)

    def param_shapes(self):
        return {"weight": (self.out_channels, self.in_channels) + self.kernel_size,
                "bias": (self.out_channels,)}

    def _one_sample(self, x):
        C, L = x.shape[1], x.shape[2]
        y = engine.conv2d(engine.reshape(x, (1, C, 1, L)), self.weight, self.bias,
                          self.out_channels, (1,) + self.kernel_size, (1,) + self.stride,
                          (0,) + self.padding, (1,) + self.dilation)
        return engine.reshape(y, (1, self.out_channels, y.shape[3]))

    def forward(self, x):
        _need(len(x.shape) == 3 and x.shape[1] == self.in_channels,
              "Conv1d(%d, %d)" % (self.in_channels, self.out_channels),
              "expects (N, %d, L)" % self.in_channels, x.shape)
        return per_sample(self._one_sample, x)


class _Pool2d(Module):
    def __init__(self, kernel_size, stride, padding):
        super().__init__()
        self.kernel_size = _pair(kernel_size)
        self.stride = self.kernel_size if stride is None else _pair(stride)
        self.padding = _pair(padding)

    def forward(self, x):
        _need(len(x.shape) == 4, type(self).__name__, "expects (N, C, H, W)", x.shape)
        return per_sample(lambda xb: engine.pool2d(xb, self.kernel_size, self.stride,
                                                   self.padding, self._mode), x)


class MaxPool2d(_Pool2d):
    _mode = "max"

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1):
        if dilation != 1:
            raise NotImplementedError("MaxPool2d: dilation=%s is not supported on the board"
                                      % (dilation,))
        super().__init__(kernel_size, stride, padding)


class AvgPool2d(_Pool2d):
    def __init__(self, kernel_size, stride=None, padding=0, count_include_pad=True):
        super().__init__(kernel_size, stride, padding)
        self.count_include_pad = count_include_pad
        self._mode = "avg" if count_include_pad else "avg_valid"


class BatchNorm2d(Module):
    """Inference BatchNorm: running statistics and affine folded into one scale and shift per
    channel when the record is loaded."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, **desktop_only):
        super().__init__()
        self.num_features = num_features
        self.eps = eps
        self.momentum = momentum
        self.weight = self.bias = self.running_mean = self.running_var = None
        self._params = (("weight", "bias") if affine else ()) + ("running_mean", "running_var")

    def param_shapes(self):
        c = (self.num_features,)
        return {"weight": c, "bias": c, "running_mean": c, "running_var": c}

    def loaded(self):
        from cinders._tensor import empty
        n = self.num_features
        scale = empty("f", n)
        shift = empty("f", n)
        for c in range(n):
            a = 1.0 / (self.running_var.data[c] + self.eps) ** 0.5
            if self.weight is not None:
                a *= self.weight.data[c]
            scale[c] = a
            shift[c] = (self.bias.data[c] if self.bias is not None else 0.0) - \
                self.running_mean.data[c] * a
        self._scale = scale
        self._shift = shift
        self.weight = self.bias = self.running_mean = self.running_var = None

    def forward(self, x):
        _need(len(x.shape) == 4 and x.shape[1] == self.num_features,
              "BatchNorm2d(%d)" % self.num_features, "expects (1, C, H, W)", x.shape)
        return per_sample(lambda xb: engine.channel_affine(xb, self._scale, self._shift), x)


class _ConvBlock:
    """Conv2d, then an activation and/or a pool, run channel by channel (see engine.conv2d):
    the same numbers as the three layers, without the full-size convolution output."""

    def __init__(self, conv, act, pool):
        self.conv = conv
        self.act = act._op if act is not None else None
        self.pool = (pool.kernel_size, pool.stride, pool.padding, pool._mode) if pool else None

    def args(self):
        """engine.conv2d's arguments after the input."""
        c = self.conv
        return (c.weight, c.bias, c.out_channels, c.kernel_size, c.stride, c.padding,
                c.dilation, self.act, self.pool)

    def __call__(self, x):
        self.conv._check(x)
        return per_sample(lambda xb: engine.conv2d(xb, *self.args()), x)


class _ConvChain:
    """Two _ConvBlocks in a row, on an engine that declares CONV_CHAIN: the second computes its
    output a band at a time from the rows of the first's it reads (engine.conv_chain), so the
    first's output never exists whole. Same numbers as running the two blocks."""

    def __init__(self, first, second):
        self.first = first
        self.second = second

    def __call__(self, x):
        self.first.conv._check(x)
        return per_sample(lambda xb: engine.conv_chain(xb, self.first.args(),
                                                       self.second.args()), x)


def fuse(layers):
    """Sequential's steps: each Conv2d [activation] [pool] run becomes one _ConvBlock, and on an
    engine with CONV_CHAIN two such blocks in a row one _ConvChain."""
    steps = []
    i = 0
    while i < len(layers):
        layer = layers[i]
        if isinstance(layer, Conv2d):
            act = pool = None
            j = i + 1
            if j < len(layers) and getattr(layers[j], "_op", None):
                act = layers[j]
                j += 1
            if j < len(layers) and isinstance(layers[j], _Pool2d):
                pool = layers[j]
                j += 1
            if j > i + 1:
                block = _ConvBlock(layer, act, pool)
                last = steps[-1] if steps else None
                if (getattr(engine, "CONV_CHAIN", False) and isinstance(last, _ConvBlock)
                        and last.conv.out_channels == layer.in_channels):
                    steps[-1] = _ConvChain(last, block)
                else:
                    steps.append(block)
                i = j
                continue
        steps.append(layer)
        i += 1
    return steps
