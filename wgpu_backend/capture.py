"""cn.Wgpu's side of cn.capture: the recorder core/capture.py drives (`Wgpu.capture_recorder()`).

The interface is backend-neutral (a backend declaring `capturable` returns an object with these
methods; see core/capture.py): record a thread's launches (`start`, `stop`), name the buffer
behind a handle (`buffer`), keep buffers for a program (`keep`), prepare and `replay` it. Here a
launch is device.py's `Launch`, a buffer a raw WebGPU buffer, and a program the device's prepared
sequence of dispatches (one submit to replay).
"""

import struct
import weakref

from cinders import dtypes
from .codegen.packing import word_count


class LaunchRecorder:
    """Recording and replay of the launches of every cn.Wgpu() on one device."""

    def __init__(self, backend):
        self.backend = backend
        self.device = backend.device
        self.pool = backend.pool

    # ---- recording --------------------------------------------------------------------------
    def start(self):
        """Record the calling thread's launches and allocations (other threads are not)."""
        self.device.start_recording()

    def stop(self):
        """End the calling thread's recording: (launches, allocated) with launches [Launch] and
        allocated {id(buffer): (buffer, launches before it)}."""
        recording = self.device.stop_recording()
        self.pool.unpin(recording.uploaded)   # the program reserves those its kernels read
        return recording.launches, recording.allocated

    def owns(self, handle_backend):
        """Whether tensors of `handle_backend` (a base backend) live on this recorder's device."""
        return handle_backend.capturable and handle_backend.capture_recorder() is self

    # ---- buffers ----------------------------------------------------------------------------
    @staticmethod
    def buffer(h):
        """(buffer, byte offset, byte size) of a contiguous handle: what a replay rebinds
        (inputs) and copies out (outputs). A storage dtype packs `per_word` values to a u32
        word (codegen/packing.py): its bytes are its whole words."""
        per_word = h.dtype.per_word
        return h.storage.raw, 4 * h.offset // per_word, 4 * word_count(h.dtype, h.size)

    def host_scalar(self, value):
        """A float32 scalar in a buffer of its own, never shared with any other value (a replay
        rewrites it before it runs, while other values may reuse pooled buffers)."""
        from .backend import GpuArray
        out = GpuArray(self.pool.allocate(4, fresh=True), (), (), 0, dtypes.float32)
        self.write_scalar(out.storage.raw, 0, value)
        return out

    def write_scalar(self, buffer, offset, value):
        """Upload a host value before the next replay (queue-ordered)."""
        self.device.write_buffer(buffer, offset, struct.pack("<f", float(value)))

    def new_output(self, shape, dtype):
        """A fresh contiguous handle for a replay to copy an output into."""
        return self.backend.empty(shape, dtype)

    def contiguous(self, h):
        """h, or a contiguous copy of it (what a replay binds and copies is contiguous, and
        starts on a whole word: buffer copies move whole words, so a view of a storage dtype
        that starts inside a word, x[3:] of int8 x, is copied to a word of its own)."""
        h = self.backend.contiguous(h)
        if h.offset % h.dtype.per_word:
            whole = self.backend.empty(h.shape, h.dtype)
            self.backend.copy_into(whole, h)
            h = whole
        return h

    def assign(self, dst, src):
        """Copy src into dst's own buffer, in place (state updates under cn.capture)."""
        self.backend.copy_into(dst, src)

    def keep(self, owner, buffers):
        """Take `buffers` out of circulation while `owner` (a captured program) lives."""
        self.pool.reserve(list(buffers))
        weakref.finalize(owner, self.pool.unreserve_later, [id(b) for b in buffers])

    # ---- programs ---------------------------------------------------------------------------
    def prepare(self, launches):
        """The device program of a recorded sequence, and the byte offset of each launch's
        parameter block in it (where a replay patches random seeds)."""
        return self.device.prepare(launches)

    def replay(self, program, rebinds, patches, copies):
        """Submit `program` (None: only the copies): rebinds {launch: buffers}, patches
        [(byte offset, bytes)], copies [(src, src offset, dst, dst offset, nbytes)]."""
        self.device.replay(program, rebinds, patches, copies)

