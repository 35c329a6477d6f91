"""A newcomer's walkthrough, run from the docs themselves: the files and commands of
docs/training.md ("Your own model, end to end") and the bash blocks of the README's board and
web sections, in an empty folder, with the wheel `python -m build` makes installed (with the
`numpy` and `board` extras the walkthrough uses) in a fresh virtual environment. The code is
read out of the Markdown, so a doc that drifts from the code fails here; the outputs the docs
show are what is asserted.

What the test changes, and why: `cinders serve` gets `--port 0` (any free port) and is checked
in Chromium; `cinders train --dataset mnist` gets `--epochs 1` (CI time); `cinders flash` needs a
board on a serial port and is not run (tests/test_firmware.py flashes an emulated one).
"""
import ast
import json
import os
import re
import shutil
import subprocess

import pytest

from cinders.assets import REPO_ROOT

import install_support as inst

NOT_RUN = {"cinders flash ": "needs a board on a serial port (tests/test_firmware.py: QEMU)"}


def markdown(path):
    with open(os.path.join(REPO_ROOT, path)) as f:
        return f.read()


def block_after(text, marker, lang):
    """The first ```lang block after `marker` in a Markdown text."""
    start = text.index(marker)
    match = re.compile(r"```%s\n(.*?)```" % lang, re.S).search(text, start)
    assert match, "no ```%s block after %r" % (lang, marker)
    return match.group(1)


def commands(block):
    """[(command, its comment)] of a bash block: the comment after it on its line and the
    comment-only lines below it (where the docs show a command's output)."""
    found = []
    for line in block.splitlines():
        if line.lstrip().startswith("#") and found:
            found[-1] = (found[-1][0], found[-1][1] + " " + line.lstrip("# ").strip())
        elif line.strip():
            command, *comment = re.split(r"\s+#\s", line, maxsplit=1)
            found.append((command.strip(), comment[0].strip() if comment else ""))
    return found


@pytest.fixture(scope="module")
def user(tmp_path_factory):
    """(folder, bin, env): an empty folder and a fresh venv with the wheel[numpy,board]."""
    wheel = inst.built_wheel()
    venv = inst.fresh_venv(tmp_path_factory.mktemp("venv-walk"), wheel, extras=["numpy", "board"])
    env = inst.user_env(inst.private_cache(tmp_path_factory.mktemp("cache") / "cinders"))
    env["PATH"] = venv + os.pathsep + env["PATH"]
    folder = tmp_path_factory.mktemp("empty")
    inst.run(venv, ["cinders", "setup-web"], folder, env, timeout=600)
    return folder, venv, env


def sh(user, command, timeout=600):
    folder, _, env = user
    r = subprocess.run(["bash", "-c", command], cwd=folder, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, "%s failed (%d):\n%s\n%s" % (command, r.returncode, r.stdout[-3000:], r.stderr[-3000:])
    return r.stdout


def test_the_numpy_extra_makes_numpy_the_default_backend(user):
    import cinders as cn
    out = sh(user, "python -c 'import cinders as cn; print(cn.default_backend().name)'")
    assert out.strip() == cn.NumPy().name


def serve_and_check(user, command, inputs, want):
    """`cinders serve DIR` as the doc says (on any free port), the page run in Chromium."""
    import numpy as np
    folder, venv, env = user
    argv = command.split() + ["--port", "0"]
    server, url = inst.start_server(venv, argv, folder, env)
    try:
        backend, got, failed = inst.chromium_page_output(url, inputs)
    finally:
        inst.stop(server)
    assert backend == "wasm" and failed == []
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_training_md_then_the_readme_board_and_web_sections(user):
    import numpy as np
    folder, _, _ = user
    doc = markdown("docs/training.md")
    (folder / "spiral_model.py").write_text(block_after(doc, "`spiral_model.py`:", "python"))
    train_source = block_after(doc, "`train_spiral.py`", "python")
    (folder / "train_spiral.py").write_text(train_source)
    out = sh(user, "python train_spiral.py")
    accuracy = float(re.search(r"held-out accuracy (\d\.\d+)", out).group(1))
    assert accuracy >= 0.95, out
    assert (folder / "spiral.safetensors").exists() and (folder / "runs" / "spiral" / "metrics.csv").exists()

    # the doc's inputs: point.json holds [0.3, -0.2]; data.json the held-out spiral of train_spiral.py
    (folder / "point.json").write_text("[0.3, -0.2]")
    spiral = next(n for n in ast.parse(train_source).body if isinstance(n, ast.FunctionDef) and n.name == "spiral")
    scope = {}
    exec("import math, random\n" + ast.get_source_segment(train_source, spiral), scope)
    points = scope["spiral"](500, seed=2)
    (folder / "data.json").write_text(json.dumps({"inputs": [p for p, _ in points], "labels": [k for _, k in points]}))

    steps = commands(block_after(doc, "Then, one command per step", "bash"))
    predicted = None
    for command, comment in steps:
        if command.startswith("cinders serve "):
            serve_and_check(user, command, [0.3, -0.2], [predicted["logits"]])
            continue
        out = sh(user, command)
        shown = re.search(r"(\{.*\}|accuracy: [\d.]+)", comment)
        if command.startswith("cinders predict"):
            predicted = json.loads(out)
            assert predicted["class"] == json.loads(shown.group(1))["class"], (out, comment)
        elif command.startswith("cinders eval"):
            assert float(out.split()[-1]) >= 0.95 and out.startswith("accuracy: "), out
        elif "micropython predict.py" in command:   # "the same numbers on a board"
            board = json.loads(out.strip().splitlines()[-1])
            assert board["class"] == predicted["class"]
            np.testing.assert_allclose(board["logits"], predicted["logits"], rtol=1e-4, atol=1e-4)
        elif command.startswith("cinders export-"):
            assert out.startswith("wrote "), out

    # The README's board section in the same folder; its own model is the spiral one.
    shutil.copyfile(folder / "spiral_model.py", folder / "my_model.py")
    shutil.copyfile(folder / "spiral.safetensors", folder / "my.safetensors")
    readme = markdown("README.md")
    for command, comment in commands(block_after(readme, "## On microcontrollers", "bash")):
        if any(command.startswith(p) for p in NOT_RUN):
            continue
        if command.startswith("cinders train "):
            command += " --epochs 1"
        out = sh(user, command)
        if "micropython" in command:
            got, shown = json.loads(out.strip().splitlines()[-1]), comment.replace("[...]", "[]")
            assert got["class"] == 7 and got["engine"] == json.loads(shown)["engine"] == "array", out
    for written in ("bundle/predict.py", "bundle2/predict.py", "fw"):
        assert (folder / written).exists(), written

    # The README's web section: the user's own model in a page, an ONNX model, an app.
    x, _ = inst.onnx_mlp(folder / "model.onnx")
    for command, comment in commands(block_after(readme, "### Use cinders in your own web page", "bash")):
        if command.startswith("cinders serve "):
            serve_and_check(user, command, [0.3, -0.2], [predicted["logits"]])
            continue
        out = sh(user, command)
        assert out.startswith("wrote ") and "cinders serve site" in out, out
    assert (folder / "site" / "ocr" / "index.html").exists()
