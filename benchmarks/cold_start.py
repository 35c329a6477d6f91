"""Cold starts of pages, first visits with an empty HTTP cache (the browser keeps a profile on disk,
as a visitor's does), interleaved across servers so each sees the same machine load: navigation
to `ready` (polled, and as the page set it: its own clock) and the runtime's split of it (cinders.js `model.timings`).

    python benchmarks/cold_start.py                          # the demo server's MNIST and PyScript pages
    python benchmarks/cold_start.py --servers before=http://127.0.0.1:8931/,after=http://127.0.0.1:8932/ \\
        --pages /,/pyscript/ --rounds 4 --warmup             # the same pages from two checkouts' servers

One JSON line per visit, then one per (server, page) with the median, min and max; every line
records the load average. --warmup drops the first round (a server compresses each file on its
first request; `cinders export-web` sites ship their copies precompressed).
"""
import argparse
import json
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))
from browser_env import CHROMIUM, QUIET_FLAGS, WEBGPU_FLAGS, wait_ready  # noqa: E402

TIMINGS = "() => { const m = window.cindersDemo && window.cindersDemo.model; return m ? m.timings : null; }"


def emit(row):
    print(json.dumps({**row, "load_avg_1m": round(os.getloadavg()[0], 2)}, sort_keys=True), flush=True)


# When the page set #status to ready (its own clock; the MNIST page's window.cindersDemo.readyAt),
# without the polling that notices it (ready_ms: a requestAnimationFrame and a round trip later).
READY_AT = "() => window.cindersDemo && window.cindersDemo.readyAt !== undefined ? window.cindersDemo.readyAt : null"


def visit(context, url):
    """One cold visit: (ms from navigation to ready as polled, as the page set it or None, the
    runtime's timings or None)."""
    cdp = context.new_cdp_session(context.pages[0] if context.pages else context.new_page())
    cdp.send("Network.clearBrowserCache")
    page = context.new_page()
    try:
        page.goto(url)
        wait_ready(page, timeout=180_000)
        return page.evaluate("() => performance.now()"), page.evaluate(READY_AT), page.evaluate(TIMINGS)
    finally:
        page.close()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", help="label=url,... (default: a demo server started here)")
    parser.add_argument("--pages", default="/,/pyscript/")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", action="store_true", help="leave the first round out of the medians")
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright
    server = None
    if args.servers:
        servers = [entry.split("=", 1) for entry in args.servers.split(",")]
    else:
        from cinders.web.server import DemoServer, ensure_setup
        ensure_setup()
        server = DemoServer(port=0).start()
        servers = [["demo", server.url]]
    ready, ready_at_page = {}, {}
    try:
        with sync_playwright() as p:
            context = p.chromium.launch_persistent_context(tempfile.mkdtemp(), executable_path=CHROMIUM,
                                                           headless=True, args=QUIET_FLAGS + WEBGPU_FLAGS)
            try:
                for round_ in range(args.rounds):
                    for path in args.pages.split(","):
                        for label, url in servers:
                            ms, ready_at, timings = visit(context, url.rstrip("/") + "/" + path.lstrip("/"))
                            emit({"server": label, "page": path, "round": round_, "ready_ms": round(ms),
                                  "ready_at_ms": ready_at and round(ready_at), "timings": timings})
                            if not (args.warmup and round_ == 0):
                                ready.setdefault((label, path), []).append(ms)
                                if ready_at is not None:
                                    ready_at_page.setdefault((label, path), []).append(ready_at)
            finally:
                context.close()
    finally:
        if server:
            server.stop()
    for (label, path), times in ready.items():
        row = {"server": label, "page": path, "ready_ms_median": round(statistics.median(times)),
               "min": round(min(times)), "max": round(max(times)), "visits": len(times)}
        at = ready_at_page.get((label, path))
        if at:
            row.update(ready_at_ms_median=round(statistics.median(at)), ready_at_min=round(min(at)),
                       ready_at_max=round(max(at)))
        emit(row)


if __name__ == "__main__":
    main()
