"""The layers. Attribute names, shapes and initialisation follow PyTorch, so state dicts load
1:1 and freshly built models start from the same distributions.

Every constructor takes `backend=` (default: cn.default_backend()) and `seed=` (default: the next
seeds of cn.manual_seed's sequence). Parameters created on an Autodiff backend require grad.
"""

import math

from ..dtypes import float32, int32
from ..errors import ShapeError
from ..creation import full, random
from . import functional as F
from .module import Module, parameter


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def _uniform(shape, bound, backend, seed):
    """U(-bound, bound): PyTorch's kaiming_uniform(a=sqrt(5)) for weights is bound 1/sqrt(fan_in)."""
    return parameter(random(shape, backend=backend, seed=seed) * (2.0 * bound) - bound)


def _constant(shape, value, backend, trainable=True, dtype=float32):
    t = full(shape, value, backend=backend, dtype=dtype)
    return parameter(t) if trainable else t


def _seed(seed, k):
    return None if seed is None else seed + k


class Linear(Module):
    """y = x @ weight.T + bias; weight (out_features, in_features)."""

    def __init__(self, in_features, out_features, bias=True, backend=None, seed=None):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        bound = 1.0 / math.sqrt(in_features) if in_features else 0.0
        self.weight = _uniform((out_features, in_features), bound, backend, seed)
        self.bias = _uniform((out_features,), bound, backend, _seed(seed, 1)) if bias else None

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)

    def config(self):
        return {"in_features": self.in_features, "out_features": self.out_features, "bias": self.bias is not None}

    def extra_repr(self):
        return "in_features=%d, out_features=%d, bias=%s" % (self.in_features, self.out_features, self.bias is not None)


class Conv2d(Module):
    """2-D convolution (cross-correlation), NCHW; weight (out, in/groups, kh, kw)."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 groups=1, bias=True, backend=None, seed=None):
        super().__init__()
        if in_channels % groups or out_channels % groups:
            raise ShapeError("Conv2d: in_channels %d and out_channels %d must be divisible by groups %d"
                             % (in_channels, out_channels, groups))
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = _pair(kernel_size)
        self.stride = _pair(stride)
        self.padding = _pair(padding)
        self.dilation = _pair(dilation)
        self.groups = groups
        kh, kw = self.kernel_size
        bound = 1.0 / math.sqrt(in_channels // groups * kh * kw)
        self.weight = _uniform((out_channels, in_channels // groups, kh, kw), bound, backend, seed)
        self.bias = _uniform((out_channels,), bound, backend, _seed(seed, 1)) if bias else None

    def forward(self, x):
        _check_conv_input("Conv2d", "(N, C, H, W)", x, self.in_channels)
        return F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)

    def extra_repr(self):
        return "%d, %d, kernel_size=%s, stride=%s, padding=%s" % (
            self.in_channels, self.out_channels, self.kernel_size, self.stride, self.padding)


def _check_conv_input(layer, layout, x, channels):
    """The layer's own name, rank and channel count in the error, not the conv2d it runs as."""
    if x.ndim != len(layout.split(",")) or x.shape[1] != channels:
        raise ShapeError("%s: expects a %d-D input %s with C = %d, got shape %s"
                         % (layer, len(layout.split(",")), layout, channels, tuple(x.shape)))


def inferred_input_shape(model, count):
    """One sample's shape from the model's first layer when no record says it: (in_features,)
    for a Linear; (C, L) for a Conv1d and (C, S, S) for a Conv2d, from the `count` numbers of
    one input. None when the first layer does not tell or `count` does not fit it."""
    first = next((m for m in model.modules() if isinstance(m, (Linear, Conv1d, Conv2d))), None)
    if isinstance(first, Linear):
        return (first.in_features,)
    if first is None or not count or count % first.in_channels:
        return None
    spatial = count // first.in_channels
    if isinstance(first, Conv1d):
        return (first.in_channels, spatial)
    side = math.isqrt(spatial)
    return (first.in_channels, side, side) if side * side == spatial else None


def _single(v, name):
    if isinstance(v, int):
        return v
    if len(v) != 1:
        raise ShapeError("Conv1d: %s must be one number, got %r" % (name, v))
    return v[0]


class Conv1d(Module):
    """1-D convolution of (N, C, L) signals; weight (out, in/groups, k). Computed as the 2-D
    convolution of (N, C, 1, L) with a (1, k) kernel (the board runtime does the same)."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 groups=1, bias=True, backend=None, seed=None):
        super().__init__()
        if in_channels % groups or out_channels % groups:
            raise ShapeError("Conv1d: in_channels %d and out_channels %d must be divisible by groups %d"
                             % (in_channels, out_channels, groups))
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = (_single(kernel_size, "kernel_size"),)
        self.stride = (_single(stride, "stride"),)
        self.padding = (_single(padding, "padding"),)
        self.dilation = (_single(dilation, "dilation"),)
        self.groups = groups
        bound = 1.0 / math.sqrt(in_channels // groups * self.kernel_size[0])
        self.weight = _uniform((out_channels, in_channels // groups) + self.kernel_size, bound, backend, seed)
        self.bias = _uniform((out_channels,), bound, backend, _seed(seed, 1)) if bias else None

    def forward(self, x):
        _check_conv_input("Conv1d", "(N, C, L)", x, self.in_channels)
        y = F.conv2d(x.unsqueeze(2), self.weight.unsqueeze(2), self.bias, (1,) + self.stride,
                     (0,) + self.padding, (1,) + self.dilation, self.groups)
        return y.squeeze(2)

    def extra_repr(self):
        return "%d, %d, kernel_size=%s, stride=%s, padding=%s" % (
            self.in_channels, self.out_channels, self.kernel_size, self.stride, self.padding)


class MaxPool2d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, dilation=1):
        super().__init__()
        self.kernel_size, self.stride, self.padding, self.dilation = kernel_size, stride, padding, dilation

    def forward(self, x):
        return F.max_pool2d(x, self.kernel_size, self.stride, self.padding, self.dilation)


class AvgPool2d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, count_include_pad=True):
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.count_include_pad = count_include_pad

    def forward(self, x):
        return F.avg_pool2d(x, self.kernel_size, self.stride, self.padding, self.count_include_pad)


class BatchNorm2d(Module):
    """Batch statistics in training (and an update of the running ones, unbiased variance;
    momentum=None averages all batches seen,
    like torch); running statistics in eval()."""

    buffers = ("running_mean", "running_var", "num_batches_tracked")

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, backend=None):
        super().__init__()
        self.num_features = num_features
        self.eps = eps
        self.momentum = momentum
        self.weight = _constant((num_features,), 1.0, backend) if affine else None
        self.bias = _constant((num_features,), 0.0, backend) if affine else None
        self.running_mean = _constant((num_features,), 0.0, backend, trainable=False)
        self.running_var = _constant((num_features,), 1.0, backend, trainable=False)
        self.num_batches_tracked = _constant((), 0, backend, trainable=False, dtype=int32)

    def forward(self, x):
        if x.ndim != 4 or x.shape[1] != self.num_features:
            raise ShapeError("BatchNorm2d(%d): needs input (N, %d, H, W), got shape %s"
                             % (self.num_features, self.num_features, x.shape))
        if not self.training:
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, self.eps)
        axes = (0, 2, 3)
        mean = x.mean(axes)
        centred = x - mean.reshape(1, -1, 1, 1)
        var = (centred * centred).mean(axes)
        self._update_running(mean, var, x.numel() // self.num_features)
        out = centred / (var.reshape(1, -1, 1, 1) + self.eps).sqrt()
        if self.weight is not None:
            out = out * self.weight.reshape(1, -1, 1, 1) + self.bias.reshape(1, -1, 1, 1)
        return out

    def _update_running(self, mean, var, n):
        from ..autodiff import no_grad
        with no_grad():
            if mean.backend.differentiable:
                mean, var = mean.detach(), var.detach()
            self.num_batches_tracked = self.num_batches_tracked + 1
            # momentum=None is torch's cumulative average: weight 1/k for the k-th batch
            m = 1.0 / self.num_batches_tracked.item() if self.momentum is None else self.momentum
            unbiased = var * (n / max(n - 1, 1))
            self.running_mean = self.running_mean * (1.0 - m) + mean * m
            self.running_var = self.running_var * (1.0 - m) + unbiased * m


class LayerNorm(Module):
    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True, backend=None):
        super().__init__()
        self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.eps = eps
        self.weight = _constant(self.normalized_shape, 1.0, backend) if elementwise_affine else None
        self.bias = _constant(self.normalized_shape, 0.0, backend) if elementwise_affine and bias else None

    def forward(self, x):
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


class Dropout(Module):
    """Zeroes elements with probability p in training. With `seed`, call k uses seed + k, so a
    run is reproducible; without, masks follow cn.manual_seed's sequence."""

    def __init__(self, p=0.5, seed=None):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError("Dropout: p must be in [0, 1], got %r" % (p,))
        self.p = p
        self.seed = seed
        self._calls = 0

    def forward(self, x):
        seed = None
        if self.seed is not None:
            seed = self.seed + self._calls
            self._calls += 1
        return F.dropout(x, self.p, self.training, seed)


class Embedding(Module):
    """A lookup table: int32 indices -> rows of weight (num_embeddings, embedding_dim), N(0, 1)."""

    def __init__(self, num_embeddings, embedding_dim, backend=None, seed=None):
        super().__init__()
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.weight = parameter(random((num_embeddings, embedding_dim), backend=backend,
                                       distribution="normal", seed=seed))

    def forward(self, indices):
        return F.embedding(indices, self.weight)


class ReLU(Module):
    def forward(self, x):
        return x.relu()


class ReLU6(Module):
    def forward(self, x):
        return F.relu6(x)


class Hardsigmoid(Module):
    def forward(self, x):
        return F.hardsigmoid(x)


class Hardswish(Module):
    def forward(self, x):
        return F.hardswish(x)


class Identity(Module):
    def forward(self, x):
        return x


class AdaptiveAvgPool2d(Module):
    """Averages each (N, C) plane down to output_size (an int, or (h, w); None keeps that dim)."""

    def __init__(self, output_size):
        super().__init__()
        self.output_size = output_size

    def forward(self, x):
        return F.adaptive_avg_pool2d(x, self.output_size)

    def extra_repr(self):
        return "output_size=%r" % (self.output_size,)


class GELU(Module):
    def forward(self, x):
        return x.gelu()


class Sigmoid(Module):
    def forward(self, x):
        return x.sigmoid()


class Tanh(Module):
    def forward(self, x):
        return x.tanh()


class Softmax(Module):
    def __init__(self, dim=-1):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return x.softmax(self.dim)


class Flatten(Module):
    def __init__(self, start_dim=1, end_dim=-1):
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x):
        return x.flatten(self.start_dim, self.end_dim)


class Sequential(Module):
    """Calls its layers in order. Indexable, iterable, len(); state keys "0.weight", ... (so a
    model's `self.layers = Sequential(...)` gives "layers.0.weight", like torch)."""

    def __init__(self, *layers):
        super().__init__()
        if len(layers) == 1 and isinstance(layers[0], (list, tuple)):
            layers = layers[0]
        for layer in layers:
            if not isinstance(layer, Module):
                raise TypeError("Sequential: %r is not a Module" % (layer,))
        self._layers = list(layers)

    def _items(self):
        return [(str(i), layer) for i, layer in enumerate(self._layers)]

    def forward(self, x):
        for layer in self._layers:
            x = layer(x)
        return x

    def __getitem__(self, i):
        if isinstance(i, slice):
            return Sequential(self._layers[i])
        return self._layers[i]

    def __len__(self):
        return len(self._layers)

    def __iter__(self):
        return iter(self._layers)

    def append(self, layer):
        self._layers.append(layer)
        return self
