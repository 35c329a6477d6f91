"""The command-line entries of cinders.apps, registered in the `cinders` command's table:
`cinders vad AUDIO.wav`, `cinders ocr IMAGE`."""
import json

from ..cli import BACKEND_ARG, arg, command, make_backend, positive_float, non_negative_int


def _probability(text):
    value = positive_float(text)
    if value >= 1:
        raise ValueError("--threshold must be below 1, got %r" % (text,))
    return value


@command("vad", "speech segments of a WAV file (Silero VAD): one JSON object on stdout", [
    arg("audio", help="a PCM WAV file (any rate, mono or stereo; resampled to 16 kHz)"),
    arg("--threshold", type=_probability, default=0.5, help="speech probability that starts speech (default 0.5)"),
    arg("--min-silence-ms", type=non_negative_int, default=100,
        help="silence that ends a segment, in ms (default 100)"),
    arg("--min-speech-ms", type=non_negative_int, default=250,
        help="segments this short or shorter are dropped, in ms (default 250)"),
    arg("--speech-pad-ms", type=non_negative_int, default=30, help="padding kept around each segment, in ms (default 30)"),
    arg("--model", default=None, help="the silero_vad.onnx to use (default: silero-vad 6.2.3's, fetched once)"),
    BACKEND_ARG,
])
def vad(args):
    from .vad import detect_speech
    found = detect_speech(args.audio, backend=make_backend(args.backend), model=args.model,
                          threshold=args.threshold, min_silence_ms=args.min_silence_ms,
                          min_speech_ms=args.min_speech_ms, speech_pad_ms=args.speech_pad_ms)
    print(json.dumps(found), flush=True)
    return 0


@command("ocr", "read the text in an image (PP-OCR: detection, angle, recognition): one JSON object on stdout", [
    arg("image", help="an image file (PNG, JPEG, ... anything Pillow reads)"),
    BACKEND_ARG,
])
def ocr(args):
    from .ocr import read_text
    print(json.dumps(read_text(args.image, backend=make_backend(args.backend)), ensure_ascii=False), flush=True)
    return 0
