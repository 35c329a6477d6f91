"""The Backend protocol: the small set of primitive ops every backend implements.

Everything else (softmax, gelu, layer norm, conv2d, pooling, cross-entropy, ...) is composed
from these in the tensor layer (`cinders.tensor`, `cinders.functional`), once, for all backends.

Handles
-------
A backend stores tensor data in *handles* of its own type (a NumPy array, an `array`-backed
buffer, a GPU buffer view...). Handles are opaque to the tensor layer. Every handle knows its
own shape and dtype (`backend.shape(h)`, `backend.dtype(h)`), but the tensor layer tracks both
too and has validated every call before it reaches the backend, so a primitive may assume:

* shapes fit (same ndim for binary/where/matmul operands, each dim equal or 1 for broadcasting;
  negative axes already normalised; slice bounds already clipped);
* dtypes fit (both operands of a binary op share one dtype; `matmul` gets float32);
* all handles belong to this backend.

Backends never raise ShapeError/DTypeError themselves for these cases; the tensor layer does,
with a message naming the op. A backend may raise for genuine device limits (buffer too large).

Dtypes are `cinders.dtypes.float32 | int32 | bool_`. Bool tensors hold 0/1 (True/False).

Primitive ops (the whole list)
------------------------------
creation/reading
    from_flat(values, shape, dtype)     values: flat row-major sequence of Python numbers
    full(shape, value, dtype)
    random(shape, distribution, seed, dtype)  "uniform" [0,1) or "normal" (0,1); see RANDOM below
    to_flat(h) -> list                  flat row-major Python list (ints for int32/bool, floats)
elementwise
    unary(op, x)          op in UNARY_OPS (the op table, core/ops.py); result dtype =
                          ops.result_dtype(op, x's dtype)
    binary(op, a, b)      op in BINARY_OPS; numpy broadcasting between same-ndim shapes;
                          result dtype = ops.result_dtype(op, operands' dtype)
    where(cond, a, b)     cond bool; broadcasting like binary; result dtype = a's
    cast(x, dtype)        float->int truncates toward zero; anything->bool is x != 0
reductions (one axis; the tensor layer loops for several and flattens for axis=None)
    reduce(op, x, axis, keepdim)  op in REDUCE_OPS; argmax/argmin -> int32, first occurrence;
                          max/min propagate NaN; sum of an empty axis is 0, prod is 1
                          (the tensor layer rejects max/min/argmax/argmin over an empty axis)
linear algebra
    matmul(a, b)          a (..., M, K), b (..., K, N), same ndim >= 2, batch dims broadcast
movement (may return views; results must never alias data that a later op mutates)
    reshape(x, shape)     same number of elements
    permute(x, dims)
    expand(x, shape)      same ndim; dims of size 1 grow
    slice(x, starts, stops, steps)  one (start, stop, step) per dim, 0 <= start <= stop, step >= 1
    cat(xs, axis)         all same ndim and dtype, equal except along axis
    pad(x, pads, value)   pads: ((before, after), ...) per dim, each >= 0; constant value
indexing
    gather(x, axis, index)          torch.gather: index int32, same ndim as x,
                                    index.shape[d] <= x.shape[d] for d != axis
    scatter_add(x, axis, index, src)  copy of x with src[i] added at index (torch.scatter_add);
                                    the backward of gather
    Index values: in [-n, n) for an axis of size n, negatives counting from the end (NumPy's
    take_along_axis; torch.gather rejects negatives, cinders accepts them on every backend).
    An index outside that range is an error that a backend reports where it costs no device
    sync: CPU backends (Python, NumPy) raise cinders.errors.IndexingError (an IndexError)
    "<op>: index <i> is out of bounds for axis <a> with size <n>". A GPU backend cannot see the values without waiting for the
    device, so it never raises: gather reads 0 there and scatter_add drops the value, and
    neither ever touches another row. The tensor layer itself checks Python-list indices
    (x[[0, 5]]), whose values it holds.
images (NCHW; what conv2d and the pools are composed from)
    unfold2d(x, kernel, stride, padding, dilation, pad_value)
                          x (N, C, H, W) -> (N, C*kh*kw, OH*OW), like torch.nn.functional.unfold
                          but padded with pad_value (0 for conv, -inf for max pooling)
    fold2d(cols, size, kernel, stride, padding, dilation)
                          the adjoint of unfold2d (col2im, overlapping entries summed);
                          size = (H, W) of the image; cols (N, C*kh*kw, L) -> (N, C, H, W)

Optional primitives (OPTIONAL_PRIMITIVES): a backend that implements one declares it with a
class flag; where the flag is False the tensor layer composes the op from the primitives above,
and that composition is the reference every kernel is tested against.
    conv2d(x, w, bias, stride, padding, dilation, groups, activation)     flag: conv2d_kernel
                          torch.nn.functional.conv2d followed by an activation, without the
                          unfold2d matrix: x (N, C, H, W) float32, w (O, C/groups, kh, kw),
                          bias (O,) or None, stride/dilation (sh, sw), padding
                          ((top, bottom), (left, right)), activation None or one the backend
                          lists in `conv2d_activations` ("relu", "relu6"; "silu", "hardswish",
                          "hardsigmoid" where declared; NaN propagates); -> (N, O, OH, OW).
                          Reference: functional.conv2d's unfold2d + matmul composition and
                          functional.conv_activation. Decorators forward the flag of the
                          backend they wrap and record the op (Autodiff: its gradient).
    conv2d_grad_input(g, w, size, stride, padding, dilation, groups)  flag: conv2d_backward_kernels
    conv2d_grad_weight(x, g, kernel, stride, padding, dilation, groups)
    conv2d_grad_bias(g)
                          conv2d's gradients without unfold2d/fold2d matrices: g (N, O, OH, OW)
                          the output gradient (after the activation's), w (O, C/groups, kh, kw),
                          x (N, C, H, W), size = (H, W), kernel = (kh, kw), the other arguments
                          as conv2d's -> dx (N, C, H, W), dw (O, C/groups, kh, kw), dbias (O,).
                          Reference: autodiff._conv2d_gradients' composition (dw = g @
                          unfold2d(x)^T, dx = fold2d(w^T @ g), dbias = sum of g), which
                          cn.Autodiff runs where the inner backend does not declare the flag.
                          Fusion forwards the flag (a boundary); Autodiff does not (it uses it).
    pool2d(x, op, kernel, stride, padding, dilation)       flag: pool2d_kernel
                          max_pool2d / avg_pool2d without the unfold2d matrix: x (N, C, H, W)
                          float32, op "max" (padding counts as -inf, NaN propagates), "avg"
                          (sum / kh*kw, padding counts as 0) or "avg_real" (sum / the window's
                          pixels inside the image); kernel/stride/padding/dilation pairs,
                          padding symmetric (ph, pw) at most half the kernel -> (N, C, OH, OW).
                          Reference: functional.max_pool2d / avg_pool2d's unfold2d + reduce.
                          Fusion forwards the flag (a boundary); Autodiff does not (it
                          differentiates the composition).
    lstm_cell(gates, c)   flag: recurrent_kernels
                          one LSTM step after its matmuls: gates (B, 4H) float32 in ONNX's
                          order i, o, f, g (biases added), c (B, H) the cell state ->
                          (2, B, H) holding h' and c': i, o, f = sigmoid, c' = f*c + i*tanh(g),
                          h' = o*tanh(c'), sigmoid(x) = 1 / (1 + exp(-x)).
    gru_cell(gx, gh, h)   flag: recurrent_kernels
                          one GRU step as PyTorch exports it (linear_before_reset): gx, gh
                          (B, 3H) the input and the recurrent projection in ONNX's order z, r, n
                          (biases added), h (B, H) -> h' (B, H): z, r = sigmoid(gx + gh),
                          n = tanh(gx_n + r*gh_n), h' = (1 - z)*n + z*h.
                          Reference of both: functional.lstm_cell / gru_cell's compositions.
                          A sequence's steps are kernels, not dozens of small ops each.
                          Decorators do not forward the flag: Autodiff differentiates the
                          composition and Fusion fuses it.

    softmax(x, axis)      flag: normalization_kernels
                          functional.softmax of float32 x along axis (normalised): e = exp(x -
                          max), e / sum(e), those float32 steps in that order.
    layer_norm(x, weight, bias, eps)                                      flag: normalization_kernels
                          nn.functional.layer_norm over x's last dim (float32, D > 0); weight and
                          bias (D,) or None: c = x - sum(x)/D, c / sqrt(sum(c*c)/D + eps) * weight
                          + bias, those float32 steps in that order.
                          Reference of both: the compositions in functional.softmax and
                          nn.functional.layer_norm. One op instead of 5 and 9, without their
                          temporaries. Decorators do not forward the flag (as recurrent_kernels).

Synchronisation
---------------
`to_flat` is the only point where a backend must wait for its device. Asynchronous backends
also offer `async to_flat_async(h)` (the browser cannot block). Backends may implement
`memory_stats()` and `synchronize()`.

Declared gaps and devices
-------------------------
`unsupported_ops = {op: reason}` (class or instance attribute; empty by default) names the ops
of the op table (or primitives) a backend has no kernel for, each with its reason: the tensor
layer fails loudly on them, tests/test_op_table.py accepts the gap only with the reason, and
cn.Router runs them on another member. `device(index)` is the backend placed on its device
`index` (`cn.tensor(x, backend=b, device=i)`); a backend bound to one device has only device 0.

Optimizer kernels
-----------------
The optimizers use `fused_adam(p, g, m, v, beta1, beta2, step_size, eps) -> p'` when
the parameter's (inner) backend has it, instead of ~12 elementwise ops. It is the one hook that
writes its arguments: m and v (Adam's moments, which cn.optim.Adam passes only while they are
its private state) are updated in place; p and g are read only and p' is a new handle. In
float32 and in this order, exactly what cn.optim.Adam composes:
    m <- m + (g - m) * (1 - beta1);  v <- v * beta2 + g * g * (1 - beta2)
    p' = p - m / (sqrt(v) + eps) * step_size

Abilities (declared, never probed)
----------------------------------
Beyond the primitives, a backend class declares what else it offers as class attributes; code
elsewhere reads these flags (never hasattr or class names):
    differentiable     records gradients (cn.Autodiff): backward(tensor), detach(tensor),
                       to_inner(tensor); the optimizers and composites ask `backend.differentiable`
    compiles_kernels   cn.Fusion can compile into it: fusion_compiler(max_buffers) returns the
                       compiler of core/fusion/backend.py (`compiler_for`). cn.Wgpu's compiler
                       builds on its public compile-and-launch interface: empty(shape, dtype),
                       launch(key, build, inputs, outputs, params, groups, ...) -> outputs
    capturable         cn.capture can record and replay its launches: capture_recorder()
                       returns the recorder described in core/capture.py
    quantized_matmul   weights stay quantized: matmul_quantized(a, q, scale, zero_point,
                       layout) -> C = a @ dequantize(B) with B's values read from the packed
                       storage-dtype handle q inside the kernel (never a float32 copy of B);
                       `layout` is a QuantizedLayout (below); q, scale and zero_point
                       are contiguous. a: (M, K) (any strides), float32
                       (C float32, scaled per block) or int32 (scale None: C int32, exact
                       integer sums: MatMulInteger). core/onnx/ops/quantization*.py use it
                       where the backend declares it, and compose the same result elsewhere.
                       a_scale (keyword; float32 shape () or None): float32 a is a QDQ
                       activation, integers times a_scale; a backend may sum rint(a / a_scale)
                       exactly in int32 and scale once (cn.Wasm, cn.NumPy), the same C.
                       A float16 q (`bits` 16: a half model's weight, core/onnx/ops/linalg.py)
                       has no scale or zero point (None): C float32 = a @ q widened.
    quantized_conv2d   conv2d_quantized(x, x_param, q, scale, zero_point, bias, stride, padding,
                       dilation, groups) -> (N, O, OH, OW): a 2-D convolution whose products
                       are integers (8-bit values minus their zero points, exact int32 sums):
                       x (N, C, H, W) int32 minus x_param (its zero point: int32 shape () or
                       None), or float32 whose integers are round(x / x_param) (x_param: its
                       float32 scale, shape (); a QDQ graph's dequantized activation); q the
                       8-bit weight (O, C/groups, kh, kw) minus zero_point (None, 1 or O
                       values); scale None gives the int32 sums, else (float32 x, 1 or O
                       values) float32 sums * x_scale * scale[o] + bias[o] (bias None or (O,));
                       padding ((top, bottom), (left, right)). Contiguous handles. As
                       matmul_quantized's a_scale: with float32 x a backend may instead sum
                       x * (q - zero point) in float32 and scale by scale[o] (cn.Wgpu: a GPU's
                       f32 fma is as fast as its i32 one), the same C to float32 rounding.
    half_conv2d        conv2d_quantized also takes a float16 q (a half model's weight, as
                       matmul_quantized does): float32 x, x_param, scale and zero_point None,
                       C float32 = conv(x, q widened) + bias[o], any group (cn.Wgpu: its conv
                       kernels read the weight at 2 bytes a value)
    dynamic_quantize   dynamic_quantize(x) -> (y, scale, zero_point): ONNX DynamicQuantizeLinear
                       of float32 x in one kernel, y int32 (0..255) shaped like x, scale
                       float32 and zero_point int32 of shape (); the same float32 arithmetic
                       as the composition in core/onnx/ops/quantization.py
    quantize_dequantize  quantize_dequantize(x, y_scale, y_zero_point, x_scale, x_zero_point,
                       lo, hi) -> float32 (min(max(round(x / y_scale) + y_zero_point, lo), hi)
                       - x_zero_point) * x_scale: a QDQ activation's QuantizeLinear then
                       DequantizeLinear (per tensor: scales float32 shape (), zero points
                       int8/uint8/int32 shape () or None) in one kernel, the composition's
                       float32 steps (core/onnx/ops/quantization.py QuantizeDequantize)
A decorator forwards the abilities that pass through it (cn.Fusion is capturable when its
inner backend is; cn.Autodiff is differentiable whatever it wraps).

User kernels (cinders.fusion.custom_op)
---------------------------------------
    custom(op, handles, shape) -> handle   op's elementwise function over float32 handles of
                                           `shape` (already broadcast to its rank)
Every backend has it: the base class runs `op.reference` in tensor ops; Autodiff computes on its
inner backend and records `op.backward`; Fusion records it into the lazy graph; Wgpu launches
the op's WGSL. A new decorator backend overrides it to pass the call inward; nothing else.

Buffer reuse
------------
Handles are values: no op changes an input (only `assign` writes, and says so). A backend may
still write a result into an input's buffer, but only once it knows that no handle can read that
buffer any more; that is its own memory matter, invisible here (cn.Wgpu: an input that died
before the next launch, wgpu_backend/pool.py "In-place results").

RANDOM (identical numbers on every backend)
-------------------------------------------
A counter-based generator, so that Python, NumPy, WGSL and MicroPython draw the same values:
    hash32(x): x ^= x >> 16; x *= 0x7feb352d; x ^= x >> 15; x *= 0x846ca68b; x ^= x >> 16
               (all mod 2**32)
    key      = hash32(seed mod 2**32)
    bits(i)  = hash32((i mod 2**32) ^ key)
    uniform_i = (bits(i) >> 8) * 2**-24                               in [0, 1)
    normal_i  = sqrt(-2 ln(1 - u(2i))) * cos(2 pi u(2i+1))           (Box-Muller, u = uniform)
`reference_random` below is the executable definition that backends are tested against.
"""

import math

from . import ops

# The op lists come from the op table (core/ops.py), where each op's dtype rule and gradient
# are defined; backends hold only kernels for them.
UNARY_OPS = ops.names("unary")
BINARY_OPS = ops.names("binary")
COMPARISON_OPS = ops.names("binary", ops.COMPARE)
REDUCE_OPS = ops.names("reduce")

PRIMITIVES = (
    "from_flat", "full", "random", "to_flat",
    "unary", "binary", "where", "cast",
    "reduce", "matmul",
    "reshape", "permute", "expand", "slice", "cat", "pad",
    "gather", "scatter_add",
    "unfold2d", "fold2d",
)
OPTIONAL_PRIMITIVES = ("conv2d", "pool2d", "conv2d_grad_input", "conv2d_grad_weight",
                       "conv2d_grad_bias")

# Each primitive's arguments in call order: "H" a handle, "Hs" a list of handles, other kinds
# plain values ("op" an op-table name, "shape", "ints", "pair", "pairs", "int", "bool",
# "number", "distribution", "dtype"). What a backend that forwards calls (cn.Router's moves,
# cn.Remote's wire format) reads instead of knowing each primitive.
SIGNATURES = {
    "from_flat": ("shape", "dtype"), "full": ("shape", "number", "dtype"),
    "random": ("shape", "distribution", "int", "dtype"), "to_flat": ("H",),
    "unary": ("op", "H"), "binary": ("op", "H", "H"), "where": ("H", "H", "H"), "cast": ("H", "dtype"),
    "reduce": ("op", "H", "int", "bool"), "matmul": ("H", "H"),
    "reshape": ("H", "shape"), "permute": ("H", "ints"), "expand": ("H", "shape"),
    "slice": ("H", "ints", "ints", "ints"), "cat": ("Hs", "int"), "pad": ("H", "pairs", "number"),
    "gather": ("H", "int", "H"), "scatter_add": ("H", "int", "H", "H"),
    "unfold2d": ("H", "pair", "pair", "pair", "pair", "number"),
    "fold2d": ("H", "pair", "pair", "pair", "pair", "pair"),
}
HANDLE_KINDS = ("H", "Hs")


def split_call(primitive, call):
    """(handles, other arguments) of a primitive call's arguments, each in order."""
    handles, args = [], []
    for kind, v in zip(SIGNATURES[primitive], call):
        if kind == "H":
            handles.append(v)
        elif kind == "Hs":
            handles.extend(v)
        else:
            args.append(v)
    return handles, args


def join_call(primitive, handles, args):
    """A primitive's call arguments from its handles and other arguments (split_call's inverse)."""
    handles, args = iter(handles), iter(args)
    return [list(handles) if kind == "Hs" else next(handles) if kind == "H" else next(args)
            for kind in SIGNATURES[primitive]]


# Semantics that are easy to get wrong, fixed once here for every backend:
#   div        true division (the tensor layer casts int operands to float32 first)
#   floordiv   floor(a / b) (Python semantics, rounds toward -inf); int: floordiv by 0 -> 0
#   mod        a - floor(a / b) * b, sign of b (Python semantics); int: mod by 0 -> 0
#   round      half to even (like NumPy and PyTorch)
#   pow        float only (the tensor layer casts)


class Backend:
    """Base class: documents the protocol and gives the shared helpers.

    Subclasses implement every name in PRIMITIVES. Two backend instances are the same device
    when their `device_key()` are equal; tensors of different devices never mix.
    """

    name = "backend"
    unsupported_ops = {}  # {op name: why this backend has no kernel for it} (see above)
    # True when cn.capture records this backend's own op stream (start_recording,
    # stop_recording, compare_recordings, define_program, replay: cn.Remote) instead of kernels.
    records_ops = False

    def device(self, index):
        """This backend placed on its device `index` (one device: only 0). cn.Router has several."""
        if index != 0:
            from .errors import ArgumentError
            raise ArgumentError("%r has one device (0), not device %r; cn.Router(*backends) has several"
                                % (self, index))
        return self

    # Declared abilities (see "Abilities" above): read, never probed with hasattr or class names.
    differentiable = False    # records gradients: backward(), detach(), to_inner() (cn.Autodiff)
    compiles_kernels = False  # fusion_compiler(max_buffers): cn.Fusion compiles groups with it
    capturable = False        # capture_recorder(): cn.capture records and replays its launches
    conv2d_kernel = False     # conv2d(...): a convolution kernel of its own (else unfold + matmul)
    conv2d_activations = ("relu", "relu6")  # the activations conv2d(...) applies at its store
    conv2d_backward_kernels = False  # conv2d_grad_input/_weight/_bias(...): conv2d's backward
    pool2d_kernel = False     # pool2d(...): max/avg pooling kernels of their own (else unfold + reduce)
    recurrent_kernels = False  # lstm_cell(...), gru_cell(...): one kernel per recurrent step
    normalization_kernels = False  # softmax(...), layer_norm(...): one kernel each
    sends_to_peers = False    # send_to(handles, other): its server sends them to other's (cn.Remote)
    # Storage dtypes (cn.int8, cn.uint8, cn.float16: core/dtypes.py) this backend holds at their
    # size: from_flat, full, to_flat, cast to and from them, and the movement ops (reshape,
    # permute, expand, slice, cat, pad, gather). The tensor layer widens them before
    # every other op, and refuses them on a backend that does not list them.
    storage_dtypes = ()
    quantized_matmul = False  # matmul_quantized(a, q, scale, zero_point, layout, a_scale=None), see above
    dynamic_quantize = False  # dynamic_quantize(x) -> (y, scale, zero_point), see above
    quantize_dequantize = False  # quantize_dequantize(x, ys, yz, xs, xz, lo, hi), see above
    quantized_conv2d = False  # conv2d_quantized(x, x_param, q, scale, zero_point, ...), see above
    half_conv2d = False  # conv2d_quantized with a float16 q, see above

    def device_key(self):
        """Hashable identity of the device this backend computes on."""
        return (type(self).__name__,)

    def __eq__(self, other):
        return isinstance(other, Backend) and self.device_key() == other.device_key()

    def __hash__(self):
        return hash(self.device_key())

    def __repr__(self):
        return "cn.%s()" % type(self).__name__

    # A decorator backend (Autodiff, Fusion) exposes what it wraps; base backends return None.
    @property
    def inner(self):
        return None

    def custom(self, op, handles, shape):
        """A user kernel (see "User kernels" above); here: its reference in tensor ops."""
        return op.run_reference(self, handles, shape)

    @property
    def shares_constants(self):
        """True when a handle made by `full` is never mutated, so the tensor layer may cache the
        scalar operand of `x * 2.0` and reuse one handle in every op. Base backends: yes; a
        decorator says so only when its handles carry no state it updates later."""
        return self.inner is None

    def synchronize(self):
        """Wait for queued work. CPU backends compute eagerly, so there is nothing to wait for."""

    def profile_start(self):
        """cn.profile begins: a backend that measures more (GPU time) starts here."""

    def profile_stop(self):
        """cn.profile ends (after synchronize)."""

    def assign(self, target, new):
        """The handle `target` holds after `target[key] = value` computed `new` (a Tensor of the
        same shape and dtype). Tensors are values, so this is new's handle; a decorator that
        tracks identity (Autodiff's leaves) says otherwise."""
        return new.handle

    def shape(self, h):
        raise NotImplementedError

    def dtype(self, h):
        raise NotImplementedError


def numel(shape):
    """The number of elements of a shape (1 for ())."""
    n = 1
    for d in shape:
        n *= d
    return n


def broadcast_shape(*shapes):
    """The shape same-ndim operands broadcast to, as the protocol hands them over (each dim equal
    or 1; a 0 meets only 0 or 1)."""
    out = shapes[0]
    for shape in shapes[1:]:
        out = tuple(q if p == 1 else p for p, q in zip(out, shape))
    return tuple(out)


def row_major_strides(shape):
    """Element strides of a dense row-major tensor of this shape, as a tuple."""
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


def is_row_major(shape, strides):
    """True when element strides (in elements) lay `shape` out densely in row-major order (dims
    of size 1 may have any stride): what strided-view backends (Wgpu, Wasm) test before a copy."""
    step = 1
    for n, s in zip(reversed(shape), reversed(strides)):
        if n != 1 and s != step:
            return False
        step *= n
    return True


def unfold2d_output_size(height, width, kernel, stride, padding, dilation):
    """(OH, OW): how many kernel windows fit along each image dim (unfold2d, fold2d, conv2d,
    pooling all share it)."""
    return tuple((size + 2 * p - d * (k - 1) - 1) // s + 1
                 for size, k, s, p, d in zip((height, width), kernel, stride, padding, dilation))


def _hash32(x):
    x &= 0xFFFFFFFF
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    x ^= x >> 16
    return x


def reference_random(n, distribution, seed):
    """The first n values of the RANDOM generator above, as Python floats."""
    key = _hash32(seed)

    def uniform(i):
        return (_hash32((i & 0xFFFFFFFF) ^ key) >> 8) * (1.0 / 16777216.0)

    if distribution == "uniform":
        return [uniform(i) for i in range(n)]
    if distribution == "normal":
        out = []
        for i in range(n):
            u1, u2 = uniform(2 * i), uniform(2 * i + 1)
            out.append(math.sqrt(-2.0 * math.log(1.0 - u1)) * math.cos(2.0 * math.pi * u2))
        return out
    raise ValueError("unknown distribution %r: use 'uniform' or 'normal'" % (distribution,))


class QuantizedLayout:
    """Where matmul_quantized finds B's element (k, n) of a (K, N) product: value q_off + k *
    q_sk + n * q_sn of q (`bits` 8: the storage dtype's elements; 4: nibbles of uint8 bytes, low
    first; 16: float16 elements); its scale and zero point at off + (k // block) * sb + n * sn of their handles
    (zero_point None: `zp_default` everywhere; zp_bits 4: nibbles too)."""

    __slots__ = ("k", "n", "bits", "block", "q", "scale", "zp", "zp_bits", "zp_default")

    def __init__(self, k, n, bits, block, q, scale=(0, 0, 0), zp=(0, 0, 0), zp_bits=8,
                 zp_default=0):
        self.k, self.n, self.bits, self.block = k, n, bits, block
        self.q, self.scale, self.zp = tuple(q), tuple(scale), tuple(zp)  # (off, sk|sb, sn)
        self.zp_bits, self.zp_default = zp_bits, zp_default
