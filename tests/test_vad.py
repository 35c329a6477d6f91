"""Voice activity (cinders.apps.vad, `cinders vad`) against silero-vad's own get_speech_timestamps
on the same shipped model run by onnxruntime; the audio helpers (cinders.audio) against exact
references. Speech is synthesised by espeak-ng (Debian) with known pauses."""

import json
import math
import random
import shutil
import subprocess
import wave

import numpy as np
import pytest
import torch

import cinders as cn
from cinders import audio
from cinders.apps import shipped
from cinders.apps.vad import CHUNK, SAMPLE_RATE, VoiceActivity, speech_segments
from cinders.cli import main as cli

silero = pytest.importorskip("silero_vad.utils_vad", reason="silero-vad (the oracle) is in the dev extra")


@pytest.fixture(scope="module")
def model_path():
    return shipped.model_path("silero_vad.onnx")


def speak(path, text):
    if shutil.which("espeak-ng") is None:
        pytest.fail("espeak-ng is missing: scripts/setup.sh installs it")
    subprocess.run(["espeak-ng", "-s", "150", "-w", str(path), text], check=True)


@pytest.fixture(scope="module")
def talk(tmp_path_factory):
    """Three phrases with two long pauses (espeak-ng's [[_:]] is a pause), as espeak writes it:
    22050 Hz mono 16-bit."""
    path = tmp_path_factory.mktemp("vad") / "talk.wav"
    speak(path, "Hello there. [[_:_:_:_:]] This is a test of voice activity detection. [[_:_:_:_:]] Goodbye.")
    return path


def oracle_segments(samples, model_path, **kw):
    model = silero.OnnxWrapper(model_path, force_onnx_cpu=True)
    found = silero.get_speech_timestamps(torch.tensor(samples, dtype=torch.float32), model, **kw)
    return [(s["start"], s["end"]) for s in found]


def samples_16k(path):
    samples, rate = audio.read_wav(str(path))
    return audio.resample(samples, rate, SAMPLE_RATE)


def test_segments_equal_silero_on_numpy(talk, model_path):
    x = samples_16k(talk)
    want = oracle_segments(x, model_path)
    assert len(want) == 3, want      # the two pauses split the three phrases
    got = speech_segments(VoiceActivity(backend=cn.NumPy()).probabilities(x), len(x))
    assert got == want


@pytest.mark.parametrize("make", [cn.Python, cn.Wgpu], ids=["python", "wgpu"])
def test_probabilities_equal_onnxruntime_on_other_backends(talk, model_path, make):
    """The streamed state and context give onnxruntime's probabilities chunk by chunk (1.2 s of
    speech: the pure-Python backend takes ~0.1 s a chunk)."""
    x = samples_16k(talk)[:CHUNK * 38]
    model = silero.OnnxWrapper(model_path, force_onnx_cpu=True)
    want = model.audio_forward(torch.tensor([x], dtype=torch.float32), SAMPLE_RATE)[0].tolist()
    got = VoiceActivity(backend=make()).probabilities(x)
    assert np.allclose(got, want, atol=1e-4), np.abs(np.array(got) - want).max()


def test_thresholds_and_hysteresis_equal_silero_on_random_probabilities():
    """The segment logic alone, on 300 random probability tracks and settings."""
    rng = random.Random(0)
    for case in range(300):
        n = rng.randrange(1, 400)
        level, probs = rng.random(), []
        for _ in range(n):          # runs of similar values, like a real track
            if rng.random() < 0.1:
                level = rng.random()
            probs.append(min(1.0, max(0.0, level + rng.uniform(-0.1, 0.1))))
        n_samples = n * CHUNK - rng.randrange(CHUNK)
        kw = dict(threshold=rng.choice([0.3, 0.5, 0.7]), min_speech_duration_ms=rng.choice([0, 100, 250]),
                  min_silence_duration_ms=rng.choice([0, 100, 300]), speech_pad_ms=rng.choice([0, 30, 100]))
        want = silero.get_speech_timestamps_from_probs(probs, audio_length_samples=n_samples, **kw)
        got = speech_segments(probs, n_samples, threshold=kw["threshold"], min_speech_ms=kw["min_speech_duration_ms"],
                              min_silence_ms=kw["min_silence_duration_ms"], speech_pad_ms=kw["speech_pad_ms"])
        assert got == [(s["start"], s["end"]) for s in want], (case, kw)


def test_cli_prints_segments_in_seconds(talk, model_path, capsys):
    assert cli(["vad", str(talk), "--min-silence-ms", "200"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["sample_rate"] == 16000
    want = oracle_segments(samples_16k(talk), model_path, min_silence_duration_ms=200)
    assert [(s["start"], s["end"]) for s in out["segments"]] == [
        (round(a / 16000, 3), round(b / 16000, 3)) for a, b in want]
    starts = [s["start"] for s in out["segments"]]
    assert starts == sorted(starts)


def test_cli_refuses_a_file_that_is_not_wav(tmp_path, capsys):
    bad = tmp_path / "song.wav"
    bad.write_bytes(b"ID3\x03 not a wave file at all")
    assert cli(["vad", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "not a PCM WAV file" in err and "Traceback" not in err


@pytest.mark.parametrize("width", [1, 2, 3, 4])
@pytest.mark.parametrize("channels", [1, 2])
def test_read_wav_every_pcm_width(tmp_path, width, channels):
    values = [0.0, 0.5, -0.5, 0.25, -1.0]
    scale = 2 ** (8 * width - 1)
    frames = bytearray()
    for v in values:
        q = int(v * scale)
        sample = (q + 128).to_bytes(1, "little") if width == 1 else q.to_bytes(width, "little", signed=True)
        frames += sample * channels
    path = tmp_path / "x.wav"
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(8000)
        w.writeframes(bytes(frames))
    got, rate = audio.read_wav(str(path))
    assert rate == 8000 and got == pytest.approx(values, abs=1.0 / scale)


def test_resample_is_band_limited_and_exact_on_a_tone():
    rate, target, f = 22050, 16000, 440.0
    x = [math.sin(2 * math.pi * f * i / rate) for i in range(rate // 4)]
    y = audio.resample(x, rate, target)
    assert len(y) == math.ceil(len(x) * target / rate)
    t = np.arange(len(y)) / target
    inner = slice(100, len(y) - 100)       # away from the zero-padded ends
    assert np.abs(np.array(y)[inner] - np.sin(2 * math.pi * f * t)[inner]).max() < 1e-3
    # a tone above the new Nyquist rate (8 kHz) is removed, not folded back as an alias
    hi = [math.sin(2 * math.pi * 10000.0 * i / rate) for i in range(rate // 4)]
    assert np.abs(np.array(audio.resample(hi, rate, target))[inner]).max() < 0.02


def test_resample_pure_python_equals_numpy():
    rng = random.Random(1)
    x = [rng.uniform(-1, 1) for _ in range(3000)]
    assert np.allclose(audio.resample(x, 44100, 16000, numpy=False), audio.resample(x, 44100, 16000), atol=1e-12)
