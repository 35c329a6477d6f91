"""Voice activity: Silero VAD (silero-vad 6.2.3, MIT) streamed chunk by chunk, and the speech
segments its probabilities mean.

    vad = VoiceActivity(backend=cn.NumPy())           # the shipped model, fetched on first use
    probs = vad.probabilities(samples)                 # 16 kHz floats -> one probability per 512
    segments = speech_segments(probs, len(samples))    # [(start_sample, end_sample), ...]
    detect_speech("talk.wav")                          # {"segments": [{"start": s, "end": s}], ...}

The model is an imported ONNX graph like any other (`cinders.onnx.load`), so it runs on every
backend. Its recurrent state and the 64 samples of context before each chunk are carried here,
as silero's own wrapper does. `speech_segments` has the thresholds and hysteresis of silero's
`get_speech_timestamps` (its segments are the tests' oracle); splitting speech longer than a
maximum duration is not offered.
"""

from .. import audio
from ..capture import capture
from ..creation import tensor, zeros
from ..errors import InputError

SAMPLE_RATE = 16000
CHUNK = 512          # samples per model call at 16 kHz
CONTEXT = 64         # samples of the previous chunk the model sees before each chunk
STATE_SHAPE = (2, 1, 128)


class VoiceActivity:
    """Speech probability per 512-sample chunk of 16 kHz audio, carrying the model's state.
    model: a silero_vad.onnx path or bytes (default: the shipped one), or a Module that
    cinders.onnx.load made with fixed_inputs={"sr": 16000}."""

    def __init__(self, model=None, backend=None):
        from ..onnx import load
        from .shipped import model_path
        if model is None or isinstance(model, (str, bytes)):
            # The sample rate is fixed: the graph's If on it is decided at import, so a call reads
            # nothing from the device and cn.capture can replay it.
            model = load(model or model_path("silero_vad.onnx"), backend=backend,
                         fixed_inputs={"sr": SAMPLE_RATE})
        self.model = model
        self.backend = backend
        # Every chunk has the same shapes: from the fourth on, a GPU backend replays the recorded
        # kernels of one model call (cn.capture) instead of running Python per kernel.
        self.forward = capture(model)
        self.reset()

    def reset(self):
        """Forget the audio seen so far (a new stream)."""
        self.state = zeros(*STATE_SHAPE, backend=self.backend)
        self.context = [0.0] * CONTEXT

    def step(self, chunk):
        """Run the model on one chunk of CHUNK samples; the speech probability as a 1x1 tensor,
        not read yet (a GPU backend keeps working; the page awaits `to_data_async()`)."""
        if len(chunk) != CHUNK:
            raise InputError("a VAD chunk is %d samples at 16 kHz, got %d" % (CHUNK, len(chunk)))
        window = self.context + list(chunk)
        probability, self.state = self.forward(tensor([window], backend=self.backend), self.state)
        self.context = window[-CONTEXT:]
        return probability

    def __call__(self, chunk):
        """The probability (float) that this chunk of CHUNK samples is speech."""
        return self.step(chunk).item()

    def probabilities(self, samples):
        """One probability per chunk of `samples` (16 kHz; the last chunk zero-padded), from a fresh
        state."""
        self.reset()
        return [self(chunk) for chunk in audio.frames(samples, CHUNK)]


def speech_segments(probabilities, n_samples, threshold=0.5, neg_threshold=None, min_speech_ms=250,
                    min_silence_ms=100, speech_pad_ms=30, rate=SAMPLE_RATE, chunk=CHUNK):
    """[(start, end)] in samples: speech starts at a chunk whose probability reaches `threshold`
    and ends once it has stayed below `neg_threshold` (default threshold - 0.15) for
    `min_silence_ms`; segments of `min_speech_ms` or less are dropped; each keeps `speech_pad_ms`
    of padding, and two segments closer than twice that share the gap."""
    if neg_threshold is None:
        neg_threshold = max(threshold - 0.15, 0.01)
    min_speech = rate * min_speech_ms / 1000
    min_silence = rate * min_silence_ms / 1000
    pad = rate * speech_pad_ms / 1000
    segments, start, silence_from = [], None, 0
    for i, p in enumerate(probabilities):
        here = chunk * i
        if p >= threshold:
            silence_from = 0           # speech again: the silence so far does not count
            if start is None:
                start = here
                continue
        if start is not None and p < neg_threshold:
            silence_from = silence_from or here
            if here - silence_from >= min_silence:
                if silence_from - start > min_speech:
                    segments.append([start, silence_from])
                start, silence_from = None, 0
    if start is not None and n_samples - start > min_speech:
        segments.append([start, n_samples])
    return _padded(segments, pad, n_samples)


def _padded(segments, pad, n_samples):
    for i, segment in enumerate(segments):
        if i == 0:
            segment[0] = int(max(0, segment[0] - pad))
        if i + 1 < len(segments):
            following = segments[i + 1]
            gap = following[0] - segment[1]
            share = gap // 2 if gap < 2 * pad else pad
            segment[1] = int(min(n_samples, segment[1] + share))
            following[0] = int(max(0, following[0] - share))
        else:
            segment[1] = int(min(n_samples, segment[1] + pad))
    return [tuple(s) for s in segments]


def detect_speech(path, backend=None, model=None, **thresholds):
    """The speech segments of a WAV file, in seconds: {"segments": [{"start", "end"}],
    "sample_rate": 16000}. `thresholds` are speech_segments' keywords."""
    samples, rate = audio.read_wav(path)
    samples = audio.resample(samples, rate, SAMPLE_RATE)
    vad = VoiceActivity(model=model, backend=backend)
    found = speech_segments(vad.probabilities(samples), len(samples), **thresholds)
    return {"segments": [{"start": round(a / SAMPLE_RATE, 3), "end": round(b / SAMPLE_RATE, 3)} for a, b in found],
            "sample_rate": SAMPLE_RATE}
