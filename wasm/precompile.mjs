// Prepares the cinders wheel for fast browser start-up with the very Pyodide the browser runs, in
// Node (bytecode and memory are specific to one Pyodide build, so they cannot be made by the
// desktop's Python).
//
//   node wasm/precompile.mjs <pyodide folder> <wheel> <pycache.zip> <snapshot.bin>
//
// pycache.zip   __pycache__/*.pyc of every cinders module (unchecked-hash pycs: valid without
//               comparing source timestamps), so importing cinders compiles nothing.
// snapshot.bin  Pyodide's memory right after start-up with cinders imported, without its zero
//               pages (snapshot_pages.mjs)
//               (loadPyodide({_loadSnapshot})): the page skips the interpreter's own start-up,
//               most of a cold start. Pyodide marks the snapshot API experimental; cinders.js
//               falls back to a plain start when the snapshot does not load.
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";
import { dropZeroPages } from "./snapshot_pages.mjs";

const [pyodideDir, wheelPath, pycachePath, snapshotPath] = process.argv.slice(2);
const { loadPyodide } = await import(pathToFileURL(path.join(pyodideDir, "pyodide.mjs")).href);
const pyodide = await loadPyodide({ indexURL: pyodideDir + path.sep, _makeSnapshot: true,
                                    stdout: () => {}, stderr: console.error });
// Installed where the browser installs it, so the code objects name the same files.
const sitePackages = pyodide.runPython("import sysconfig; sysconfig.get_paths()['purelib']");
pyodide.unpackArchive(new Uint8Array(fs.readFileSync(wheelPath)), "wheel", { extractDir: sitePackages });
pyodide.runPython(`
import compileall, os, py_compile, sysconfig, zipfile
site = sysconfig.get_paths()["purelib"]
ok = compileall.compile_dir(os.path.join(site, "cinders"), quiet=1,
                            invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
if not ok:
    raise SystemExit("precompile: some cinders module does not compile")
with zipfile.ZipFile("/pycache.zip", "w", zipfile.ZIP_DEFLATED) as zf:
    for folder, _, files in sorted(os.walk(os.path.join(site, "cinders"))):
        for name in sorted(files):
            if name.endswith(".pyc"):
                full = os.path.join(folder, name)
                zf.write(full, os.path.relpath(full, site))
del compileall, os, py_compile, sysconfig, zipfile, site, ok, zf, folder, files, name, full
`);
fs.writeFileSync(pycachePath, pyodide.FS.readFile("/pycache.zip"));
// The snapshot imports cinders from the wheel file itself (zipimport) instead of its unpacked
// copy: a page started from it then only writes the wheel's bytes to the same path
// (cinders.js, startPyodide), a millisecond, where unpacking took a quarter of a second; the
// zipimporter's table of contents is in the snapshot, and modules imported later (on demand) and
// tracebacks read the file. The unpacked copy (and its bytecode) serves a start without snapshot.
const wheelInSnapshot = sitePackages + "/" + path.basename(wheelPath);
pyodide.FS.writeFile(wheelInSnapshot, new Uint8Array(fs.readFileSync(wheelPath)));
pyodide.runPython(`
import shutil, sys, sysconfig
shutil.rmtree(sysconfig.get_paths()["purelib"] + "/cinders")
sys.path.insert(0, ${JSON.stringify(wheelInSnapshot)})
sys.path_importer_cache.clear()
del shutil, sys, sysconfig
`);
// Every cinders module that imports here (those needing NumPy, wgpu-py, ... cannot), so a page
// imports nothing itself, plus what unpackArchive runs on (a start without the snapshot unpacks the wheel).
// No module may hold a JS object at import time: the snapshot is plain wasm memory.
// Pyodide restores a snapshot into its wasm memory as first sized, never grown, so the imported
// modules must fit in it ("offset is out of bounds" when they did not), with room to spare: how
// much memory an import takes varies from run to run (string hashes are salted per process), and
// a margin of a few hundred KB once made every second build fail. Left out, so:
//   - the tools a page loads only on demand: the ONNX importer, the apps and their audio/vision
//     helpers, cn.Router/cn.Remote, data-parallel training, the PyTorch reader, the board exporter;
//   - what only the desktop runs: the CLI (argparse), the demo server (http.server, email), the
//     site exporter, the kernels' build and desktop engines, Remote's server-to-server peers.
const HEADROOM_BYTES = 3 << 20;
const memoryAtStart = pyodide._module.HEAP8.length;
pyodide.runPython(`
import importlib, posixpath, zipfile
import pyodide._package_loader
with zipfile.ZipFile(${JSON.stringify(wheelInSnapshot)}) as wheel:
    sources = sorted(posixpath.split(n) for n in wheel.namelist() if n.startswith("cinders/"))
for folder, name in sources:
    package = folder.replace("/", ".")
    on_demand = package.startswith(("cinders.micro", "cinders.onnx", "cinders.apps")) or name in (
        "pytorch.py", "pickle_vm.py", "remote.py", "remote_wire.py", "remote_socket.py", "remote_server.py",
        "router.py", "data_parallel.py", "vision.py", "audio.py")
    desktop_only = name in ("__main__.py", "cli.py", "server.py", "export.py", "build.py", "engines.py",
                            "remote_peers.py")
    if name.endswith(".py") and not (on_demand or desktop_only):
        module = package if name == "__init__.py" else package + "." + name[:-3]
        try:
            importlib.import_module(module)
        except Exception:  # desktop-only (numpy, wgpu-py, ...) or a script: not for the browser
            pass
del importlib, posixpath, zipfile, wheel, sources, folder, package, name, module, on_demand, desktop_only
`);
// Everything imported lives as long as the page: frozen out of the collector's generations here,
// so the page's first collection (cinders.web.bridge.load_model's) scans only what it made itself.
pyodide.runPython("import gc; gc.collect(); gc.freeze(); del gc");
// The headroom, proven: a block of HEADROOM_BYTES must still fit without growing the memory.
pyodide.runPython(`_headroom = bytearray(${HEADROOM_BYTES}); del _headroom`);
if (pyodide._module.HEAP8.length > memoryAtStart) {
  console.error(`precompile: importing cinders left less than ${HEADROOM_BYTES} bytes free in ` +
                `Pyodide's first ${memoryAtStart} bytes of memory (it grew to ${pyodide._module.HEAP8.length}); ` +
                "a snapshot would not restore reliably. Load more modules on demand (see the list above). " +
                "No snapshot written.");
  process.exit(1);
}
// Stored without its zero pages (snapshot_pages.mjs): half the bytes for the browser to decode.
fs.writeFileSync(snapshotPath, dropZeroPages(pyodide.makeMemorySnapshot()));
