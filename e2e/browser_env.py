"""What every e2e test and the browser benchmark share: the Chromium binary and its flags.

WebGPU flags: `--enable-unsafe-webgpu` alone gives a SwiftShader adapter in headless Chromium 156
here, on http://127.0.0.1 (a secure context; navigator.gpu does not exist on about:blank).
`--enable-features=Vulkan`, `--use-angle=swiftshader` and `--use-webgpu-adapter=swiftshader`
change nothing on this machine; they are not needed. Without `--enable-unsafe-webgpu`,
navigator.gpu exists but requestAdapter() resolves to null (how the CPU-fallback test disables
WebGPU; `--disable-webgpu` does the same).
"""
import os

CHROMIUM = os.environ.get("CINDERS_CHROMIUM", "/usr/lib/chromium/chromium")
# Root in containers needs --no-sandbox; the rest keeps Chromium from calling home (the network
# is closed, and a test must see only its own requests).
QUIET_FLAGS = ["--no-sandbox", "--disable-background-networking", "--disable-component-update",
               "--disable-sync", "--no-first-run", "--disable-default-apps",
               "--disable-features=MediaRouter,OptimizationHints,Translate"]
WEBGPU_FLAGS = ["--enable-unsafe-webgpu"]
READY_TIMEOUT_MS = 120_000


def wait_ready(page, timeout=READY_TIMEOUT_MS):
    """Wait for #status to read `ready`; fail with what it says otherwise (error text)."""
    page.wait_for_function(
        "() => { const s = document.querySelector('#status'); "
        "return s && (s.textContent === 'ready' || s.textContent.startsWith('error')); }",
        timeout=timeout)
    status = page.text_content("#status")
    assert status == "ready", "page did not load: #status = %r" % status
    return page


