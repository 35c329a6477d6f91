"""The /vad/ page: Silero VAD on an uploaded WAV file and on Chromium's fake microphone (a WAV of
espeak-ng speech with known pauses), on WebGPU and on cn.Wasm(); segments against silero's own
get_speech_timestamps on the desktop (onnxruntime), which the page never sees."""
import json

import pytest
import torch

from cinders import audio
from cinders.apps import shipped
from cinders.apps.vad import CHUNK, SAMPLE_RATE

from browser_env import QUIET_FLAGS, WEBGPU_FLAGS, wait_ready

silero = pytest.importorskip("silero_vad.utils_vad", reason="silero-vad (the oracle) is in the dev extra")
PHRASES = "Hello there. [[_:_:_:_:]] This is a test of voice activity detection. [[_:_:_:_:]] Goodbye."


def silero_model():
    return silero.OnnxWrapper(shipped.model_path("silero_vad.onnx"), force_onnx_cpu=True)


@pytest.fixture(scope="module")
def speech(tmp_path_factory):
    """(path of a 16 kHz WAV, silero's segments in samples). 16 kHz, so that the fake microphone
    and the page's AudioContext need no resampling of their own."""
    import subprocess
    folder = tmp_path_factory.mktemp("vad-page")
    subprocess.run(["espeak-ng", "-s", "150", "-w", str(folder / "espeak.wav"), PHRASES], check=True)
    samples, rate = audio.read_wav(str(folder / "espeak.wav"))
    samples = audio.resample(samples, rate, SAMPLE_RATE)
    path = folder / "talk16k.wav"
    audio.write_wav(str(path), samples, SAMPLE_RATE)
    samples, _ = audio.read_wav(str(path))            # what the page reads: the 16-bit file
    found = silero.get_speech_timestamps(torch.tensor(samples, dtype=torch.float32), silero_model())
    segments = [[s["start"], s["end"]] for s in found]
    assert len(segments) == 3, segments
    return path, segments


def finished(page, timeout=300_000):
    page.wait_for_function("() => { const s = document.querySelector('#status').textContent; "
                           "return s === 'done' || s.startsWith('error'); }", timeout=timeout)
    assert page.text_content("#status") == "done", page.text_content("#status")
    return json.loads(page.evaluate("() => JSON.stringify(window.cindersVad.update)"))


def upload(page, path):
    page.set_input_files("#file", str(path))
    return finished(page)


def assert_close(got, want, chunks):
    assert len(got) == len(want), (got, want)
    for g, w in zip(got, want):
        assert abs(g[0] - w[0]) <= chunks * CHUNK and abs(g[1] - w[1]) <= chunks * CHUNK, (got, want)


@pytest.fixture(scope="module")
def microphone_flags(speech):
    return ["--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
            "--use-file-for-fake-audio-capture=%s" % speech[0]]


@pytest.mark.parametrize("webgpu", [True, False], ids=["webgpu", "wasm"])
def test_uploaded_file_and_microphone_give_silero_segments(launch_browser, new_page, speech, microphone_flags,
                                                           webgpu):
    path, want = speech
    browser = launch_browser(args=QUIET_FLAGS + (WEBGPU_FLAGS if webgpu else []) + microphone_flags)
    try:
        page = wait_ready(new_page("/vad/", on_browser=browser), timeout=180_000)
        assert page.text_content("#backend").startswith("webgpu" if webgpu else "wasm")
        got = upload(page, path)
        # a WAV file is read as exact PCM and resampled as on the desktop: the same segments
        assert_close(got["segments_samples"], want, chunks=1)
        assert page.locator("#segments li").count() == 3
        assert got["chunk_ms"] > 0 and got["realtime"] > 0
        # The fake microphone plays the same file in a loop from when capture starts. On a busy
        # machine Chromium's capture drops blocks, so what the page heard is not the file: the
        # oracle is silero on the samples the page heard, and the file's three segments must each
        # overlap what was heard.
        page.click("#mic")
        page.wait_for_function("() => document.querySelector('#status').textContent === 'listening'")
        seconds = want[-1][1] / SAMPLE_RATE + 0.3
        page.wait_for_function("(n) => window.cindersVad.heard >= n", arg=int(seconds * SAMPLE_RATE),
                               timeout=60_000)
        page.click("#stop")
        page.evaluate("() => window.cindersVad.done()")
        heard = json.loads(page.evaluate("() => JSON.stringify(window.cindersVad.update)"))
        recording = torch.tensor(page.evaluate("() => window.cindersVad.recording()"), dtype=torch.float32)
        assert len(recording) >= seconds * SAMPLE_RATE - CHUNK
        oracle = [[s["start"], s["end"]] for s in silero.get_speech_timestamps(recording, silero_model())]
        assert_close(heard["segments_samples"][:3], oracle[:3], chunks=1)
        for (start, end), (file_start, file_end) in zip(heard["segments_samples"][:3], want):
            assert start < file_end and file_start < end, (heard["segments_samples"], want)
    finally:
        browser.close()
