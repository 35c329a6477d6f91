"""`cinders export-web RECORD --model-source FILE --out DIR` and `cinders serve DIR`.

The folder it writes is a complete static site that runs the model in the browser with
PyScript (Pyodide) and needs nothing from the internet:

    DIR/index.html           a minimal page: an input box (JSON), a Run button, the output
    DIR/main.py              the page's Python: picks WebGPU or the CPU, loads the record, runs
    DIR/pyscript.json        PyScript's configuration: the local interpreter and the files below
    DIR/<model source>.py    the model's class, copied unchanged
    DIR/model.safetensors    the record
    DIR/cinders-*.whl        cinders itself (pure Python), unpacked by PyScript into the page
    DIR/wasm-kernels/        cn.Wasm()'s kernels, for browsers without WebGPU
    DIR/vendor/pyodide/      the Pyodide interpreter (npm `pyodide`, local copy)
    DIR/vendor/pyscript/     PyScript (npm `@pyscript/core`, local copy)

Any static file server serves it (`cinders serve DIR` is one, on 127.0.0.1); edit index.html and
main.py to make the page your own. Nothing of the model source runs here: it is checked to parse
and copied.
"""
import ast
import json
import os
import shutil

from ..errors import RecordError
from ..files import check_writable_target, open_regular
from ..record import read_metadata, validate

# What a page does not need of the npm packages: source maps, type files, Pyodide's consoles.
NOT_SHIPPED = ("*.map", "*.d.ts", "*.html", "README.md", "package.json")
PAGE = """<!doctype html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <meta name="viewport" content="width=device-width, initial-scale=1">
  <title>{title}</title>
  <link rel="icon" href="data:,">
  <link rel="stylesheet" href="./vendor/pyscript/core.css">
  <script type="module" src="./vendor/pyscript/core.js"></script>
  <style>
    body {{ font-family: system-ui, sans-serif; max-width: 720px; margin: 0 auto; padding: 1rem; }}
    textarea {{ width: 100%; font-family: monospace; }}
    #output {{ white-space: pre-wrap; font-family: monospace; }}
  </style>
</head>
<body>
  <h1>{title}</h1>
  <p>Input: one sample of shape {shape} (a flat or nested JSON list), or a list of samples.</p>
  <textarea id="input" rows="6">{example}</textarea>
  <button id="run" disabled>Run</button>
  <div>Output: <span id="output"></span></div>
  <div>Status: <span id="status">loading</span> · Backend: <span id="backend">?</span></div>
  <script type="py" src="./main.py" config="./pyscript.json"></script>
</body>
</html>
"""
MAIN = '''"""The page's Python (written by `cinders export-web`; edit freely). PyScript runs it with
top-level await; pyscript.json put cinders, the record and {source} in the working folder."""
import json

from pyscript import document, when

import cinders as cn
from cinders import record
from cinders.web import bridge

import {module} as model_source

INPUT_SHAPE = {shape!r}  # one sample


def show(selector, text):
    document.querySelector(selector).textContent = text


# WebGPU when the browser has it, else cn.Wasm() on the kernels shipped beside this page, else the CPU
chosen = await bridge.init("auto", kernels={kernels!r})  # noqa: F704
show("#backend", chosen["backend"])
# Only the classes of the model's own source may be named by the record (records name no code).
model = record.load_model("model.safetensors", allow=[model_source.{cls}])
model.eval()
document.querySelector("#run").disabled = False
show("#status", "ready")


def as_batch(values):
    """The input as a batch: one sample (flat or nested) becomes a batch of one."""
    x = cn.tensor(values)
    per_sample = 1
    for d in INPUT_SHAPE:
        per_sample *= d
    if x.numel() % per_sample:
        raise ValueError("the input holds %d numbers, not a multiple of %d (shape %s)"
                         % (x.numel(), per_sample, INPUT_SHAPE))
    return x.reshape(-1, *INPUT_SHAPE)


@when("click", "#run")
async def run(event):
    show("#status", "running")
    try:
        output = model(as_batch(json.loads(document.querySelector("#input").value)))
        values = await output.to_data_async()  # GPU results are read asynchronously in the browser
        show("#output", json.dumps(values))
        show("#status", "ready")
    except Exception as e:  # shown in the page, where the user looks, instead of the old output
        show("#output", "")
        show("#status", "error: %s: %s" % (type(e).__name__, " ".join(str(e).split())))
'''


def _npm_package(node_modules, name):
    folder = os.path.join(node_modules, *name.split("/"))
    if not os.path.isdir(folder):
        raise FileNotFoundError("%s is missing from %s: run scripts/setup.sh (it fetches the pinned npm "
                                "packages)" % (name, node_modules))
    return folder


MAX_SOURCE_BYTES = 16 << 20


def model_class_in(source_path, class_name):
    """Check that the model source defines class_name (parsed, not run)."""
    if not str(source_path).endswith(".py"):
        raise RecordError("--model-source %s is not a Python file (.py)" % ascii(str(source_path)))
    try:
        with open_regular(source_path, RecordError, "model source") as f:
            text = f.read(MAX_SOURCE_BYTES + 1)
        if len(text) > MAX_SOURCE_BYTES:
            raise RecordError("model source %s is over %d bytes" % (source_path, MAX_SOURCE_BYTES))
        tree = ast.parse(text.decode("utf-8"), source_path)
    except (SyntaxError, ValueError) as e:  # ValueError: not UTF-8, NUL bytes
        raise RecordError("model source %s is not valid Python: %s" % (source_path, e)) from None
    if not any(isinstance(n, ast.ClassDef) and n.name == class_name for n in tree.body):
        raise RecordError("%s does not define class %s, which the record names"
                          % (source_path, class_name))


def export_web(record_path, model_source, out_dir, input_shape=None, node_modules=None):
    """Write the static site of `record_path` into out_dir; returns the list of files written."""
    from ..assets import web_deps_dir
    meta = read_metadata(record_path)
    class_path = meta.get("model_class")
    if not class_path:
        raise RecordError("%s names no model_class: save it with model.save()" % record_path)
    cls = class_path.rpartition(".")[2]
    model_class_in(model_source, cls)
    module = os.path.splitext(os.path.basename(model_source))[0]
    if not module.isidentifier():
        raise ValueError("--model-source %s: the file name must be a Python module name" % model_source)
    if input_shape is None and meta.get("input_shape"):
        input_shape = validate.input_shape(meta["input_shape"], "record %s" % ascii(record_path))
    if input_shape is None:
        raise ValueError("%s records no input shape (saved before the model ever ran): pass "
                         "--input-shape A,B,..." % record_path)
    node_modules = node_modules or web_deps_dir()
    pyodide = _npm_package(node_modules, "pyodide")
    pyscript = os.path.join(_npm_package(node_modules, "@pyscript/core"), "dist")

    os.makedirs(out_dir, exist_ok=True)
    vendor = os.path.join(out_dir, "vendor")
    if os.path.isdir(vendor):
        shutil.rmtree(vendor)
    shutil.copytree(pyodide, os.path.join(vendor, "pyodide"), ignore=shutil.ignore_patterns(*NOT_SHIPPED))
    shutil.copytree(pyscript, os.path.join(vendor, "pyscript"), ignore=shutil.ignore_patterns(*NOT_SHIPPED))
    for old in os.listdir(out_dir):
        if old.startswith("cinders-") and old.endswith(".whl"):
            os.remove(os.path.join(out_dir, old))
    wheel_name = _write_wheel(out_dir)
    kernels = _copy_wasm_kernels(out_dir)
    for src, dst in ((record_path, "model.safetensors"), (model_source, module + ".py")):
        shutil.copyfile(src, check_writable_target(os.path.join(out_dir, dst), RecordError))
    config = {
        "interpreter": "./vendor/pyodide/pyodide.mjs",
        "files": {"./" + wheel_name: "./*", "./model.safetensors": "./model.safetensors",
                  "./%s.py" % module: "./%s.py" % module},
    }
    written = {"pyscript.json": json.dumps(config, indent=1) + "\n",
               "main.py": MAIN.format(source=module + ".py", module=module, cls=cls, shape=tuple(input_shape),
                                  kernels=kernels),
               "index.html": PAGE.format(title="%s in the browser" % cls, shape=tuple(input_shape),
                                         example=json.dumps(_zeros(input_shape)))}
    for name, text in written.items():
        with open(check_writable_target(os.path.join(out_dir, name), RecordError), "w") as f:
            f.write(text)
    return sorted(os.path.join(out_dir, n) for n in os.listdir(out_dir))


def _copy_wasm_kernels(out_dir):
    """cn.Wasm()'s module into DIR/wasm-kernels/ (built from source when missing), so a browser
    without WebGPU runs the site on it; its URL relative to the page."""
    from cinders.wasm.build import module_path, SERVED_NAME
    folder = os.path.join(out_dir, "wasm-kernels")
    os.makedirs(folder, exist_ok=True)
    shutil.copyfile(module_path(), check_writable_target(os.path.join(folder, SERVED_NAME), RecordError))
    return "./wasm-kernels/" + SERVED_NAME


def _write_wheel(out_dir):
    """Build the cinders wheel (sources only) in a private folder and move it into out_dir:
    the shared cache's wheel (with bytecode and snapshot for `cinders demo`) stays untouched."""
    import tempfile
    from .wheel import build_wheel
    with tempfile.TemporaryDirectory() as tmp:
        wheel = build_wheel(tmp, bytecode=False)
        name = os.path.basename(wheel)
        shutil.move(wheel, os.path.join(out_dir, name))
    return name


def _zeros(shape):
    if len(shape) == 1:
        return [0.0] * shape[0]
    return [_zeros(shape[1:]) for _ in range(shape[0])]


def serve(folder, port=8000, open_browser=False):
    """`cinders serve DIR`: serve a folder (an export-web site) on 127.0.0.1 until Ctrl-C."""
    from .server import DemoServer
    if not os.path.isdir(folder):
        raise FileNotFoundError("%s: no such folder" % folder)
    server = DemoServer(port=port, mounts=[("/", os.path.abspath(folder))])
    print("Serving %s at %s  (Ctrl-C to stop)" % (folder, server.url), flush=True)
    server.serve_until_interrupted(open_browser)


# ---------------------------------------------------------------- apps and ONNX models
# `cinders export-web --app vad|ocr --out DIR` and `cinders export-web MODEL.onnx --out DIR` write
# the folder the demo server serves, cut down to one page: DIR/<page>/ (the page), DIR/shared/
# (the JS the pages share), DIR/wasm/
# (cinders.js), DIR/node_modules/pyodide/, DIR/wheels/ (the cinders wheel and its manifest),
# DIR/wasm-kernels/ (cn.Wasm()'s module, when it could be built), DIR/shipped-models/ (the app's
# models) and DIR/index.html, which sends the browser to the page. The pages name ../wasm/ and
# ../shipped-models/ relative to themselves, so the folder works at the root of any static server
# or in a subfolder of one; it needs nothing else.
APPS = {"vad": ["silero_vad.onnx"],
        "ocr": ["PP-OCRv6_det_small.onnx", "ch_ppocr_mobile_v2.0_cls_mobile.onnx", "PP-OCRv6_rec_small.onnx"]}
REDIRECT = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="0; url={page}/">
<title>{page}</title><link rel="icon" href="data:,"></head>
<body><a href="{page}/">{page}</a></body></html>
"""


def export_app(app, out_dir, node_modules=None):
    """Write the static site of one of Cinders' app pages (APPS); returns the files written."""
    from ..apps import shipped
    from .server import REPO_ROOT
    if app not in APPS:
        raise ValueError("no app %s (known: %s)" % (ascii(app), ", ".join(sorted(APPS))))
    _write_page_site(os.path.join(REPO_ROOT, "web_demos", app), app, out_dir, node_modules)
    models = os.path.join(out_dir, "shipped-models")
    os.makedirs(models, exist_ok=True)
    for name in APPS[app]:
        shutil.copyfile(shipped.model_path(name), os.path.join(models, name))
    return _files_under(out_dir)


def export_onnx(model_path, out_dir, node_modules=None):
    """Write the static site of an ONNX model: the model page (web_demos/model/) imports
    DIR/model/model.onnx in the tab and runs it; returns the files written. The model is checked
    to import here first, so a graph Cinders refuses is refused now, not in the user's tab."""
    from ..onnx import load
    from .server import REPO_ROOT
    load(model_path)
    _write_page_site(os.path.join(REPO_ROOT, "web_demos", "model"), "model", out_dir, node_modules)
    shutil.copyfile(model_path, check_writable_target(os.path.join(out_dir, "model", "model.onnx"), RecordError))
    return _files_under(out_dir)


def _write_page_site(page_dir, page, out_dir, node_modules):
    """The page and the runtime every page loads (cinders.js, Pyodide, the wheel, the kernels)."""
    from ..assets import web_deps_dir
    from .server import REPO_ROOT, ensure_wasm_module, wasm_module_dir
    from .wheel import MANIFEST, ensure_wheel
    node_modules = node_modules or web_deps_dir()
    pyodide = _npm_package(node_modules, "pyodide")
    os.makedirs(out_dir, exist_ok=True)
    for name in (page, "shared", "wasm", "node_modules", "wheels", "wasm-kernels"):
        if os.path.isdir(os.path.join(out_dir, name)):
            shutil.rmtree(os.path.join(out_dir, name))
    shutil.copytree(page_dir, os.path.join(out_dir, page))
    shutil.copytree(os.path.join(REPO_ROOT, "web_demos", "shared"), os.path.join(out_dir, "shared"))
    shutil.copytree(pyodide, os.path.join(out_dir, "node_modules", "pyodide"),
                    ignore=shutil.ignore_patterns(*NOT_SHIPPED))
    os.makedirs(os.path.join(out_dir, "wasm"))
    shutil.copyfile(os.path.join(REPO_ROOT, "wasm", "cinders.js"), os.path.join(out_dir, "wasm", "cinders.js"))
    wheel = ensure_wheel()
    wheels = os.path.join(out_dir, "wheels")
    os.makedirs(wheels)
    with open(os.path.join(os.path.dirname(wheel), MANIFEST)) as f:
        manifest = json.load(f)
    for key in ("wheel", "pycache", "snapshot"):
        if manifest.get(key):
            shutil.copyfile(os.path.join(os.path.dirname(wheel), manifest[key]), os.path.join(wheels, manifest[key]))
    shutil.copyfile(os.path.join(os.path.dirname(wheel), MANIFEST), os.path.join(wheels, MANIFEST))
    ensure_wasm_module()            # without the toolchain the page runs on WebGPU or Python
    kernels = os.path.join(wasm_module_dir(), "cinders-kernels.wasm")
    if os.path.isfile(kernels):
        os.makedirs(os.path.join(out_dir, "wasm-kernels"))
        shutil.copyfile(kernels, os.path.join(out_dir, "wasm-kernels", "cinders-kernels.wasm"))
    with open(check_writable_target(os.path.join(out_dir, "index.html"), RecordError), "w") as f:
        f.write(REDIRECT.format(page=page))


def _files_under(folder):
    return sorted(os.path.join(root, name) for root, _, names in os.walk(folder) for name in names)
