"""Audio for inference: WAV files in, mono float samples at the rate a model wants.

    samples, rate = cinders.audio.read_wav("speech.wav")        # list of floats in [-1, 1]
    samples = cinders.audio.resample(samples, rate, 16000)
    for chunk in cinders.audio.frames(samples, 512): ...

Pure Python (the `wave` module of the standard library), so it runs in Pyodide and anywhere
Cinders runs; on the desktop `resample` takes a NumPy path when NumPy imports. Samples are plain
Python float lists at the API: a model's input tensor is made from them on its own backend.
"""

import array
import math
import os
import sys
import wave

from .errors import InputError
from . import limits

# Band-limited resampling: a Kaiser-windowed sinc of this many zero crossings on each side.
# 16 crossings keep the passband flat to ~0.9 of the lower Nyquist rate; speech models
# (16 kHz) lose nothing they use.
SINC_ZEROS = 16
KAISER_BETA = 8.6


def read_wav(path):
    """(samples, sample_rate) of a PCM WAV file: mono (channels averaged), floats in [-1, 1).
    8-, 16-, 24- and 32-bit integer PCM; other encodings raise InputError."""
    try:
        with wave.open(path, "rb") as w:
            channels, width, rate, count = w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()
            if isinstance(path, (str, bytes, os.PathLike)):   # a header may claim more frames than there are
                count = min(count, os.path.getsize(path) // (width * channels))
            limits.check_elements("WAV file %s" % ascii(path), count * channels, element_bytes=limits.LIST_ELEMENT_BYTES)
            raw = w.readframes(count)
    except (wave.Error, EOFError, RuntimeError) as e:   # RuntimeError: a chunk that runs past the end
        raise InputError("%s is not a PCM WAV file this reader knows (%s)" % (ascii(path), ascii(str(e) or type(e).__name__))) from None
    raw = raw[:len(raw) - len(raw) % (width * channels)]   # a truncated file: its whole frames
    if rate <= 0 or channels <= 0:
        raise InputError("%s: sample rate %d, %d channels" % (ascii(path), rate, channels))
    if width == 1:     # 8-bit WAV is unsigned
        values, scale, offset = array.array("B", raw), 128.0, 128.0
    elif width == 2:
        values, scale, offset = _little_endian(array.array("h", raw)), 32768.0, 0.0
    elif width == 3:   # no array code for 24 bits: widen each to 32
        padded = b"".join(b"\0" + raw[i:i + 3] for i in range(0, len(raw) - 2, 3))
        values, scale, offset = _little_endian(array.array("i", padded)), 2147483648.0, 0.0
    elif width == 4:
        values, scale, offset = _little_endian(array.array("i", raw)), 2147483648.0, 0.0
    else:
        raise InputError("%s: %d-byte samples are not PCM this reader knows" % (ascii(path), width))
    frames = len(values) // channels
    if channels == 1:
        return [(v - offset) / scale for v in values], rate
    return [sum(values[i * channels:(i + 1) * channels]) / channels / scale - offset / scale
            for i in range(frames)], rate


def _little_endian(values):
    if sys.byteorder == "big":
        values.byteswap()
    return values


def write_wav(path, samples, rate):
    """A mono 16-bit PCM WAV file of float samples in [-1, 1] (clipped)."""
    pcm = array.array("h", (max(-32768, min(32767, int(round(s * 32767.0)))) for s in samples))
    with wave.open(path, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(_little_endian(pcm).tobytes())


def resample(samples, rate, target, numpy=None):
    """samples at `rate` Hz resampled to `target` Hz with a band-limited (windowed-sinc) filter
    whose cut-off is the lower of the two Nyquist rates. Returns a list of floats. numpy: None
    uses NumPy when it imports; False computes in pure Python (as in Pyodide), same numbers."""
    if rate == target:
        return list(samples)
    if rate <= 0 or target <= 0:
        raise InputError("resample: rates must be positive, got %r -> %r" % (rate, target))
    g = math.gcd(rate, target)
    up, down = target // g, rate // g
    n_out = (len(samples) * up + down - 1) // down
    limits.check_elements("resample", n_out, element_bytes=limits.LIST_ELEMENT_BYTES)
    np = None
    if numpy is not False:
        try:
            import numpy as np
        except ImportError:
            pass
    if np is None:
        return _resample_python(samples, up, down, n_out)
    return _resample_numpy(np, samples, up, down, n_out)


def _taps(up, down):
    """Per output phase: the input offset of its first tap and its filter weights. Output k sits at
    input position k*down/up; the filter is sinc at the lower Nyquist rate, Kaiser-windowed."""
    cutoff = min(1.0, up / down)           # of the input's Nyquist rate
    half = int(math.ceil(SINC_ZEROS / cutoff))
    norm = _bessel_i0(KAISER_BETA)
    phases = []
    for phase in range(up):
        centre = phase * down / up         # fractional input position of this phase
        first = int(math.floor(centre)) - half + 1
        weights = []
        for j in range(first, first + 2 * half):
            t = j - centre
            x = cutoff * t
            s = cutoff * (math.sin(math.pi * x) / (math.pi * x) if x else 1.0)
            r = t / (half + 1)
            w = _bessel_i0(KAISER_BETA * math.sqrt(max(0.0, 1.0 - r * r))) / norm
            weights.append(s * w)
        phases.append((first, (phase * down) // up, weights))
    return phases


def _bessel_i0(x):
    total, term, k = 1.0, 1.0, 1
    while term > 1e-12 * total:
        term *= (x / (2.0 * k)) ** 2
        total += term
        k += 1
    return total


def _resample_python(samples, up, down, n_out):
    samples = list(samples)
    n = len(samples)
    out = [0.0] * n_out
    taps = _taps(up, down)
    for k in range(n_out):
        first, base, weights = taps[k % up]
        start = (k // up) * down + first
        acc = 0.0
        for j, w in enumerate(weights):
            i = start + j
            if 0 <= i < n:
                acc += samples[i] * w
        out[k] = acc
    return out


def _resample_numpy(np, samples, up, down, n_out):
    x = np.asarray(samples, dtype=np.float64)
    out = np.zeros(n_out)
    taps = _taps(up, down)
    width = len(taps[0][2])
    padded = np.concatenate([np.zeros(width), x, np.zeros(width)])
    for phase, (first, _, weights) in enumerate(taps):
        ks = np.arange(phase, n_out, up)
        if not len(ks):
            continue
        starts = (ks // up) * down + first + width          # into `padded`
        window = padded[starts[:, None] + np.arange(width)[None, :]]
        out[ks] = window @ np.asarray(weights)
    return out.tolist()


def frames(samples, size, pad=True):
    """Consecutive chunks of `size` samples; the last is zero-padded when `pad` (as speech models
    expect whole chunks), else dropped if short."""
    for start in range(0, len(samples), size):
        chunk = list(samples[start:start + size])
        if len(chunk) < size:
            if not pad:
                return
            chunk += [0.0] * (size - len(chunk))
        yield chunk
