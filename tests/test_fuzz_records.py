"""Fuzzing the record readers (issue 10): real records, mutated (bit flips, truncations, header
and metadata edits), fed to every reader. Each input must load correctly or raise a CindersError
subclass: never another exception type, never a hang, never memory beyond a cap, and a failed
in-place load leaves the model as it was. Fixed seed and count, so a failure replays exactly:
the message names the case number and the mutation."""

import collections
import json
import os
import random
import struct
import time

import numpy as np
import pytest

import cinders as cn
from cinders.micro import export, quantize
from cinders.models.mnist import MnistCNN, MnistMLP
from cinders.record import safetensors as st
from cinders.train.checkpoint import load_checkpoint, save_checkpoint

from fuzz_support import Bounds

SEED = int(os.environ.get("CINDERS_FUZZ_SEED", 10))  # CI: fixed; set it to fuzz further
CASES = int(os.environ.get("CINDERS_FUZZ_CASES", 2000))             # a few ms each: about 15 s on the 2-core CI machine
CASE_SECONDS = 5         # a single input taking longer is a hang
MEMORY_CAP = 256 * 2 ** 20  # the process may grow by at most this over the whole run (peak RSS)
CLASSES = ["cinders.models.mnist.MnistMLP", "cinders.models.mnist.MnistCNN", "os.system",
           "cinders.__main__.X", "this.X", "cinders.nn.layers.Linear", "", "cinders.models.mnist"]
CODES = list(st.DTYPES) + ["F64", "I64", "x", ""]


def weird_values(rng):
    return rng.choice([0, 1, -1, 2 ** 31, 2 ** 63, 10 ** 12, -10 ** 9, 3.5, float("nan"), None, "4",
                       [], [1, 2], {}, True, "x" * 300])


def base_records(folder):
    cn.manual_seed(3)
    paths = {}
    paths["mlp"] = os.path.join(folder, "mlp.safetensors")
    MnistMLP(hidden=4).save(paths["mlp"])
    paths["cnn16"] = os.path.join(folder, "cnn16.safetensors")
    MnistCNN(channels1=2, channels2=2, hidden=4).save(paths["cnn16"], dtype=cn.float16)
    paths["int8"] = os.path.join(folder, "int8.safetensors")
    quantize.quantize_file(paths["mlp"], paths["int8"])
    paths["checkpoint"] = os.path.join(folder, "checkpoint.safetensors")
    model, optimizer = MnistMLP(hidden=4).to(cn.Autodiff(cn.NumPy())), cn.optim.Adam(1e-3)
    x = cn.random((2, 1, 28, 28), backend=model.layers[1].weight.backend)
    optimizer.step(model, model(x).sum().backward())
    save_checkpoint(paths["checkpoint"], model, optimizer, {"epoch": 1, "batch": 2, "history": []})
    return {k: open(p, "rb").read() for k, p in paths.items()}


def split(data):
    n = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8:8 + n]), data[8 + n:]


def join(header, body, pad=True):
    text = json.dumps(header).encode()
    if pad:
        text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + body


def edit_header(rng, data):
    header, body = split(data)
    names = [k for k in header if k != "__metadata__"]
    meta = header.setdefault("__metadata__", {})
    kind = rng.randrange(12)
    name = rng.choice(names)
    entry = header[name]
    if kind == 0:
        entry["dtype"] = rng.choice(CODES)
    elif kind == 1:
        entry["shape"] = [rng.choice([0, 1, 2, 3, 10, 784, -1, 2 ** 40, 2 ** 64]) for _ in range(rng.randrange(5))]
    elif kind == 2:
        i = rng.randrange(2)
        entry["data_offsets"][i] = max(0, entry["data_offsets"][i] + rng.choice([-8, -4, -1, 1, 4, 2 ** 33]))
    elif kind == 3:
        del entry[rng.choice(list(entry))]
    elif kind == 4:
        entry[rng.choice(["dtype", "shape", "data_offsets", "extra"])] = weird_values(rng)
    elif kind == 5:
        header[name + rng.choice(["", ".x", ".scale", "/"])] = dict(entry)
    elif kind == 6:
        del header[name]
    elif kind == 7:
        meta["model_class"] = rng.choice(CLASSES)
    elif kind == 8:
        config = json.loads(meta.get("model_config", "{}"))
        key = rng.choice(list(config) + ["hidden", "channels1", "extra"]) if isinstance(config, dict) else "hidden"
        value = weird_values(rng) if rng.random() < 0.5 else rng.choice([0, 5, 64, 10 ** 6, 10 ** 9])
        if isinstance(config, dict):
            config[key] = value
        meta["model_config"] = json.dumps(config) if rng.random() < 0.9 else "{" + '"a":' * 50
    elif kind == 9:
        meta[rng.choice(["format", "cinders_version", "quantization", "dtype", "kind"])] = rng.choice(
            ["cinders", "pt", "keras", "0.1.0", "99.0.0", "0.0", "int8-per-channel-symmetric", "int4", "float16"])
    elif kind == 10:
        meta[rng.choice(list(meta) or ["x"])] = weird_values(rng)
    elif "progress" in meta and rng.random() < 0.7:  # checkpoints: their JSON metadata
        key = rng.choice(["progress", "optimizer"])
        value = json.loads(meta[key])
        if isinstance(value, dict) and value and rng.random() < 0.7:
            value[rng.choice(list(value))] = weird_values(rng)
        else:
            value = weird_values(rng) if rng.random() < 0.5 else "[" * 10000
        meta[key] = value if isinstance(value, str) else json.dumps(value)
    else:
        header = {k: header[k] for k in rng.sample(list(header), len(header))}  # reordered
        return join(header, body, pad=rng.random() < 0.5) + (b"\0" * rng.randrange(3))
    return join(header, body)


def mutate(rng, data):
    """(description, mutated bytes)."""
    kind = rng.randrange(6)
    if kind == 0:
        out = bytearray(data)
        n = rng.choice([1, 1, 2, 8])
        head = struct.unpack("<Q", data[:8])[0] + 8
        for _ in range(n):  # half the flips land in the header, where the structure is
            i = rng.randrange(head) if rng.random() < 0.5 else rng.randrange(len(out))
            out[i] ^= 1 << rng.randrange(8)
        return "flip %d bits" % n, bytes(out)
    if kind == 1:
        cut = rng.randrange(len(data))
        return "truncate at %d" % cut, data[:cut]
    if kind == 2:
        return "append", data + bytes(rng.randrange(256) for _ in range(rng.choice([1, 4, 8, 100])))
    if kind == 3:
        n = rng.choice([0, 1, 7, 2 ** 20, 2 ** 40, 2 ** 63, len(data)])
        return "header length %d" % n, struct.pack("<Q", n) + data[8:]
    return "header edit", edit_header(rng, data)


def state_of(model):
    return {k: v.numpy().copy() for k, v in model.state_dict().items()}


READERS = {
    "load_model": lambda p: cn.load_model(p),
    "MnistMLP.load": lambda p: MnistMLP.load(p),
    "read_file": lambda p: st.read_file(p),
    "quantize": lambda p: quantize.quantize_file(p, p + ".q"),
    "board record": lambda p: export.write_board_record(p, p + ".b"),
    "checkpoint": lambda p: load_checkpoint(p, MnistMLP(hidden=4).to(cn.Autodiff(cn.NumPy())),
                                            cn.optim.Adam(1e-3)),
}


def test_mutated_records_load_or_raise_cinders_errors(tmp_path):
    rng = random.Random(SEED)
    bases = base_records(str(tmp_path))
    target = MnistMLP(hidden=4)
    before = state_of(target)
    outcomes = collections.Counter()
    messages = set()
    path = str(tmp_path / "case.safetensors")
    started = time.monotonic()
    with Bounds(CASE_SECONDS, MEMORY_CAP) as bounds:
        for case in range(CASES):
            base = rng.choice(sorted(bases))
            what, data = mutate(rng, bases[base])
            with open(path, "wb") as f:
                f.write(data)
            readers = ["in place"] + rng.sample(sorted(READERS), 2)
            for reader in readers:
                label = "case %d (%s of %s, %s)" % (case, what, base, reader)
                with bounds.case(label):
                    try:
                        if reader == "in place":
                            target.load(path)
                            before = state_of(target)  # a valid mutation loaded: the new reference
                        else:
                            READERS[reader](path)
                        outcomes["loaded"] += 1
                    except cn.CindersError as e:
                        outcomes[type(e).__name__] += 1
                        messages.add(str(e).split(":")[0][:60])
                        if reader == "in place":
                            after = state_of(target)
                            assert all(np.array_equal(before[k], after[k], equal_nan=True) for k in before), \
                                label + ": a failed load changed the model"
                    except Exception as e:  # noqa: BLE001  (the point: any other type is a defect)
                        pytest.fail("%s: %s: %s" % (label, type(e).__name__, e))
    elapsed = time.monotonic() - started
    total = sum(outcomes.values())
    print("\nrecord fuzz: %d mutated files, %d reads in %.1f s: %s"
          % (CASES, total, elapsed, dict(sorted(outcomes.items()))))
    # the fuzzer must reach past the first check: some inputs load, many distinct errors
    assert outcomes["loaded"] > 0 and outcomes["RecordError"] > CASES // 4
    assert len(messages) > 20
