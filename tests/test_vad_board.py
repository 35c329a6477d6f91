"""Silero VAD on the board (issue 24, deliverable 4): the shipped silero_vad.onnx imported with its
sample rate and shapes decided at import, bundled by `cinders export-micro`, and run chunk by chunk
with its recurrent state carried (cinders/vad.py) on the MicroPython unix port in a 512 KB heap or
less: the speech probabilities of real (espeak-ng) speech equal the desktop's cinders.apps.vad on
cn.NumPy() to 1e-4, on the array engine and on the ulab builds."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import cinders as cn
from cinders import audio
from cinders.apps import shipped
from cinders.apps.vad import CHUNK, SAMPLE_RATE, VoiceActivity

sys.path.insert(0, os.path.dirname(__file__))
import firmware_support as fs  # noqa: E402
from test_onnx_board import _micropython  # noqa: E402
from test_vad import speak  # noqa: E402

CHUNKS = 4          # 0.13 s: two chunks of silence, then the start of "Hello"
# The least heap each engine ran the bundle in, measured with -X heapsize (64-bit unix port):
# array 304K (288K fails), ulab float32 288K (272K fails), ulab double 448K (416K fails).
HEAPS = {"array": "320K", "float32-2d": "320K", "float64-2d": "512K"}


def _cli(*args):
    done = subprocess.run([sys.executable, "-m", "cinders", *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def board_vad(tmp_path_factory):
    """(bundle folder, speech samples file, desktop probabilities)."""
    tmp = tmp_path_factory.mktemp("vad_board")
    speak(tmp / "hello.wav", "Hello there.")
    samples, rate = audio.read_wav(str(tmp / "hello.wav"))
    samples = audio.resample(samples, rate, SAMPLE_RATE)[:CHUNKS * CHUNK]
    np.asarray(samples, dtype="<f4").tofile(tmp / "hello.f32")
    _cli("import-onnx", shipped.model_path("silero_vad.onnx"), "--out", str(tmp / "imported"),
         "--fixed-input", "sr=16000", "--input-shape", "input=1,576", "--input-shape", "state=2,1,128")
    source = (tmp / "imported" / "silero_vad.py").read_text()
    # decided at import: no shape arithmetic or If left for the board, the LSTM's gates reordered once
    assert "ops.LSTM(" in source and "ops.Shape(" not in source and "ops.truth(" not in source
    _cli("export-micro", str(tmp / "imported" / "silero_vad.safetensors"), "--out", str(tmp / "bundle"),
         "--model-source", str(tmp / "imported" / "silero_vad.py"))
    want = VoiceActivity(backend=cn.NumPy()).probabilities(samples)
    assert len(want) == CHUNKS and min(want) < 0.1 and max(want) > 0.5, want   # silence, then speech
    return tmp / "bundle", tmp / "hello.f32", want


def _run_on_board(exe, heap, bundle, audio_file):
    ran = subprocess.run([exe, "-X", "heapsize=" + heap, "-c",
                          "import sys; sys.path.insert(0, 'lib'); from cinders import vad; vad.main(%r)"
                          % str(audio_file)], cwd=bundle, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    lines = [json.loads(line) for line in ran.stdout.strip().splitlines()]
    assert [line["chunk"] for line in lines] == list(range(CHUNKS))
    return [line["probability"] for line in lines]


def test_vad_on_the_array_engine_matches_the_desktop(board_vad):
    bundle, audio_file, want = board_vad
    # 1.2 MB of float32 weights in a 320 KB heap: the large tensors are read from the record while
    # their layer runs (cinders/onnx_ops.py, Streamed)
    assert os.path.getsize(bundle / "model.safetensors") > 1024 * 1024
    got = _run_on_board(_micropython(), HEAPS["array"], bundle, audio_file)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("build", ["float32-2d", "float64-2d"])
def test_vad_on_ulab_matches_the_desktop(board_vad, build):
    bundle, audio_file, want = board_vad
    exe = fs.build(**fs.UNIX_BUILDS[build]).path
    got = _run_on_board(exe, HEAPS[build], bundle, audio_file)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
