// Runs a benchmark script inside Pyodide under Node, with `cinders` importable from core/, to
// measure what the browser's CPU fallback costs (Pyodide's CPython compiled to wasm; no NumPy).
//
//   node benchmarks/pyodide_run.mjs benchmarks/python_backend.py [args...]
//
// Pyodide comes from the web cache that `cinders.assets.web_deps_dir()` fills
// ($CINDERS_CACHE or <repo>/.cache, then web/node_modules).
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const cache = process.env.CINDERS_CACHE || path.join(repo, ".cache");
const pyodideModule = path.join(cache, "web", "node_modules", "pyodide", "pyodide.mjs");
const [script, ...args] = process.argv.slice(2);
if (!script) {
  console.error("usage: node benchmarks/pyodide_run.mjs SCRIPT.py [args...]");
  process.exit(2);
}

const { loadPyodide } = await import(pathToFileURL(pyodideModule).href);
const pyodide = await loadPyodide();
pyodide.FS.mkdirTree("/repo");
pyodide.FS.mount(pyodide.FS.filesystems.NODEFS, { root: repo }, "/repo");
pyodide.FS.mkdirTree("/site");
pyodide.FS.symlink("/repo/core", "/site/cinders");  // the package layout setup.py builds
const scriptPath = "/repo/" + path.relative(repo, path.resolve(script));
pyodide.globals.set("script_argv", pyodide.toPy([scriptPath, ...args]));
await pyodide.runPythonAsync(`
import runpy, sys
sys.path[:0] = ["/site", "/repo/benchmarks"]
sys.argv = list(script_argv)
runpy.run_path(sys.argv[0], run_name="__main__")
`);
