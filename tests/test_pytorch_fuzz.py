"""Bounded, seeded fuzzing of load_pytorch (issue 10 item 5): mutated torch.save files (zip,
legacy, plain pickle; raw bytes and the data.pkl inside the zip) each give a state dict or a
CindersError, never another exception, a hang or memory beyond the cap. The counts are printed
(`pytest -s` shows them) and kept in .cache/fuzz/pytorch.json."""

import json
import os
import pickle
import subprocess
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
SEED, COUNT, CAP_MB = 0, 3000, 1024


def _seed_files(folder):
    torch.manual_seed(0)
    base = torch.randn(4, 6)
    sample = {"w": base, "view": base[1:3, ::2], "t": base.t(), "h": torch.randn(3).half(),
              "n": torch.tensor(5), "b": torch.tensor([True, False]), "e": torch.zeros(0)}
    paths = [os.path.join(folder, n) for n in ("sample.zip.pt", "sample.legacy.pt", "sample.plain.pkl")]
    torch.save(sample, paths[0])
    torch.save(sample, paths[1], _use_new_zipfile_serialization=False)
    with open(paths[2], "wb") as f:
        pickle.dump(sample, f, protocol=2)
    return paths


def test_mutated_checkpoints_give_a_result_or_a_cinders_error(tmp_path):
    files = _seed_files(str(tmp_path))
    run = subprocess.run([sys.executable, os.path.join(HERE, "pytorch_fuzz.py"), "--seed", str(SEED),
                          "--count", str(COUNT), "--cap-mb", str(CAP_MB)] + files,
                         capture_output=True, text=True, timeout=300)
    assert run.stdout.strip(), run.stderr[-3000:]
    counts = json.loads(run.stdout.strip().splitlines()[-1])
    print("pytorch fuzz:", json.dumps({k: v for k, v in counts.items() if k != "by_mutation"}))
    os.makedirs(os.path.join(HERE, "..", ".cache", "fuzz"), exist_ok=True)
    with open(os.path.join(HERE, "..", ".cache", "fuzz", "pytorch.json"), "w") as f:
        json.dump(counts, f, indent=1, sort_keys=True)
    assert counts["failures"] == 0, counts["failure_examples"]
    assert run.returncode == 0, run.stderr[-3000:]
    assert counts["cases"] == COUNT
    # both outcomes are exercised, and mutations inside data.pkl reach the interpreter
    assert counts["refused"] > COUNT // 4 and counts["loaded_same"] > 0
    assert counts["by_mutation"]["pickle-flip"].get("refused", 0) > 0
