"""ONNX operators: resizing."""

import math

import cinders as cn
from ...backend import numel
from ...dtypes import float32, int32
from ...indexing import _take
from ...limits import LIST_ELEMENT_BYTES, check_shape
from ..proto import OnnxError
from .base import _axis, host, ints, op


def _source_coords(out_size, in_size, scale, mode, roi_start=0.0, roi_end=1.0):
    """Input coordinate (float) of each output index along one axis."""
    coords = []
    for i in range(out_size):
        if mode == "half_pixel":
            x = (i + 0.5) / scale - 0.5
        elif mode == "pytorch_half_pixel":
            x = (i + 0.5) / scale - 0.5 if out_size > 1 else 0.0
        elif mode == "align_corners":  # the resized length is in_size * scale, unrounded
            x = i * (in_size - 1) / (in_size * scale - 1) if in_size * scale > 1 else 0.0
        elif mode == "asymmetric":
            x = i / scale
        elif mode == "tf_crop_and_resize":
            x = (roi_start * (in_size - 1) + i * (roi_end - roi_start) * (in_size - 1) / (out_size - 1)
                 if out_size > 1 else 0.5 * (roi_start + roi_end) * (in_size - 1))
        elif mode == "half_pixel_symmetric":
            adj = out_size / (scale * in_size)
            centre = in_size / 2
            offset = centre * (1 - adj)
            x = offset + (i + 0.5) / scale - 0.5
        else:
            raise OnnxError("Resize: coordinate_transformation_mode %r is not supported" % (mode,))
        coords.append(x)
    return coords


def _nearest(x, mode):
    if mode == "round_prefer_floor":
        return math.ceil(x - 0.5)
    if mode == "floor":
        return math.floor(x)
    if mode == "ceil":
        return math.ceil(x)
    return math.floor(x + 0.5)   # round_prefer_ceil (the default)


def _resize_axis(x, axis, out_size, scale, mode, transform, nearest_mode, cubic_a, exclude_outside,
                 extrapolation, roi):
    n = x.shape[axis]
    coords = _source_coords(out_size, n, scale, transform, *roi)
    outside = [c < 0 or c > n - 1 for c in coords] if transform == "tf_crop_and_resize" else None
    if mode == "nearest":
        idx = [min(max(_nearest(c, nearest_mode), 0), n - 1) for c in coords]
        out = _take(x, axis, cn.tensor(idx, backend=x.backend, dtype=int32))
    else:
        if mode == "linear":
            taps = [(math.floor(c), [1 - (c - math.floor(c)), c - math.floor(c)]) for c in coords]
            offsets = [0, 1]
        else:  # cubic
            a = cubic_a
            offsets = [-1, 0, 1, 2]
            taps = []
            for c in coords:
                f = math.floor(c)
                t = c - f
                ws = [_cubic(t + 1, a), _cubic(t, a), _cubic(1 - t, a), _cubic(2 - t, a)]
                taps.append((f, ws))
        weights = [[0.0] * len(offsets) for _ in coords]
        indices = [[0] * len(offsets) for _ in coords]
        for i, (f, ws) in enumerate(taps):
            total = 0.0
            for j, o in enumerate(offsets):
                src = f + o
                inside = 0 <= src < n
                w = ws[j]
                if exclude_outside and not inside:
                    w = 0.0
                weights[i][j] = w
                indices[i][j] = min(max(src, 0), n - 1)
                total += w
            if exclude_outside and total:
                weights[i] = [w / total for w in weights[i]]
        out = None
        for j in range(len(offsets)):
            picked = _take(x, axis, cn.tensor([row[j] for row in indices], backend=x.backend, dtype=int32))
            w = cn.tensor([row[j] for row in weights], backend=x.backend).reshape(
                [out_size if d == axis else 1 for d in range(x.ndim)])
            term = picked * w
            out = term if out is None else out + term
    if outside is not None and any(outside):
        mask = cn.tensor(outside, backend=x.backend).reshape([out_size if d == axis else 1 for d in range(x.ndim)])
        out = cn.where(mask, extrapolation, out)
    return out


def _cubic(s, a):
    s = abs(s)
    if s <= 1:
        return (a + 2) * s ** 3 - (a + 3) * s ** 2 + 1
    if s < 2:
        return a * s ** 3 - 5 * a * s ** 2 + 8 * a * s - 4 * a
    return 0.0


@op(host=("roi", "scales", "sizes"))
def Resize(X, roi=None, scales=None, sizes=None, antialias=0, axes=None, coordinate_transformation_mode="half_pixel",
           cubic_coeff_a=-0.75, exclude_outside=0, extrapolation_value=0.0, keep_aspect_ratio_policy="stretch",
           mode="nearest", nearest_mode="round_prefer_floor", opset=13):
    if antialias:
        raise OnnxError("Resize: antialias is not supported")
    rank = X.ndim
    axes = [_axis(a, rank) for a in axes] if axes else list(range(rank))
    scales = [float(s) for s in (host(scales) or [])]
    sizes = ints(sizes) or []
    roi = [float(r) for r in (host(roi) or [])]
    if not all(math.isfinite(v) and v >= 0 for v in scales) or any(v < 0 for v in sizes) \
            or len(scales or sizes) != len(axes) and (scales or sizes):
        raise OnnxError("Resize: scales %s / sizes %s are not one finite, non-negative value per axis of %s"
                        % (scales[:8], sizes[:8], axes))
    if opset < 11:
        coordinate_transformation_mode, nearest_mode = "asymmetric", "floor"
    full_scales = {a: 1.0 for a in range(rank)}
    full_sizes = {a: X.shape[a] for a in range(rank)}
    if sizes:
        if keep_aspect_ratio_policy != "stretch":
            ratios = [sizes[i] / X.shape[a] for i, a in enumerate(axes)]
            r = min(ratios) if keep_aspect_ratio_policy == "not_larger" else max(ratios)
            sizes = [int(r * X.shape[a] + 0.5) for a in axes]
            for i, a in enumerate(axes):
                full_scales[a], full_sizes[a] = r, sizes[i]
        else:
            for i, a in enumerate(axes):
                full_sizes[a] = sizes[i]
                full_scales[a] = sizes[i] / X.shape[a]
    else:
        for i, a in enumerate(axes):
            full_scales[a] = scales[i]
            full_sizes[a] = int(math.floor(X.shape[a] * scales[i]))
    # checked before any coordinate list is built: scales of 1e9 would build them for minutes
    if any(v < 0 for v in full_sizes.values()):
        raise OnnxError("Resize: negative output size %s" % (list(full_sizes.values()),))
    check_shape("Resize", tuple(full_sizes.values()), LIST_ELEMENT_BYTES)
    rois = {a: (0.0, 1.0) for a in range(rank)}
    if roi:
        k = len(roi) // 2
        for i, a in enumerate(axes if k == len(axes) else range(rank)):
            rois[a] = (roi[i], roi[i + k])
    x = X.cast(float32)
    for a in range(rank):
        if full_sizes[a] == X.shape[a] and full_scales[a] == 1.0 and coordinate_transformation_mode != "tf_crop_and_resize":
            continue
        x = _resize_axis(x, a, full_sizes[a], full_scales[a], mode, coordinate_transformation_mode,
                         nearest_mode, cubic_coeff_a, exclude_outside, extrapolation_value, rois[a])
    return x if X.dtype is float32 else x.cast(X.dtype)


@op(host=("scales",))
def Upsample(X, scales=None, mode="nearest", height_scale=None, width_scale=None):
    return Resize(X, None, scales, coordinate_transformation_mode="asymmetric", mode=mode,
                  nearest_mode="floor")


def _reflect(p, lo, hi):
    """Reflect float coordinates p into [lo, hi] by the nearer border, repeatedly (GridSample)."""
    span = hi - lo
    if span <= 0:
        return p * 0.0 + lo
    below, above = lo - p, p - hi
    out = p
    for dist, start, sign in ((below, lo, 1.0), (above, hi, -1.0)):
        flips = (dist / span).floor()
        rest = dist - flips * span
        even = (flips % 2.0) == 0.0
        reflected = cn.where(even, start + rest * sign, (hi if sign > 0 else lo) - rest * sign)
        out = cn.where(dist > 0, reflected, out)
    return out


@op()
def GridSample(X, grid, align_corners=0, mode="linear", padding_mode="zeros"):
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    n, c = X.shape[:2]
    spatial = X.shape[2:]
    nd = len(spatial)
    out_spatial = grid.shape[1:-1]
    count = numel(out_spatial)
    g = grid.reshape(n, count, nd)
    per_dim = []        # per spatial dim: [(int32 index (n, L), float weight (n, L))]
    for d, size in enumerate(spatial):
        v = g[:, :, nd - 1 - d]                     # the grid's last component is the last dim
        p = (v + 1.0) * 0.5 * (size - 1) if align_corners else ((v + 1.0) * size - 1.0) * 0.5
        lo, hi = (0.0, size - 1.0) if align_corners else (-0.5, size - 0.5)
        if padding_mode == "border":
            p = cn.where((p < lo) | (p > hi), p.maximum(0.0).minimum(size - 1.0), p)
        elif padding_mode == "reflection":
            p = _reflect(p, lo, hi)
        if mode == "nearest":
            taps = [(p.round(), None)]
        elif mode == "linear":
            f = p.floor()
            t = p - f
            taps = [(f, 1.0 - t), (f + 1.0, t)]
        else:
            f = p.floor()
            t = p - f
            a = -0.75
            w = [((a * (t + 1) - 5 * a) * (t + 1) + 8 * a) * (t + 1) - 4 * a,
                 ((a + 2) * t - (a + 3)) * t * t + 1,
                 ((a + 2) * (1 - t) - (a + 3)) * (1 - t) * (1 - t) + 1]
            w.append(1.0 - w[0] - w[1] - w[2])
            taps = [(f + float(k), w[k + 1]) for k in (-1, 0, 1, 2)]
        resolved = []
        for pos, weight in taps:
            if padding_mode == "zeros":
                inside = ((pos >= 0) & (pos <= size - 1)).cast(float32)
                weight = inside if weight is None else weight * inside
            elif padding_mode == "reflection":
                pos = _reflect(pos, lo, hi)
            idx = pos.maximum(0.0).minimum(size - 1.0).cast(int32)
            resolved.append((idx, weight))
        per_dim.append(resolved)
    flat = X.reshape(n, c, numel(spatial))
    strides = [numel(spatial[d + 1:]) for d in range(nd)]
    out = None

    def combine(d, index, weight):
        nonlocal out
        if d == nd:
            picked = flat.gather(2, index.unsqueeze(1).expand(n, c, count))
            term = picked if weight is None else picked * weight.unsqueeze(1)
            out = term if out is None else out + term
            return
        for idx, w in per_dim[d]:
            part = idx * strides[d]
            combine(d + 1, part if index is None else index + part,
                    w if weight is None else (weight if w is None else weight * w))
    combine(0, None, None)
    return out.reshape((n, c) + tuple(out_spatial))
