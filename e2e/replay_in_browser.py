"""Runs inside Pyodide (the e2e test sends this file's text): replays recorded primitive calls
(see primitive_trace.py) on the page's backend and returns each case's result values as JSON.

Globals set by the test: TRACES (JSON text). Result: JSON text
[{"name", "values" | "error"}], one entry per case, in order.
"""
import json
import traceback

from cinders import dtypes
from cinders.web.bridge import current_backend


def _decode(value, made):
    if isinstance(value, dict):
        if "h" in value:
            return made[value["h"]]
        if "dtype" in value:
            return dtypes.from_name(value["dtype"])
        if "float" in value:
            return float(value["float"])
    if isinstance(value, list):
        return tuple(_decode(v, made) for v in value)
    return value


async def replay_all(traces):
    backend = current_backend()  # the page's backend (e2e/test_fusion_browser.py wraps it)
    out = []
    for trace in traces:
        made = {}
        try:
            for i, (name, args) in enumerate(trace["calls"]):
                if name == "to_flat":
                    continue  # a read the tensor layer made on the desktop: nothing to recompute
                made[i] = getattr(backend, name)(*[_decode(a, made) for a in args])
            values = await backend.to_flat_async(made[trace["result"]])
            out.append({"name": trace["name"], "values": values})
        except Exception:  # one broken op must not hide the others: report it and go on
            out.append({"name": trace["name"], "error": traceback.format_exc(limit=4)})
    return json.dumps(out)


RESULT = await replay_all(json.loads(TRACES))  # noqa: F704  (top-level await: runPythonAsync)
RESULT
