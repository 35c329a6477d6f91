"""Reading text: PP-OCR (rapidocr 3.10.0's models, Apache-2.0) on Cinders, any backend.

    reader = TextReader(backend=cn.NumPy())        # the shipped models, fetched on first use
    reader.read(vision.read_image("photo.png"))    # [{"text", "score", "box"}], top to bottom
    read_text("photo.png")                          # {"lines": [...]}: what `cinders ocr` prints

Detection (DB) gives a text-probability map; its binarised, dilated regions become minimum-area
rectangles grown by the unclip ratio; each is cut out upright (a perspective warp), turned
right way up when the angle classifier says it is upside down, and read by the recogniser, whose
per-column character probabilities are decoded greedily (CTC: repeats merged, blanks dropped).
The defaults are rapidocr's. The models are imported ONNX graphs like any other; everything
around them is pure Python on Cinders tensors, so it runs in Pyodide too.
"""

import math
import time

from .. import vision
from ..capture import capture
from ..dtypes import float32
from ..errors import InputError
from ..functional import stack

DET_LIMIT_SIDE = 736          # the shorter side is scaled up to this (a multiple of 32 after)
DET_THRESHOLD = 0.3           # text probability that marks a pixel as text
BOX_THRESHOLD = 0.5           # mean probability a region needs to be a line
UNCLIP_RATIO = 1.6            # how far a region grows: area * ratio / perimeter on each side
MIN_SIDE = 3
CLS_SHAPE = (48, 192)
CLS_THRESHOLD = 0.9           # confidence needed to turn a line by 180 degrees
REC_HEIGHT, REC_MIN_WIDTH = 48, 320
TEXT_SCORE = 0.5              # lines read with less confidence are dropped


class TextReader:
    """Detection, angle classification and recognition models, and the steps between them.

    det_limit_side: the detector's shorter side is scaled up to this (rapidocr's 736); a smaller
    one reads small, large text faster (the page's test uses 160)."""

    def __init__(self, det=None, cls=None, rec=None, backend=None, det_limit_side=DET_LIMIT_SIDE):
        from ..onnx import load
        from .shipped import model_path
        self.backend = backend
        self.det_limit_side = det_limit_side
        rec_path = rec or model_path("PP-OCRv6_rec_small.onnx")
        # The classifier (one line shape) and the recogniser (per line width; the most recently
        # used widths keep their programs) replay their kernels where the backend records them
        # (cn.capture). The detector does not: its kernels dominate its time, and a program
        # keeps a whole forward's activations (hundreds of MB for a photo in a tab's memory).
        self.det = load(det or model_path("PP-OCRv6_det_small.onnx"), backend=backend)
        self.cls = capture(load(cls or model_path("ch_ppocr_mobile_v2.0_cls_mobile.onnx"), backend=backend))
        self.rec = capture(load(rec_path, backend=backend))
        self.characters = ["<blank>"] + recogniser_characters(rec_path) + [" "]

    def read(self, image, timings=None):
        """[{"text", "score", "box": [[x, y] * 4]}] of a (h, w, 3) RGB image, top to bottom, then
        left to right. timings, a dict, gets the milliseconds spent in each stage."""
        steps = self.steps(image, {} if timings is None else timings)
        try:
            tensor = next(steps)
            while True:
                tensor = steps.send(tensor.tolist())
        except StopIteration as done:
            return done.value

    async def read_async(self, image, timings=None):
        """read() that awaits each tensor it reads (the browser's WebGPU cannot block)."""
        steps = self.steps(image, {} if timings is None else timings)
        try:
            tensor = next(steps)
            while True:
                tensor = steps.send(await tensor.to_data_async())
        except StopIteration as done:
            return done.value

    def steps(self, image, timings):
        """The one implementation of reading, as a generator: it yields each tensor it must read and
        is sent back its values (nested lists), so read() and read_async() only differ in how they
        read. Returns the lines; timings gets ms per stage (detect, boxes, classify, recognise)."""
        for stage in ("detect", "boxes", "classify", "recognise"):
            timings.setdefault(stage, 0.0)
        clock = _Clock(timings)
        h, w, _ = image.shape
        probability = yield self.detect_input(image)
        clock.lap("detect")
        boxes = reading_order(boxes_from_map(probability[0][0], w, h))
        clock.lap("boxes")
        lines = []
        for box in boxes:
            crop = upright_crop(image, box)
            upright, flipped = (yield self.cls(_line_input(crop, CLS_SHAPE[0], CLS_SHAPE[1], CLS_SHAPE[1])))[0]
            crop = oriented(crop, upright, flipped)
            clock.lap("classify")
            # Per step the likeliest character and its probability, found where the (time,
            # characters) probabilities are: a few numbers per step are read, not thousands.
            columns = self.rec(recogniser_input(crop))[0]
            best = yield stack([columns.argmax(-1).cast(float32), columns.max(-1)], -1)
            text, score = ctc_greedy([(int(i), p) for i, p in best], self.characters)
            clock.lap("recognise")
            if text and score >= TEXT_SCORE:
                lines.append({"text": text, "score": round(score, 5),
                              "box": [[int(round(x)), int(round(y))] for x, y in box]})
        return lines

    def detect_input(self, image):
        """The detector's probability map (1, 1, h', w') of an image, not yet read."""
        h, w, _ = image.shape
        rh, rw = det_size(h, w, self.det_limit_side)
        return self.det(vision.to_model_input(vision.resize(image, rh, rw), mean=0.5, std=0.5, bgr=True))


class _Clock:
    """Milliseconds since the last lap, added to a stage's total."""

    def __init__(self, timings):
        self.timings, self.last = timings, time.perf_counter()

    def lap(self, stage):
        now = time.perf_counter()
        self.timings[stage] += (now - self.last) * 1e3
        self.last = now


def oriented(crop, upright, flipped):
    """The crop turned by 180 degrees when the classifier's scores say it is surely upside down."""
    if flipped > upright and flipped > CLS_THRESHOLD:
        return vision.rotate90(crop, 2)
    return crop


def recogniser_input(crop):
    """A line image as the recogniser's input: 48 high, at least 320 wide, aspect kept."""
    h, w, _ = crop.shape
    width = int(REC_HEIGHT * max(REC_MIN_WIDTH / REC_HEIGHT, w / h))
    return _line_input(crop, REC_HEIGHT, width, width)


def recogniser_characters(path):
    """The recogniser's dictionary: PaddleOCR's exporters store it in the ONNX file's metadata
    ("character", one per line)."""
    from ..onnx.proto import read_model
    with open(path, "rb") as f:
        model = read_model(f.read())
    for entry in model.metadata_props:
        if entry.key == "character":
            return entry.value.split("\n")
    raise InputError("%s has no 'character' metadata: not a PaddleOCR recogniser" % ascii(path))


def det_size(h, w, limit_side=DET_LIMIT_SIDE):
    """The detector's input size: the shorter side scaled up to limit_side, each side then
    rounded to a multiple of 32."""
    ratio = limit_side / min(h, w) if min(h, w) < limit_side else 1.0
    return (max(32, int(round(int(h * ratio) / 32) * 32)), max(32, int(round(int(w * ratio) / 32) * 32)))


def _line_input(crop, height, max_width, pad_to):
    """A line image as a model input: height fixed, width from its aspect ratio (at most
    max_width), normalised to [-1, 1] (BGR), zero-padded on the right to pad_to."""
    h, w, _ = crop.shape
    width = min(max_width, int(math.ceil(height * w / h)))
    x = vision.to_model_input(vision.resize(crop, height, max(1, width)), mean=0.5, std=0.5, bgr=True)
    return vision.pad_width(x, pad_to)


def ctc_greedy(steps, characters):
    """CTC greedy decoding of steps [(the likeliest character's index, its probability)]: repeats
    merged, blanks (index 0) dropped; the score is the mean probability of the characters kept."""
    text, probs, previous = [], [], None
    for best, probability in steps:
        if best != previous and best != 0:
            text.append(characters[best])
            probs.append(probability)
        previous = best
    return "".join(text), (sum(probs) / len(probs) if probs else 0.0)


def boxes_from_map(probability, width, height):
    """Line quadrilaterals from the detector's probability map (rows of floats), scaled to an image
    of width x height."""
    rows, cols = len(probability), len(probability[0])
    text = [[p > DET_THRESHOLD for p in row] for row in probability]
    # Dilate by a 2x2 square: a pixel is text if it or its up/left/up-left neighbour is.
    mask = [[text[y][x] or (x and text[y][x - 1]) or (y and (text[y - 1][x] or (x and text[y - 1][x - 1])))
             for x in range(cols)] for y in range(rows)]
    boxes = []
    for region in _regions(mask):
        corners, sides = vision.min_area_rect(region)
        if min(sides) < MIN_SIDE:
            continue
        if _mean_inside(probability, corners) < BOX_THRESHOLD:
            continue
        a, b = sides
        grown, sides = vision.min_area_rect([(round(x), round(y)) for x, y in
                                             vision.expand_rect(corners, a * b * UNCLIP_RATIO / (2 * (a + b)))])
        if min(sides) < MIN_SIDE + 2:
            continue
        scaled = [(min(max(round(x / cols * width), 0), width), min(max(round(y / rows * height), 0), height))
                  for x, y in grown]
        box = [(int(min(max(x, 0), width - 1)), int(min(max(y, 0), height - 1)))
               for x, y in vision.order_clockwise(scaled)]
        if int(math.dist(box[0], box[1])) <= 3 or int(math.dist(box[0], box[3])) <= 3:
            continue
        boxes.append(box)
    return boxes


def _regions(mask):
    """8-connected regions of True pixels, each as the (x, y) of its leftmost and rightmost
    pixel per row (enough for their convex hull)."""
    rows, cols = len(mask), len(mask[0])
    seen = [[False] * cols for _ in range(rows)]
    for y0 in range(rows):
        row = mask[y0]
        for x0 in range(cols):
            if not row[x0] or seen[y0][x0]:
                continue
            seen[y0][x0] = True
            stack, extent = [(x0, y0)], {}
            while stack:
                x, y = stack.pop()
                lo, hi = extent.get(y, (x, x))
                extent[y] = (min(lo, x), max(hi, x))
                for ny in (y - 1, y, y + 1):
                    if 0 <= ny < rows:
                        mrow, srow = mask[ny], seen[ny]
                        for nx in (x - 1, x, x + 1):
                            if 0 <= nx < cols and mrow[nx] and not srow[nx]:
                                srow[nx] = True
                                stack.append((nx, ny))
            yield [p for y, (lo, hi) in extent.items() for p in ((lo, y), (hi, y))]


def _mean_inside(probability, corners):
    """Mean probability over the pixels inside the rectangle (the detector's box score)."""
    rows, cols = len(probability), len(probability[0])
    xs, ys = [p[0] for p in corners], [p[1] for p in corners]
    x0, x1 = max(0, int(math.floor(min(xs)))), min(cols - 1, int(math.ceil(max(xs))))
    y0, y1 = max(0, int(math.floor(min(ys)))), min(rows - 1, int(math.ceil(max(ys))))
    total, count = 0.0, 0
    for y in range(y0, y1 + 1):
        row = probability[y]
        for x in range(x0, x1 + 1):
            if vision.inside_convex(corners, x, y):
                total += row[x]
                count += 1
    return total / count if count else 0.0


def upright_crop(image, box):
    """The line inside `box` cut out as an upright rectangle; a tall one (height >= 1.5 x width)
    is read as vertical text turned on its side."""
    width = int(max(math.dist(box[0], box[1]), math.dist(box[2], box[3])))
    height = int(max(math.dist(box[0], box[3]), math.dist(box[1], box[2])))
    crop = vision.warp_quad(image, box, max(1, width), max(1, height))
    return vision.rotate90(crop) if height >= 1.5 * width else crop


def reading_order(boxes):
    """Boxes sorted top to bottom; boxes whose tops are within 10 pixels read left to right."""
    boxes = sorted(boxes, key=lambda b: (b[0][1], b[0][0]))
    for i in range(len(boxes) - 1):
        for j in range(i, -1, -1):
            if abs(boxes[j + 1][0][1] - boxes[j][0][1]) < 10 and boxes[j + 1][0][0] < boxes[j][0][0]:
                boxes[j], boxes[j + 1] = boxes[j + 1], boxes[j]
            else:
                break
    return boxes


def read_text(path, backend=None, reader=None):
    """{"lines": [{"text", "score", "box"}]} of an image file: what `cinders ocr` prints."""
    reader = reader or TextReader(backend=backend)
    return {"lines": reader.read(vision.read_image(path, backend=reader.backend))}
