"""The data loaders on small files written here in the REAL formats, and `tfcluster data fetch`
with a fake opener: nothing touches the network."""
import functools
import gzip
import hashlib
import io
import json
import os
import re
import struct
import tarfile

import numpy as np
import pytest

from trainers.common import data
from tfcluster.cli import main as cli
from tfcluster.data import fetch as fetcher
from tfcluster.errors import TfclusterError


# ---------------------------------------------------------------- MNIST IDX

def write_idx(path, array, magic):
    """An IDX file: big-endian magic, one big-endian uint32 per dimension, the bytes."""
    payload = struct.pack(">I", magic) + struct.pack(">" + "I" * array.ndim, *array.shape)
    payload += array.astype(np.uint8).tobytes()
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wb") as handle:
        handle.write(payload)


def write_mnist(folder, train=12, test=5):
    rng = np.random.default_rng(3)
    arrays = {"train_x": rng.integers(0, 256, size=(train, 28, 28)),
              "train_y": rng.integers(0, 10, size=train),
              "test_x": rng.integers(0, 256, size=(test, 28, 28)),
              "test_y": rng.integers(0, 10, size=test)}
    for key, name in data.MNIST_FILES.items():
        magic = data.IDX_IMAGES if key.endswith("_x") else data.IDX_LABELS
        write_idx(os.path.join(folder, name), arrays[key], magic)
    return arrays


def test_mnist_idx_gz_files(tmp_path):
    arrays = write_mnist(str(tmp_path))
    flat = data.load_mnist(str(tmp_path))
    assert flat.name == "mnist" and flat.num_classes == 10
    assert flat.train_x.shape == (12, 784) and flat.test_x.shape == (5, 784)
    assert flat.train_x.dtype == np.float32 and 0.0 <= flat.train_x.min() <= flat.train_x.max() <= 1.0
    np.testing.assert_allclose(flat.train_x[3], arrays["train_x"][3].reshape(-1) / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(flat.test_y, arrays["test_y"])
    assert flat.train_y.dtype == np.int64
    images = data.load_mnist(str(tmp_path), flat=False)
    assert images.train_x.shape == (12, 28, 28, 1)
    np.testing.assert_allclose(images.train_x[0, 5, 7, 0], arrays["train_x"][0, 5, 7] / 255.0)
    assert data.load_images("mnist", str(tmp_path)).train_x.shape == (12, 784)


def test_idx_plain_file_and_bad_files(tmp_path):
    labels = np.arange(7) % 10
    plain = str(tmp_path / "labels-idx1-ubyte")
    write_idx(plain, labels, data.IDX_LABELS)
    np.testing.assert_array_equal(data.read_idx(plain), labels)
    bad_magic = str(tmp_path / "bad")
    write_idx(bad_magic, labels, 1234)
    with pytest.raises(ValueError, match="not an MNIST IDX file"):
        data.read_idx(bad_magic)
    truncated = str(tmp_path / "short")
    with open(truncated, "wb") as handle:
        handle.write(struct.pack(">II", data.IDX_LABELS, 10) + bytes(4))
    with pytest.raises(ValueError, match="truncated"):
        data.read_idx(truncated)


def test_mnist_missing_names_the_fetch_command(tmp_path):
    with pytest.raises(data.DataMissing) as caught:
        data.load_mnist(str(tmp_path))
    assert "tfcluster data fetch mnist --dest %s" % tmp_path in str(caught.value)


def test_digits_offline():
    digits = data.load_digits()
    assert digits.train_x.shape == (1500, 64) and digits.test_x.shape == (297, 64)
    assert 0.0 <= digits.train_x.min() and digits.train_x.max() <= 1.0
    assert set(np.unique(digits.train_y)) == set(range(10))
    assert data.load_digits(flat=False).train_x.shape == (1500, 8, 8, 1)
    shard = digits.shard(1, 2)
    np.testing.assert_array_equal(shard.train_y, digits.train_y[1::2])
    with pytest.raises(SystemExit, match="choose mnist, fashion_mnist or digits"):
        data.load_images("fashion", "/nowhere")


# ---------------------------------------------------------------- CIFAR-10 binary batches

def cifar_records(count, first_label=0):
    """COUNT records whose pixels encode where they are: red = row, green = column,
    blue = 10 * label + image number; channel-major like the real files."""
    records, expected = [], []
    for n in range(count):
        label = (first_label + n) % 10
        rows, cols = np.meshgrid(np.arange(32), np.arange(32), indexing="ij")
        planes = np.stack([rows, cols, np.full((32, 32), 10 * label + n % 10)])
        records.append(bytes([label]) + planes.astype(np.uint8).tobytes())
        expected.append(label)
    return b"".join(records), expected


def write_cifar(folder, per_batch=3):
    os.makedirs(folder, exist_ok=True)
    for index, name in enumerate(data.CIFAR_TRAIN_FILES):
        payload, _ = cifar_records(per_batch, first_label=index)
        with open(os.path.join(folder, name), "wb") as handle:
            handle.write(payload)
    payload, _ = cifar_records(4, first_label=7)
    with open(os.path.join(folder, data.CIFAR_TEST_FILE), "wb") as handle:
        handle.write(payload)


def test_cifar_batch_layout(tmp_path):
    payload, labels = cifar_records(4, first_label=2)
    path = str(tmp_path / "data_batch_1.bin")
    with open(path, "wb") as handle:
        handle.write(payload)
    images, got = data.read_cifar_batch(path)
    assert images.shape == (4, 32, 32, 3) and images.dtype == np.uint8
    np.testing.assert_array_equal(got, labels)
    assert images[1, 5, 9, 0] == 5          # red plane: the row
    assert images[1, 5, 9, 1] == 9          # green plane: the column
    assert images[1, 5, 9, 2] == 10 * labels[1] + 1


@pytest.mark.parametrize("inner", ["", "cifar-10-batches-bin"])
def test_cifar10_in_dir_or_extracted_subdir(tmp_path, inner):
    write_cifar(os.path.join(str(tmp_path), inner))
    dataset = data.load_cifar10(str(tmp_path))
    assert dataset.name == "cifar10" and dataset.num_classes == 10
    assert dataset.train_x.shape == (15, 32, 32, 3) and dataset.test_x.shape == (4, 32, 32, 3)
    assert list(dataset.train_y[:3]) == [0, 1, 2] and list(dataset.train_y[3:6]) == [1, 2, 3]
    assert list(dataset.test_y) == [7, 8, 9, 0]
    assert data.load_cifar("cifar10", str(tmp_path)).train_x.shape == (15, 32, 32, 3)


def test_cifar10_bad_and_missing_files(tmp_path):
    bad = str(tmp_path / "test_batch.bin")
    with open(bad, "wb") as handle:
        handle.write(bytes(data.CIFAR_RECORD + 5))
    with pytest.raises(ValueError, match="not a multiple"):
        data.read_cifar_batch(bad)
    with pytest.raises(data.DataMissing) as caught:
        data.load_cifar10(str(tmp_path))
    message = str(caught.value)
    assert "tfcluster data fetch cifar10 --dest %s" % tmp_path in message
    assert "data_batch_1.bin" in message and "--dataset synthetic" in message
    with pytest.raises(SystemExit, match="choose cifar10, fashion_mnist or synthetic"):
        data.load_cifar("cifar100", str(tmp_path))


def test_synthetic_cifar10_is_deterministic_and_learnable():
    first, second = data.synthetic_cifar10(), data.synthetic_cifar10()
    assert first.name == "synthetic-cifar10"
    assert first.train_x.shape == (2000, 32, 32, 3) and first.train_x.dtype == np.uint8
    assert first.test_x.shape == (500, 32, 32, 3)
    np.testing.assert_array_equal(first.train_x, second.train_x)
    assert set(np.unique(first.train_y)) == set(range(10))
    # The class shows in the pixels: nearest class mean on the training set classifies the
    # test set far above chance, though no single image is clean (noise everywhere).
    x = first.train_x.reshape(2000, -1).astype(np.float32)
    means = np.stack([x[first.train_y == c].mean(axis=0) for c in range(10)])
    test = first.test_x.reshape(500, -1).astype(np.float32)
    predicted = np.argmin(((test[:, None, :] - means[None]) ** 2).sum(axis=2), axis=1)
    assert (predicted == first.test_y).mean() > 0.9
    assert np.abs(x[0] - means[first.train_y[0]]).mean() > 15


# ---------------------------------------------------------------- census CSV

ADULT_ROWS = [
    "39, State-gov, 77516, Bachelors, 13, Never-married, Adm-clerical, Not-in-family, White, "
    "Male, 2174, 0, 40, United-States, <=50K",
    "50, Self-emp-not-inc, 83311, Bachelors, 13, Married-civ-spouse, Exec-managerial, Husband, "
    "White, Male, 0, 0, 13, United-States, >50K",
    "54, ?, 180211, Some-college, 10, Married-civ-spouse, ?, Husband, Asian-Pac-Islander, Male, "
    "0, 0, 60, South, >50K",
]


def write_census(folder):
    with open(os.path.join(folder, "adult.data"), "w") as handle:
        handle.write("\n".join(ADULT_ROWS) + "\n\n")
    with open(os.path.join(folder, "adult.test"), "w") as handle:
        handle.write("|1x3 Cross validator\n")
        handle.write("25, Private, 226802, 11th, 7, Never-married, Machine-op-inspct, Own-child, "
                     "Black, Male, 0, 0, 40, United-States, <=50K.\n")
        handle.write("44, Private, 160323, Some-college, 10, Married-civ-spouse, "
                     "Machine-op-inspct, Husband, Black, Male, 7688, 0, 40, United-States, >50K.\n")
        handle.write("\n")


def test_census_files(tmp_path):
    write_census(str(tmp_path))
    census = data.load_census(str(tmp_path))
    assert census.name == "census" and census.num_classes == 2
    assert len(census.train_x) == 3 and len(census.test_x) == 2     # junk and blank lines skipped
    assert list(census.train_y) == [0, 1, 1]
    assert list(census.test_y) == [0, 1]                            # labels ending in '.'
    first = census.train_x[0]
    assert first["age"] == 39 and first["workclass"] == b"State-gov"
    assert first["capital_gain"] == 2174 and first["native_country"] == b"United-States"
    assert census.train_x["occupation"][2] == b"?"                  # '?' kept as a category
    assert census.test_x["capital_gain"][1] == 7688
    assert census.train_x.dtype.names == tuple(data.CENSUS_COLUMNS[:-1])
    dropped = data.load_census(str(tmp_path), drop_missing=True)
    assert len(dropped.train_x) == 2 and list(dropped.train_y) == [0, 1]


def test_census_missing_names_the_fetch_command(tmp_path):
    with pytest.raises(data.DataMissing) as caught:
        data.load_census(str(tmp_path))
    assert "tfcluster data fetch census --dest %s" % tmp_path in str(caught.value)
    empty = tmp_path / "adult.data"
    empty.write_text("not, a, census, line\n")
    with pytest.raises(ValueError, match="no census rows"):
        data.read_census_csv(str(empty))


def test_synthetic_census_schema_and_signal():
    first, second = data.synthetic_census(), data.synthetic_census()
    assert first.name == "synthetic-census"
    assert first.train_x.dtype == data.CENSUS_DTYPE and len(first.train_x) == 4000
    np.testing.assert_array_equal(first.train_y, second.train_y)
    for column in data.CENSUS_CATEGORICAL:
        assert set(first.train_x[column]) <= {v.encode() for v in data.CENSUS_VOCABULARY[column]}
    positive = first.train_y.mean()
    assert 0.15 < positive < 0.5
    # The label depends on a few features: married people with more education earn more.
    married = first.train_x["marital_status"] == b"Married-civ-spouse"
    educated = first.train_x["education_num"] >= 13
    assert first.train_y[married & educated].mean() > 2 * first.train_y[~married].mean()


# ---------------------------------------------------------------- tfcluster data fetch

class FakeResponse(io.BytesIO):
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class FakeOpener:
    """Serves bytes per URL; a URL mapped to an exception raises it. Records every call."""

    def __init__(self, served):
        self.served = served
        self.calls = []

    def __call__(self, url, timeout=None):
        self.calls.append(url)
        body = self.served[url]
        if isinstance(body, Exception):
            raise body
        return FakeResponse(body)


def sha256(payload):
    return hashlib.sha256(payload).hexdigest()


@pytest.fixture
def fake_manifest(monkeypatch):
    entries = {}
    monkeypatch.setattr(fetcher, "manifest", lambda: entries)
    return entries


def test_fetch_checksum_ok_keeps_the_file(tmp_path, fake_manifest, capsys):
    payload = b"census rows\n" * 100
    fake_manifest["tiny"] = {"files": [{"name": "adult.data", "sha256": sha256(payload),
                                        "urls": ["https://a.example/adult.data"]}]}
    opener = FakeOpener({"https://a.example/adult.data": payload})
    fetcher.fetch("tiny", str(tmp_path), opener=opener)
    assert (tmp_path / "adult.data").read_bytes() == payload
    assert os.listdir(tmp_path) == ["adult.data"]
    fetcher.fetch("tiny", str(tmp_path), opener=opener)      # present and right: not downloaded
    assert opener.calls == ["https://a.example/adult.data"]
    assert "present, checksum ok" in capsys.readouterr().out


def test_fetch_wrong_checksum_fails_and_leaves_nothing(tmp_path, fake_manifest):
    fake_manifest["tiny"] = {"files": [{"name": "adult.test", "sha256": sha256(b"expected"),
                                        "urls": ["https://a.example/t", "https://b.example/t"]}]}
    opener = FakeOpener({"https://a.example/t": b"tampered", "https://b.example/t": b"also bad"})
    with pytest.raises(TfclusterError) as caught:
        fetcher.fetch("tiny", str(tmp_path), opener=opener)
    assert "checksum" in str(caught.value) and "adult.test" in str(caught.value)
    assert opener.calls == ["https://a.example/t", "https://b.example/t"]     # every mirror
    assert os.listdir(tmp_path) == []                                          # no file, no .part


def test_fetch_falls_back_to_the_next_mirror(tmp_path, fake_manifest):
    payload = b"\x00\x01" * 50
    fake_manifest["tiny"] = {"files": [{"name": "f.bin", "sha256": sha256(payload),
                                        "urls": ["https://down.example/f", "https://up.example/f"]}]}
    opener = FakeOpener({"https://down.example/f": OSError("connection refused"),
                         "https://up.example/f": payload})
    fetcher.fetch("tiny", str(tmp_path), opener=opener)
    assert (tmp_path / "f.bin").read_bytes() == payload


def test_fetch_extracts_cifar_archive_the_loader_reads(tmp_path, fake_manifest):
    staging = tmp_path / "staging"
    write_cifar(str(staging / "cifar-10-batches-bin"))
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        archive.add(str(staging / "cifar-10-batches-bin"), arcname="cifar-10-batches-bin")
    payload = buffer.getvalue()
    fake_manifest["cifar10"] = {"files": [{"name": "cifar-10-binary.tar.gz", "extract": True,
                                           "sha256": sha256(payload),
                                           "urls": ["https://c.example/cifar.tgz"]}]}
    dest = tmp_path / "cifar10"
    fetcher.fetch("cifar10", str(dest), opener=FakeOpener({"https://c.example/cifar.tgz": payload}))
    dataset = data.load_cifar10(str(dest))
    assert dataset.train_x.shape == (15, 32, 32, 3) and list(dataset.test_y) == [7, 8, 9, 0]


@pytest.mark.parametrize("python_has_filter", [True, False])
def test_fetch_refuses_an_archive_reaching_out_of_the_folder(tmp_path, fake_manifest, monkeypatch,
                                                             python_has_filter):
    """Python before 3.10.12/3.11.4 has no tar filter (Debian 12: 3.11.2): the same refusal."""
    if not python_has_filter:
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    elif not hasattr(tarfile, "data_filter"):
        pytest.skip("this Python has no tarfile filter")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        link = tarfile.TarInfo("batches/escape")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        archive.addfile(link)
    payload = buffer.getvalue()
    fake_manifest["cifar10"] = {"files": [{"name": "cifar-10-binary.tar.gz", "extract": True,
                                           "sha256": sha256(payload),
                                           "urls": ["https://c.example/cifar.tgz"]}]}
    dest = tmp_path / "cifar10"
    with pytest.raises(TfclusterError) as raised:
        fetcher.fetch("cifar10", str(dest),
                      opener=FakeOpener({"https://c.example/cifar.tgz": payload}))
    assert "escape" in str(raised.value) or "/etc/passwd" in str(raised.value)
    assert not (dest / "batches" / "escape").exists()


def test_cli_fetch_unknown_name_exits_2(tmp_path, capsys):
    code = cli.main(["data", "fetch", "imagenet", "--dest", str(tmp_path / "x")])
    assert code == 2
    err = capsys.readouterr().err
    assert "unknown dataset 'imagenet'" in err and "census" in err and "cifar10" in err


def test_cli_fetch_with_patched_opener(tmp_path, monkeypatch, capsys):
    """The real manifest's census entry through the CLI, its canonical URLs only; the bytes
    served do not match the published checksum, so the command fails (exit 1) and leaves no
    file behind."""
    served = {}
    for entry in fetcher.manifest()["census"]["files"]:
        for url in entry["urls"]:
            served[url] = b"not the census"
    monkeypatch.setattr(fetcher, "fetch", functools.partial(fetcher.fetch,
                                                            opener=FakeOpener(served)))
    dest = tmp_path / "census"
    assert cli.main(["data", "fetch", "census", "--dest", str(dest), "--source", "url"]) == 1
    assert "checksum" in capsys.readouterr().err
    assert os.listdir(dest) == []


def test_real_manifest_is_well_formed():
    datasets = fetcher.manifest()
    assert {"mnist", "cifar10", "census"} <= set(datasets)
    for name, dataset in datasets.items():
        for entry in dataset["files"]:
            assert re.fullmatch(r"[0-9a-f]{64}", entry["sha256"]), (name, entry)
            assert entry["urls"] and all(u.startswith("https://") for u in entry["urls"])
    names = {e["name"] for e in datasets["census"]["files"]}
    assert names == set(data.CENSUS_FILES.values())
    json.dumps(datasets)


# ---------------------------------------------------------------- what preflight checks

def test_needed_follows_the_last_dataset_and_data_dir_options():
    from tfcluster_agent.datafiles import needed
    command = "python -m trainers.mnist_replica --data_dir=/d/mnist --train_steps=5"
    assert needed(command, "mnist") == ("mnist", "/d/mnist")
    assert needed(command + " --dataset=digits", "mnist") is None  # bundled: no files
    assert needed(command + " --dataset digits --dataset mnist", "mnist") == ("mnist", "/d/mnist")
    assert needed(command + " --data_dir '/my data'", "mnist") == ("mnist", "/my data")
    assert needed(command, "") is None  # --cmd programs: nothing to check


def test_missing_files_sees_the_extracted_cifar_folder(tmp_path):
    from tfcluster_agent.datafiles import CIFAR_TEST_FILE, CIFAR_TRAIN_FILES, missing_files
    assert missing_files("cifar10", str(tmp_path)) == CIFAR_TRAIN_FILES + [CIFAR_TEST_FILE]
    inner = tmp_path / "cifar-10-batches-bin"
    inner.mkdir()
    for name in CIFAR_TRAIN_FILES + [CIFAR_TEST_FILE]:
        (inner / name).write_bytes(b"")
    assert missing_files("cifar10", str(tmp_path)) == []
