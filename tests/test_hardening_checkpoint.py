"""Issue 10: a checkpoint write killed mid-way left checkpoint.safetensors.tmp-PID behind for
good, even after a successful resume. Now the next resume (or save) removes temporaries whose
writer is gone, and never those of a writer still running."""

import os
import signal
import subprocess
import sys

import cinders as cn
from cinders.models.mnist import MnistMLP
from cinders.train.checkpoint import load_checkpoint, save_checkpoint

CHILD = r"""
import os, signal, sys
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
