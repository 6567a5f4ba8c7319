"""What a host's tasks run with, for the run's record (docs/provenance.md): the distributions the
task's interpreter can import, the CUDA, cuDNN and NCCL versions among them or in TensorFlow's
build, and the hashes of the data files the tasks read.

Standard library only, and cheap at every preflight: the distributions are read from their
metadata folders' names (importlib.metadata would read every METADATA file), and a data file is
hashed again only after it changed.
"""
import os
import sys

from tfcluster_agent import jsonc as json
from tfcluster_agent.hostcode import file_sha256, sha256
from tfcluster_agent.supervisor import boot_id, write_atomic

# {version key: the distribution that carries it} (tensorflow[and-cuda] wheels), named alone
# (CUDA 13's nvidia-cuda-runtime) or for a CUDA major version (nvidia-cudnn-cu12): the newest wins.
LIBRARY_PACKAGES = {"cuda": "nvidia-cuda-runtime", "cudnn": "nvidia-cudnn", "nccl": "nvidia-nccl"}
# TensorFlow's build facts (tf.sysconfig.get_build_info(), read without importing TensorFlow).
BUILD_INFO = os.path.join("tensorflow", "python", "platform", "build_info.py")
BUILD_KEYS = {"cuda_version": "tf_built_cuda", "cudnn_version": "tf_built_cudnn"}
CUDA_TOOLKIT = "/usr/local/cuda/version.json"


def normal_name(name):
    """A distribution's name as PEP 503 compares them: lower case, runs of -_. as one -."""
    name = name.lower().replace("_", "-").replace(".", "-")
    while "--" in name:
        name = name.replace("--", "-")
    return name


def _pth_folders(folder):
    """The folders FOLDER's .pth files add to sys.path, as site.addpackage reads them (lines
    starting with import are code, not folders)."""
    found = []
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(".pth"))
    except OSError:
        return found
    for name in names:
        try:
            with open(os.path.join(folder, name), encoding="utf-8", errors="replace") as handle:
                lines = handle.read().splitlines()
        except OSError:
            continue
        for line in lines:
            line = line.rstrip()
            if not line or line.startswith(("#", "import ", "import\t")):
                continue
            path = os.path.join(folder, line)
            if os.path.isdir(path):
                found.append(path)
    return found


def search_path(python, own_site_folders):
    """The folders PYTHON imports distributions from: for the agent's own interpreter
    OWN_SITE_FOLDERS() and what their .pth files add; another one is asked (a second process)."""
    if os.path.abspath(python) != os.path.abspath(sys.executable):
        import subprocess
        try:
            probe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tfprobe.py")
            out = subprocess.run([python, probe, "path"], capture_output=True, text=True,
                                 timeout=60)
        except (OSError, subprocess.SubprocessError):
            return []
        return [p for p in out.stdout.splitlines() if p and os.path.isdir(p)]
    folders = []
    for folder in own_site_folders():
        if os.path.isdir(folder):
            folders += [folder] + _pth_folders(folder)
    return folders


def _metadata_version(path):
    """The Version field of an egg-info's PKG-INFO (or a dist-info's METADATA) at PATH."""
    for name in ("PKG-INFO", "METADATA"):
        try:
            with open(os.path.join(path, name), encoding="utf-8", errors="replace") as handle:
                for line in handle:
                    if line.startswith("Version:"):
                        return line.split(":", 1)[1].strip()
                    if not line.strip():
                        break
        except OSError:
            continue
    return None


def distributions(folders):
    """{normal name: version} of the distributions in FOLDERS, the first of a name winning as
    importlib.metadata's lookup does: from the names of their .dist-info and .egg-info folders
    (name-version.dist-info; name-version-pyX.Y.egg-info, or name.egg-info and its PKG-INFO)."""
    found = {}
    for folder in folders:
        try:
            entries = sorted(os.listdir(folder))
        except OSError:
            continue
        for entry in entries:
            stem, dot, suffix = entry.rpartition(".")
            if not dot or suffix not in ("dist-info", "egg-info"):
                continue
            parts = stem.split("-")
            name = normal_name(parts[0])
            if not name or name in found:
                continue
            version = parts[1] if len(parts) > 1 else _metadata_version(
                os.path.join(folder, entry))
            if version:
                found[name] = version
    return found


def packages_hash(packages):
    """One hash of a package set, {name: version}: equal sets, equal hashes."""
    text = "".join("%s==%s\n" % item for item in sorted(packages.items()))
    return sha256(text.encode()).hexdigest()


def _build_info(folders):
    """TensorFlow's CUDA and cuDNN build versions from its build_info.py, where present: a
    literal dict or list of pairs, read as text."""
    for folder in folders:
        try:
            with open(os.path.join(folder, BUILD_INFO), encoding="utf-8") as handle:
                text = handle.read()
        except OSError:
            continue
        found = {}
        for key, name in BUILD_KEYS.items():
            at = text.find("'%s'" % key)
            if at < 0:
                continue
            rest = text[at + len(key) + 2:].lstrip(" :,")
            if rest[:1] in ("'", '"'):
                found[name] = rest[1:rest.find(rest[0], 1)]
        return found
    return {}


def library_versions(packages, folders):
    """{cuda, cudnn, nccl (installed distributions), tf_built_cuda, tf_built_cudnn (TensorFlow's
    build), cuda_toolkit (a system toolkit)}: those present."""
    versions = {}
    for key, base in LIBRARY_PACKAGES.items():
        names = [n for n in packages if n == base or
                 (n.startswith(base + "-cu") and n[len(base) + 3:].isdigit())]
        if names:
            versions[key] = packages[max(names, key=lambda n: int(n[len(base) + 3:] or 0))]
    versions.update(_build_info(folders))
    try:
        with open(CUDA_TOOLKIT) as handle:
            versions["cuda_toolkit"] = json.load(handle)["cuda"]["version"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return versions


def package_facts(python, own_site_folders):
    """The preflight's facts about PYTHON's distributions: {packages, packages_hash, versions}."""
    folders = search_path(python, own_site_folders)
    packages = distributions(folders)
    return {"packages": packages, "packages_hash": packages_hash(packages),
            "versions": library_versions(packages, folders)}


def data_hashes(paths, cache_dir=None, settle_ns=2 * 10**9):
    """{path: sha256} of the files in PATHS that exist. A hash is remembered in CACHE_DIR against
    the file's inode, size and change times: a data set is read again only after it changed,
    not at every launch. A file changed in the last SETTLE_NS is not remembered (a change
    within the clock's tick could leave its times as they were)."""
    cache = None
    saved = {}
    if cache_dir:
        # Per machine (a home may be shared): inodes are the machine's own.
        cache = os.path.join(os.path.expanduser(cache_dir), "data-%s" % sha256(
            boot_id().encode()).hexdigest()[:16])
        try:
            with open(cache) as handle:
                saved = json.load(handle)
        except (OSError, ValueError):
            saved = {}
    import time
    settled = time.time_ns() - settle_ns
    hashes, keep = {}, {}
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            continue
        key = [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
        entry = saved.get(path)
        if isinstance(entry, list) and entry[:4] == key:
            hashes[path] = entry[4]
        else:
            try:
                hashes[path] = file_sha256(path)
            except OSError:
                continue
        if max(st.st_mtime_ns, st.st_ctime_ns) < settled:
            keep[path] = key + [hashes[path]]
    if cache and any(saved.get(p) != entry for p, entry in keep.items()):
        try:
            os.makedirs(os.path.dirname(cache), exist_ok=True)
            write_atomic(cache, json.dumps(dict(saved, **keep)))
        except OSError:
            pass  # no writable home: hashed again next time
    return hashes
