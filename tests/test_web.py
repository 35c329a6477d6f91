"""The desktop side of the browser runtime: the pure-Python wheel and the demo server
(the browser itself is exercised by e2e/)."""
import json
import os
import sys
import urllib.error
import urllib.request
import zipfile

import numpy as np
import pytest

import cinders
from cinders.cli import build_parser
from cinders.web import bridge
from cinders.web.server import DemoServer
from cinders.web.wheel import MANIFEST, build_wheel, ensure_wheel, source_files


def test_wheel_holds_only_pure_python_and_installs_every_package(tmp_path):
    path = build_wheel(str(tmp_path), bytecode=False)
    assert os.path.basename(path) == "cinders-%s-py3-none-any.whl" % cinders.__version__
    names = zipfile.ZipFile(path).namelist()
    code = [n for n in names if not n.startswith("cinders-%s.dist-info/" % cinders.__version__)]
    assert all(n.endswith((".py", ".wgsl", ".json", ".js", ".html", ".css")) for n in code), code
    for module in ("cinders/__init__.py", "cinders/tensor.py", "cinders/backends/python_backend.py",
                   "cinders/record/safetensors.py", "cinders/nn/__init__.py", "cinders/models/mnist.py",
                   "cinders/web/bridge.py", "cinders/wgpu/__init__.py", "cinders/wgpu/browser.py"):
        assert module in names, module
    wheel_info = zipfile.ZipFile(path).read("cinders-%s.dist-info/WHEEL" % cinders.__version__).decode()
    assert "Root-Is-Purelib: true" in wheel_info and "Tag: py3-none-any" in wheel_info
    record = zipfile.ZipFile(path).read("cinders-%s.dist-info/RECORD" % cinders.__version__).decode()
    assert len(record.strip().splitlines()) == len(names)


def test_wheel_is_rebuilt_only_when_sources_change(tmp_path):
    first = ensure_wheel(str(tmp_path), bytecode=False)
    stamp = os.stat(first).st_mtime_ns
    assert ensure_wheel(str(tmp_path), bytecode=False) == first and os.stat(first).st_mtime_ns == stamp
    manifest = tmp_path / MANIFEST
    data = json.loads(manifest.read_text())
    assert data["files"] == len(source_files())
    data["sources_sha256"] = "stale"
    manifest.write_text(json.dumps(data))
    ensure_wheel(str(tmp_path), bytecode=False)
    assert json.loads(manifest.read_text())["sources_sha256"] != "stale"


@pytest.fixture
def server(tmp_path):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "index.html").write_text("<p>root</p>")
    (tmp_path / "site" / "app.js").write_text("export {};")
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "x.wasm").write_bytes(b"\0asm")
    (tmp_path / "secret.txt").write_text("outside every mount")
    with DemoServer(port=0, mounts=[("/lib/", str(tmp_path / "lib")), ("/", str(tmp_path / "site"))]) as s:
        yield s


def fetch(url):
    try:
        with urllib.request.urlopen(url) as r:
            return r.status, r.headers.get("Content-Type"), r.read()
    except urllib.error.HTTPError as e:
        return e.code, None, b""


def test_server_binds_localhost_and_serves_mounts_with_types(server):
    assert server.url.startswith("http://127.0.0.1:") and server.httpd.server_address[0] == "127.0.0.1"
    assert fetch(server.url)[2] == b"<p>root</p>"
    assert fetch(server.url + "app.js")[1] == "text/javascript"
    assert fetch(server.url + "lib/x.wasm")[:2] == (200, "application/wasm")


def test_server_never_serves_outside_its_folders(server):
    for path in ("../secret.txt", "lib/../../secret.txt", "%2e%2e/secret.txt", "lib/%2e%2e/%2e%2e/secret.txt"):
        status, _, body = fetch(server.url + path)
        assert b"outside every mount" not in body and status == 404, path


def test_server_sends_brotli_then_gzip_to_browsers_that_accept_them(server, tmp_path):
    import brotli
    import gzip
    body = b"export const table = [%s];\n" % b", ".join(b"%d" % (i % 97) for i in range(20000))
    (tmp_path / "site" / "big.js").write_bytes(body)

    def get(accept):
        request = urllib.request.Request(server.url + "big.js", headers={"Accept-Encoding": accept})
        with urllib.request.urlopen(request) as r:
            return r.headers.get("Content-Encoding"), r.headers.get("Vary"), r.read()

    encoding, vary, sent = get("gzip, deflate, br, zstd")   # what Chromium sends
    assert (encoding, vary) == ("br", "Accept-Encoding") and brotli.decompress(sent) == body
    assert len(sent) < len(body) / 4
    encoding, _, sent = get("gzip;q=1.0, identity")
    assert encoding == "gzip" and gzip.decompress(sent) == body
    assert get("identity") == (None, None, body)


def test_server_sends_a_sites_precompressed_copies_while_they_are_current(server, tmp_path):
    """An exported site carries FILE.br and FILE.gz (precompress): sent as they are, never made
    per request; a file changed after them is compressed afresh instead."""
    import brotli
    import gzip
    import time
    from cinders.web.server import precompress
    body = b"export const table = [%s];\n" % b", ".join(b"%d" % (i % 89) for i in range(20000))
    big = tmp_path / "site" / "shipped.js"
    big.write_bytes(body)
    precompress(str(tmp_path / "site"))
    assert brotli.decompress((tmp_path / "site" / "shipped.js.br").read_bytes()) == body
    assert gzip.decompress((tmp_path / "site" / "shipped.js.gz").read_bytes()) == body
    (tmp_path / "site" / "shipped.js.br").write_bytes(brotli.compress(b"the shipped copy"))

    def get(accept):
        request = urllib.request.Request(server.url + "shipped.js", headers={"Accept-Encoding": accept})
        with urllib.request.urlopen(request) as r:
            return r.headers.get("Content-Encoding"), r.read()

    encoding, sent = get("gzip, deflate, br")
    assert encoding == "br" and brotli.decompress(sent) == b"the shipped copy"
    time.sleep(0.01)
    big.write_bytes(body + b"// changed\n")   # newer than its shipped copies
    encoding, sent = get("gzip, deflate, br")
    assert encoding == "br" and brotli.decompress(sent) == body + b"// changed\n"


def test_demo_command_is_registered():
    args = build_parser().parse_args(["demo", "--port", "8123", "--no-open"])
    assert (args.port, args.no_open) == (8123, True)
    assert build_parser().parse_args(["demo"]).port == 8000


def test_cinders_demo_sets_up_serves_and_prints_its_url():
    import subprocess
    import sys
    proc = subprocess.Popen([sys.executable, "-m", "cinders.cli", "demo", "--port", "0", "--no-open"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        seen = []   # set-up (npm packages, wheel, its precompile) may say what it does first
        line = proc.stdout.readline()
        while line and not line.startswith("Cinders demo at") and len(seen) < 50:
            seen.append(line)
            line = proc.stdout.readline()
        assert line.startswith("Cinders demo at http://127.0.0.1:"), seen + [line]
        url = line.split()[3]
        for path in ("", "pyscript/", "wasm/cinders.js", "shared/preprocess.js", "wheels/cinders-wheel.json",
                     "models/mnist-cnn.safetensors", "node_modules/pyodide/pyodide.mjs"):
            assert fetch(url + path)[0] == 200, path
        manifest = json.loads(fetch(url + "wheels/cinders-wheel.json")[2])
        assert fetch(url + "wheels/" + manifest["wheel"])[0] == 200
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_shipped_copy_that_is_a_link_is_never_sent(server, tmp_path):
    """FILE.gz beside a served file may be a symlink to anything (a site folder from elsewhere):
    only a regular file beside it is sent, else the server compresses the file itself."""
    import gzip
    body = b"export const x = [%s];\n" % b", ".join(b"%d" % i for i in range(5000))
    (tmp_path / "site" / "linked.js").write_bytes(body)
    secret = tmp_path / "secret.txt"
    secret.write_bytes(gzip.compress(b"not for the web"))
    (tmp_path / "site" / "linked.js.gz").symlink_to(secret)
    request = urllib.request.Request(server.url + "linked.js", headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(request) as r:
        assert r.headers.get("Content-Encoding") == "gzip"
        assert gzip.decompress(r.read()) == body


def test_a_sites_model_source_is_its_own_module_and_never_an_installed_one(tmp_path):
    """load_model(source=...) (export-web sites: the user's model file) runs that source as the
    module its file names; a file named like an installed module (json.py) is refused instead of
    silently meaning the installed module."""
    import asyncio
    from test_install import POINT_MODEL, user_model
    x, want = user_model(tmp_path)
    record_bytes = (tmp_path / "point.safetensors").read_bytes()

    async def run():
        await bridge.init("python")
        predictor = await bridge.load_model(record_bytes, "point.safetensors", POINT_MODEL, "/site/point_model.py?v=1")
        out = await predictor.run([float(v) for v in x.reshape(-1)], [2])
        np.testing.assert_allclose(np.array(out["values"]), want, rtol=1e-5, atol=1e-6)
        with pytest.raises(ValueError, match="already the name of an installed module"):
            await bridge.load_model(record_bytes, "point.safetensors", POINT_MODEL, "json.py")
    try:
        asyncio.run(run())
    finally:
        sys.modules.pop("point_model", None)   # the site's module, registered by load_model


SNAPSHOT_PAGES_CHECK = """
import { dropZeroPages, restoreZeroPages, PAGE_BYTES } from %s;
import fs from "node:fs";
const memory = new Uint8Array(fs.readFileSync(process.argv[2]));
const file = dropZeroPages(memory);
fs.writeFileSync(process.argv[3], file);
const restored = new Uint8Array(memory.length);
restoreZeroPages(file.buffer, restored);
const truncated = new Uint8Array(memory.length);
const refusal = (bytes) => { try { restoreZeroPages(bytes, truncated); return ""; } catch (e) { return e.message; } };
const overlapping = file.slice();
new DataView(overlapping.buffer).setUint32(4 * 6, 0, true);   // the second run starts inside the first
console.log(JSON.stringify({same: Buffer.compare(Buffer.from(memory), Buffer.from(restored)) === 0,
                            refused: [refusal(file.buffer.slice(0, file.length - 1)),   // its last byte cut
                                      refusal(file.buffer.slice(0, 20)),                // inside the run table
                                      refusal(overlapping.buffer)]}));
"""


@pytest.mark.skipif(not __import__("shutil").which("node"), reason="Node is part of the browser set-up")
def test_the_snapshot_file_drops_zero_pages_and_restores_the_memory_exactly(tmp_path):
    """wasm/snapshot_pages.mjs: the snapshot as the server sends it (nonzero pages only) restores
    the very memory, a last short page included; a file cut at its end or inside its run table,
    or whose runs overlap, is refused; the manifest's snapshot_bytes (wheel.snapshot_memory_bytes)
    reads the memory's size from its header, and refuses a file without it."""
    import subprocess
    from cinders.web.wheel import snapshot_memory_bytes
    rng = np.random.default_rng(0)
    memory = np.zeros(4096 * 9 + 144, np.uint8)
    for page in (0, 1, 4, 8):   # runs of nonzero pages between zero ones, and a short last page
        memory[page * 4096 + rng.integers(0, 4096, 20) % (len(memory) - page * 4096)] = rng.integers(1, 256, 20)
    memory[-1] = 7
    (tmp_path / "memory.bin").write_bytes(memory.tobytes())
    script = tmp_path / "check.mjs"
    from cinders.web.wheel import PRECOMPILE_SCRIPT
    module = os.path.join(os.path.dirname(PRECOMPILE_SCRIPT), "snapshot_pages.mjs")
    script.write_text(SNAPSHOT_PAGES_CHECK % json.dumps("file://" + os.path.realpath(module)))
    out = subprocess.run(["node", str(script), str(tmp_path / "memory.bin"), str(tmp_path / "snapshot.bin")],
                         capture_output=True, text=True, check=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert result["same"] is True
    assert all("truncated or corrupt" in message for message in result["refused"]), result["refused"]
    assert (tmp_path / "snapshot.bin").stat().st_size < memory.nbytes - 3 * 4096   # the zero pages stay out
    assert snapshot_memory_bytes(str(tmp_path / "snapshot.bin")) == memory.nbytes
    with pytest.raises(cinders.CindersError, match="not a cinders snapshot"):
        snapshot_memory_bytes(str(tmp_path / "memory.bin"))
