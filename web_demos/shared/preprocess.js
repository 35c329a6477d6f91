// MNIST-like preprocessing shared by the demo pages (the Pyodide page, the MicroPython page and
// the PyScript example). Pure functions on plain arrays: no DOM needed, so Node can test them.
//
// MNIST's recipe (LeCun et al.): the digit is cropped to its bounding box, scaled so its longer
// side is 20 px (aspect ratio kept, anti-aliased), and placed in a 28x28 field so that its centre
// of mass sits at the centre. Ink is 1, background 0.
//
//   strokesToMnist(strokes)  pen strokes [[{x, y}, ...], ...] in any coordinates -> Float32Array(784).
//       The strokes are re-drawn at MNIST scale with an MNIST-like pen, so the stroke width the
//       model sees does not depend on how large the user drew or on the canvas size.
//   imageToMnist(gray, width, height)  an image (Float32Array, ink 1 / paper 0, or paper 1 / ink 0:
//       detected from the border) -> Float32Array(784), for uploaded pictures and pasted digits.
//   imageDataToGray(imageData)  canvas ImageData -> Float32Array of luminance*alpha over white paper.

export const SIZE = 28;       // MNIST field
export const BOX = 20;        // the digit's longer side inside the field
export const PEN = 2.3;       // pen diameter in MNIST pixels (MNIST strokes are about 2-3 px wide)
const SUPERSAMPLE = 4;        // strokes are drawn at 4x and box-filtered down: anti-aliased edges

function bounds(points) {
  let x0 = Infinity, y0 = Infinity, x1 = -Infinity, y1 = -Infinity;
  for (const p of points) {
    if (p.x < x0) x0 = p.x;
    if (p.x > x1) x1 = p.x;
    if (p.y < y0) y0 = p.y;
    if (p.y > y1) y1 = p.y;
  }
  return { x0, y0, x1, y1 };
}

// Squared distance from (px, py) to the segment a-b.
function segmentDistance2(px, py, ax, ay, bx, by) {
  const dx = bx - ax, dy = by - ay;
  const len2 = dx * dx + dy * dy;
  let t = len2 > 0 ? ((px - ax) * dx + (py - ay) * dy) / len2 : 0;
  t = t < 0 ? 0 : t > 1 ? 1 : t;
  const ex = ax + t * dx - px, ey = ay + t * dy - py;
  return ex * ex + ey * ey;
}

// Box-filter a (size*factor)^2 grid down to size^2.
function downsample(grid, size, factor) {
  const hi = size * factor, out = new Float32Array(size * size), area = factor * factor;
  for (let y = 0; y < hi; y++) {
    for (let x = 0; x < hi; x++) out[((y / factor) | 0) * size + ((x / factor) | 0)] += grid[y * hi + x];
  }
  for (let i = 0; i < out.length; i++) out[i] /= area;
  return out;
}

// Shift a 28x28 field by whole pixels so the centre of mass lands on the centre (as MNIST did).
export function centreByMass(field, size = SIZE) {
  let mass = 0, mx = 0, my = 0;
  for (let y = 0; y < size; y++) {
    for (let x = 0; x < size; x++) {
      const v = field[y * size + x];
      mass += v; mx += v * x; my += v * y;
    }
  }
  if (mass === 0) return field;
  const sx = Math.round((size - 1) / 2 - mx / mass), sy = Math.round((size - 1) / 2 - my / mass);
  const out = new Float32Array(size * size);
  for (let y = 0; y < size; y++) {
    const ty = y + sy;
    if (ty < 0 || ty >= size) continue;
    for (let x = 0; x < size; x++) {
      const tx = x + sx;
      if (tx >= 0 && tx < size) out[ty * size + tx] = field[y * size + x];
    }
  }
  return out;
}

// strokes: array of polylines (arrays of {x, y}); a single point is a dot. Returns null when empty.
export function strokesToMnist(strokes, { pen = PEN } = {}) {
  const points = strokes.flat();
  if (points.length === 0) return null;
  const b = bounds(points);
  const w = b.x1 - b.x0, h = b.y1 - b.y0;
  // The centre line fits in BOX - pen so that the ink, pen included, spans BOX pixels.
  const scale = (BOX - pen) / Math.max(w, h, 1e-6);
  const ox = SIZE / 2 - (w * scale) / 2, oy = SIZE / 2 - (h * scale) / 2;
  const f = SUPERSAMPLE, hi = SIZE * f, r2 = (pen * f / 2) ** 2;
  const segments = [];
  for (const stroke of strokes) {
    const mapped = stroke.map((p) => [((p.x - b.x0) * scale + ox) * f, ((p.y - b.y0) * scale + oy) * f]);
    if (mapped.length === 1) mapped.push(mapped[0]);
    for (let i = 1; i < mapped.length; i++) segments.push([...mapped[i - 1], ...mapped[i]]);
  }
  const grid = new Float32Array(hi * hi);
  const reach = pen * f / 2 + 1;
  for (const [ax, ay, bx, by] of segments) {
    // Only pixels near this segment can be inked by it.
    const xa = Math.max(0, Math.floor(Math.min(ax, bx) - reach)), xb = Math.min(hi - 1, Math.ceil(Math.max(ax, bx) + reach));
    const ya = Math.max(0, Math.floor(Math.min(ay, by) - reach)), yb = Math.min(hi - 1, Math.ceil(Math.max(ay, by) + reach));
    for (let y = ya; y <= yb; y++) {
      for (let x = xa; x <= xb; x++) {
        if (grid[y * hi + x] === 0 && segmentDistance2(x + 0.5, y + 0.5, ax, ay, bx, by) <= r2) grid[y * hi + x] = 1;
      }
    }
  }
  return centreByMass(downsample(grid, SIZE, f));
}

// Luminance of each pixel composited over white paper: 0 = black ink ... 1 = white.
export function imageDataToGray({ data, width, height }) {
  const gray = new Float32Array(width * height);
  for (let i = 0; i < width * height; i++) {
    const a = data[4 * i + 3] / 255;
    const lum = (0.299 * data[4 * i] + 0.587 * data[4 * i + 1] + 0.114 * data[4 * i + 2]) / 255;
    gray[i] = a * lum + (1 - a);
  }
  return gray;
}

// Average over the border decides which way round the picture is: MNIST wants ink = 1.
function inkFromGray(gray, width, height) {
  let border = 0, n = 0;
  for (let x = 0; x < width; x++) { border += gray[x] + gray[(height - 1) * width + x]; n += 2; }
  for (let y = 0; y < height; y++) { border += gray[y * width] + gray[y * width + width - 1]; n += 2; }
  const lightPaper = border / n > 0.5;
  const ink = new Float32Array(gray.length);
  for (let i = 0; i < gray.length; i++) ink[i] = lightPaper ? 1 - gray[i] : gray[i];
  // Paper is rarely exactly 0: subtract its level so the crop finds the digit, not the page.
  const paper = lightPaper ? 1 - border / n : border / n;
  for (let i = 0; i < ink.length; i++) ink[i] = Math.max(0, (ink[i] - paper) / Math.max(1e-6, 1 - paper));
  return ink;
}

// Area-average resampling of the crop [x0, x0+cw) x [y0, y0+ch) of src to dw x dh.
function resampleArea(src, width, x0, y0, cw, ch, dw, dh) {
  const out = new Float32Array(dw * dh), sx = cw / dw, sy = ch / dh;
  for (let oy = 0; oy < dh; oy++) {
    const ya = y0 + oy * sy, yb = ya + sy;
    for (let ox = 0; ox < dw; ox++) {
      const xa = x0 + ox * sx, xb = xa + sx;
      let sum = 0;
      for (let y = Math.floor(ya); y < Math.ceil(yb); y++) {
        const wy = Math.min(yb, y + 1) - Math.max(ya, y);
        for (let x = Math.floor(xa); x < Math.ceil(xb); x++) {
          sum += wy * (Math.min(xb, x + 1) - Math.max(xa, x)) * src[y * width + x];
        }
      }
      out[oy * dw + ox] = sum / (sx * sy);
    }
  }
  return out;
}

// gray: Float32Array(width*height) in [0, 1], either polarity. Returns null when there is no ink.
export function imageToMnist(gray, width, height, { threshold = 0.1 } = {}) {
  const ink = inkFromGray(gray, width, height);
  let x0 = width, y0 = height, x1 = -1, y1 = -1;
  for (let y = 0; y < height; y++) {
    for (let x = 0; x < width; x++) {
      if (ink[y * width + x] > threshold) {
        if (x < x0) x0 = x;
        if (x > x1) x1 = x;
        if (y < y0) y0 = y;
        if (y > y1) y1 = y;
      }
    }
  }
  if (x1 < 0) return null;
  const cw = x1 - x0 + 1, ch = y1 - y0 + 1, scale = BOX / Math.max(cw, ch);
  const dw = Math.max(1, Math.round(cw * scale)), dh = Math.max(1, Math.round(ch * scale));
  const digit = resampleArea(ink, width, x0, y0, cw, ch, dw, dh);
  let top = 0;
  for (const v of digit) top = Math.max(top, v);
  const field = new Float32Array(SIZE * SIZE);
  const px = Math.floor((SIZE - dw) / 2), py = Math.floor((SIZE - dh) / 2);
  for (let y = 0; y < dh; y++) {
    for (let x = 0; x < dw; x++) field[(y + py) * SIZE + x + px] = Math.min(1, digit[y * dw + x] / top);
  }
  return centreByMass(field);
}
