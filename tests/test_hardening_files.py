"""Issue 26, files stay inside their folder and --out never replaces a link or a device: ONNX
external data (symlinks out, FIFOs, devices, directories, lengths that disagree with the dims,
regions shared by many initializers), unbounded reads (/dev/zero), records and checkpoints
that are FIFOs, and the writers behind `--out` (records, import-onnx, export-web)."""

import os
import subprocess
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper

import cinders as cn
import cinders.onnx
from cinders import record
from cinders.errors import CindersError, RecordError, printable
from cinders.onnx import OnnxError


def external_model(folder, n=4, location="w.bin", length=None, copies=1, offset=0):
    """model.onnx in `folder` whose initializers w0.. each read n float32 from `location`."""
    inits, nodes, outputs = [], [], []
    for i in range(copies):
        t = TensorProto(name="w%d" % i, data_type=TensorProto.FLOAT, dims=[n])
        t.data_location = TensorProto.EXTERNAL
        entries = {"location": location, "offset": str(offset), "length": str(4 * n if length is None else length)}
        for k, v in entries.items():
            e = t.external_data.add()
            e.key, e.value = k, v
        inits.append(t)
        nodes.append(helper.make_node("Identity", ["w%d" % i], ["y%d" % i]))
        outputs.append(helper.make_tensor_value_info("y%d" % i, TensorProto.FLOAT, [n]))
    graph = helper.make_graph(nodes, "g", [], outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = os.path.join(folder, "model.onnx")
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
    return path


def test_external_data_inside_the_folder_loads(tmp_path):
    np.arange(4, dtype=np.float32).tofile(tmp_path / "w.bin")
    m = cinders.onnx.load(external_model(str(tmp_path)), backend=cn.NumPy())
    assert m().tolist() == [0, 1, 2, 3]


def test_external_data_symlink_out_of_the_folder_is_refused(tmp_path):
    (tmp_path / "secret").write_bytes(b"SECRETSECRETSECR")
    (tmp_path / "model").mkdir()
    os.symlink(tmp_path / "secret", tmp_path / "model" / "w.bin")
    with pytest.raises(OnnxError, match="outside"):
        cinders.onnx.load(external_model(str(tmp_path / "model")), backend=cn.NumPy())


def test_external_data_symlink_inside_the_folder_is_followed(tmp_path):
    np.arange(4, dtype=np.float32).tofile(tmp_path / "real.bin")
    os.symlink("real.bin", tmp_path / "w.bin")
    assert cinders.onnx.load(external_model(str(tmp_path)), backend=cn.NumPy())().tolist() == [0, 1, 2, 3]


def test_external_data_fifo_is_refused_not_hung(tmp_path):
    os.mkfifo(tmp_path / "w.bin")
    path = external_model(str(tmp_path))
    # in a child: a hang must fail the test, not block the suite
    code = "import cinders.onnx, cinders as cn\ntry:\n cinders.onnx.load(%r, backend=cn.NumPy())\n" \
           "except cinders.onnx.OnnxError as e:\n print('refused', e)\n" % path
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "refused" in out.stdout and "FIFO" in out.stdout, out.stdout + out.stderr


@pytest.mark.parametrize("location", ["/dev/zero", "sub", "../w.bin"])
def test_external_data_devices_folders_and_parents_are_refused(tmp_path, location):
    (tmp_path / "sub").mkdir()
    with pytest.raises(OnnxError):
        cinders.onnx.load(external_model(str(tmp_path), location=location), backend=cn.NumPy())


def test_external_length_is_checked_against_the_dims_before_reading(tmp_path):
    # one element, a 1.5 GB length: refused from the header, nothing read
    with open(tmp_path / "w.bin", "wb") as f:
        f.truncate(1 << 20)
    with pytest.raises(OnnxError, match="external data length"):
        cinders.onnx.load(external_model(str(tmp_path), n=1, length=1500 << 20), backend=cn.NumPy())


def test_one_region_named_by_many_initializers_is_refused(tmp_path):
    np.zeros(1024, np.float32).tofile(tmp_path / "w.bin")
    assert len(cinders.onnx.load(external_model(str(tmp_path), n=1024), backend=cn.NumPy()).state_dict()) == 1
    with pytest.raises(OnnxError, match="more than the external files hold"):
        cinders.onnx.load(external_model(str(tmp_path), n=1024, copies=200), backend=cn.NumPy())


def test_device_and_fifo_as_the_model_are_refused(tmp_path):
    with pytest.raises(OnnxError, match="device"):
        cinders.onnx.load("/dev/zero")
    os.mkfifo(tmp_path / "m.onnx")
    with pytest.raises(OnnxError, match="FIFO"):
        cinders.onnx.load(str(tmp_path / "m.onnx"))
    with pytest.raises(OnnxError, match="directory"):
        cinders.onnx.load(str(tmp_path))


def test_fifo_records_and_checkpoints_are_refused(tmp_path):
    os.mkfifo(tmp_path / "r.safetensors")
    with pytest.raises(RecordError, match="FIFO"):
        record.read_tensors(str(tmp_path / "r.safetensors"), cn.NumPy())
    with pytest.raises(RecordError, match="FIFO"):
        record.load_pytorch(str(tmp_path / "r.safetensors"))
    with pytest.raises(RecordError, match="device"):
        record.load_pytorch("/dev/zero")


def _tensors():
    return {"w": cn.tensor([1.0, 2.0], backend=cn.NumPy())}


def test_out_never_replaces_a_symlink(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    os.symlink(victim, tmp_path / "out.safetensors")
    with pytest.raises(RecordError, match="symlink"):
        record.save_tensors(str(tmp_path / "out.safetensors"), _tensors())
    assert os.path.islink(tmp_path / "out.safetensors") and victim.read_text() == "keep me"


def test_out_never_replaces_a_special_file(tmp_path):
    os.mkfifo(tmp_path / "out.safetensors")
    with pytest.raises(RecordError, match="FIFO"):
        record.save_tensors(str(tmp_path / "out.safetensors"), _tensors())
    with pytest.raises(RecordError, match="device"):
        record.save_tensors("/dev/null", _tensors())
    assert not [p for p in os.listdir(tmp_path) if ".tmp" in p]


def test_out_replaces_a_regular_file(tmp_path):
    (tmp_path / "out.safetensors").write_text("old")
    record.save_tensors(str(tmp_path / "out.safetensors"), _tensors())
    assert record.read_tensors(str(tmp_path / "out.safetensors"), cn.NumPy())[1]["w"].tolist() == [1, 2]


def test_import_onnx_refuses_a_symlinked_py_and_leaves_no_temporary(tmp_path):
    np.arange(4, dtype=np.float32).tofile(tmp_path / "w.bin")
    src = external_model(str(tmp_path))
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "victim.py").write_text("keep")
    os.symlink(tmp_path / "victim.py", out / "m.py")
    with pytest.raises(OnnxError, match="symlink"):
        cinders.onnx.import_onnx(src, str(out), name="m")
    assert (tmp_path / "victim.py").read_text() == "keep"
    assert not [p for p in os.listdir(out) if p.endswith(".tmp")]


def test_import_onnx_writes_non_ascii_sources(tmp_path):
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="nœud")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
                              doc_string="modèle")
    graph.node[0].doc_string = "défini"
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], doc_string="é")
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    py = cinders.onnx.import_onnx(str(path), str(tmp_path / "out"), name="m")[0]
    assert os.path.exists(py) and not [p for p in os.listdir(tmp_path / "out") if p.endswith(".tmp")]


def test_messages_escape_control_characters():
    e = OnnxError("op \x1b[2J\x1b[Hfake\rline\nnext \u202e")
    text = str(e)
    assert text.isprintable() and "\\x1b" in text and "\n" not in text
    assert len(str(RecordError("x" * 10 ** 7))) < 3000
    assert printable("é ok") == "é ok"


def test_cli_prints_one_escaped_line(tmp_path, capsys):
    from cinders.cli import main
    bad = tmp_path / "evil\x1b[2Jname.onnx"
    bad.write_bytes(b"\x0a\x05\x1b[2J\x07")
    assert main(["import-onnx", str(bad), "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert "\x1b" not in err and err.count("\n") == 1, err


def test_export_web_model_source_must_be_a_python_file(tmp_path):
    from cinders.web.export import model_class_in
    (tmp_path / "model.txt").write_text("class M: pass")
    (tmp_path / "bin.py").write_bytes(b"\xff\xfe\0\0class")
    for path in (tmp_path / "model.txt", tmp_path / "bin.py", tmp_path):
        with pytest.raises(CindersError):
            model_class_in(str(path), "M")


def test_quantize_out_never_replaces_a_symlink(tmp_path):
    from cinders.micro import quantize
    from cinders.models.mnist import MnistMLP
    cn.manual_seed(0)
    MnistMLP(hidden=4).save(str(tmp_path / "m.safetensors"))
    (tmp_path / "victim").write_text("keep")
    os.symlink(tmp_path / "victim", tmp_path / "q.safetensors")
    with pytest.raises(RecordError, match="symlink"):
        quantize.quantize_file(str(tmp_path / "m.safetensors"), str(tmp_path / "q.safetensors"))
    assert (tmp_path / "victim").read_text() == "keep"
