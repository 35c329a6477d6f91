"""Image augmentation on the CPU (desktop only: NumPy), for batches of grayscale images.

One resampling pass per batch: every output pixel looks up where it came from under a random
affine map (rotation, scale, shift) plus an optional smooth elastic displacement, then samples
the source bilinearly with zero outside. Parameters come from the batch's `random.Random`, so
a batch is the same whichever worker thread builds it.
"""

import math


class RandomDistortion:
    """fn(images (B, H, W) float32, rng) -> distorted images.

    rotate: max degrees either way; scale: max relative zoom either way; shift: max pixels
    either way; elastic: displacement strength in pixels (0 disables), smoothed with a Gaussian
    of width `sigma` pixels (Simard et al. 2003).
    """

    def __init__(self, rotate=10.0, scale=0.1, shift=2.0, elastic=0.0, sigma=4.0):
        self.rotate = rotate
        self.scale = scale
        self.shift = shift
        self.elastic = elastic
        self.sigma = sigma

    def __call__(self, images, rng):
        import numpy as np
        b, h, w = images.shape
        angle = np.array([rng.uniform(-self.rotate, self.rotate) for _ in range(b)]) * (math.pi / 180)
        zoom = np.array([1.0 + rng.uniform(-self.scale, self.scale) for _ in range(b)])
        dy = np.array([rng.uniform(-self.shift, self.shift) for _ in range(b)])
        dx = np.array([rng.uniform(-self.shift, self.shift) for _ in range(b)])
        cy, cx = (h - 1) / 2.0, (w - 1) / 2.0
        ys, xs = np.meshgrid(np.arange(h) - cy, np.arange(w) - cx, indexing="ij")
        # Inverse map: output pixel -> source pixel (undo the shift, then the rotation and zoom).
        oy = ys[None] - dy[:, None, None]
        ox = xs[None] - dx[:, None, None]
        cos = (np.cos(angle) / zoom)[:, None, None]
        sin = (np.sin(angle) / zoom)[:, None, None]
        sy = cos * oy - sin * ox + cy
        sx = sin * oy + cos * ox + cx
        if self.elastic:
            noise = np.random.default_rng(rng.getrandbits(63)).uniform(-1, 1, size=(2, b, h, w))
            gy, gx = _gaussian_matrix(h, self.sigma), _gaussian_matrix(w, self.sigma)
            field = gy @ noise @ gx.T  # separable Gaussian smoothing of each field
            field *= self.elastic / max(np.abs(field).max(), 1e-6)
            sy = sy + field[0]
            sx = sx + field[1]
        return bilinear_sample(images, sy, sx).astype(np.float32)


def _gaussian_matrix(n, sigma):
    import numpy as np
    i = np.arange(n)
    g = np.exp(-((i[:, None] - i[None, :]) ** 2) / (2.0 * sigma * sigma))
    return g / g.sum(axis=1, keepdims=True)


def bilinear_sample(images, sy, sx):
    """images (B, H, W) sampled at fractional source coordinates sy, sx (B, H, W); 0 outside."""
    import numpy as np
    b, h, w = images.shape
    y0 = np.floor(sy).astype(np.int64)
    x0 = np.floor(sx).astype(np.int64)
    fy = sy - y0
    fx = sx - x0
    flat = images.reshape(b, h * w)
    out = np.zeros(sy.shape, dtype=np.float64)
    for oy, ox, weight in ((0, 0, (1 - fy) * (1 - fx)), (0, 1, (1 - fy) * fx),
                           (1, 0, fy * (1 - fx)), (1, 1, fy * fx)):
        yy, xx = y0 + oy, x0 + ox
        inside = (yy >= 0) & (yy < h) & (xx >= 0) & (xx < w)
        index = (np.clip(yy, 0, h - 1) * w + np.clip(xx, 0, w - 1)).reshape(b, -1)
        values = np.take_along_axis(flat, index, axis=1).reshape(sy.shape)
        out += np.where(inside, values, 0.0) * weight
    return out
