"""What the /vad/ page (web_demos/vad/) calls inside Pyodide: Silero VAD streamed on the page's
backend, chunk by chunk, as audio arrives from the microphone or a file.

    info = load(model_bytes)                       # the .onnx bytes the page fetched
    samples = wav_samples(wav_bytes)               # a WAV file: exact PCM, resampled like the desktop
    update = await push(samples)                   # 16 kHz floats; runs every whole chunk so far
    update -> {"probabilities": [new ones], "segments": [{"start", "end"}] (seconds, so far),
               "chunks", "chunk_ms" (mean model time per chunk), "realtime": audio time / model time}

The same VoiceActivity and speech_segments as `cinders vad` on the desktop; a probability is read
with `await to_data_async()`, so WebGPU never blocks the page.
"""
import os
import tempfile
import time

from .. import audio
from .vad import CHUNK, SAMPLE_RATE, VoiceActivity, speech_segments

_state = {"vad": None, "pending": [], "probabilities": [], "samples": 0, "model_ms": 0.0}


def _backend():
    from ..web import bridge
    return bridge.current_backend()


def load(model_bytes):
    backend = _backend()
    started = time.perf_counter()
    _state["vad"] = VoiceActivity(model=bytes(model_bytes), backend=backend)
    reset()
    return {"backend": repr(backend), "load_ms": (time.perf_counter() - started) * 1e3}


def reset():
    """A new stream: the model's state, the probabilities and the pending samples are cleared."""
    _state["vad"].reset()
    _state.update(pending=[], probabilities=[], samples=0, model_ms=0.0)


def wav_samples(wav_bytes):
    """The 16 kHz samples of a WAV file's bytes, read and resampled exactly as on the desktop."""
    with tempfile.NamedTemporaryFile(suffix=".wav", delete=False) as f:
        f.write(bytes(wav_bytes))
    try:
        samples, rate = audio.read_wav(f.name)
    finally:
        os.unlink(f.name)
    return audio.resample(samples, rate, SAMPLE_RATE)


async def push(samples, threshold=0.5, min_silence_ms=100, min_speech_ms=250):
    """Add 16 kHz samples (a list or a JS Float32Array) and run the model on every whole chunk."""
    if hasattr(samples, "to_py"):       # a JS Float32Array from the page: a memoryview in Python
        samples = samples.to_py().tolist()
    pending = _state["pending"]
    pending.extend(samples)
    _state["samples"] += len(samples)
    vad, new = _state["vad"], []
    while len(pending) >= CHUNK:
        chunk = pending[:CHUNK]
        del pending[:CHUNK]
        started = time.perf_counter()
        value = await vad.step(chunk).to_data_async()
        _state["model_ms"] += (time.perf_counter() - started) * 1e3
        while isinstance(value, list):
            value = value[0]
        new.append(value)
    _state["probabilities"] += new
    return summary(new, threshold, min_silence_ms, min_speech_ms)


def summary(new=(), threshold=0.5, min_silence_ms=100, min_speech_ms=250):
    probs = _state["probabilities"]
    found = speech_segments(probs, len(probs) * CHUNK, threshold=threshold, min_silence_ms=min_silence_ms,
                            min_speech_ms=min_speech_ms)
    chunk_ms = _state["model_ms"] / len(probs) if probs else 0.0
    return {"probabilities": list(new),
            "segments": [{"start": a / SAMPLE_RATE, "end": b / SAMPLE_RATE} for a, b in found],
            "segments_samples": [[a, b] for a, b in found],
            "chunks": len(probs), "chunk_ms": chunk_ms,
            "realtime": (CHUNK / SAMPLE_RATE * 1e3) / chunk_ms if chunk_ms else 0.0}
