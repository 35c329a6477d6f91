"""Reading text (cinders.apps.ocr, `cinders ocr`) on PP-OCR's shipped models: text that PIL
renders in Debian's DejaVu fonts (several faces and sizes, a rotated line, light on dark) is read
back exactly; the geometry helpers of cinders.vision against exact answers."""
import json
import math

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont

import cinders as cn
from cinders import vision
from cinders.apps.ocr import TextReader, ctc_greedy, reading_order
from cinders.cli import main as cli

FONTS = "/usr/share/fonts/truetype/dejavu/"
# (text, font file, size, where, colours): one image holds every case, so the detector runs once
LINES = [
    ("Hello Cinders", "DejaVuSans.ttf", 36, (40, 40)),
    ("Reading text in a tab", "DejaVuSerif.ttf", 30, (40, 130)),
    ("OCR 2026-11-26 at 19:45", "DejaVuSansMono.ttf", 24, (40, 220)),
]
DARK = ("Light on dark", "DejaVuSans-Bold.ttf", 32, (360, 330))
ROTATED = ("Tilted line", "DejaVuSans.ttf", 34, (40, 380), 8)   # degrees, counter-clockwise


def render(path):
    image = Image.new("RGB", (640, 480), "white")
    draw = ImageDraw.Draw(image)
    for text, face, size, at in LINES:
        draw.text(at, text, fill="black", font=ImageFont.truetype(FONTS + face, size))
    text, face, size, (x, y) = DARK
    draw.rectangle([x - 20, y - 20, 630, y + 60], fill=(20, 24, 40))
    draw.text((x, y), text, fill=(240, 240, 240), font=ImageFont.truetype(FONTS + face, size))
    text, face, size, (x, y), angle = ROTATED
    line = Image.new("RGB", (300, 60), "white")
    ImageDraw.Draw(line).text((10, 5), text, fill="black", font=ImageFont.truetype(FONTS + face, size))
    line = line.rotate(angle, expand=True, fillcolor="white")
    image.paste(line, (x, y))
    image.save(path)
    return path


@pytest.fixture(scope="module")
def picture(tmp_path_factory):
    return render(tmp_path_factory.mktemp("ocr") / "text.png")


@pytest.fixture(scope="module")
def read_back(picture):
    reader = TextReader(backend=cn.NumPy())
    return reader.read(vision.read_image(str(picture), backend=cn.NumPy()))


def test_every_rendered_line_is_read_exactly(read_back):
    texts = [line["text"] for line in read_back]
    want = {LINES[0][0], LINES[1][0], LINES[2][0], DARK[0], ROTATED[0]}
    assert set(texts) == want, texts
    assert all(0.5 <= line["score"] <= 1.0 for line in read_back)


def test_lines_come_top_to_bottom_with_their_boxes(read_back):
    tops = [min(y for _, y in line["box"]) for line in read_back]
    assert tops == sorted(tops)
    by_text = {line["text"]: line["box"] for line in read_back}
    text, face, size, (x, y) = LINES[0]
    box = by_text[text]
    assert abs(box[0][0] - x) <= 8 and abs(box[0][1] - y) <= 12      # top-left near where PIL drew it
    width = ImageFont.truetype(FONTS + face, size).getlength(text)
    assert abs((box[1][0] - box[0][0]) - width) <= 16
    # the tilted line's box is tilted the same way, its right end higher (by less than the text's
    # 8 degrees: the box is the smallest rectangle around the detected blob, whose top follows
    # the letters' uneven heights)
    tilted = by_text[ROTATED[0]]
    slope = math.degrees(math.atan2(tilted[0][1] - tilted[1][1], tilted[1][0] - tilted[0][0]))
    assert 2 <= slope <= ROTATED[4] + 2, tilted


def test_cli_prints_the_lines_as_json(picture, read_back, capsys):
    assert cli(["ocr", str(picture)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [line["text"] for line in out["lines"]] == [line["text"] for line in read_back]
    assert all(len(line["box"]) == 4 for line in out["lines"])


def test_cli_refuses_a_file_that_is_no_image(tmp_path, capsys):
    bad = tmp_path / "x.png"
    bad.write_bytes(b"not an image")
    assert cli(["ocr", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "not an image" in err and "Traceback" not in err


def test_ctc_greedy_merges_repeats_and_drops_blanks():
    chars = ["<blank>", "a", "b"]
    steps = [(1, 0.8), (1, 0.7), (0, 0.9), (1, 0.6), (2, 0.8)]
    text, score = ctc_greedy(steps, chars)
    assert text == "aab" and score == pytest.approx((0.8 + 0.6 + 0.8) / 3)


def test_min_area_rect_of_a_rotated_rectangle():
    angle = math.radians(30)
    ux, uy = math.cos(angle), math.sin(angle)
    pts = [(10 + a * ux - b * uy, 20 + a * uy + b * ux) for a in range(0, 41, 2) for b in range(0, 11)]
    corners, (along, across) = vision.min_area_rect(pts)
    assert sorted([along, across]) == pytest.approx([10, 40], abs=1e-6)
    grown = vision.expand_rect(corners, 2.0)
    _, sides = vision.min_area_rect(grown)
    assert sorted(sides) == pytest.approx([14, 44], abs=1e-6)


def test_warp_quad_cuts_out_an_axis_aligned_box_exactly():
    data = np.arange(6 * 8 * 3, dtype=np.float32).reshape(6, 8, 3)
    image = cn.tensor(data, backend=cn.NumPy())
    crop = vision.warp_quad(image, [(2, 1), (6, 1), (6, 4), (2, 4)], 4, 3)
    assert np.array_equal(crop.numpy(), data[1:4, 2:6])


@pytest.mark.parametrize("make", [cn.NumPy, cn.Python], ids=["numpy", "python"])
def test_resize_matches_pil_bilinear_on_upscale(make):
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, (5, 7, 3)).astype(np.float32)
    got = vision.resize(cn.tensor(data, backend=make()), 10, 14).numpy()
    # exact half-pixel bilinear interpolation, written out
    def axis(n_in, n_out):
        s = np.maximum((np.arange(n_out) + 0.5) * n_in / n_out - 0.5, 0)
        i0 = np.minimum(s.astype(int), n_in - 1)
        return i0, np.minimum(i0 + 1, n_in - 1), np.where(i0 < n_in - 1, s - i0, 0)
    y0, y1, wy = axis(5, 10)
    x0, x1, wx = axis(7, 14)
    rows = data[y0] * (1 - wy)[:, None, None] + data[y1] * wy[:, None, None]
    want = rows[:, x0] * (1 - wx)[None, :, None] + rows[:, x1] * wx[None, :, None]
    assert np.allclose(got, want, atol=1e-3)


def test_reading_order_puts_a_row_left_to_right():
    boxes = [[(300, 14), (400, 14), (400, 40), (300, 40)], [(10, 10), (100, 10), (100, 40), (10, 40)],
             [(10, 100), (90, 100), (90, 130), (10, 130)]]
    assert [b[0] for b in reading_order(boxes)] == [(10, 10), (300, 14), (10, 100)]
