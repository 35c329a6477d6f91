"""Issue 10, records: a model file never runs code, never costs more memory than its bytes, and
bad values get a RecordError naming the key or tensor. Each case here was a probe that got past
the loader before (imported modules, gigabytes allocated, NaN loaded silently...)."""

import json
import math
import os
import subprocess
import sys
import tracemalloc

import pytest

import cinders as cn
from cinders import nn, record
from cinders.micro import export, quantize
from cinders.models.mnist import MnistCNN, MnistMLP
from cinders.record import safetensors as st
from cinders.record import safetensors_write as stw

MLP_CLASS = "cinders.models.mnist.MnistMLP"


def mlp_record(tmp_path, name="mlp.safetensors", hidden=8, **meta):
    """A real MnistMLP record whose metadata is then overridden by `meta` (None deletes a key)."""
    path = str(tmp_path / name)
    cn.manual_seed(0)
    MnistMLP(hidden=hidden).save(path)
    if meta:
        rewrite(path, meta)
    return path


def rewrite(path, meta=None, tensors=None):
    """Rewrite a record with metadata keys replaced and tensors ({name: (code, shape, values)})
    replaced or added."""
    metadata, stored = st.read_file(path)
    metadata = dict(metadata)
    for k, v in (meta or {}).items():
        if v is None:
            metadata.pop(k, None)
        else:
            metadata[k] = v
    stored = dict(stored)
    stored.update(tensors or {})
    stw.write_file(path, stored, metadata)


# ---------------------------------------------------------------- classes come from a registry

def run_python(code, env_path=None):
    env = dict(os.environ)
    if env_path:
        env["PYTHONPATH"] = env_path + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_records_naming_modules_import_nothing(tmp_path):
    """cinders.__main__.X used to import the CLI (which ran the host's argv); this.X printed the
    Zen of Python; probe_evil.Evil ran a module found on PYTHONPATH; os.system was taken as the
    model source by export-micro. Now each is refused and no module is imported."""
    (tmp_path / "probe_evil.py").write_text(
        "open(%r, 'w').write('ran')\nimport cinders\nclass Evil(cinders.nn.Module):\n    pass\n"
        % str(tmp_path / "marker"))
    names = ["cinders.__main__.X", "this.X", "probe_evil.Evil", "os.system", "cinders.cli.main",
             "cinders.record.save_tensors", "builtins.eval", "cinders.nn.Module.__subclasses__"]
    paths = []
    for i, name in enumerate(names):
        paths.append(mlp_record(tmp_path, "r%d.safetensors" % i, model_class=name))
    out = run_python("""
import json, sys, os
import cinders as cn
from cinders.micro import export
before = set(sys.modules)
results = []
for path in %r:
    for how in ("load_model", "export"):
        try:
            if how == "load_model":
                cn.load_model(path)
            else:
                export.export_micro(path, os.path.join(%r, "bundle"))
            results.append("loaded")
        except cn.RecordError as e:
            results.append("RecordError" if "not allowed" in str(e) else "other: " + str(e))
new = sorted(m for m in set(sys.modules) - before if m.split(".")[0] in ("this", "probe_evil", "cinders"))
print(json.dumps({"results": results, "new_modules": new}))
""" % (paths, str(tmp_path)), env_path=str(tmp_path))
    last = json.loads(out.strip().splitlines()[-1])
    assert last["results"] == ["RecordError"] * (2 * len(names)), last
    assert "cinders.__main__" not in last["new_modules"] and "cinders.cli" not in last["new_modules"]
    assert not any(m.startswith(("this", "probe_evil")) for m in last["new_modules"]), last
    assert "The Zen of Python" not in out
    assert not (tmp_path / "marker").exists()
    assert not (tmp_path / "bundle" / "model.py").exists()


class UserNet(nn.Module):
    def __init__(self, width=3):
        super().__init__()
        self.fc = nn.Linear(2, width)

    def forward(self, x):
        return self.fc(x)

    def config(self):
        return {"width": self.fc.out_features}


def test_registered_and_allowed_classes_load(tmp_path):
    path = str(tmp_path / "user.safetensors")
    UserNet(width=4).save(path)
    with pytest.raises(cn.RecordError, match="not allowed"):
        cn.load_model(path)
    assert cn.load_model(path, allow=[UserNet]).fc.out_features == 4
    assert cn.load_model(path, allow=[sys.modules[__name__]]).fc.out_features == 4  # a module: its classes
    with pytest.raises(TypeError, match="never imported"):
        cn.load_model(path, allow=[UserNet.__module__ + ".UserNet"])
    # a record saved from another module (a script's __main__) finds the class by its name
    rewrite(path, {"model_class": "__main__.UserNet"})
    assert type(cn.load_model(path, allow=[UserNet])) is UserNet
    record.registry._registered.pop(record.class_path(UserNet), None)
    try:
        assert cn.register_model(UserNet) is UserNet
        assert type(cn.load_model(path)) is UserNet
        # export-micro resolves by the same rule and copies the class's own file
        # (check=False: this test file is no board model; export-micro's board check would list
        # every desktop-only name it uses)
        written = export.export_micro(path, str(tmp_path / "bundle"), check=False)
        assert str(tmp_path / "bundle" / "model.py") in written
        assert open(tmp_path / "bundle" / "model.py").read() == open(__file__).read()
    finally:
        record.registry._registered.pop(record.class_path(UserNet), None)
    with pytest.raises(TypeError):
        cn.register_model(len)


# ---------------------------------------------------------------- configs: types, ranges, size

def test_config_that_builds_a_huge_model_is_refused_before_allocating(tmp_path):
    """A 400 KB record claiming {"hidden": 30000} used to build a 94 MB-per-matrix model first."""
    path = mlp_record(tmp_path, model_config=json.dumps({"hidden": 30000}))
    tracemalloc.start()
    try:
        with pytest.raises(cn.RecordError, match=r"larger than the file.*model_config\['hidden'\] = 30000"):
            cn.load_model(path, backend=cn.NumPy())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * 2 ** 20, "loading a bad config allocated %d bytes" % peak
    # a config of the right class that builds other shapes than the file's is refused too
    rewrite(path, {"model_config": json.dumps({"hidden": 9})})
    with pytest.raises(cn.RecordError, match="does not match"):
        cn.load_model(path)


@pytest.mark.parametrize("config, message", [
    ({"hidden": -5}, r"model_config\['hidden'\] = -5 is the value at fault"),
    ({"hidden": "abc"}, r"model_config\['hidden'\] is 'abc'; MnistMLP.hidden takes an integer"),
    ({"hidden": 8.0}, r"model_config\['hidden'\] is 8.0; MnistMLP.hidden takes an integer"),
    ({"hidden": True}, r"model_config\['hidden'\] is True; MnistMLP.hidden takes an integer"),
    ({"hidden": 8, "depth": 2}, r"model_config key 'depth' is not an argument of MnistMLP"),
    ({"hidden": [8]}, r"model_config\['hidden'\] is \[8\]"),
])
def test_config_values_are_validated_naming_the_key(tmp_path, config, message):
    path = mlp_record(tmp_path, model_config=json.dumps(config))
    with pytest.raises(cn.RecordError, match=message):
        cn.load_model(path)
    with pytest.raises(cn.RecordError, match=message):
        MnistMLP.load(path)


def test_config_with_nan_or_not_an_object_is_refused(tmp_path):
    path = mlp_record(tmp_path, model_config='{"hidden": NaN}')
    with pytest.raises(cn.RecordError, match=r"model_config\['hidden'\] holds nan"):
        cn.load_model(path)
    rewrite(path, {"model_config": "[8]"})
    with pytest.raises(cn.RecordError, match="not a JSON object"):
        cn.load_model(path)
    rewrite(path, {"model_config": "[" * 100000})
    with pytest.raises(cn.RecordError, match="not JSON"):
        cn.load_model(path)


def test_shape_only_build_matches_the_real_model():
    """The meta build gives the same state names, shapes and dtypes as building for real, and
    the shape-only backend has every primitive of the protocol."""
    from cinders.backend import PRIMITIVES
    from cinders.record import validate
    assert [p for p in PRIMITIVES if not callable(getattr(validate.MetaBackend, p, None))] == []
    for cls, config in ((MnistCNN, {"channels1": 3, "channels2": 5, "hidden": 7}), (MnistMLP, {"hidden": 4}),
                        (nn.BatchNorm2d, {"num_features": 3}), (nn.TransformerEncoderLayer, {"d_model": 8, "nhead": 2})):
        real = record.spec_of(cls(**config).state_dict())
        assert validate._meta_build(cls, config, 10 ** 9) == real, cls


# ---------------------------------------------------------------- values

def test_nonfinite_weights_are_an_error_unless_allowed(tmp_path):
    path = mlp_record(tmp_path)
    _, stored = st.read_file(path)
    code, shape, values = stored["layers.3.bias"]
    values = list(values)
    values[4] = float("nan")
    rewrite(path, tensors={"layers.3.bias": (code, shape, values)})
    with pytest.raises(cn.RecordError, match=r"'layers.3.bias' holds nan at flat index 4.*allow_nonfinite=True"):
        cn.load_model(path)
    target = MnistMLP(hidden=8)
    before = target.state_dict()["layers.3.bias"].tolist()
    with pytest.raises(cn.RecordError, match="allow_nonfinite"):
        target.load(path)
    assert target.state_dict()["layers.3.bias"].tolist() == before  # nothing loaded
    model = cn.load_model(path, allow_nonfinite=True)
    assert math.isnan(model.state_dict()["layers.3.bias"].tolist()[4])
    assert math.isnan(MnistMLP.load(path, allow_nonfinite=True).state_dict()["layers.3.bias"].tolist()[4])
    values[4] = float("-inf")
    rewrite(path, tensors={"layers.3.bias": ("F16", shape, values)})
    with pytest.raises(cn.RecordError, match=r"holds -inf at flat index 4"):
        MnistMLP(hidden=8).load(path)


def int8_record(tmp_path):
    src = mlp_record(tmp_path, "float.safetensors")
    dst = str(tmp_path / "int8.safetensors")
    quantize.quantize_file(src, dst)
    return dst


@pytest.mark.parametrize("change, message", [
    (lambda s: {"layers.1.weight.scale": ("I32", (8,), [1] * 8)}, "is I32; int8 scales are F32"),
    (lambda s: {"layers.1.weight.scale": ("F32", (4, 2), [0.01] * 8)}, r"has shape \(4, 2\).*needs shape \(8,\)"),
    (lambda s: {"layers.1.weight.scale": ("F32", (7,), [0.01] * 7)}, r"has shape \(7,\).*needs shape \(8,\)"),
    (lambda s: {"layers.1.weight.scale": ("F32", (8,), [0.01] * 7 + [-1.0])}, r"scale'\[7\] = -1.0"),
    (lambda s: {"layers.1.weight.scale": ("F32", (8,), [0.01] * 7 + [float("inf")])}, r"scale'\[7\] = inf"),
    (lambda s: {"layers.3.bias.scale": ("F32", (10,), [1.0] * 10)}, "scale without an int8 tensor"),
])
def test_int8_scales_are_checked(tmp_path, change, message):
    path = int8_record(tmp_path)
    _, stored = st.read_file(path)
    rewrite(path, tensors=change(stored))
    with pytest.raises(cn.RecordError, match=message):
        cn.load_model(path)


def test_int8_record_still_loads(tmp_path):
    model = cn.load_model(int8_record(tmp_path))
    assert type(model) is MnistMLP and model.config() == {"hidden": 8}


def test_unknown_format_or_newer_version_is_refused(tmp_path):
    path = mlp_record(tmp_path, format="keras")
    with pytest.raises(cn.RecordError, match="format 'keras' is not one this cinders reads"):
        cn.load_model(path)
    with pytest.raises(cn.RecordError, match="format 'keras'"):
        MnistMLP(hidden=8).load(path)
    rewrite(path, {"format": "cinders", "cinders_version": "9.2.0"})
    with pytest.raises(cn.RecordError, match=r"written by cinders 9\.2\.0, newer than this cinders %s"
                       % cn.__version__.replace(".", r"\.")):
        cn.load_model(path)
    with pytest.raises(cn.RecordError, match="written by cinders 9.2.0"):
        record.read_metadata(path)
    rewrite(path, {"cinders_version": "banana"})
    with pytest.raises(cn.RecordError, match="not a version"):
        cn.load_model(path)
    rewrite(path, {"cinders_version": "0.0.1", "format": "pt"})  # older, and plain safetensors: fine
    assert type(cn.load_model(path)) is MnistMLP


def test_checking_a_record_leaves_seeds_and_other_threads_alone(tmp_path):
    import threading
    from cinders.tensor import default_backend_here
    path = mlp_record(tmp_path, hidden=4)
    cn.manual_seed(5)
    cn.load_model(path)
    after_load = cn.random(3).tolist()
    cn.manual_seed(5)
    MnistMLP(hidden=4)  # what loading builds for real: the same seeds drawn, no more
    assert cn.random(3).tolist() == after_load
    seen = []
    meta = record.validate.MetaBackend(10)
    with default_backend_here(meta):
        assert cn.default_backend() is meta
        worker = threading.Thread(target=lambda: seen.append(cn.default_backend()))
        worker.start()
        worker.join()
    assert seen[0] is not meta and cn.default_backend() is seen[0]


class ReadsValues(nn.Module):
    """A constructor that reads tensor values: it cannot be built on shapes alone."""

    def __init__(self, n=3):
        super().__init__()
        self.w = cn.ones(n)
        self._total = self.w.sum().item()

    def config(self):
        return {"n": self.w.shape[0]}


def test_models_whose_constructor_reads_values_still_load(tmp_path):
    path = str(tmp_path / "reads.safetensors")
    ReadsValues(4).save(path)
    model = cn.load_model(path, allow=[ReadsValues])
    assert model.w.shape == (4,) and model._total == 4.0
    rewrite(path, {"model_config": json.dumps({"n": 5})})
    with pytest.raises(cn.RecordError, match="does not match"):  # checked after the real build
        cn.load_model(path, allow=[ReadsValues])


class Annotated(nn.Module):
    def __init__(self, rate: float = 0, width=2):
        super().__init__()
        self.rate = rate
        self.w = cn.zeros(width)

    def config(self):
        return {"rate": self.rate, "width": self.w.shape[0]}


def test_annotations_decide_config_types_before_defaults(tmp_path):
    path = str(tmp_path / "annotated.safetensors")
    Annotated(rate=0.5, width=3).save(path)
    assert cn.load_model(path, allow=[Annotated]).rate == 0.5   # `rate: float = 0` takes 0.5
    rewrite(path, {"model_config": json.dumps({"rate": 0.5, "width": 3.0})})
    with pytest.raises(cn.RecordError, match=r"model_config\['width'\] is 3.0; Annotated.width takes an integer"):
        cn.load_model(path, allow=[Annotated])
