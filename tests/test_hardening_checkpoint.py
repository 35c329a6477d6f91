"""Issue 10: a checkpoint write killed mid-way left checkpoint.safetensors.tmp-PID behind for
good, even after a successful resume. Now the next resume (or save) removes temporaries whose
writer is gone, and never those of a writer still running."""

import os
import signal
import subprocess
import sys

import pytest

import cinders as cn
from cinders.models.mnist import MnistMLP
from cinders.train.checkpoint import load_checkpoint, save_checkpoint

CHILD = r"""
import os, signal, sys
import pytest

import cinders as cn
from cinders.models.mnist import MnistMLP
from cinders.train.checkpoint import save_checkpoint
path = sys.argv[1]
cn.manual_seed(0)
model, opt = MnistMLP(hidden=4), cn.optim.Adam(1e-3)
save_checkpoint(path, model, opt, {"epoch": 1, "batch": 0})
os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)   # killed while writing the next one
save_checkpoint(path, model, opt, {"epoch": 2, "batch": 0})
"""


def test_killed_checkpoint_write_leaves_no_temporary_after_resume(tmp_path):
    path = str(tmp_path / "checkpoint.safetensors")
    child = subprocess.run([sys.executable, "-c", CHILD, path], capture_output=True, text=True, timeout=120)
    assert child.returncode == -signal.SIGKILL, child.stderr
    leftovers = [n for n in os.listdir(tmp_path) if ".tmp-" in n]
    assert len(leftovers) == 1 and os.path.getsize(tmp_path / leftovers[0]) > 0  # what a kill leaves
    # a temporary of a writer that is still running is not touched
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = tmp_path / ("checkpoint.safetensors.tmp-%d" % sleeper.pid)
        live.write_bytes(b"being written")
        progress = load_checkpoint(path, MnistMLP(hidden=4), cn.optim.Adam(1e-3))  # the resume
        assert progress == {"epoch": 1, "batch": 0}   # the previous checkpoint, intact
        assert sorted(os.listdir(tmp_path)) == sorted(["checkpoint.safetensors", live.name])
        save_checkpoint(path, MnistMLP(hidden=4), cn.optim.Adam(1e-3), {"epoch": 3, "batch": 0})
        assert live.exists()
    finally:
        sleeper.kill()
        sleeper.wait()
    cn.record.save_tensors(path + ".other", {"w": cn.zeros(2)})
    assert live.exists()  # other files' temporaries are not this file's
    save_checkpoint(path, MnistMLP(hidden=4), cn.optim.Adam(1e-3), {"epoch": 4, "batch": 0})
    assert not live.exists()  # its writer is gone now


def test_malformed_checkpoint_metadata_is_refused_before_anything_loads(tmp_path):
    import json

    import numpy as np

    from cinders.record import safetensors as st
    from cinders.record import safetensors_write as stw
    path = str(tmp_path / "checkpoint.safetensors")
    backend = cn.Autodiff(cn.NumPy())
    model, optimizer = MnistMLP(hidden=4).to(backend), cn.optim.Adam(1e-3)
    optimizer.step(model, model(cn.random((2, 1, 28, 28), backend=backend)).sum().backward())
    save_checkpoint(path, model, optimizer, {"epoch": 1, "batch": 0, "history": [], "metrics": []})
    good_meta, good_tensors = st.read_file(path)
    progress, opt = json.loads(good_meta["progress"]), json.loads(good_meta["optimizer"])
    bad_cases = [
        ({"progress": "[" * 10000}, "progress metadata is not JSON"),
        ({"progress": "[1, 2]"}, "progress metadata is not a JSON object"),
        ({"progress": json.dumps(dict(progress, epoch="1"))}, "epoch '1' is not a count"),
        ({"progress": json.dumps(dict(progress, history={"a": 1}))}, "history is not a list"),
        ({"progress": json.dumps(dict(progress, metrics=[{"total": "x", "count": 1}]))}, "metrics"),
        ({"optimizer": json.dumps(dict(opt, steps=-1))}, "steps -1 is not a count"),
        ({"optimizer": json.dumps(dict(opt, numbers={"layers.1.weight": {"t": [1]}}))}, "numbers"),
        ({"optimizer": json.dumps(dict(opt, numbers={"nowhere": {}}))}, "unknown parameters nowhere"),
    ]
    name = next(k for k in good_tensors if k.startswith("optim/"))
    code, shape, values = good_tensors[name]
    for meta_change, message in bad_cases + [(None, "optimizer state .* has shape")]:
        meta, tensors = dict(good_meta), dict(good_tensors)
        if meta_change is None:  # a moment tensor of the wrong shape
            tensors[name] = (code, (len(values),), values)
        else:
            meta.update(meta_change)
        stw.write_file(path, tensors, meta)
        fresh, fresh_opt = MnistMLP(hidden=4).to(backend), cn.optim.Adam(1e-3)
        before = {k: v.numpy().copy() for k, v in fresh.state_dict().items()}
        with pytest.raises(cn.RecordError, match=message):
            load_checkpoint(path, fresh, fresh_opt)
        assert all(np.array_equal(before[k], v.numpy()) for k, v in fresh.state_dict().items())
        assert fresh_opt.steps == 0
