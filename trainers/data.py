"""Data loaders for the real file formats, plus scikit-learn's bundled digits as the offline set.

Each loader returns a Dataset of numpy arrays; none of them downloads anything (the controller's
`tfcluster data fetch` and the Ansible `datasets` role put the files in place).
"""
import gzip
import os
import struct
from dataclasses import dataclass

import numpy as np


class DataMissing(SystemExit):
    """Raised when a data set's files are absent; the message says how to get them."""


@dataclass
class Dataset:
    name: str
    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    num_classes: int

    @property
    def input_shape(self):
        return self.train_x.shape[1:]

    def shard(self, index, count):
        """This worker's share of the training set (every COUNT-th example from INDEX)."""
        return Dataset(self.name, self.train_x[index::count], self.train_y[index::count],
                       self.test_x, self.test_y, self.num_classes)

    def limit(self, train=None, test=None):
        return Dataset(self.name, self.train_x[:train], self.train_y[:train],
                       self.test_x[:test], self.test_y[:test], self.num_classes)


def batches(x, y, batch_size, seed):
    """Endless shuffled mini-batches."""
    rng = np.random.default_rng(seed)
    while True:
        order = rng.permutation(len(x))
        for start in range(0, len(order) - batch_size + 1, batch_size):
            pick = order[start:start + batch_size]
            yield x[pick], y[pick]
        if len(order) < batch_size:
            yield x, y


def one_hot(labels, num_classes):
    return np.eye(num_classes, dtype=np.float32)[labels]


# ---------------------------------------------------------------- MNIST (IDX, gzip)

MNIST_FILES = {"train_x": "train-images-idx3-ubyte.gz", "train_y": "train-labels-idx1-ubyte.gz",
               "test_x": "t10k-images-idx3-ubyte.gz", "test_y": "t10k-labels-idx1-ubyte.gz"}
IDX_IMAGES, IDX_LABELS = 2051, 2049


def read_idx(path):
    """An IDX file (optionally gzipped) as a numpy array of unsigned bytes."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as handle:
        magic = struct.unpack(">I", handle.read(4))[0]
        if magic not in (IDX_IMAGES, IDX_LABELS):
            raise ValueError("%s is not an MNIST IDX file (magic %d)" % (path, magic))
        dims = magic & 0xFF
        shape = struct.unpack(">" + "I" * dims, handle.read(4 * dims))
        data = np.frombuffer(handle.read(), dtype=np.uint8)
    if data.size != int(np.prod(shape)):
        raise ValueError("%s is truncated: %d bytes for shape %s" % (path, data.size, shape))
    return data.reshape(shape)


def load_mnist(data_dir, flat=True):
    missing = [f for f in MNIST_FILES.values() if not os.path.exists(os.path.join(data_dir, f))]
    if missing:
        raise DataMissing("MNIST files missing in %s (%s): run `tfcluster data fetch mnist --dest %s`"
                          " or pass --dataset digits" % (data_dir, ", ".join(missing), data_dir))
    arrays = {key: read_idx(os.path.join(data_dir, name)) for key, name in MNIST_FILES.items()}
    return _images_dataset("mnist", arrays, flat, channels_last=(28, 28, 1))


def _images_dataset(name, arrays, flat, channels_last):
    def images(raw):
        scaled = raw.astype(np.float32) / 255.0
        return scaled.reshape(len(raw), -1) if flat else scaled.reshape((len(raw),) + channels_last)
    return Dataset(name, images(arrays["train_x"]), arrays["train_y"].astype(np.int64),
                   images(arrays["test_x"]), arrays["test_y"].astype(np.int64), 10)


# ---------------------------------------------------------------- digits (offline)

def load_digits(flat=True):
    """scikit-learn's bundled 8x8 handwritten digits: 1797 images, no download."""
    from sklearn.datasets import load_digits as sk_digits
    bunch = sk_digits()
    x = (bunch.images / 16.0).astype(np.float32)
    y = bunch.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], y[order]
    x = x.reshape(len(x), -1) if flat else x[..., np.newaxis]
    split = 1500
    return Dataset("digits", x[:split], y[:split], x[split:], y[split:], 10)


def load_images(name, data_dir, flat=True):
    """MNIST-shaped image data by name: mnist (IDX files in DATA_DIR) or digits (offline)."""
    if name == "mnist":
        return load_mnist(data_dir, flat)
    if name == "digits":
        return load_digits(flat)
    raise SystemExit("unknown --dataset %r: choose mnist or digits" % name)
