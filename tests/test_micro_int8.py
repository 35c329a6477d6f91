"""Issue 28 (boards) and issue 26 (board records), on real MicroPython:

* the frozen int8 MNIST CNN runs in a 64 KB heap (it needed 82 KB: the first convolution's
  pooled output was one 12.5 KB block, and loading left the heap in pieces). The ulab engine now
  computes conv -> relu -> pool -> conv -> relu -> pool a pooled row at a time, so the first
  block's output never exists whole, and record.load allocates what it keeps side by side;
* the board reads int8 records as the desktop does: what the desktop refuses (an unknown
  quantization, int8 without one, scales that are not positive and finite) the board refuses
  too, with a RecordError, instead of running with wrong weights;
* a record's input_shape of [1e400], [1.5], ["a"], [0] or [1e9] is a one-line RecordError on the
  board, before anything is allocated.
"""
import json
import math
import os
import subprocess
import sys

import pytest

import cinders as cn
from cinders.errors import RecordError
from cinders.micro import quantize
from cinders.record import safetensors as st

import firmware_support as fs
from test_hardening_board import bundle, micropython, run_with  # noqa: F401  (fixtures)


def test_frozen_int8_cnn_runs_in_64k(tmp_path):
    """Frozen firmware (runtime and model.py in flash, as on a board), float32 4-D ulab."""
    records = fs.records(str(tmp_path))
    out = str(tmp_path / "frozen-bundle")
    r = subprocess.run([sys.executable, "-m", "cinders", "export-micro", records["cnn-int8"],
                        "--out", out, "--freeze"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    fw = fs.build(port="unix", float="float", dims=4, manifest=os.path.join(out, "manifest.py"))
    for i, (pixels, _) in enumerate(fs.digits(2)):
        path = fs.write_digit(pixels, str(tmp_path / ("d%d.json" % i)))
        p = subprocess.run([fw.path, "-X", "heapsize=64K", "predict.py", path], cwd=out,
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, "the frozen int8 CNN at 64K:\n" + p.stdout[-2000:] + p.stderr[-2000:]
        fs.check_answer(json.loads(p.stdout.strip().splitlines()[-1]), records["cnn-int8"], pixels, "ulab")


def _int8(bundle, tmp_path):
    """(metadata, tensors) of the int8 record of the bundle fixture's model."""
    path = quantize.quantize_file(str(bundle / "mlp.safetensors"), str(tmp_path / "int8.safetensors"))
    return st.read_file(path)


def _desktop(tmp_path, metadata, stored):
    """cn.load_model of the record, or the RecordError it raises."""
    from cinders.record import safetensors_write as stw
    path = str(tmp_path / "desktop.safetensors")
    stw.write_file(path, {n: (d, s, list(v)) for n, (d, s, v) in stored.items()}, metadata)
    try:
        return cn.load_model(path, backend=cn.NumPy())
    except RecordError as e:
        return e


def test_board_runs_the_int8_record_the_desktop_runs(micropython, bundle, tmp_path):
    metadata, stored = _int8(bundle, tmp_path)
    code, out = run_with(micropython, bundle, tmp_path, meta=metadata, tensors=stored)
    assert code == 0, out
    model = _desktop(tmp_path, metadata, stored)
    want = model(cn.tensor([0.5] * 784, backend=cn.NumPy()).reshape(1, 784)).tolist()[0]
    got = json.loads(out.strip().splitlines()[-1])["logits"]
    assert max(abs(a - b) for a, b in zip(got, want)) <= 1e-4 + 1e-4 * max(abs(w) for w in want), (got, want)


def _scaled(stored, value):
    name = [n for n in stored if n.endswith(".scale")][0]
    dtype, shape, values = stored[name]
    return {name: (dtype, shape, [value] + list(values)[1:])}


@pytest.mark.parametrize("case", ["unknown scheme", "no scheme", "zero scale", "negative scale",
                                  "NaN scale", "infinite scale"])
def test_board_refuses_the_int8_records_the_desktop_refuses(micropython, bundle, tmp_path, case):
    metadata, stored = _int8(bundle, tmp_path)
    metadata = dict(metadata)
    if case == "unknown scheme":
        metadata["quantization"] = "int4-blocks"
    elif case == "no scheme":
        del metadata["quantization"]
    else:
        value = {"zero scale": 0.0, "negative scale": -0.5, "NaN scale": math.nan,
                 "infinite scale": math.inf}[case]
        stored = dict(stored, **_scaled(stored, value))
    assert isinstance(_desktop(tmp_path, metadata, stored), RecordError)
    code, out = run_with(micropython, bundle, tmp_path, meta=metadata, tensors=stored)
    assert code != 0 and "RecordError" in out, out
    last = out.strip().splitlines()[-1]
    assert last.startswith("RecordError:") and ("quantization" in last or "scale" in last
                                                 or "I8" in last), last


@pytest.mark.parametrize("shape", ["[1e400]", "[1.5]", '["a"]', "[0]", "[1000000000]", "[-1, 784]",
                                   "[28, 28, 28, 28, 28, 28]"])
def test_board_input_shape_is_one_clear_error(micropython, bundle, tmp_path, shape):
    code, out = run_with(micropython, bundle, tmp_path, meta={"input_shape": shape})
    last = out.strip().splitlines()[-1]
    assert code != 0 and last.startswith("RecordError: input_shape"), out
    assert "MemoryError" not in out and "invalid syntax" not in out, out


def test_int8_tensors_the_layers_read_as_floats_are_refused(micropython, tmp_path):
    """A BatchNorm weight stored as I8 with a scale: the desktop dequantizes it; the board's
    BatchNorm reads plain floats, and used to fold the raw int8 values in (a wrong answer with
    no error). It is refused now, naming the tensor; the int8 record as `cinders quantize`
    writes it runs."""
    from cinders.micro import export
    from cinders.record import safetensors_write as stw
    from test_micro import all_layers_model
    model, src = all_layers_model(tmp_path)
    path = str(tmp_path / "all.safetensors")
    cn.record.save(model, path)
    q = quantize.quantize_file(path, str(tmp_path / "all-int8.safetensors"))
    metadata, stored = st.read_file(q)
    values = list(stored["features.1.weight"][2])
    qv, scales = quantize.quantize_rows(values, len(values))
    stored = dict(stored)
    stored["features.1.weight"] = ("I8", (len(values),), list(qv))
    stored["features.1.weight.scale"] = ("F32", (len(values),), list(scales))
    bad = str(tmp_path / "bn-int8.safetensors")
    stw.write_file(bad, {n: (d, s, list(v)) for n, (d, s, v) in stored.items()}, metadata)
    cn.load_model(bad, backend=cn.NumPy(), allow=[type(model)])  # the desktop takes it
    with open(tmp_path / "x.json", "w") as f:
        json.dump([0.5] * 784, f)
    for record_path, ok in ((q, True), (bad, False)):
        bundle = str(tmp_path / ("bundle-ok" if ok else "bundle-bad"))
        export.export_micro(record_path, bundle, model_file=str(src), input_shape=(1, 28, 28))
        p = subprocess.run([micropython, "-X", "heapsize=4M", "predict.py", str(tmp_path / "x.json")],
                           cwd=bundle, capture_output=True, text=True, timeout=300)
        if ok:
            assert p.returncode == 0, p.stdout + p.stderr
        else:
            last = (p.stdout + p.stderr).strip().splitlines()[-1]
            assert p.returncode != 0 and last.startswith("RecordError") and "features.1.weight" in last, last
