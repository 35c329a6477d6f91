"""ONNX operators: convolution and pooling."""

import math

import cinders as cn
from ...dtypes import float32
from ...functional import conv2d, conv_activation, max_pool2d
from ...tensor import Tensor, unfold2d
from ..proto import OnnxError
from .base import op
from .linalg import half_product, half_weight, widened
from .shapes import _reverse


def _spatial_pads(x_shape, kernel, strides, dilations, pads, auto_pad, ceil_mode=0):
    """(begins, ends) padding per spatial dim, following auto_pad and ceil_mode."""
    nd = len(kernel)
    spatial = x_shape[2:]
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        begins, ends = [], []
        for n, k, s, d in zip(spatial, kernel, strides, dilations):
            out = -(-n // s)
            total = max(0, (out - 1) * s + (k - 1) * d + 1 - n)
            small, big = total // 2, total - total // 2
            begins.append(small if auto_pad == "SAME_UPPER" else big)
            ends.append(big if auto_pad == "SAME_UPPER" else small)
        return begins, ends
    if auto_pad == "VALID" or not pads:
        begins, ends = [0] * nd, [0] * nd
    else:
        begins, ends = list(pads[:nd]), list(pads[nd:])
    if ceil_mode:
        for i, (n, k, s, d) in enumerate(zip(spatial, kernel, strides, dilations)):
            span = n + begins[i] + ends[i] - ((k - 1) * d + 1)
            out = -(-span // s) + 1
            if (out - 1) * s >= n + begins[i]:
                out -= 1
            ends[i] += max(0, (out - 1) * s + (k - 1) * d + 1 - (n + begins[i] + ends[i]))
    return begins, ends


def _to_2d(x):
    """(N, C, L) -> (N, C, 1, L): 1-D windows run as 2-D ones."""
    return x.unsqueeze(2)


def _pad_spatial(x, begins, ends, value):
    flat = []
    for b, e in zip(reversed(begins), reversed(ends)):
        flat += [b, e]
    return cn.pad(x, flat, value) if any(flat) else x


@op()
def Conv(X, W, B=None, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None,
         activation=None):
    # activation: not ONNX's; the importer sets it where a Relu / Clip(0, 6) follows (fold.py)
    nd = X.ndim - 2
    if nd not in (1, 2, 3):
        raise OnnxError("Conv: %d-D convolution is not supported (1-D to 3-D are)" % nd)
    kernel = list(W.shape[2:])
    strides = strides or [1] * nd
    dilations = dilations or [1] * nd
    begins, ends = _spatial_pads(X.shape, kernel, strides, dilations, pads, auto_pad)
    if nd == 3:
        return _conv3d(_pad_spatial(X, begins, ends, 0.0), W, B, strides, dilations, group)
    x, w = X, W
    if nd == 1:
        x, w = _to_2d(X), _to_2d(W)
        strides, dilations = [1] + list(strides), [1] + list(dilations)
        begins, ends = [0] + list(begins), [0] + list(ends)
    if half_weight(w, x) and (group == 1 or x.backend.half_conv2d):
        out = _half_conv(x, w, B, strides, dilations, begins, ends, group, activation)
        return out.squeeze(2) if nd == 1 else out
    out = conv2d(x, widened(w), B, stride=tuple(strides), padding=tuple(zip(begins, ends)),
                 dilation=tuple(dilations), groups=group, activation=activation)
    return out.squeeze(2) if nd == 1 else out


def _half_conv(x, w, bias, strides, dilations, begins, ends, group, activation):
    """2-D convolution with a half model's float16 weight W (O, C/group, kh, kw), then bias and
    activation: in the backend's conv kernels, which widen W as they read it, where it declares
    `half_conv2d` (core/backend.py), else (group 1) the unfolded image's rows times W, read
    k-contiguous and widened inside matmul_quantized (linalg.half_product)."""
    if x.backend.half_conv2d:
        bias = None if bias is None else bias.cast(float32).reshape((-1,)).handle
        out = x.backend.conv2d_quantized(x.handle, None, w.handle, None, None, bias, tuple(strides),
                                         tuple(zip(begins, ends)), tuple(dilations), group)
        return conv_activation(Tensor(x.backend, out, x.backend.shape(out), float32), activation)
    kernel = tuple(w.shape[2:])
    if begins != ends:   # unfold2d pads both sides alike: pad x itself first
        x, begins = _pad_spatial(x, begins, ends, 0.0), [0, 0]
    cols = unfold2d(x, kernel, tuple(strides), tuple(begins), tuple(dilations))
    n, ckk, length = cols.shape
    o = w.shape[0]
    out = half_product(cols.permute(0, 2, 1).reshape((n * length, ckk)), w.reshape((o, ckk)), transposed=True)
    oh = (x.shape[2] + 2 * begins[0] - dilations[0] * (kernel[0] - 1) - 1) // strides[0] + 1
    out = out.reshape((n, length, o)).permute(0, 2, 1).reshape((n, o, oh, length // oh))
    return conv_activation(out if bias is None else out + bias.reshape((1, o, 1, 1)), activation)


def _conv3d(x, w, bias, strides, dilations, group):
    """3-D convolution of a padded x as a sum over the kd depth taps of 2-D convolutions, each
    over every output depth slice at once (folded into the batch)."""
    n, c, depth = x.shape[:3]
    o, kd = w.shape[0], w.shape[2]
    sd, dd = strides[0], dilations[0]
    od = (depth - (kd - 1) * dd - 1) // sd + 1
    out = None
    for k in range(kd):
        tap = x[:, :, k * dd:k * dd + (od - 1) * sd + 1:sd]                     # (N, C, OD, H, W)
        tap = tap.permute(0, 2, 1, 3, 4).reshape(n * od, c, x.shape[3], x.shape[4])
        y = conv2d(tap, w[:, :, k], None, stride=tuple(strides[1:]), padding=0,
                   dilation=tuple(dilations[1:]), groups=group)
        out = y if out is None else out + y
    out = out.reshape(n, od, o, out.shape[2], out.shape[3]).permute(0, 2, 1, 3, 4)
    return out if bias is None else out + bias.reshape(1, o, 1, 1, 1)


@op()
def ConvTranspose(X, W, B=None, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
                  output_padding=None, output_shape=None, pads=None, strides=None):
    nd = X.ndim - 2
    if nd not in (1, 2):
        raise OnnxError("ConvTranspose: %d-D is not supported (1-D and 2-D are)" % nd)
    x, w = (X, W) if nd == 2 else (_to_2d(X), _to_2d(W))
    strides = ([1] if nd == 1 else []) + list(strides or [1] * nd)
    dilations = ([1] if nd == 1 else []) + list(dilations or [1] * nd)
    output_padding = ([0] if nd == 1 else []) + list(output_padding or [0] * nd)
    kernel = list(w.shape[2:])
    n, c, h, wd = x.shape
    total = []
    for i, size in enumerate((h, wd)):
        total.append(strides[i] * (size - 1) + output_padding[i] + (kernel[i] - 1) * dilations[i] + 1)
    if output_shape is not None:
        wanted = ([1] if nd == 1 else []) + list(output_shape)[-nd:]
        pad_total = [t - o for t, o in zip(total, wanted)]
        if auto_pad == "SAME_UPPER":
            begins = [p // 2 for p in pad_total]
        else:
            begins = [p - p // 2 for p in pad_total]
        ends = [p - b for p, b in zip(pad_total, begins)]
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        wanted = [size * s for size, s in zip((h, wd), strides)]
        pad_total = [t - o for t, o in zip(total, wanted)]
        begins = [p // 2 if auto_pad == "SAME_UPPER" else p - p // 2 for p in pad_total]
        ends = [p - b for p, b in zip(pad_total, begins)]
    elif pads:
        begins = ([0] if nd == 1 else []) + list(pads[:nd])
        ends = ([0] if nd == 1 else []) + list(pads[nd:])
    else:
        begins, ends = [0, 0], [0, 0]
    # dilate the input with stride-1 zeros between pixels, then a plain convolution with the
    # flipped, transposed kernel
    sh, sw = strides
    if sh > 1 or sw > 1:
        x = x.reshape(n, c, h, 1, wd, 1)
        x = cn.pad(x, [0, sw - 1, 0, 0, 0, sh - 1], 0.0).reshape(n, c, h * sh, wd * sw)
        x = x[:, :, :h * sh - sh + 1, :wd * sw - sw + 1]
    o_per_group = w.shape[1]
    cg = c // group
    wt = w.reshape(group, cg, o_per_group, kernel[0], kernel[1]).permute(0, 2, 1, 3, 4)
    wt = _reverse(_reverse(wt, 3), 4).reshape(group * o_per_group, cg, kernel[0], kernel[1])
    full_pad = [(k - 1) * d for k, d in zip(kernel, dilations)]
    pb = [fp - b for fp, b in zip(full_pad, begins)]
    pe = [fp - e + op_ for fp, e, op_ in zip(full_pad, ends, output_padding)]
    crop_b = [max(0, -p) for p in pb]
    crop_e = [max(0, -p) for p in pe]
    x = _pad_spatial(x, [max(0, p) for p in pb], [max(0, p) for p in pe], 0.0)
    out = conv2d(x, wt, B, stride=1, padding=0, dilation=tuple(dilations), groups=group)
    if any(crop_b) or any(crop_e):
        out = out[:, :, crop_b[0]:out.shape[2] - crop_e[0], crop_b[1]:out.shape[3] - crop_e[1]]
    return out.squeeze(2) if nd == 1 else out


def _windows(X, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode):
    """(kernel, strides, dilations, begins, ends) of a pooling window over X's spatial dims."""
    nd = X.ndim - 2
    if nd not in (1, 2, 3):
        raise OnnxError("pooling: %d-D windows are not supported (1-D to 3-D are)" % nd)
    if not kernel_shape or len(kernel_shape) != nd:
        raise OnnxError("pooling: kernel_shape %r does not fit a %d-D input" % (kernel_shape, nd))
    strides = list(strides or [1] * nd)
    dilations = list(dilations or [1] * nd)
    kernel = list(kernel_shape)
    begins, ends = _spatial_pads(X.shape, kernel, strides, dilations, pads, auto_pad, ceil_mode)
    return kernel, strides, dilations, begins, ends


def _window_reduce(x, kernel, strides, dilations, how):
    """Sum ("sum") or max ("max") of every window of an already padded (N, C, *spatial) x.
    2-D windows are one unfold2d; 1-D ones run as 2-D with height 1; 3-D ones reduce each depth
    slice's 2-D windows, then across the kd depth taps."""
    nd = x.ndim - 2
    if nd == 1:
        return _window_reduce(_to_2d(x), [1] + kernel, [1] + strides, [1] + dilations, how).squeeze(2)
    if nd == 3:
        n, c, depth = x.shape[:3]
        plane = _window_reduce(x.reshape(n, c * depth, *x.shape[3:]), kernel[1:], strides[1:], dilations[1:], how)
        plane = plane.reshape(n, c, depth, *plane.shape[2:])
        kd, sd, dd = kernel[0], strides[0], dilations[0]
        od = (depth - (kd - 1) * dd - 1) // sd + 1
        out = None
        for k in range(kd):
            tap = plane[:, :, k * dd:k * dd + (od - 1) * sd + 1:sd]
            out = tap if out is None else (out + tap if how == "sum" else out.maximum(tap))
        return out
    n, c = x.shape[:2]
    oh, ow = _pool_shape(x, kernel, strides, dilations)
    cols = unfold2d(x, tuple(kernel), tuple(strides), 0, tuple(dilations)).reshape(n, c, kernel[0] * kernel[1], oh * ow)
    cols = cols.sum(2) if how == "sum" else cols.max(2)
    return cols.reshape(n, c, oh, ow)


def _pool_shape(x, kernel, strides, dilations):
    return tuple((size - (k - 1) * d - 1) // s + 1 for size, k, s, d in zip(x.shape[2:], kernel, strides, dilations))


@op(multi=True)
def MaxPool(X, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None, pads=None,
            storage_order=0, strides=None, outputs=1):
    if outputs > 1:
        raise OnnxError("MaxPool: the Indices output is not supported")
    kernel, strides, dilations, begins, ends = _windows(X, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    if X.ndim == 4 and X.dtype is float32 and begins == ends and all(2 * p <= k for p, k in zip(begins, kernel)):
        # functional's window (symmetric padding within half the kernel): one pool2d kernel
        # where the backend has it, with no padded copy
        return max_pool2d(X, tuple(kernel), tuple(strides), tuple(begins), tuple(dilations))
    floor = -math.inf if X.dtype is float32 else -2.0 ** 31
    x = _pad_spatial(X.cast(float32), begins, ends, floor)
    out = _window_reduce(x, kernel, strides, dilations, "max")
    return out if X.dtype is float32 else out.cast(X.dtype)


@op()
def AveragePool(X, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None,
                kernel_shape=None, pads=None, strides=None):
    kernel, strides, dilations, begins, ends = _windows(X, kernel_shape, strides, dilations, pads, auto_pad, 0)
    _, _, _, _, ceil_ends = _windows(X, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    extra = [ce - e for ce, e in zip(ceil_ends, ends)]          # what ceil_mode adds: never counted
    total_ends = [e + x_ for e, x_ in zip(ends, extra)]
    sums = _window_reduce(_pad_spatial(X, begins, total_ends, 0.0), kernel, strides, dilations, "sum")
    ones = cn.ones(1, 1, *X.shape[2:], backend=X.backend)
    if count_include_pad:
        mask = _pad_spatial(_pad_spatial(ones, begins, ends, 1.0), [0] * len(begins), extra, 0.0)
    else:
        mask = _pad_spatial(ones, begins, total_ends, 0.0)
    counts = _window_reduce(mask, kernel, strides, dilations, "sum")
    return sums / counts


@op()
def LpPool(X, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None, p=2, pads=None, strides=None):
    kernel, strides, dilations, begins, ends = _windows(X, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    x = _pad_spatial(X.abs() ** float(p), begins, ends, 0.0)
    return _window_reduce(x, kernel, strides, dilations, "sum") ** (1.0 / p)


@op()
def GlobalAveragePool(X):
    return X.mean(tuple(range(2, X.ndim)), keepdim=True)


@op()
def GlobalMaxPool(X):
    return X.max(tuple(range(2, X.ndim)), keepdim=True)


@op()
def GlobalLpPool(X, p=2):
    return (X.abs() ** float(p)).sum(tuple(range(2, X.ndim)), keepdim=True) ** (1.0 / p)
