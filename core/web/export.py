"""`cinders export-web RECORD --model-source FILE --out DIR` and `cinders serve DIR`.

The folder it writes is a complete static site that runs the model in the browser and needs
nothing from the internet. The model runs in a Web Worker (wasm/cinders.js,
`Cinders.load({worker: true})`, as on the demo pages): the page shows a progress bar and answers
input while Pyodide (started from its memory snapshot) and the model load.

    DIR/index.html           a minimal page: an input box (JSON), a Run button, the output, progress
    DIR/app.js               the page's script: loads the model in the worker, runs it on Run
    DIR/<model source>.py    the model's class, copied unchanged (imported in the worker)
    DIR/model.safetensors    the record
    DIR/wasm/                cinders.js, its worker, its kernel threads' scripts and the snapshot's reader
    DIR/wheels/              cinders itself (pure Python), its bytecode and Pyodide snapshot
    DIR/wasm-kernels/        cn.Wasm()'s kernels, for browsers without WebGPU
    DIR/node_modules/pyodide/   the Pyodide interpreter (npm `pyodide`, local copy)

Any static file server serves it (`cinders serve DIR` is one, on 127.0.0.1, with the files
brotli-compressed and the site cross-origin isolated); edit index.html and app.js to make the page
your own. Nothing of the model source runs here: it is checked to parse and copied.
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
  <link rel="modulepreload" href="./wasm/cinders.js">
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
  <div>Status: <span id="status">loading</span>
    <progress id="load-progress" max="4" value="0" aria-label="Loading"></progress>
    <span id="load-bytes"></span> · Backend: <span id="backend">?</span></div>
  <script type="module" src="./app.js"></script>
</body>
</html>
"""
APP = """// The page's script (written by `cinders export-web`; edit freely). The model runs in a Web
// Worker (wasm/cinders.js): this thread only shows progress and results, so it answers input
// while the model loads. ?backend=webgpu|wasm|python forces a backend.
import {{ Cinders }} from "./wasm/cinders.js";

const INPUT_SHAPE = {shape};  // one sample
const $ = (id) => document.getElementById(id);

// A Python exception arrives as its traceback: its last line names it ("ValueError: ...").
function errorLine(error) {{
  const lines = String(error && error.message ? error.message : error).trim().split("\\n").filter((l) => l.trim());
  return (lines[lines.length - 1] || "unknown error").trim();
}}

function showProgress({{ step, steps, bytes }}) {{
  $("load-progress").max = steps;
  $("load-progress").value = step;
  $("load-bytes").textContent = `${{(bytes / 1e6).toFixed(1)}} MB`;
}}

let model;
try {{
  model = await Cinders.load({{
    model: "./model.safetensors", modelSource: "./{source}", worker: true,
    backend: new URLSearchParams(location.search).get("backend") || "auto",
    onStatus: (text) => {{ $("status").textContent = text; }},
    onProgress: showProgress,
  }});
  $("backend").textContent = model.backend;
  $("load-progress").hidden = true;
  $("run").disabled = false;
  $("status").textContent = "ready";
}} catch (error) {{
  $("status").textContent = "error: " + errorLine(error);
  throw error;
}}

$("run").addEventListener("click", async () => {{
  $("status").textContent = "running";
  try {{
    // One sample (flat or nested) is a batch of one; the worker checks the count.
    const result = await model.run([JSON.parse($("input").value)].flat(Infinity), INPUT_SHAPE);
    $("output").textContent = JSON.stringify(result.values);
    $("status").textContent = "ready";
  }} catch (error) {{  // shown in the page, where the user looks, instead of the old output
    $("output").textContent = "";
    $("status").textContent = "error: " + errorLine(error);
  }}
}});
"""


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
    _write_runtime(out_dir, node_modules)
    for src, dst in ((record_path, "model.safetensors"), (model_source, module + ".py")):
        shutil.copyfile(src, check_writable_target(os.path.join(out_dir, dst), RecordError))
    written = {"app.js": APP.format(source=module + ".py", shape=json.dumps(list(input_shape))),
               "index.html": PAGE.format(title="%s in the browser" % cls, shape=tuple(input_shape),
                                         example=json.dumps(_zeros(input_shape)))}
    for name, text in written.items():
        with open(check_writable_target(os.path.join(out_dir, name), RecordError), "w") as f:
            f.write(text)
    return _precompressed(out_dir)


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
    return _precompressed(out_dir)


def export_onnx(model_path, out_dir, node_modules=None):
    """Write the static site of an ONNX model: the model page (web_demos/model/) imports
    DIR/model/model.onnx in the tab and runs it; returns the files written. The model is checked
    to import here first, so a graph Cinders refuses is refused now, not in the user's tab."""
    from ..onnx import load
    from .server import REPO_ROOT
    load(model_path)
    _write_page_site(os.path.join(REPO_ROOT, "web_demos", "model"), "model", out_dir, node_modules)
    shutil.copyfile(model_path, check_writable_target(os.path.join(out_dir, "model", "model.onnx"), RecordError))
    return _precompressed(out_dir)


def _write_page_site(page_dir, page, out_dir, node_modules):
    """The page, the JS the pages share, the runtime (_write_runtime) and DIR/index.html, which
    sends the browser to the page."""
    from .server import REPO_ROOT
    _write_runtime(out_dir, node_modules, replace=(page, "shared"))
    shutil.copytree(page_dir, os.path.join(out_dir, page))
    shutil.copytree(os.path.join(REPO_ROOT, "web_demos", "shared"), os.path.join(out_dir, "shared"))
    with open(check_writable_target(os.path.join(out_dir, "index.html"), RecordError), "w") as f:
        f.write(REDIRECT.format(page=page))


def _write_runtime(out_dir, node_modules, replace=()):
    """What every page loads, laid out as the demo server serves it (cinders.js finds the rest
    relative to itself): DIR/wasm/ (cinders.js and its worker), DIR/node_modules/pyodide/,
    DIR/wheels/ (the wheel, its bytecode and Pyodide snapshot, their manifest), DIR/wasm-kernels/
    (cn.Wasm()'s module, when it could be built). Folders of an earlier export (and `replace`)
    are replaced."""
    from ..assets import web_deps_dir
    from .server import REPO_ROOT, ensure_wasm_module, wasm_module_dir
    from .wheel import MANIFEST, ensure_wheel
    node_modules = node_modules or web_deps_dir()
    pyodide = _npm_package(node_modules, "pyodide")
    os.makedirs(out_dir, exist_ok=True)
    for name in tuple(replace) + ("wasm", "node_modules", "wheels", "wasm-kernels"):
        if os.path.isdir(os.path.join(out_dir, name)):
            shutil.rmtree(os.path.join(out_dir, name))
    shutil.copytree(pyodide, os.path.join(out_dir, "node_modules", "pyodide"),
                    ignore=shutil.ignore_patterns(*NOT_SHIPPED))
    os.makedirs(os.path.join(out_dir, "wasm"))
    for name in ("cinders.js", "cinders-worker.js", "kernel_threads.mjs", "cinders-kernel-thread.js", "snapshot_pages.mjs"):
        shutil.copyfile(os.path.join(REPO_ROOT, "wasm", name), os.path.join(out_dir, "wasm", name))
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
        # the threaded build, for a site served cross-origin isolated (cinders serve: COOP/COEP)
        threaded = os.path.join(wasm_module_dir(), "cinders-kernels-threads.wasm")
        if os.path.isfile(threaded):
            shutil.copyfile(threaded, os.path.join(out_dir, "wasm-kernels", "cinders-kernels-threads.wasm"))


def _precompressed(out_dir):
    """Each compressible file's brotli and gzip copies beside it (server.precompress: no compressing
    on a visitor's request); returns every file of the site."""
    from .server import precompress
    precompress(out_dir)
    return _files_under(out_dir)


def _files_under(folder):
    return sorted(os.path.join(root, name) for root, _, names in os.walk(folder) for name in names)
