"""How large a tensor may be: one rule, checked before anything is allocated.

`cn.arange(10**12)` or `cn.random((10**12,))` on the Python backend would otherwise run for
minutes building lists before failing; with the limit they fail at once with cn.SizeLimitError.

By default a tensor is refused when building it would need more than the memory available now
(Linux MemAvailable, else physical memory): elements times the bytes each costs while it is
built (4 for float32; more where Python lists are built first: `arange`, `eye`, and backends
that say so with an `element_bytes` attribute, like the pure-Python one). Where the memory is
unknown (Pyodide, other systems), FALLBACK_BYTES. `cn.limits.set_max_elements(n)` (or the
CINDERS_MAX_ELEMENTS environment variable) replaces this with a fixed number of elements;
`set_max_elements(None)` goes back to the default.

Graphs have their own cap: an imported ONNX node costs a few KB of Python (its object, its line
of generated source, the compiled code) whatever its bytes, so a 2 MB file of a million 2-byte
nodes would cost gigabytes. `max_graph_nodes()` (default DEFAULT_GRAPH_NODES, or the
CINDERS_MAX_GRAPH_NODES environment variable; `set_max_graph_nodes(n)`) caps the nodes of a file,
subgraphs included, and ATTRIBUTES_PER_NODE times that its attributes; the ONNX reader counts
both from the bytes before it builds a node.
"""

import os

from .backend import numel
from .errors import SizeLimitError

FALLBACK_BYTES = 4 << 30
LIST_ELEMENT_BYTES = 40   # a Python list of floats/ints: 8-byte slot + the number object
_CHEAP_BYTES = 64 << 20   # below this nothing is measured: small tensors pay no system call


DEFAULT_GRAPH_NODES = 50_000   # large real graphs (a 32-layer decoder, a U-Net) have 3,000-15,000
ATTRIBUTES_PER_NODE = 4        # real graphs average fewer than 2


def _from_environment(variable="CINDERS_MAX_ELEMENTS"):
    env = os.environ.get(variable)
    if not env:
        return None
    try:
        return int(env)
    except ValueError:
        raise SizeLimitError("%s=%r is not an integer" % (variable, env)) from None


_fixed = [_from_environment()]  # elements, or None: the memory available decides
_graph_nodes = [_from_environment("CINDERS_MAX_GRAPH_NODES")]  # or None: DEFAULT_GRAPH_NODES


def available_bytes():
    """Memory available to allocate now (bytes): MemAvailable on Linux, else physical memory."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return FALLBACK_BYTES


def max_elements():
    """The fixed limit (elements) set by set_max_elements or CINDERS_MAX_ELEMENTS, or None
    when the default (the memory available) applies."""
    return _fixed[0]


def set_max_elements(n):
    """Fix the limit at n elements (an int >= 1), or None for the default. Returns the old one."""
    if n is not None and (type(n) is not int or n < 1):
        raise SizeLimitError("set_max_elements: %r is not a positive int" % (n,))
    old = _fixed[0]
    _fixed[0] = n
    return old


def max_graph_nodes():
    """The most nodes an imported graph may hold, subgraphs included (attributes: ATTRIBUTES_PER_NODE
    times as many)."""
    return _graph_nodes[0] or DEFAULT_GRAPH_NODES


def set_max_graph_nodes(n):
    """Cap imported graphs at n nodes (an int >= 1), or None for the default. Returns the old cap
    (None when the default applied)."""
    if n is not None and (type(n) is not int or n < 1):
        raise SizeLimitError("set_max_graph_nodes: %r is not a positive int" % (n,))
    old = _graph_nodes[0]
    _graph_nodes[0] = n
    return old


def check_elements(op, count, shape=None, element_bytes=4):
    """SizeLimitError naming `op` when `count` elements (costing `element_bytes` each while
    being built) exceed the limit. Returns count."""
    fixed = _fixed[0]
    if fixed is None and count * element_bytes <= _CHEAP_BYTES or fixed is not None and count <= fixed:
        return count  # the common case: no system call, no message
    where = "%s: %s%d elements" % (op, "shape %s, " % (tuple(shape),) if shape is not None else "", count)
    if fixed is not None:
        raise SizeLimitError("%s is more than the limit of %d set by cn.limits.set_max_elements "
                             "or CINDERS_MAX_ELEMENTS" % (where, fixed))
    have = available_bytes()
    if count * element_bytes > have:
        raise SizeLimitError("%s need about %d MB but %d MB of memory are available; refused before "
                             "allocating (cn.limits.set_max_elements(n) sets another limit)"
                             % (where, (count * element_bytes) >> 20, have >> 20))
    return count


def check_shape(op, shape, element_bytes=4):
    return check_elements(op, numel(shape), shape, element_bytes)


def element_bytes(backend, default=4):
    """Bytes one element costs while `backend` builds a tensor (its `element_bytes`, else default)."""
    return getattr(backend, "element_bytes", default)
