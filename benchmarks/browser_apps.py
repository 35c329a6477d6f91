"""The apps in the browser against ONNX Runtime Web, same model, same headless Chromium, one run:
per-chunk latency of Silero VAD. JSON lines on stdout (and --out FILE).

    .venv/bin/python benchmarks/browser_apps.py [--seconds 6] [--cinders wasm,webgpu] [--ort wasm,webgpu]

  cinders/<backend>  the /vad/ page (?backend=...) on an uploaded 16 kHz WAV: its chunk_ms, the
                     mean model time per 512-sample chunk (step + `await to_data_async()`)
  ort/<ep>           benchmarks/web/ort_vad.html: ONNX Runtime Web streaming the same samples
                     with the recurrent state (session.run + reading the probability)
and ratio lines (cinders / ort; < 1 means cinders is faster), plus realtime (32 ms of audio /
chunk_ms) and the largest probability difference against ORT Web and against onnxruntime on the
desktop (the same model: a row that disagrees is wrong, however fast).
The audio is espeak-ng speech ("--seconds" long at most), so both see the same samples.

  ocr/<backend>      (--ocr) the /ocr/ page reading a picture PIL renders (three lines of
                     DejaVu, --ocr-size WxH, detector side --ocr-side): the page's ms per stage and
                     in all (the median of --ocr-repeats readings after a first one), and whether
                     the text came back exactly.
  ort-ocr/<ep>       benchmarks/web/ort_ocr.html: the same three models on ONNX Runtime Web, fed
                     the very inputs cinders.apps.ocr makes from the picture on the desktop (the
                     models alone: no pre- or post-processing, which the Cinders page pays), and
                     whether its recogniser's argmax per step equals onnxruntime's on the desktop.
                     The ratio line divides the page's whole reading by the models' time.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "e2e"))

from cinders import audio  # noqa: E402
from cinders.apps.vad import CHUNK, SAMPLE_RATE  # noqa: E402
from cinders.web.server import DemoServer, default_mounts, ensure_setup  # noqa: E402

from browser_env import CHROMIUM, QUIET_FLAGS, WEBGPU_FLAGS  # noqa: E402

READY_MS = 300_000
SPEECH = "Hello there. [[_:_:_:_:]] This is a test of voice activity detection, in a browser tab."


def emit(row, out):
    line = json.dumps(row, sort_keys=True)
    print(line, flush=True)
    if out:
        out.write(line + "\n")
        out.flush()


def speech_wav(folder, seconds):
    """(path of a 16 kHz WAV of espeak-ng speech, its samples as the page reads them)."""
    subprocess.run(["espeak-ng", "-s", "150", "-w", os.path.join(folder, "espeak.wav"), SPEECH], check=True)
    samples, rate = audio.read_wav(os.path.join(folder, "espeak.wav"))
    samples = audio.resample(samples, rate, SAMPLE_RATE)[: int(seconds * SAMPLE_RATE)]
    samples = samples[: len(samples) // CHUNK * CHUNK]
    path = os.path.join(folder, "talk16k.wav")
    audio.write_wav(path, samples, SAMPLE_RATE)
    return path, audio.read_wav(path)[0]


def desktop_probabilities(samples):
    """onnxruntime on the desktop, chunk by chunk with state and context: the oracle of every row."""
    import numpy as np
    import onnxruntime as ort
    from cinders.apps import shipped
    from cinders.apps.vad import CONTEXT
    session = ort.InferenceSession(shipped.model_path("silero_vad.onnx"), providers=["CPUExecutionProvider"])
    state, context, probabilities = np.zeros((2, 1, 128), np.float32), [0.0] * CONTEXT, []
    for i in range(0, len(samples) - CHUNK + 1, CHUNK):
        window = context + list(samples[i:i + CHUNK])
        out, state = session.run(None, {"input": np.array([window], np.float32), "state": state,
                                        "sr": np.array(SAMPLE_RATE, np.int64)})
        probabilities.append(float(out[0][0]))
        context = window[-CONTEXT:]
    return probabilities


def wait_status(page, want, timeout=READY_MS):
    page.wait_for_function("(w) => { const s = document.querySelector('#status').textContent; "
                           "return s === w || s.startsWith('error'); }", arg=want, timeout=timeout)
    status = page.text_content("#status")
    if status != want:
        raise RuntimeError(status)


def measure_cinders(browser, url, backend, wav):
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(url + "vad/?backend=" + backend)
        wait_status(page, "ready")
        page.set_input_files("#file", wav)
        wait_status(page, "done")
        update = json.loads(page.evaluate("() => JSON.stringify(window.cindersVad.update)"))
        probabilities = page.evaluate("() => window.cindersVad.probabilities")
        return {"chunk_ms": update["chunk_ms"], "chunks": update["chunks"]}, probabilities
    finally:
        context.close()


def measure_ort(browser, url, ep, samples):
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(url + "bench/ort_vad.html?ep=" + ep)
        wait_status(page, "ready")
        result = page.evaluate("(s) => window.ortVad.stream(s)", samples)
        return {"chunk_ms": result["chunk_ms"], "chunks": len(result["probabilities"])}, result["probabilities"]
    finally:
        context.close()


def ocr_picture(folder, size):
    from PIL import Image, ImageDraw, ImageFont
    fonts = "/usr/share/fonts/truetype/dejavu/"
    lines = [("Hello Cinders", "DejaVuSans.ttf", 30), ("Read in a tab", "DejaVuSerif.ttf", 28),
             ("Offline, on any backend", "DejaVuSans-Bold.ttf", 26)]
    image = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(image)
    for i, (text, face, points) in enumerate(lines):
        draw.text((16, 14 + 52 * i), text, fill="black", font=ImageFont.truetype(fonts + face, points))
    path = os.path.join(folder, "lines.png")
    image.save(path)
    return path, [text for text, _, _ in lines]


def measure_ocr(browser, url, backend, picture, side, repeats):
    """The /ocr/ page reading the picture 1 + repeats times: the medians of the later readings
    (the first compiles kernels and records captures)."""
    import statistics
    path, want = picture
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(url + "ocr/?side=%d&backend=%s" % (side, backend))
        wait_status(page, "ready")
        results = []
        for _ in range(1 + repeats):
            page.set_input_files("#file", [])
            page.evaluate("() => { document.querySelector('#status').textContent = 'reading'; }")
            page.set_input_files("#file", path)
            wait_status(page, "done")
            results.append(json.loads(page.evaluate("() => JSON.stringify(window.cindersOcr.result)")))
        later = results[1:] or results
        stages = {k: statistics.median(r["timings"][k] for r in later) for k in later[0]["timings"]}
        return {"stages_ms": stages, "total_ms": statistics.median(r["total_ms"] for r in later),
                "exact": all([line["text"] for line in r["lines"]] == want for r in results)}
    finally:
        context.close()


def ocr_model_inputs(folder, picture, side):
    """Write the inputs cinders.apps.ocr feeds its three models for the picture (on cn.NumPy(), the
    same steps as the page) into folder/ocr/: float32 files and manifest.json for ort_ocr.html.
    Returns onnxruntime's recogniser argmax per step on the desktop, line by line (the oracle)."""
    import numpy as np
    import onnxruntime as ort
    import cinders as cn
    from cinders import vision
    from cinders.apps import shipped
    from cinders.apps.ocr import TextReader
    reader = TextReader(backend=cn.NumPy(), det_limit_side=side)
    fed = []

    def recorded(model, name):
        def call(x):
            fed.append((name, x.numpy()))
            return model(x)
        return call
    reader.det, reader.cls, reader.rec = (recorded(m, n) for m, n in
                                          ((reader.det, "det"), (reader.cls, "cls"), (reader.rec, "rec")))
    reader.read(vision.read_image(picture[0], backend=cn.NumPy()))
    out = os.path.join(folder, "ocr")
    os.makedirs(out, exist_ok=True)
    specs = []
    for i, (name, array) in enumerate(fed):
        array.astype("<f4").tofile(os.path.join(out, "%d-%s.bin" % (i, name)))
        specs.append((name, {"file": "%d-%s.bin" % (i, name), "shape": list(array.shape)}))
    manifest = {"det": specs[0][1], "lines": [{"cls": specs[i][1], "rec": specs[i + 1][1]}
                                              for i in range(1, len(specs), 2)]}
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f)
    session = ort.InferenceSession(shipped.model_path("PP-OCRv6_rec_small.onnx"), providers=["CPUExecutionProvider"])
    return [np.argmax(session.run(None, {session.get_inputs()[0].name: array})[0][0], axis=-1).tolist()
            for name, array in fed if name == "rec"]


def measure_ort_ocr(browser, url, ep, repeats, oracle):
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(url + "bench/ort_ocr.html?ep=%s&data=/bench-data/ocr/" % ep)
        wait_status(page, "ready")
        result = page.evaluate("(n) => window.ortOcr.run(n)", repeats)
        argmax = result.pop("rec_argmax")
        return dict(result, same_as_desktop_onnxruntime=argmax == oracle)
    finally:
        context.close()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=6.0, help="audio length (default 6 s)")
    parser.add_argument("--cinders", default="wasm,webgpu", help="/vad/ backends (?backend=)")
    parser.add_argument("--ort", default="wasm,webgpu", help="ONNX Runtime Web execution providers")
    parser.add_argument("--ocr", default="", help="/ocr/ backends to time (e.g. wasm,webgpu); '' for none")
    parser.add_argument("--ocr-ort", default="wasm,webgpu", help="ONNX Runtime Web providers for the OCR anchor")
    parser.add_argument("--ocr-repeats", type=int, default=3, help="timed readings per configuration")
    parser.add_argument("--ocr-size", default="640x480", help="the OCR picture's WxH")
    parser.add_argument("--ocr-side", type=int, default=160, help="the detector's shorter side (?side=)")
    parser.add_argument("--out", help="also append the JSON lines to this file")
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    ensure_setup()
    out = open(args.out, "a") if args.out else None
    with tempfile.TemporaryDirectory() as tmp, \
            DemoServer(port=0, mounts=[("/bench/", os.path.join(HERE, "web")), ("/bench-data/", tmp)]
                       + default_mounts()) as server, sync_playwright() as p:
        wav, samples = speech_wav(tmp, args.seconds)
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=QUIET_FLAGS + WEBGPU_FLAGS)
        emit({"bench": "browser_apps", "kind": "environment", "chromium": browser.version,
              "cpu_count": os.cpu_count(), "load_avg_1m": os.getloadavg()[0],
              "audio_s": len(samples) / SAMPLE_RATE}, out)
        rows, probs, oracle = {}, {}, desktop_probabilities(samples)
        configs = [("cinders", b) for b in args.cinders.split(",") if b]
        configs += [("ort", e) for e in args.ort.split(",") if e]
        for framework, backend in configs:
            try:
                measure = measure_cinders if framework == "cinders" else measure_ort
                row, probs[framework, backend] = measure(browser, server.url, backend,
                                                         wav if framework == "cinders" else samples)
            except Exception as e:  # one failed configuration must not hide the others
                emit({"bench": "browser_apps", "model": "silero_vad", "framework": framework, "backend": backend,
                      "error": str(e).split("\n")[0]}, out)
                continue
            row.update(bench="browser_apps", model="silero_vad", framework=framework, backend=backend,
                       realtime=(CHUNK / SAMPLE_RATE * 1e3) / row["chunk_ms"],
                       max_diff_vs_onnxruntime=max(abs(a - b) for a, b in zip(probs[framework, backend], oracle)))
            rows[framework, backend] = row
            emit(row, out)
        for backend in ("wasm", "webgpu"):
            if ("cinders", backend) in rows and ("ort", backend) in rows:
                mine, theirs = probs["cinders", backend], probs["ort", backend]
                emit({"bench": "browser_apps", "kind": "ratio", "model": "silero_vad", "backend": backend,
                      "chunk_ms_ratio": rows["cinders", backend]["chunk_ms"] / rows["ort", backend]["chunk_ms"],
                      "max_probability_diff": max(abs(a - b) for a, b in zip(mine, theirs))}, out)
        if args.ocr:
            picture = ocr_picture(tmp, tuple(int(v) for v in args.ocr_size.split("x")))
            oracle = ocr_model_inputs(tmp, picture, args.ocr_side)
        ocr_rows = {}
        ocr_configs = [("cinders", b) for b in args.ocr.split(",") if b]
        ocr_configs += [("ort", e) for e in args.ocr_ort.split(",") if e and args.ocr]
        for framework, backend in ocr_configs:
            try:
                if framework == "cinders":
                    row = measure_ocr(browser, server.url, backend, picture, args.ocr_side, args.ocr_repeats)
                else:
                    row = measure_ort_ocr(browser, server.url, backend, args.ocr_repeats, oracle)
                ocr_rows[framework, backend] = row
            except Exception as e:  # one failed configuration must not hide the others
                row = {"error": str(e).split("\n")[0]}
            row.update(bench="browser_apps", model="pp-ocr", framework=framework, backend=backend,
                       size=args.ocr_size, side=args.ocr_side)
            emit(row, out)
        for backend in ("wasm", "webgpu"):
            if ("cinders", backend) in ocr_rows and ("ort", backend) in ocr_rows:
                emit({"bench": "browser_apps", "kind": "ratio", "model": "pp-ocr", "backend": backend,
                      "reading_vs_ort_models": ocr_rows["cinders", backend]["total_ms"]
                      / ocr_rows["ort", backend]["total_ms"]}, out)
        browser.close()


if __name__ == "__main__":
    main()
