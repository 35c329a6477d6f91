"""Maps the architecture's top-level folders onto the one import package `cinders`.

core/          -> cinders
wgpu_backend/  -> cinders.wgpu
micro/         -> cinders.micro
Every sub-folder holding an __init__.py becomes a sub-package, so new folders need no edit here.
"""
import os

from setuptools import setup

ROOTS = {"cinders": "core", "cinders.wgpu": "wgpu_backend", "cinders.micro": "micro"}


def packages_under(package, folder):
    found = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "__")))
        if "__init__.py" in filenames:
            rel = os.path.relpath(dirpath, folder)
            name = package if rel == "." else package + "." + rel.replace(os.sep, ".")
            found[name] = dirpath
    return found


package_dir = {}
for package, folder in ROOTS.items():
    package_dir.update(packages_under(package, folder))

setup(
    packages=sorted(package_dir),
    package_dir=package_dir,
    # Non-Python files that ship inside the packages (WGSL templates, the micro runtime's data).
    package_data={name: ["*.wgsl", "*.json", "*.js", "*.html", "*.css"] for name in package_dir},
)
