"""Maps the architecture's top-level folders onto the one import package `cinders`.

core/          -> cinders
wgpu_backend/  -> cinders.wgpu
wasm_backend/  -> cinders.wasm
micro/         -> cinders.micro
Every sub-folder holding an __init__.py becomes a sub-package, so new folders need no edit here,
except micro/runtime/: that is the board's own `cinders` package (MicroPython imports it as
`cinders`), shipped as data of cinders.micro and copied onto boards, never imported on the desktop.
"""
import os

from setuptools import setup

ROOTS = {"cinders": "core", "cinders.wgpu": "wgpu_backend", "cinders.wasm": "wasm_backend",
         "cinders.micro": "micro"}
BOARD_RUNTIME = os.path.join("micro", "runtime")


def packages_under(package, folder):
    found = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "__"))
                             and os.path.join(dirpath, d) != BOARD_RUNTIME)
        if "__init__.py" in filenames:
            rel = os.path.relpath(dirpath, folder)
            name = package if rel == "." else package + "." + rel.replace(os.sep, ".")
            found[name] = dirpath
    return found


package_dir = {}
for package, folder in ROOTS.items():
    package_dir.update(packages_under(package, folder))

# Non-Python files that ship inside the packages (WGSL templates, web assets), and the board runtime.
package_data = {name: ["*.wgsl", "*.json", "*.js", "*.html", "*.css"] for name in package_dir}
package_data["cinders.wasm"] += ["*.h", "*.mjs"]   # the kernels' C runtime, the Node engine
package_data["cinders.micro"] += ["runtime/*.py", "runtime/cinders/*.py"]

# Web assets ship as data folders, each folder one entry (no __init__.py: never imported, and left
# out of the browser's own wheel, core/web/wheel.py, which walks import packages only).
for folder in ("wasm", "web_demos"):
    for dirpath, dirnames, _ in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "__")))
        name = "cinders.web.assets." + dirpath.replace(os.sep, ".")
        package_dir[name] = dirpath
        package_data[name] = ["*"]

setup(packages=sorted(package_dir), package_dir=package_dir, package_data=package_data)
