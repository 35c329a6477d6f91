"""The board runtime's `wasm` engine: MicroPython WebAssembly under Node with cn.Wasm()'s module
installed as the /mnist-micro/ page does (wasm/micro_kernels.mjs): the engine is picked, and
the answers equal cn.NumPy()'s (float32 and int8 records)."""
import json
import shutil
import subprocess

import numpy as np
import pytest

import cinders as cn
from cinders import record
from cinders.micro import export, quantize
from cinders.wasm import build

from test_micro_wasm import RUNNER, TRAINED, digit, micropython_mjs  # noqa: F401  (digit: a fixture)


@pytest.mark.parametrize("int8", [False, True], ids=["mlp-f32", "mlp-int8"])
def test_micropython_wasm_engine_matches_numpy(digit, tmp_path, int8):
    rec = TRAINED % "mlp"
    if int8:
        rec = quantize.quantize_file(rec, str(tmp_path / "int8.safetensors"))
    model = record.load_model(rec, backend=cn.NumPy())
    bundle = str(tmp_path / "bundle")
    export.export_micro(rec, bundle, mpy=False)
    node = shutil.which("node")
    assert node, "node is needed for the MicroPython WebAssembly tests (install Node.js 20)"
    r = subprocess.run([node, RUNNER, micropython_mjs(), bundle, digit, "20", build.module_path()],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    got, timings = (json.loads(line) for line in r.stdout.strip().splitlines()[-2:])
    with open(digit) as f:
        pixels = json.load(f)
    want = model(cn.tensor(pixels, backend=cn.NumPy()).reshape(1, 1, 28, 28)).tolist()[0]
    assert got["engine"] == "wasm"
    assert got["class"] == int(np.argmax(want))
    np.testing.assert_allclose(got["logits"], want, rtol=1e-4, atol=1e-4)
    print("MicroPython wasm engine, MLP %s: %s" % ("int8" if int8 else "float32", timings))
