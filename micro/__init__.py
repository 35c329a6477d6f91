"""cinders.micro: the MicroPython side of Cinders, seen from the desktop.

    runtime/          the board runtime (importable on MicroPython as `cinders`; copied into
                      bundles as lib/cinders/..., together with core/record/safetensors.py)
    quantize.py       per-channel symmetric int8 records (`cinders quantize`), and dequantizing
                      them for the desktop backends
    export.py         `cinders export-micro` (a self-contained bundle) and `cinders flash`
    commands.py       the command-line entries
"""
import os

RUNTIME_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "runtime")
