"""Convolution and pooling of the `array('f')` engine (see _array.py), in their own module so
that models without them do not hold their code in RAM."""

from cinders._array import UNARY_FN, _buffer, _relu
from cinders._window import window_count
from cinders._tensor import Tensor, empty

# float("-inf"), not -math.inf: the compiler folds math.inf into a constant, which mpy-tool
# writes into frozen C code as `-inf` (no such C name), so frozen firmware would not build
_NEG_INF = float("-inf")


def _span(offset, stride, size, out_size):
    """Output positions o whose input position o * stride + offset lies inside [0, size)."""
    lo = max(0, (stride - 1 - offset) // stride)
    hi = min(out_size, (size - 1 - offset) // stride + 1)
    return lo, hi


def conv2d(x, weight, bias, out_channels, kernel, stride, padding, dilation, act=None,
           pool=None):
    """Direct convolution, one kernel tap at a time over whole output rows (no im2col: the
    unfolded matrix of a 16-channel 14x14 input alone would need 113 KB).

    With `act` (a unary op name) and/or `pool` ((kernel, stride, padding, mode)), each output
    channel is computed into a scratch plane, activated and pooled there, and only the pooled
    plane is stored: conv16 -> relu -> pool on 28x28 keeps 12.5 KB instead of 50 KB.
    """
    _, C, H, W = x.shape
    kh, kw = kernel
    sh, sw = stride
    ph, pw = padding
    dh, dw = dilation
    OH = window_count(H, kh, sh, ph, dh)
    OW = window_count(W, kw, sw, pw, dw)
    plane = OH * OW
    if pool is not None:
        PH, PW = _pool_out(OH, OW, pool)
    else:
        PH, PW = OH, OW
    out, slot = _buffer(x, out_channels * PH * PW)
    work = _scratch(plane) if (act is not None or pool is not None) else None
    xd = x.data
    scale = weight.scale
    b = bias.data if bias is not None else None
    f = UNARY_FN.get(act)
    for oc, _, row in weight.chunks(1):
        dst = out[oc * PH * PW:(oc + 1) * PH * PW]
        acc = work if work is not None else dst
        v = b[oc] if b is not None else 0.0
        for o in range(plane):
            acc[o] = v
        sc = scale[oc] if scale is not None else 1.0
        t = 0
        for c in range(C):
            cbase = c * H * W
            for ky in range(kh):
                oy0, oy1 = _span(ky * dh - ph, sh, H, OH)
                for kx in range(kw):
                    wv = row[t] * sc
                    t += 1
                    ox0, ox1 = _span(kx * dw - pw, sw, W, OW)
                    if wv == 0.0 or oy0 >= oy1 or ox0 >= ox1:
                        continue
                    for oy in range(oy0, oy1):
                        i = cbase + (oy * sh + ky * dh - ph) * W + ox0 * sw + kx * dw - pw
                        o0 = oy * OW + ox0
                        if sw == 1:  # the common case: one index serves both rows
                            d = i - o0
                            for o in range(o0, o0 + ox1 - ox0):
                                acc[o] += wv * xd[o + d]
                        else:
                            for o in range(o0, o0 + ox1 - ox0):
                                acc[o] += wv * xd[i]
                                i += sw
        if act == "relu":
            _relu(acc, plane)
        elif f is not None:
            for o in range(plane):
                acc[o] = f(acc[o])
        if pool is not None:
            _pool_plane(acc, OH, OW, dst, pool)
        elif work is not None:
            for o in range(plane):
                dst[o] = acc[o]
    return Tensor(out, (1, out_channels, PH, PW), slot)


_scratch_buf = [None]


def _scratch(n):
    a = _scratch_buf[0]
    if a is None or len(a) < n:
        _scratch_buf[0] = a = None
        a = _scratch_buf[0] = empty("f", n)
    return memoryview(a)[:n]


def _pool_out(H, W, pool):
    (kh, kw), (sh, sw), (ph, pw), _ = pool
    return window_count(H, kh, sh, ph, 1), window_count(W, kw, sw, pw, 1)


def _pool_plane(src, H, W, dst, pool):
    """Pool one H x W plane into dst. mode "max", "avg" (the padding counts, torch's default)
    or "avg_valid" (it does not)."""
    (kh, kw), (sh, sw), (ph, pw), mode = pool
    OH, OW = _pool_out(H, W, pool)
    is_max = mode == "max"
    inv = 1.0 / (kh * kw)
    o = 0
    for oy in range(OH):
        y0 = oy * sh - ph
        iy0, iy1 = max(0, y0), min(H, y0 + kh)
        for ox in range(OW):
            x0 = ox * sw - pw
            ix0, ix1 = max(0, x0), min(W, x0 + kw)
            acc = _NEG_INF if is_max else 0.0
            for iy in range(iy0, iy1):
                r = iy * W
                for ix in range(r + ix0, r + ix1):
                    v = src[ix]
                    if is_max:
                        if v > acc:
                            acc = v
                    else:
                        acc += v
            if mode == "avg_valid":
                inv = 1.0 / ((iy1 - iy0) * (ix1 - ix0))
            dst[o] = acc if is_max else acc * inv
            o += 1


def pool2d(x, kernel, stride, padding, mode):
    _, C, H, W = x.shape
    pool = (kernel, stride, padding, mode)
    OH, OW = _pool_out(H, W, pool)
    out, slot = _buffer(x, C * OH * OW)
    src = memoryview(x.data)
    for c in range(C):
        _pool_plane(src[c * H * W:(c + 1) * H * W], H, W, out[c * OH * OW:(c + 1) * OH * OW], pool)
    return Tensor(out, (1, C, OH, OW), slot)
