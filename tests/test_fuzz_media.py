"""Fuzzing the media readers (issue 26): `cinders.audio.read_wav` on real WAV files (8/16/24/32-bit,
mono and stereo) mutated in their header fields (channels, sample width, rate, frame count, chunk
sizes, format tag), truncated and bit-flipped; `cinders.vision.from_bytes` on pixel buffers with
unusual sizes and arguments (wrong lengths, zero, negative, float, bool, huge, None). Each input
must give the right answer or raise a CindersError with a printable message: never another
exception, a hang, or memory beyond the cap. Fixed seed and count; the counts are printed
(`pytest -s`)."""

import collections
import io
import json
import os
import random
import struct
import wave

import cinders as cn
from cinders import audio, vision
from cinders.errors import CindersError

from fuzz_support import Bounds

SEED = int(os.environ.get("CINDERS_FUZZ_SEED", 26))
CASES = int(os.environ.get("CINDERS_FUZZ_CASES", 600))   # about a millisecond each
CASE_SECONDS = 5
MEMORY_CAP = 256 * 2 ** 20
HUGE = [0, 1, 2, 3, 5, 2 ** 16 - 1, 2 ** 31 - 1, 2 ** 32 - 1]


def base_wavs():
    """(label, bytes, samples, rate) of small WAV files of every width this reader knows."""
    rng = random.Random(1)
    out = []
    for width in (1, 2, 3, 4):
        for channels in (1, 2):
            frames = rng.randrange(1, 40)
            raw = bytes(rng.randrange(256) for _ in range(frames * channels * width))
            buffer = io.BytesIO()
            with wave.open(buffer, "wb") as w:
                w.setnchannels(channels)
                w.setsampwidth(width)
                w.setframerate(8000)
                w.writeframes(raw)
            out.append(("%d-bit x%d" % (8 * width, channels), buffer.getvalue()))
    return out


# header fields of a canonical 44-byte WAV: (name, offset, struct code)
FIELDS = [("riff size", 4, "<I"), ("fmt size", 16, "<I"), ("format tag", 20, "<H"), ("channels", 22, "<H"),
          ("rate", 24, "<I"), ("byte rate", 28, "<I"), ("block align", 32, "<H"), ("bits", 34, "<H"),
          ("data size", 40, "<I")]


def mutate_wav(rng, data):
    data = bytearray(data)
    kind = rng.randrange(5)
    if kind == 0:
        name, at, code = rng.choice(FIELDS)
        limit = 2 ** (8 * struct.calcsize(code)) - 1
        struct.pack_into(code, data, at, min(rng.choice(HUGE + [rng.randrange(limit + 1)]), limit))
        return bytes(data), "header %s" % name
    if kind == 1:
        return bytes(data[:rng.randrange(len(data))]), "truncated"
    if kind == 2:
        for _ in range(rng.randrange(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        return bytes(data), "bytes"
    if kind == 3:
        return bytes(data[:12]) + bytes(data[36:]), "no fmt chunk"
    return bytes(data[:36]) + b"LIST" + struct.pack("<I", rng.choice(HUGE)) + bytes(data[36:]), "extra chunk"


def test_mutated_wav_files_read_or_raise_cinders_errors(tmp_path):
    rng = random.Random(SEED)
    bases = base_wavs()
    counts, by_kind, failures = collections.Counter(), collections.defaultdict(collections.Counter), []
    path = str(tmp_path / "case.wav")
    with Bounds(CASE_SECONDS, MEMORY_CAP) as bounds:
        for case in range(CASES):
            label, base = rng.choice(bases)
            data, kind = mutate_wav(rng, base)
            with open(path, "wb") as f:
                f.write(data)
            with bounds.case("wav case %d (%s, %s)" % (case, label, kind)):
                try:
                    samples, rate = audio.read_wav(path)
                    assert rate > 0 and all(-1.0 <= s < 1.0 for s in samples), "case %d: %d Hz" % (case, rate)
                    outcome = "read"
                except CindersError as e:
                    assert str(e).isprintable() and "\n" not in str(e), "case %d: %r" % (case, str(e)[:200])
                    outcome = "refused"
                except Exception as e:  # noqa: BLE001  (the point: nothing else may escape)
                    outcome = "failure"
                    failures.append("wav case %d (%s, %s): %s: %s" % (case, label, kind, type(e).__name__, str(e)[:150]))
            counts[outcome] += 1
            by_kind[kind.split(" ")[0]][outcome] += 1
    print("wav fuzz:", json.dumps({"cases": CASES, **counts, "by_kind": by_kind}, sort_keys=True))
    assert not failures, failures[:20]
    assert counts["read"] > CASES // 10 and counts["refused"] > CASES // 10, counts


def test_unmutated_wav_files_read_exactly():
    """The fuzzer's bases themselves: the reader's samples are the stdlib's frames, scaled."""
    for label, data in base_wavs():
        with wave.open(io.BytesIO(data)) as w:
            width, channels, raw = w.getsampwidth(), w.getnchannels(), w.readframes(w.getnframes())
        values = [int.from_bytes(raw[i:i + width], "little", signed=width > 1) - (128 if width == 1 else 0)
                  for i in range(0, len(raw), width)]
        scale = 2.0 ** (8 * width - 1)
        expected = [sum(values[i:i + channels]) / channels / scale for i in range(0, len(values), channels)]
        samples, rate = audio.read_wav(io.BytesIO(data))
        assert rate == 8000 and len(samples) == len(expected), label
        assert max(abs(a - b) for a, b in zip(samples, expected)) < 1e-6, label


ODD = [0, 1, 2, 3, 4, -1, -3, 2 ** 31, 2 ** 62, 1.5, 2.0, True, None, "2"]


def test_image_bytes_of_any_shape_give_the_image_or_a_cinders_error():
    rng = random.Random(SEED)
    backend = cn.NumPy()
    counts, failures = collections.Counter(), []
    with Bounds(CASE_SECONDS, MEMORY_CAP) as bounds:
        for case in range(CASES):
            width, height, channels = (rng.choice(ODD) if rng.random() < 0.3 else rng.randrange(1, 6) for _ in range(3))
            size = width * height * channels if all(type(v) is int and 0 < v < 64 for v in (width, height, channels)) else 0
            data = bytes(rng.randrange(256) for _ in range(size + rng.choice([0, 0, 0, -1, 1]) if size else rng.randrange(40)))
            with bounds.case("image case %d (%r, %r, %r)" % (case, width, height, channels)):
                try:
                    image = vision.from_bytes(data, width, height, channels, backend=backend)
                    assert image.shape == (height, width, min(channels, 3)), (case, image.shape)
                    pixels = list(data)
                    assert image.reshape(-1).tolist() == [p for i, p in enumerate(pixels) if i % channels < 3], case
                    outcome = "read"
                except CindersError as e:
                    assert str(e).isprintable() and "\n" not in str(e), "case %d: %r" % (case, str(e)[:200])
                    outcome = "refused"
                except Exception as e:  # noqa: BLE001
                    outcome = "failure"
                    failures.append("image case %d (%r, %r, %r, %d bytes): %s: %s"
                                    % (case, width, height, channels, len(data), type(e).__name__, str(e)[:150]))
            counts[outcome] += 1
    print("image fuzz:", json.dumps({"cases": CASES, **counts}, sort_keys=True))
    assert not failures, failures[:20]
    assert counts["read"] > CASES // 10 and counts["refused"] > CASES // 10, counts
