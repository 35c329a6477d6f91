"""Images for inference, on Cinders tensors: an image is a (height, width, 3) float32 tensor of
RGB values in 0..255 on any backend, so the same code runs on the desktop, in Pyodide (no NumPy,
no OpenCV) and on the GPU.

    image = vision.read_image("photo.jpg", backend=cn.NumPy())    # desktop: decoded by Pillow
    image = vision.from_rgba(canvas_bytes, width, height, backend)  # a page: a canvas's pixels
    small = vision.resize(image, 48, 320)                           # bilinear, half-pixel centres
    x = vision.to_model_input(small, mean=0.5, std=0.5, bgr=True)   # (1, 3, h, w), normalised
    crop = vision.warp_quad(image, quad, width, height)             # a rotated text line, upright

Geometry on plain Python numbers (points are (x, y) tuples): `min_area_rect`, `convex_hull`,
`order_clockwise`, `homography`. Gathers are list indices into tensors, so every backend runs them.
"""

import math
import operator

from . import limits
from .creation import tensor
from .dtypes import int32
from .errors import InputError
from .tensor import Tensor, cat, default_backend


def read_image(path, backend=None):
    """A (h, w, 3) RGB tensor of an image file (any format Pillow reads)."""
    try:
        from PIL import Image
    except ImportError:
        raise InputError("reading %s needs Pillow (pip install pillow); in a page, decode the image in a "
                         "canvas and use vision.from_rgba" % ascii(path)) from None
    try:
        with Image.open(path) as im:
            im = im.convert("RGB")
            width, height = im.size
            data = im.tobytes()
    except (OSError, SyntaxError, ValueError) as e:
        raise InputError("%s is not an image Pillow can read (%s)" % (ascii(path), e)) from None
    return from_bytes(data, width, height, 3, backend)


def from_rgba(data, width, height, backend=None):
    """A (h, w, 3) RGB tensor of RGBA bytes (a canvas's getImageData), alpha dropped."""
    return from_bytes(data, width, height, 4, backend)


def from_bytes(data, width, height, channels, backend=None):
    """A (h, w, 3) RGB tensor of interleaved 8-bit pixels (channels beyond 3 dropped). The sizes
    are checked before anything is built: a `height` of "2" or 2**31 is refused, not multiplied."""
    sizes = []
    for name, value in (("width", width), ("height", height), ("channels", channels)):
        try:
            size = operator.index(value) if type(value) is not bool else 0
        except TypeError:
            size = 0
        if size < 1:
            raise InputError("from_bytes: %s must be a positive int, got %s" % (name, ascii(value)[:40]))
        sizes.append(size)
    width, height, channels = sizes
    try:
        data = bytes(memoryview(data).cast("B"))
    except (TypeError, ValueError):
        raise InputError("from_bytes: the pixels must be bytes, got %s" % type(data).__name__) from None
    if len(data) != width * height * channels:
        raise InputError("%d bytes are not a %dx%d image of %d channels" % (len(data), width, height, channels))
    limits.check_elements("from_bytes", len(data), element_bytes=limits.LIST_ELEMENT_BYTES)
    backend = backend or default_backend()
    shape = (height, width, channels)
    # Bytes are ints in 0..255 by construction: straight to the backend, without cn.tensor's
    # checks of every value (four passes over a photo's million values: most of a second in Pyodide).
    pixels = Tensor(backend, backend.from_flat(list(data), shape, int32), shape, int32)
    return pixels[:, :, :3] if channels > 3 else pixels


def _axis_weights(n_in, n_out):
    """(lower indices, upper indices, weight of the upper) along one axis: output i samples the
    input at (i + 0.5) * n_in / n_out - 0.5, clamped at the borders (OpenCV's INTER_LINEAR)."""
    scale = n_in / n_out
    lo, hi, w = [], [], []
    for i in range(n_out):
        s = max(0.0, (i + 0.5) * scale - 0.5)
        i0 = min(int(s), n_in - 1)
        lo.append(i0)
        hi.append(min(i0 + 1, n_in - 1))
        w.append(s - i0 if i0 < n_in - 1 else 0.0)
    return lo, hi, w


def resize(image, height, width):
    """Bilinear resize of a (h, w, c) image to (height, width, c)."""
    h, w, c = image.shape
    if (h, w) == (height, width):
        return image
    if height < 1 or width < 1:
        raise InputError("resize to %dx%d" % (width, height))
    y0, y1, wy = _axis_weights(h, height)
    wy = tensor(wy, backend=image.backend).reshape(height, 1, 1)
    rows = image[y0] * (1.0 - wy) + image[y1] * wy
    x0, x1, wx = _axis_weights(w, width)
    wx = tensor(wx, backend=image.backend).reshape(1, width, 1)
    return rows[:, x0] * (1.0 - wx) + rows[:, x1] * wx


def to_model_input(image, mean=0.5, std=0.5, bgr=False):
    """(1, 3, h, w): (pixel / 255 - mean) / std, channels first; bgr reverses the channel order
    (models trained on images OpenCV decoded, such as PaddleOCR's, expect BGR)."""
    if bgr:
        image = image[:, :, [2, 1, 0]]
    return ((image * (1.0 / 255.0) - mean) * (1.0 / std)).permute(2, 0, 1).unsqueeze(0)


def pad_width(x, width, value=0.0):
    """x (n, c, h, w) padded on the right to `width` columns."""
    n, c, h, w = x.shape
    if w >= width:
        return x
    filler = tensor([value], backend=x.backend).reshape(1, 1, 1, 1).expand(n, c, h, width - w)
    return cat([x, filler], 3)


def rotate90(image, times=1):
    """The image turned counter-clockwise by 90 degrees `times` times."""
    for _ in range(times % 4):
        image = image.transpose(0, 1)[::-1]
    return image


def homography(src, dst):
    """The 3x3 projective map (row-major list of 9) taking the 4 points src to the 4 points dst."""
    rows, rhs = [], []
    for (x, y), (u, v) in zip(src, dst):
        rows.append([x, y, 1.0, 0.0, 0.0, 0.0, -u * x, -u * y])
        rhs.append(u)
        rows.append([0.0, 0.0, 0.0, x, y, 1.0, -v * x, -v * y])
        rhs.append(v)
    return _solve(rows, rhs) + [1.0]


def _solve(a, b):
    """Gaussian elimination with partial pivoting (8x8 here)."""
    n = len(b)
    m = [row[:] + [bv] for row, bv in zip(a, b)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-12:
            raise InputError("the four points of a quadrilateral are degenerate")
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [x - f * y for x, y in zip(m[r], m[col])]
    return [m[i][n] / m[i][i] for i in range(n)]


def warp_quad(image, quad, width, height):
    """The quadrilateral `quad` (4 (x, y) points: top-left, top-right, bottom-right, bottom-left)
    of a (h, w, c) image mapped onto a width x height rectangle, bilinear, edges replicated."""
    h, w, c = image.shape
    m = homography([(0, 0), (width, 0), (width, height), (0, height)], quad)
    corners = ([], [], [], [])
    weights = ([], [], [], [])
    for v in range(height):
        for u in range(width):
            # pixel centres, as OpenCV's warpPerspective samples them
            x, y = u, v
            d = m[6] * x + m[7] * y + m[8]
            sx = min(max((m[0] * x + m[1] * y + m[2]) / d, 0.0), w - 1.0)
            sy = min(max((m[3] * x + m[4] * y + m[5]) / d, 0.0), h - 1.0)
            x0, y0 = int(sx), int(sy)
            x1, y1 = min(x0 + 1, w - 1), min(y0 + 1, h - 1)
            fx, fy = sx - x0, sy - y0
            for k, (i, wt) in enumerate(((y0 * w + x0, (1 - fx) * (1 - fy)), (y0 * w + x1, fx * (1 - fy)),
                                         (y1 * w + x0, (1 - fx) * fy), (y1 * w + x1, fx * fy))):
                corners[k].append(i)
                weights[k].append(wt)
    flat = image.reshape(h * w, c)
    out = None
    for index, wt in zip(corners, weights):
        term = flat[index] * tensor(wt, backend=image.backend).reshape(width * height, 1)
        out = term if out is None else out + term
    return out.reshape(height, width, c)


# ---------------------------------------------------------------------------------- geometry

def convex_hull(points):
    """Convex hull of (x, y) points, counter-clockwise (Andrew's monotone chain)."""
    pts = sorted(set(points))
    if len(pts) <= 2:
        return pts

    def half(seq):
        out = []
        for p in seq:
            while len(out) >= 2 and _cross(out[-2], out[-1], p) <= 0:
                out.pop()
            out.append(p)
        return out
    lower, upper = half(pts), half(reversed(pts))
    return lower[:-1] + upper[:-1]


def _cross(o, a, b):
    return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])


def min_area_rect(points):
    """(corners, (side along the edge, side across)) of the smallest rectangle holding the
    points: one side lies on an edge of their convex hull (rotating calipers)."""
    hull = convex_hull(points)
    if len(hull) == 1:
        x, y = hull[0]
        return [(x, y)] * 4, (0.0, 0.0)
    best = None
    for i in range(len(hull)):
        (x0, y0), (x1, y1) = hull[i], hull[(i + 1) % len(hull)]
        length = math.hypot(x1 - x0, y1 - y0)
        if length == 0:
            continue
        ux, uy = (x1 - x0) / length, (y1 - y0) / length
        along = [(px - x0) * ux + (py - y0) * uy for px, py in hull]
        across = [-(px - x0) * uy + (py - y0) * ux for px, py in hull]
        a0, a1, c0, c1 = min(along), max(along), min(across), max(across)
        area = (a1 - a0) * (c1 - c0)
        if best is None or area < best[0]:
            best = (area, x0, y0, ux, uy, a0, a1, c0, c1)
    if best is None:
        x, y = hull[0]
        return [(x, y)] * 4, (0.0, 0.0)
    _, x0, y0, ux, uy, a0, a1, c0, c1 = best

    def at(a, c):
        return (x0 + a * ux - c * uy, y0 + a * uy + c * ux)
    return [at(a0, c0), at(a1, c0), at(a1, c1), at(a0, c1)], (a1 - a0, c1 - c0)


def expand_rect(corners, distance):
    """A rectangle grown by `distance` on every side, about its centre."""
    cx = sum(p[0] for p in corners) / 4
    cy = sum(p[1] for p in corners) / 4
    (x0, y0), (x1, y1), _, (x3, y3) = corners
    a, b = math.hypot(x1 - x0, y1 - y0), math.hypot(x3 - x0, y3 - y0)
    ua = ((x1 - x0) / a, (y1 - y0) / a) if a else (1.0, 0.0)
    ub = ((x3 - x0) / b, (y3 - y0) / b) if b else (-ua[1], ua[0])
    ha, hb = a / 2 + distance, b / 2 + distance
    return [(cx + sa * ha * ua[0] + sb * hb * ub[0], cy + sa * ha * ua[1] + sb * hb * ub[1])
            for sa, sb in ((-1, -1), (1, -1), (1, 1), (-1, 1))]


def order_clockwise(corners):
    """The 4 corners as top-left, top-right, bottom-right, bottom-left (image coordinates)."""
    by_x = sorted(corners, key=lambda p: p[0])
    left = sorted(by_x[:2], key=lambda p: p[1])
    right = sorted(by_x[2:], key=lambda p: p[1])
    return [left[0], right[0], right[1], left[1]]


def inside_convex(quad, x, y):
    """Whether (x, y) is inside (or on) the convex quadrilateral `quad` (any orientation)."""
    sign = 0
    for i in range(4):
        c = _cross(quad[i], quad[(i + 1) % 4], (x, y))
        if c:
            if sign and (c > 0) != (sign > 0):
                return False
            sign = c
    return True
