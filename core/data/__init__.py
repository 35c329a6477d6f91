"""Datasets, batchers and the DataLoader.

    train = cn.data.mnist.MnistDigits("train")          # a Dataset: len() and [i]
    loader = cn.data.DataLoader(train, batch_size=64, shuffle=True, seed=0,
                                batcher=MnistBatcher(backend), num_workers=2)
    for images, labels in loader: ...

Dataset protocol: `__len__()` and `__getitem__(i)` returning one item (any Python object).
Batcher protocol: `batcher(items, rng)` turns a list of items into whatever a training step
takes (usually tensors on a backend). `rng` is a `random.Random` seeded from the loader's
seed, the epoch and the batch index, so random augmentation is reproducible no matter which
worker thread builds the batch.
"""

import random
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor


class Dataset:
    """Base class documenting the protocol; any object with __len__ and __getitem__ serves."""

    def __len__(self):
        raise NotImplementedError

    def __getitem__(self, index):
        raise NotImplementedError


class ListDataset(Dataset):
    """A dataset over a Python sequence of items."""

    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, index):
        return self.items[index]


class Subset(Dataset):
    """The items of `dataset` at `indices`, in that order."""

    def __init__(self, dataset, indices):
        self.dataset = dataset
        self.indices = list(indices)

    def __len__(self):
        return len(self.indices)

    def __getitem__(self, index):
        return self.dataset[self.indices[index]]


class Batcher:
    """Base class: `batch(items, rng)` builds one batch; calling the batcher calls batch."""

    def __call__(self, items, rng):
        return self.batch(items, rng)

    def batch(self, items, rng):
        raise NotImplementedError


def _batch_seed(seed, epoch, index):
    # Distinct, well-mixed seeds per (seed, epoch, batch) so threads can build batches in any order.
    return (seed * 1000003 + epoch) * 1000033 + index


class DataLoader:
    """Iterates a dataset in batches.

    shuffle: a new order every epoch, fixed by (seed, epoch).
    num_workers: threads that build batches ahead of the training loop (0 builds them in the
    loop's thread). Threads suit batchers that spend their time in NumPy, which releases the GIL.
    drop_last: skip the last batch when it is smaller than batch_size.
    Each `iter(loader)` is one epoch; `set_epoch(n)` makes the next one epoch n (for resuming).
    """

    def __init__(self, dataset, batch_size=1, shuffle=False, seed=0, batcher=None, num_workers=0,
                 drop_last=False):
        if batch_size < 1:
            raise ValueError("DataLoader: batch_size must be >= 1, got %r" % (batch_size,))
        if num_workers < 0:
            raise ValueError("DataLoader: num_workers must be >= 0, got %r" % (num_workers,))
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.batcher = batcher if batcher is not None else _list_batch
        self.num_workers = num_workers
        self.drop_last = drop_last
        self.epoch = 0
        self._lock = threading.Lock()

    def __len__(self):
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def set_epoch(self, epoch):
        self.epoch = epoch

    def order(self, epoch):
        """The item indices of an epoch, in the order they are served."""
        indices = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(_batch_seed(self.seed, epoch, -1)).shuffle(indices)
        return indices

    def _chunks(self, epoch, start):
        indices = self.order(epoch)
        for b in range(start, len(self)):
            yield b, indices[b * self.batch_size:(b + 1) * self.batch_size]

    def _build(self, epoch, b, chunk):
        items = [self.dataset[i] for i in chunk]
        return self.batcher(items, random.Random(_batch_seed(self.seed, epoch, b)))

    def __iter__(self):
        with self._lock:
            epoch = self.epoch
            self.epoch += 1
        return self.batches(epoch)

    def batches(self, epoch, start=0):
        """The batches of one epoch from batch index `start` on (a resumed epoch skips the
        batches it already trained on without building them)."""
        if self.num_workers == 0:
            for b, chunk in self._chunks(epoch, start):
                yield self._build(epoch, b, chunk)
            return
        # Keep 2 batches per worker in flight; results come back in order.
        with ThreadPoolExecutor(self.num_workers, thread_name_prefix="cinders-data") as pool:
            pending = deque()
            try:
                for b, chunk in self._chunks(epoch, start):
                    pending.append(pool.submit(self._build, epoch, b, chunk))
                    if len(pending) >= 2 * self.num_workers:
                        yield pending.popleft().result()
                while pending:
                    yield pending.popleft().result()
            finally:  # the consumer stopped early (break, Ctrl-C): drop the work not yet started
                for fut in pending:
                    fut.cancel()


def _list_batch(items, rng):
    return items
