"""The browser side of Cinders as seen from Python.

wheel.py    builds the pure-Python wheel that Pyodide installs (desktop)
server.py   the local HTTP server behind `cinders demo` (desktop, stdlib only)
bridge.py   what the JS runtime (wasm/cinders.js) calls inside Pyodide: load a record, predict
"""
