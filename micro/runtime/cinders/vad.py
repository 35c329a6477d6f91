"""Silero VAD on the board: the speech probability of each 512-sample chunk of 16 kHz audio, with
the model's recurrent state and the 64 samples of context before each chunk carried from one
chunk to the next, as the desktop's cinders.apps.vad carries them.

The bundle is silero_vad.onnx imported with its sample rate and shapes decided at import, then
exported (docs/apps.md):
    cinders import-onnx silero_vad.onnx --out vad --fixed-input sr=16000 \
        --input-shape input=1,576 --input-shape state=2,1,128
    cinders export-micro vad/silero_vad.safetensors --model-source vad/silero_vad.py --out bundle
On the board, from inside the bundle (AUDIO: little-endian float32 samples at 16 kHz):
    import sys; sys.path.insert(0, "lib")
    from cinders import vad
    vad.main("AUDIO")            # one JSON line per chunk: {"chunk": i, "probability": p}
or, with the samples at hand: detector = vad.VoiceActivity(); p = detector(chunk_of_512_floats).
"""
import gc
import json

from cinders import engine, record
from cinders._tensor import Tensor, empty

CHUNK = 512         # samples per model call at 16 kHz (32 ms)
CONTEXT = 64        # samples of the previous chunk the model sees before each chunk
STATE_SHAPE = (2, 1, 128)


class VoiceActivity:
    """Speech probability per chunk of CHUNK samples, carrying the model's state. net: the
    bound model (default: model.py's Model with model.safetensors' weights, read from the file
    as each layer runs)."""

    def __init__(self, net=None, path="model.safetensors"):
        if net is None:
            import model
            net = record.load_model(path, model)
        self.net = net
        self.window = empty("f", CONTEXT + CHUNK)
        self.reset()

    def reset(self):
        """Forget the audio seen so far (a new stream)."""
        for i in range(CONTEXT):
            self.window[CHUNK + i] = 0.0   # the context the next step moves to the front
        self.state = Tensor(engine.from_flat(_zeros(256), STATE_SHAPE), STATE_SHAPE)

    def __call__(self, chunk):
        """The probability (float) that this chunk of CHUNK samples is speech."""
        if len(chunk) != CHUNK:
            raise ValueError("a VAD chunk is %d samples at 16 kHz, got %d" % (CHUNK, len(chunk)))
        w = self.window
        w[:CONTEXT] = w[CHUNK:]       # the last CONTEXT samples of the previous window
        w[CONTEXT:] = chunk
        shape = (1, CONTEXT + CHUNK)
        probability, self.state = self.net(Tensor(engine.from_flat(w, shape), shape), self.state)
        return probability.item()


def _zeros(n):
    z = empty("f", n)
    for i in range(n):
        z[i] = 0.0
    return z


def main(audio, path="model.safetensors"):
    """Print {"chunk": i, "probability": p} for each whole chunk of the float32 file `audio`,
    read a chunk at a time (the audio never sits in RAM whole)."""
    detector = VoiceActivity(path=path)
    chunk = empty("f", CHUNK)
    i = 0
    with open(audio, "rb") as f:
        while f.readinto(chunk) == 4 * CHUNK:
            gc.collect()
            print(json.dumps({"chunk": i, "probability": detector(chunk)}))
            i += 1
    return i
