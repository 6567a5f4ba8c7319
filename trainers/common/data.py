"""Data loaders for the real file formats, plus scikit-learn's bundled digits as the offline set.

Each loader returns a Dataset of numpy arrays; none of them downloads anything (the controller's
`tfcluster data fetch` and the Ansible `datasets` role put the files in place).
"""
import gzip
import importlib.util
import os
import struct
from dataclasses import dataclass

import numpy as np

from tfcluster_agent.datafiles import (CENSUS_FILES, CIFAR_TEST_FILE, CIFAR_TRAIN_FILES,  # noqa: F401
                                IDX_DATASETS, MNIST_FILES, cifar10_dir, missing_files)


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


def load_mnist(data_dir, flat=True, name="mnist"):
    """MNIST, or Fashion-MNIST (NAME fashion_mnist): the same four IDX files, the same shapes."""
    missing = missing_files(name, data_dir)
    if missing:
        raise DataMissing("%s files missing in %s (%s): run `tfcluster data fetch %s --dest %s`"
                          " or pass --dataset digits"
                          % (name, data_dir, ", ".join(missing), name, data_dir))
    arrays = {key: read_idx(os.path.join(data_dir, f)) for key, f in MNIST_FILES.items()}
    return _images_dataset(name, arrays, flat, channels_last=(28, 28, 1))


def _images_dataset(name, arrays, flat, channels_last):
    def images(raw):
        scaled = raw.astype(np.float32) / 255.0
        return scaled.reshape(len(raw), -1) if flat else scaled.reshape((len(raw),) + channels_last)
    return Dataset(name, images(arrays["train_x"]), arrays["train_y"].astype(np.int64),
                   images(arrays["test_x"]), arrays["test_y"].astype(np.int64), 10)


# ---------------------------------------------------------------- digits (offline)

def load_digits(flat=True):
    """scikit-learn's bundled 8x8 handwritten digits: 1797 images, no download. Read from its
    file as sklearn.datasets.load_digits reads it, without importing scikit-learn (~1.5 s of
    CPU in every task)."""
    spec = importlib.util.find_spec("sklearn")  # finds the package without running it
    if spec is None:
        raise SystemExit("--dataset digits needs scikit-learn installed (its bundled digits)")
    path = os.path.join(os.path.dirname(spec.origin), "datasets", "data", "digits.csv.gz")
    if os.path.exists(path):
        with gzip.open(path, "rt") as rows:
            table = np.loadtxt(rows, delimiter=",")
        x, y = table[:, :-1].reshape(-1, 8, 8), table[:, -1]
    else:  # a scikit-learn that keeps the file elsewhere: its own loader
        from sklearn.datasets import load_digits as sk_digits
        bunch = sk_digits()
        x, y = bunch.images, bunch.target
    x, y = (x / 16.0).astype(np.float32), y.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], y[order]
    x = x.reshape(len(x), -1) if flat else x[..., np.newaxis]
    split = 1500
    return Dataset("digits", x[:split], y[:split], x[split:], y[split:], 10)


def load_images(name, data_dir, flat=True):
    """MNIST-shaped image data by name: mnist or fashion_mnist (IDX files in DATA_DIR) or digits
    (offline)."""
    if name in IDX_DATASETS:
        return load_mnist(data_dir, flat, name)
    if name == "digits":
        return load_digits(flat)
    raise SystemExit("unknown --dataset %r: choose mnist, fashion_mnist or digits" % name)


def load_from_flags(args, flat=True):
    """The MNIST-shaped data set that --dataset and --data_dir name (bootstrap.add_mnist_flags)."""
    return load_images(args.dataset, args.data_dir, flat)


# ---------------------------------------------------------------- CIFAR-10 (binary batches)

CIFAR_SIDE, CIFAR_CHANNELS = 32, 3
CIFAR_RECORD = 1 + CIFAR_SIDE * CIFAR_SIDE * CIFAR_CHANNELS
CIFAR_CLASSES = ["airplane", "automobile", "bird", "cat", "deer",
                 "dog", "frog", "horse", "ship", "truck"]


def read_cifar_batch(path):
    """One CIFAR-10 binary batch: (uint8 images N x 32 x 32 x 3, int64 labels N).

    Each record is one label byte then 3072 pixel bytes, channel-major (1024 red, 1024 green,
    1024 blue, each row by row).
    """
    with open(path, "rb") as handle:
        raw = np.frombuffer(handle.read(), dtype=np.uint8)
    if raw.size == 0 or raw.size % CIFAR_RECORD:
        raise ValueError("%s is not a CIFAR-10 binary batch: %d bytes is not a multiple of %d"
                         % (path, raw.size, CIFAR_RECORD))
    records = raw.reshape(-1, CIFAR_RECORD)
    labels = records[:, 0].astype(np.int64)
    if labels.max() >= len(CIFAR_CLASSES):
        raise ValueError("%s has label %d: CIFAR-10 labels are 0-9" % (path, labels.max()))
    images = records[:, 1:].reshape(-1, CIFAR_CHANNELS, CIFAR_SIDE, CIFAR_SIDE)
    return np.ascontiguousarray(images.transpose(0, 2, 3, 1)), labels


def load_cifar10(data_dir):
    """CIFAR-10 from its binary batches. Images stay uint8 (N x 32 x 32 x 3): as float32 the
    50,000 training images would take 600 MB in every task; trainers convert per batch."""
    folder = cifar10_dir(data_dir)
    missing = missing_files("cifar10", data_dir)
    if missing:
        raise DataMissing("CIFAR-10 files missing in %s (%s): run `tfcluster data fetch cifar10 "
                          "--dest %s` or pass --dataset synthetic"
                          % (data_dir, ", ".join(missing), data_dir))
    parts = [read_cifar_batch(os.path.join(folder, n)) for n in CIFAR_TRAIN_FILES]
    test_x, test_y = read_cifar_batch(os.path.join(folder, CIFAR_TEST_FILE))
    return Dataset("cifar10", np.concatenate([p[0] for p in parts]),
                   np.concatenate([p[1] for p in parts]), test_x, test_y, len(CIFAR_CLASSES))


def synthetic_cifar10(train=2000, test=500, seed=0):
    """Learnable stand-in of CIFAR-10's shapes: 32x32x3 uint8 images, 10 classes.

    Each class has its own coarse colour pattern (4x4 blocks of 8x8 pixels); an image is its
    class's pattern plus strong per-pixel noise, so a CNN must learn to see through the noise.
    Deterministic for a given seed.
    """
    rng = np.random.default_rng(seed)
    classes = len(CIFAR_CLASSES)
    coarse = rng.uniform(-1.0, 1.0, size=(classes, 4, 4, CIFAR_CHANNELS))
    patterns = np.kron(coarse, np.ones((1, 8, 8, 1)))

    def make(count):
        labels = rng.integers(0, classes, size=count)
        pixels = 128.0 + 60.0 * patterns[labels] + rng.normal(0.0, 30.0, size=(count, 32, 32, 3))
        return np.clip(pixels, 0, 255).astype(np.uint8), labels.astype(np.int64)

    train_x, train_y = make(train)
    test_x, test_y = make(test)
    return Dataset("synthetic-cifar10", train_x, train_y, test_x, test_y, classes)


def as_cifar_shape(dataset):
    """28x28 grey images (Fashion-MNIST) in CIFAR-10's input shape: centred in 32x32 with a
    2-pixel black border, the grey value copied to the three channels, uint8 like CIFAR-10."""
    def convert(images):
        pixels = np.round(images.reshape(len(images), 28, 28) * 255.0).astype(np.uint8)
        padded = np.pad(pixels, ((0, 0), (2, 2), (2, 2)))
        return np.repeat(padded[..., np.newaxis], CIFAR_CHANNELS, axis=3)
    return Dataset(dataset.name, convert(dataset.train_x), dataset.train_y,
                   convert(dataset.test_x), dataset.test_y, dataset.num_classes)


def load_cifar(name, data_dir, train=None, test=None):
    """CIFAR-shaped data by name: cifar10 (binary batches in DATA_DIR), fashion_mnist (its IDX
    files in DATA_DIR, brought to 32x32x3) or synthetic (offline)."""
    if name == "cifar10":
        return load_cifar10(data_dir)
    if name == "fashion_mnist":
        return as_cifar_shape(load_mnist(data_dir, flat=False, name=name))
    if name == "synthetic":
        return synthetic_cifar10(train or 2000, test or 500)
    raise SystemExit("unknown --dataset %r: choose cifar10, fashion_mnist or synthetic" % name)


# ---------------------------------------------------------------- UCI Adult census (CSV)

CENSUS_COLUMNS = ["age", "workclass", "fnlwgt", "education", "education_num", "marital_status",
                  "occupation", "relationship", "race", "gender", "capital_gain", "capital_loss",
                  "hours_per_week", "native_country", "income_bracket"]
CENSUS_NUMERIC = ["age", "fnlwgt", "education_num", "capital_gain", "capital_loss",
                  "hours_per_week"]
CENSUS_CATEGORICAL = ["workclass", "education", "marital_status", "occupation", "relationship",
                      "race", "gender", "native_country"]
# One record per example: the 14 features, the label is separate. Categorical values are ASCII.
CENSUS_DTYPE = np.dtype([(c, np.float32 if c in CENSUS_NUMERIC else "S32")
                         for c in CENSUS_COLUMNS[:-1]])
CENSUS_MISSING = "?"


def read_census_csv(path, drop_missing=False):
    """One Adult file as (structured array of CENSUS_DTYPE, int64 labels: 1 when income >50K).

    Fields are separated by ", "; adult.test starts with a junk line and ends its labels with
    '.'; lines without 15 fields (that junk line, blank lines) are skipped. A missing value '?'
    stays a category of its own unless DROP_MISSING, which skips the row.
    """
    rows, labels = [], []
    with open(path, encoding="latin-1") as handle:
        for line in handle:
            fields = [f.strip() for f in line.strip().split(",")]
            if len(fields) != len(CENSUS_COLUMNS):
                continue
            if drop_missing and CENSUS_MISSING in fields:
                continue
            try:
                row = tuple(float(v) if c in CENSUS_NUMERIC else v.encode("ascii", "replace")
                            for c, v in zip(CENSUS_COLUMNS[:-1], fields[:-1]))
            except ValueError:
                continue
            rows.append(row)
            labels.append(1 if ">50K" in fields[-1] else 0)
    if not rows:
        raise ValueError("%s has no census rows (15 comma-separated fields per line)" % path)
    return np.array(rows, dtype=CENSUS_DTYPE), np.array(labels, dtype=np.int64)


def load_census(data_dir, drop_missing=False):
    missing = missing_files("census", data_dir)
    if missing:
        raise DataMissing("census files missing in %s (%s): run `tfcluster data fetch census "
                          "--dest %s` or pass --dataset synthetic"
                          % (data_dir, ", ".join(missing), data_dir))
    train_x, train_y = read_census_csv(os.path.join(data_dir, CENSUS_FILES["train"]), drop_missing)
    test_x, test_y = read_census_csv(os.path.join(data_dir, CENSUS_FILES["test"]), drop_missing)
    return Dataset("census", train_x, train_y, test_x, test_y, 2)


CENSUS_VOCABULARY = {
    "workclass": ["Private", "Self-emp-not-inc", "Self-emp-inc", "Federal-gov", "Local-gov",
                  "State-gov", "Without-pay"],
    "education": ["Preschool", "1st-4th", "5th-6th", "7th-8th", "9th", "10th", "11th", "12th",
                  "HS-grad", "Some-college", "Assoc-voc", "Assoc-acdm", "Bachelors", "Masters",
                  "Prof-school", "Doctorate"],
    "marital_status": ["Married-civ-spouse", "Divorced", "Never-married", "Separated", "Widowed",
                       "Married-spouse-absent"],
    "occupation": ["Tech-support", "Craft-repair", "Other-service", "Sales", "Exec-managerial",
                   "Prof-specialty", "Handlers-cleaners", "Machine-op-inspct", "Adm-clerical",
                   "Farming-fishing", "Transport-moving", "Protective-serv"],
    "relationship": ["Husband", "Wife", "Own-child", "Not-in-family", "Other-relative",
                     "Unmarried"],
    "race": ["White", "Black", "Asian-Pac-Islander", "Amer-Indian-Eskimo", "Other"],
    "gender": ["Male", "Female"],
    "native_country": ["United-States", "Mexico", "Philippines", "Germany", "Canada", "India"],
}


def synthetic_census(train=4000, test=1000, seed=0):
    """Rows of the census schema whose label depends on a few features, deterministically.

    Income >50K is likelier with more education, a married-civ-spouse status, long hours, a
    capital gain and an executive or professional occupation (plus noise): a wide & deep model
    learns it to well above the majority-class rate.
    """
    rng = np.random.default_rng(seed)
    voc = CENSUS_VOCABULARY

    def make(count):
        x = np.zeros(count, dtype=CENSUS_DTYPE)
        for column in CENSUS_CATEGORICAL:
            x[column] = rng.choice(np.array(voc[column], dtype="S32"), size=count)
        x["education_num"] = [voc["education"].index(e.decode()) + 1 for e in x["education"]]
        x["age"] = rng.integers(17, 80, size=count)
        x["fnlwgt"] = rng.integers(20000, 600000, size=count)
        x["hours_per_week"] = np.clip(rng.normal(40, 12, size=count).round(), 1, 99)
        gains = rng.random(count) < 0.15
        x["capital_gain"] = np.where(gains, rng.integers(1000, 20000, size=count), 0)
        x["capital_loss"] = np.where(~gains & (rng.random(count) < 0.05),
                                     rng.integers(500, 3000, size=count), 0)
        married = x["marital_status"] == b"Married-civ-spouse"
        senior_job = np.isin(x["occupation"], [b"Exec-managerial", b"Prof-specialty"])
        score = (0.9 * (x["education_num"] - 11.0) / 3.0 + 1.6 * married + 1.2 * senior_job
                 + 0.05 * (x["hours_per_week"] - 40.0) + 1.5 * (x["capital_gain"] > 5000)
                 + 0.6 * ((x["age"] > 30) & (x["age"] < 60)) - 1.4)
        labels = (score + rng.normal(0.0, 0.5, size=count) > 0).astype(np.int64)
        return x, labels

    train_x, train_y = make(train)
    test_x, test_y = make(test)
    return Dataset("synthetic-census", train_x, train_y, test_x, test_y, 2)
