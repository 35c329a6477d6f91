"""cinders.wgpu: the WebGPU backend (`cn.Wgpu()`), WGSL kernels generated in codegen.py.

Layers, top to bottom: backend.py (the protocol's primitives) -> codegen.py (WGSL sources),
pool.py (buffers), matmul.py (variant choice) -> device.py (the device interface) ->
desktop.py (wgpu-py) or the browser adapter (navigator.gpu). Only the last layer touches WebGPU.
"""

from .backend import DeviceLimitError, GpuArray, Wgpu

__all__ = ["Wgpu", "DeviceLimitError", "GpuArray"]
