"""What every generated kernel starts with: the uniform parameter block, storage bindings, the
1-D entry point, and the small index helpers the templates share.

Conventions (see device.py): binding 0 is the uniform parameter block P, an array of vec4<u32>;
bindings 1.. are storage buffers. Shapes, strides and offsets travel in P (counted in elements),
so one compiled pipeline serves every shape of the same rank; ranks, dtypes, ops and tile sizes
are baked into the source (they are the pipeline cache key). Every kernel lays P out with one
`ParamLayout`, which both packs the values and names them in the generated code.

1-D launches use up to 65535 workgroups in x and spill into y (WebGPU's per-dimension limit);
`groups_for(n, wg)` gives the counts and the entry point recovers the linear index `i`.
"""

import struct

WG = 256            # elementwise workgroup size
MAX_GROUPS = 65535  # WebGPU's default maxComputeWorkgroupsPerDimension


def groups_for(n, per_group):
    total = max(1, -(-n // per_group))
    x = min(total, MAX_GROUPS)
    return (x, -(-total // x), 1)


def zero(ty):
    """The WGSL zero of scalar type ty (f32, i32 or u32)."""
    return "%s(0)" % ty


def bits(value, dtype):
    """The u32 a kernel reads and bitcasts back to `dtype` (its WGSL word)."""
    if dtype.kind == "f":
        return struct.unpack("<I", struct.pack("<f", float(value)))[0]
    if dtype.kind == "i":
        return int(value) & 0xFFFFFFFF
    return 1 if value else 0


def _p(i):
    """The WGSL expression reading parameter i (u32) from the uniform block."""
    return "P.v[%d][%d]" % (i // 4, i % 4)


class ParamLayout:
    """A kernel's uniform parameters by name. One list of fields orders both the packer
    (`pack(name=value, ...)` -> the u32 list) and the generated code (`P[name]`, `P[name, i]`),
    so the two cannot drift apart. A field is a name (one u32) or (name, count) (an array).
    `first`: where the fields start in P (an epilogue's fields follow its matmul's)."""

    def __init__(self, *fields, first=0):
        self.fields, at = [], first
        for field in fields:
            name, count = (field, None) if isinstance(field, str) else field
            self.fields.append((name, at, count))
            at += 1 if count is None else count
        self.size = at
        self.own = at - first
        self._at = {name: (start, count) for name, start, count in self.fields}

    def __getitem__(self, key):
        """The WGSL expression reading field `name`, or element i of array field (name, i)."""
        name, i = key if isinstance(key, tuple) else (key, None)
        start, count = self._at[name]
        if (i is None) != (count is None) or (i is not None and not 0 <= i < count):
            raise KeyError("parameter %r has %s elements, asked for %r" % (name, count, i))
        return _p(start if i is None else start + i)

    def position(self, name):
        """Where scalar field `name` sits in the packed list."""
        start, count = self._at[name]
        if count is not None:
            raise KeyError("parameter %r is an array" % name)
        return start - (self.size - self.own)

    def array_position(self, name):
        """Where array field `name`'s first element sits in the packed list."""
        start, count = self._at[name]
        if count is None:
            raise KeyError("parameter %r is a scalar" % name)
        return start - (self.size - self.own)

    def array(self, name):
        """The WGSL expressions of every element of array field `name`."""
        return [self[name, i] for i in range(self._at[name][1])]

    def pack(self, **values):
        out = []
        for name, _, count in self.fields:
            value = values[name]
            if count is None:
                out.append(int(value))
            else:
                if len(value) != count:
                    raise ValueError("parameter %r takes %d values, got %d" % (name, count, len(value)))
                out += map(int, value)
        if len(values) != len(self.fields):
            raise TypeError("unknown kernel parameters %s" % sorted(set(values) - set(self._at)))
        return out


def header(n_params, buffers, shared=""):
    """Uniform block of n_params u32s (a layout's `size`), storage bindings
    [(name, wgsl_type, writable)], workgroup declarations."""
    lines = ["struct Params { v: array<vec4<u32>, %d> }" % max(1, -(-n_params // 4)),
             "@group(0) @binding(0) var<uniform> P: Params;"]
    for b, (name, ty, writable) in enumerate(buffers, start=1):
        access = "read_write" if writable else "read"
        lines.append("@group(0) @binding(%d) var<storage, %s> %s: array<%s>;" % (b, access, name, ty))
    lines.append(shared)
    return "\n".join(lines) + "\n"


_ENTRY_1D = """
@compute @workgroup_size(%d)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
  let i = gid.x + gid.y * nwg.x * %du;
"""


def entry_1d(wg=WG):
    """The entry point of a 1-D launch (groups_for(n, wg)): `i` is the linear invocation."""
    return _ENTRY_1D % (wg, wg)


_ENTRY_GROUPS = """
@compute @workgroup_size(%d)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
  let %s = wid.x + wid.y * nwg.x;
  let t = lid.x;"""


def entry_per_group(threads, index):
    """The entry point of a launch with one workgroup of `threads` per item (groups_for(n, 1)):
    `index` is the item, `t` the thread within its workgroup."""
    return _ENTRY_GROUPS % (threads, index)


def unravel(index, sizes, prefix="c"):
    """Lines computing coordinates c0..c{ndim-1} of a row-major linear `index`; sizes: the WGSL
    expressions of the dims' sizes."""
    if not sizes:
        return ""
    lines = ["  var rem_%s = %s;" % (prefix, index)]
    for d in reversed(range(len(sizes))):
        lines.append("  let %s%d = rem_%s %% %s; rem_%s = rem_%s / %s;"
                     % (prefix, d, prefix, sizes[d], prefix, prefix, sizes[d]))
    return "\n".join(lines) + "\n"


def dot(offset, coords, strides):
    """WGSL for offset + sum(coord * stride)."""
    return " + ".join([offset] + ["%s * %s" % (c, s) for c, s in zip(coords, strides)])
