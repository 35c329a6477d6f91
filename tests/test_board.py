"""An emulated Cortex-M board: the QEMU MPS2 AN500 firmware (float32, ulab) built from source,
its UART on a pty, flashed with `cinders flash` through mpremote's serial transport, and asked
with `cinders flash --run` / `cinders run-board`; answers checked against cn.NumPy() on real
held-out digits. The board has no writable filesystem, so the bundle goes in as a ROMFS image.

The QEMU UART takes ~7 KB/s from the pty, so the tests flash the int8 bundles (~130 KB and
~230 KB): a float32 CNN bundle (850 KB) works the same but takes two minutes.
"""
import json
import os
import subprocess
import sys

import pytest

from cinders.errors import BoardError
from cinders.micro import board, export
from cinders.models.mnist import MnistMLP
from cinders import record

import firmware_support as fs


@pytest.fixture(scope="module")
def qemu_board():
    """A booted emulated board: (pty path, Firmware). Stopped after the module's tests."""
    fw = fs.build(port="qemu", float="float", dims=2)
    with fs.qemu_pty(fw) as port:
        yield port, fw


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    return fs.records(str(tmp_path_factory.mktemp("records")))


def _cli(*args, timeout=600):
    r = subprocess.run([sys.executable, "-m", "cinders"] + list(args), capture_output=True,
                       text=True, timeout=timeout)
    return r.returncode, r.stdout, r.stderr


def test_run_board_before_flashing_says_what_to_do(qemu_board, tmp_path):
    port, _ = qemu_board
    path = fs.write_digit(fs.digits(1)[0][0], str(tmp_path / "d.json"))
    code, out, err = _cli("run-board", path, "--port", port)
    assert code != 0 and "no bundle on the board" in err and "cinders flash" in err, err


def test_flash_and_run_mlp_and_cnn_on_the_emulated_board(qemu_board, records, tmp_path):
    port, _ = qemu_board
    (pixels0, _), (pixels1, _) = fs.digits(2)
    d0 = fs.write_digit(pixels0, str(tmp_path / "d0.json"))
    d1 = fs.write_digit(pixels1, str(tmp_path / "d1.json"))
    for kind in ("mlp-int8", "cnn-int8"):
        bundle = str(tmp_path / kind)
        export.export_micro(records[kind], bundle, mpy=True)
        code, out, err = _cli("flash", bundle, "--port", port, "--run", d0)
        assert code == 0, out + err
        assert "ROMFS image" in out
        fs.check_answer(json.loads(out.strip().splitlines()[-1]), records[kind], pixels0, "ulab")
        code, out, err = _cli("run-board", d1, "--port", port)
        assert code == 0, out + err
        fs.check_answer(json.loads(out.strip().splitlines()[-1]), records[kind], pixels1, "ulab")
    nested = str(tmp_path / "nested.json")  # any input: nested lists of the record's input_shape
    with open(nested, "w") as f:
        json.dump([[pixels1[r * 28:(r + 1) * 28] for r in range(28)]], f)
    code, out, err = _cli("run-board", nested, "--port", port)
    assert code == 0, out + err
    fs.check_answer(json.loads(out.strip().splitlines()[-1]), records["cnn-int8"], pixels1, "ulab")
    with open(nested, "w") as f:
        json.dump([pixels1[:700]], f)
    code, out, err = _cli("run-board", nested, "--port", port)
    assert code != 0 and "holds 700 numbers, expected a multiple of 784" in out + err, out + err


def test_bundle_too_large_for_the_flash(qemu_board, tmp_path):
    port, _ = qemu_board
    model = MnistMLP(hidden=1400)  # 784 x 1400 float32: 4.4 MB, the ROMFS partition holds 4 MB
    path = str(tmp_path / "big.safetensors")
    record.save(model, path)
    bundle = str(tmp_path / "big")
    export.export_micro(path, bundle)
    with pytest.raises(BoardError, match="too large for the board's flash.*partition holds 4194304"):
        board.flash(bundle, port)


def test_serial_errors_are_clear(tmp_path, records):
    bundle = str(tmp_path / "b")
    export.export_micro(records["mlp-int8"], bundle)
    with pytest.raises(BoardError, match="no serial device at /dev/cinders-no-such-port"):
        board.flash(bundle, "/dev/cinders-no-such-port")
    master, slave = os.openpty()  # a serial line with no MicroPython behind it
    try:
        with pytest.raises(BoardError, match="does not answer as a MicroPython REPL"):
            board.flash(bundle, os.ttyname(slave), timeout=2)
        with pytest.raises(BoardError, match="does not answer as a MicroPython REPL"):
            board.run(os.ttyname(slave), [0.0] * 784, connect_timeout=2)
    finally:
        os.close(master)
        os.close(slave)
    with pytest.raises(FileNotFoundError, match="not a bundle"):
        board.flash(str(tmp_path), "/dev/cinders-no-such-port")
