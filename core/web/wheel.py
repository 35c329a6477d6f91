"""Builds the pure-Python wheel of cinders that the browser installs into Pyodide.

A pure-Python wheel is a zip of the package files plus a small `.dist-info`; writing it directly
takes a fraction of a second and needs no build tool, so `cinders demo` can rebuild it whenever
the sources change. Next to it, made by the browser's own Pyodide under Node (precompile): a zip
of bytecode and a memory snapshot of Pyodide with cinders imported, which spare every page load
the interpreter's start-up and the compiling of cinders; the wheel itself stays source only. The file list follows the import packages themselves (`cinders`,
`cinders.wgpu`, `cinders.micro`), so it is the same from a checkout (folders mapped by setup.py)
and from an installed copy.
"""
import base64
import hashlib
import importlib.util
import json
import os
import shutil
import struct
import subprocess
import sys
import zipfile

import cinders
from cinders.assets import REPO_ROOT, cache_dir, web_deps_dir
from cinders.errors import CindersError, SetupError

# What ships inside the packages (setup.py's package_data): Python sources and kernel templates.
SHIPPED_SUFFIXES = (".py", ".wgsl", ".json", ".js", ".html", ".css")
ROOT_PACKAGES = ("cinders", "cinders.wgpu", "cinders.wasm", "cinders.micro")
MANIFEST = "cinders-wheel.json"   # names the current wheel and the hash of the sources it holds


def wheel_dir():
    return os.path.join(cache_dir(), "wheel")


def _package_roots():
    """{package name: folder} for the root packages that exist in this install."""
    roots = {}
    for name in ROOT_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            roots[name] = os.path.abspath(list(spec.submodule_search_locations)[0])
    return roots


def source_files():
    """Sorted [(path inside the wheel, file on disk)] for every shipped file of every package."""
    roots = _package_roots()
    nested = set(roots.values())
    files = []
    for package, folder in roots.items():
        for dirpath, dirnames, filenames in os.walk(folder):
            # Another root package (cinders/wgpu in an installed copy) is walked under its own name.
            dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "__"))
                                 and os.path.join(dirpath, d) not in nested)
            if "__init__.py" not in filenames:
                dirnames[:] = []
                continue
            rel = os.path.relpath(dirpath, folder)
            prefix = package.replace(".", "/") + ("" if rel == "." else "/" + rel.replace(os.sep, "/"))
            for filename in sorted(filenames):
                if filename.endswith(SHIPPED_SUFFIXES):
                    files.append((prefix + "/" + filename, os.path.join(dirpath, filename)))
    return sorted(files)


PRECOMPILE_SCRIPT = os.path.join(REPO_ROOT, "wasm", "precompile.mjs")


def _sources_hash(files):
    """What the wheel and its bytecode/snapshot are made from: the shipped sources and the script
    that precompiles them (a changed script makes a new snapshot)."""
    digest = hashlib.sha256()
    for arcname, path in files + [("precompile.mjs", PRECOMPILE_SCRIPT)]:
        with open(path, "rb") as f:
            data = f.read()
        digest.update(arcname.encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
    return digest.hexdigest()


def _record_line(arcname, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (arcname, digest, len(data))


def _pyodide_version(node_modules):
    try:
        with open(os.path.join(node_modules, "pyodide", "package.json")) as f:
            return json.load(f)["version"]
    except (OSError, ValueError, KeyError):
        return None


def precompile(wheel, out_dir):
    """Start-up accelerators for the browser's Pyodide (wasm/precompile.mjs, run by Node): the
    wheel's bytecode, and a memory snapshot of Pyodide with cinders imported. Returns
    {"pycache": zip name, "snapshot": file name}, or {} when Node or the Pyodide package is
    missing (pages then start from scratch: slower, same results)."""
    script = PRECOMPILE_SCRIPT
    node = shutil.which("node")
    try:
        node_modules = web_deps_dir()
    except SetupError:
        node_modules = None
    version = node_modules and _pyodide_version(node_modules)
    if not (node and version and os.path.exists(script)):
        return {}
    made = {"pycache": "cinders-%s-pycache-pyodide-%s.zip" % (cinders.__version__, version),
            "snapshot": "cinders-%s-snapshot-pyodide-%s.bin" % (cinders.__version__, version)}
    result = subprocess.run([node, script, os.path.join(node_modules, "pyodide"), wheel,
                             os.path.join(out_dir, made["pycache"]), os.path.join(out_dir, made["snapshot"])],
                            capture_output=True, text=True)
    if result.returncode != 0:
        print("cinders: could not precompile the wheel for Pyodide (pages will start without "
              "bytecode and snapshot):\n" + result.stderr[-2000:], file=sys.stderr, flush=True)
        return {}
    return made


SNAPSHOT_MAGIC = 0x50534E43   # "CNSP", the first word of wasm/snapshot_pages.mjs's files


def snapshot_memory_bytes(path):
    """The size of the memory a snapshot file restores: the second word of its header
    (wasm/snapshot_pages.mjs, which writes the file without its zero pages)."""
    with open(path, "rb") as f:
        header = f.read(8)
    if len(header) < 8 or struct.unpack("<I", header[:4])[0] != SNAPSHOT_MAGIC:
        raise CindersError("%s is not a cinders snapshot (wasm/snapshot_pages.mjs): rebuild the wheel "
                           "(python -m cinders.web.wheel)" % path)
    return struct.unpack("<2I", header)[1]


def build_wheel(out_dir=None, bytecode=True):
    """Writes cinders-<version>-py3-none-any.whl and its manifest into out_dir; returns the path.
    bytecode: also precompile it for the browser's Pyodide (see `precompile`)."""
    out_dir = out_dir or wheel_dir()
    os.makedirs(out_dir, exist_ok=True)
    files = source_files()
    version = cinders.__version__
    name = "cinders-%s-py3-none-any.whl" % version
    dist_info = "cinders-%s.dist-info" % version
    metadata = {
        dist_info + "/METADATA": "Metadata-Version: 2.1\nName: cinders\nVersion: %s\n"
                                 "Summary: Cinders deep-learning framework (pure Python)\n" % version,
        dist_info + "/WHEEL": "Wheel-Version: 1.0\nGenerator: cinders.web.wheel\n"
                              "Root-Is-Purelib: true\nTag: py3-none-any\n",
        dist_info + "/top_level.txt": "cinders\n",
    }
    tmp = os.path.join(out_dir, name + ".tmp")
    record = []
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for arcname, path in files:
            with open(path, "rb") as f:
                data = f.read()
            zf.writestr(zipfile.ZipInfo(arcname, date_time=(1980, 1, 1, 0, 0, 0)), data,
                        compress_type=zipfile.ZIP_DEFLATED)
            record.append(_record_line(arcname, data))
        for arcname, text in metadata.items():
            data = text.encode()
            zf.writestr(zipfile.ZipInfo(arcname, date_time=(1980, 1, 1, 0, 0, 0)), data,
                        compress_type=zipfile.ZIP_DEFLATED)
            record.append(_record_line(arcname, data))
        record.append(dist_info + "/RECORD,,")
        zf.writestr(zipfile.ZipInfo(dist_info + "/RECORD", date_time=(1980, 1, 1, 0, 0, 0)),
                    "\n".join(record) + "\n", compress_type=zipfile.ZIP_DEFLATED)
    os.replace(tmp, os.path.join(out_dir, name))
    path = os.path.join(out_dir, name)
    for old in os.listdir(out_dir):  # bytecode and snapshots of earlier sources
        if old.startswith("cinders-") and ("-pycache-" in old or "-snapshot-" in old):
            os.remove(os.path.join(out_dir, old))
    manifest = {"wheel": name, "version": version, "sources_sha256": _sources_hash(files),
                "files": len(files), "bytecode": bool(bytecode), "pycache": None, "snapshot": None}
    if bytecode:
        manifest.update(precompile(path, out_dir))
    if manifest["snapshot"]:  # the page sizes Pyodide's memory by it before the snapshot arrives (cinders.js)
        manifest["snapshot_bytes"] = snapshot_memory_bytes(os.path.join(out_dir, manifest["snapshot"]))
    with open(os.path.join(out_dir, MANIFEST), "w") as f:
        json.dump(manifest, f, indent=1)
    return path


def ensure_wheel(out_dir=None, bytecode=True):
    """The wheel's path, rebuilding it only when a shipped source changed (idempotent)."""
    out_dir = out_dir or wheel_dir()
    try:
        with open(os.path.join(out_dir, MANIFEST)) as f:
            manifest = json.load(f)
        path = os.path.join(out_dir, manifest["wheel"])
        extras = [manifest.get(k) for k in ("pycache", "snapshot") if manifest.get(k)]
        if (os.path.exists(path) and manifest.get("version") == cinders.__version__
                and manifest.get("sources_sha256") == _sources_hash(source_files())
                and (not bytecode or manifest.get("bytecode"))  # tried; None when it could not be made
                and (not manifest.get("snapshot") or manifest.get("snapshot_bytes"))
                and all(os.path.exists(os.path.join(out_dir, extra)) for extra in extras)):
            return path
    except (OSError, ValueError, KeyError):
        pass
    return build_wheel(out_dir, bytecode)
