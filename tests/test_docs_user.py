"""docs/training.md's end-to-end example runs as written (fewer epochs): the model file and
the training script from the page, then the page's `cinders predict` command."""
import json
import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _blocks_after(text, marker):
    """The first ```python block after `marker`."""
    start = text.index(marker)
    return re.search(r"```python\n(.*?)```", text[start:], re.S).group(1)


def test_training_md_example_runs_from_an_empty_folder(tmp_path):
    with open(os.path.join(REPO, "docs", "training.md")) as f:
        doc = f.read()
    (tmp_path / "spiral_model.py").write_text(_blocks_after(doc, "`spiral_model.py`:"))
    script = _blocks_after(doc, "`train_spiral.py`")
    assert "epochs=30" in script
    (tmp_path / "train_spiral.py").write_text(script.replace("epochs=30", "epochs=3"))
    r = subprocess.run([sys.executable, "train_spiral.py"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[-1].startswith("held-out accuracy") and float(lines[-1].split()[-1]) > 0.5
    assert sum("done" in line for line in lines) == 3  # one line per epoch in a log
    assert (tmp_path / "runs" / "spiral" / "checkpoint.safetensors").exists()
    (tmp_path / "point.json").write_text("[0.3, -0.2]")
    command = re.search(r"^cinders predict spiral.safetensors point.json .*$", doc, re.M).group(0)
    r = subprocess.run([sys.executable, "-m", "cinders"] + command.split()[1:], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert sorted(json.loads(r.stdout)) == ["class", "logits"]
