"""Trained models that PyPI packages ship, fetched on demand into <cache>/models.

    path = shipped.model_path("silero_vad.onnx")     # fetches silero-vad 6.2.3 the first time

Each model names the package version that ships it, the wheel's sha256 and the file inside it.
Fetching runs `pip download --no-deps` of that exact version (no install, nothing of the package
runs), checks the wheel's sha256, and copies the member out after checking its size: a wheel is
data here like any model file. `python -m cinders.apps.shipped` fetches them all (the set-up does).
"""

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

from ..assets import cache_dir
from ..errors import CindersError


class ShippedModelError(CindersError, RuntimeError):
    """A shipped model could not be fetched or did not match its pinned hash."""


# package -> (version, sha256 of the wheel, licence); model file -> (package, member in the wheel)
PACKAGES = {
    "silero-vad": ("6.2.3", "7b7f5436cfcb02fae583a05b512ea96467fd449fe54cb49a5e4f06c51a1e43b8", "MIT"),
    "rapidocr": ("3.10.0", "2fc34e26cd0f48514804a94f8832283039c7334076bff60768b1fed9ad068050", "Apache-2.0"),
}
MODELS = {
    "silero_vad.onnx": ("silero-vad", "silero_vad/data/silero_vad.onnx"),
    "PP-OCRv6_det_small.onnx": ("rapidocr", "rapidocr/models/PP-OCRv6_det_small.onnx"),
    "PP-OCRv6_rec_small.onnx": ("rapidocr", "rapidocr/models/PP-OCRv6_rec_small.onnx"),
    "ch_ppocr_mobile_v2.0_cls_mobile.onnx": ("rapidocr", "rapidocr/models/ch_ppocr_mobile_v2.0_cls_mobile.onnx"),
}
MAX_MEMBER_BYTES = 256 << 20


def models_dir():
    path = os.path.join(cache_dir(), "models")
    os.makedirs(path, exist_ok=True)
    return path


def model_path(name, fetch=True):
    """Path of the shipped model file `name` (a key of MODELS), fetched first if missing."""
    if name not in MODELS:
        raise ShippedModelError("no shipped model %s (known: %s)" % (ascii(name), ", ".join(sorted(MODELS))))
    path = os.path.join(models_dir(), name)
    if not os.path.isfile(path):
        if not fetch:
            raise ShippedModelError("%s is not in %s: run `python -m cinders.apps.shipped` (needs pip "
                                    "and network to PyPI) or pass the model's path" % (name, models_dir()))
        _fetch_package(MODELS[name][0])
    return path


def _fetch_package(package):
    version, sha256, _ = PACKAGES[package]
    members = {name: member for name, (pkg, member) in MODELS.items() if pkg == package}
    print("cinders: fetching %s==%s from PyPI for %s" % (package, version, ", ".join(sorted(members))),
          file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                               "--disable-pip-version-check", "-q", "-d", tmp, "%s==%s" % (package, version)],
                              capture_output=True, text=True)
        wheels = [f for f in os.listdir(tmp) if f.endswith(".whl")]
        if done.returncode != 0 or len(wheels) != 1:
            raise ShippedModelError("pip download %s==%s failed: %s" % (package, version,
                                                                        " ".join(done.stderr.split())[-300:]))
        wheel = os.path.join(tmp, wheels[0])
        digest = _sha256(wheel)
        if digest != sha256:
            raise ShippedModelError("%s: sha256 %s, expected %s (pinned): refusing it" % (wheels[0], digest, sha256))
        with zipfile.ZipFile(wheel) as z:
            for name, member in members.items():
                info = z.getinfo(member)
                if info.file_size > MAX_MEMBER_BYTES:
                    raise ShippedModelError("%s in %s is %d bytes, over %d" % (member, wheels[0], info.file_size,
                                                                                  MAX_MEMBER_BYTES))
                target = os.path.join(models_dir(), name)
                with z.open(info) as src, open(target + ".part", "wb") as dst:
                    shutil.copyfileobj(src, dst)
                os.replace(target + ".part", target)


def _sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def main():
    for name in MODELS:
        print(model_path(name))


if __name__ == "__main__":
    main()
