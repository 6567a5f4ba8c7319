"""The host code and its identity, standard library only: which files are host code (read from
hostcode.json, the one definition that tfcluster sync and the trainers role use too) and their
content hash, which preflight compares with the controller's to find stale hosts."""
import os

from tfcluster_agent import jsonc as json

DEFINITION = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hostcode.json")
_DEFINED = []


def definition():
    """hostcode.json, {"packages": [...], "skip": pattern, ...}: read once per process."""
    if not _DEFINED:
        with open(DEFINITION) as handle:
            _DEFINED.append(json.load(handle))
    return _DEFINED[0]


def packages():
    """The packages every host gets, side by side in one code root (tfcluster_root on a host,
    the checkout or site-packages on the controller)."""
    return tuple(definition()["packages"])


def skipped(relpath):
    """True for a path (relative to the code root, "/"-separated) that is no host code."""
    import re  # here: an agent's preflight whose code is as it was lists no files
    return re.search(definition()["skip"], relpath) is not None


_SHA256 = []


def sha256(data=b""):
    """hashlib.sha256 without importing hashlib, which loads OpenSSL at every agent's
    start."""
    if not _SHA256:  # looked up once: a failed import is tried again at every call
        try:
            from _sha256 import sha256 as new  # Python 3.11
        except ImportError:
            try:
                from _sha2 import sha256 as new  # 3.12 and later
            except ImportError:
                from hashlib import sha256 as new
        _SHA256.append(new)
    return _SHA256[0](data)


def file_sha256(path):
    """The hex sha256 of the file PATH, read a MiB at a time."""
    digest = sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def code_files(code_root, folders=None):
    """(relative path, path) of every host code file below CODE_ROOT, in order; the folders
    looked into are added to the list FOLDERS, when given."""
    found = []
    for package in packages():
        top = os.path.join(code_root, package)
        if folders is not None and not os.path.isdir(top):
            folders.append(top)  # watched for its coming
        for root, dirs, files in os.walk(top):
            if folders is not None:
                folders.append(root)
            rel_root = package + root[len(top):].replace(os.sep, "/")
            dirs[:] = sorted(d for d in dirs if not skipped(rel_root + "/" + d))
            found += [(rel_root + "/" + name, os.path.join(root, name))
                      for name in sorted(files) if not skipped(rel_root + "/" + name)]
    return found


def code_hash(code_root, files=None):
    """Content hash of the host code below CODE_ROOT: each file's relative path and bytes
    (FILES: code_files(CODE_ROOT), when already listed)."""
    digest = sha256()
    for rel, path in code_files(code_root) if files is None else files:
        with open(path, "rb") as handle:
            digest.update(rel.encode() + b"\0" + sha256(handle.read()).digest())
    return digest.hexdigest()


HASH_FILE = "trainers.sha256"


def write_hash(code_root, path=None, dry_run=False):
    """The one writer of trainers.sha256 (PATH, default in CODE_ROOT), which preflight reads:
    the trainers role's `write-hash` and tfcluster sync's `sync-apply` both call it. The code
    hash of what CODE_ROOT holds now, written when the file says otherwise (complete before it
    takes the name; 0644: every user's launch reads it). DRY_RUN: a dry run's answer, nothing
    written. {"hash", "changed"}."""
    digest = code_hash(code_root)
    path = path or os.path.join(code_root, HASH_FILE)
    try:
        with open(path) as handle:
            changed = handle.read() != digest + "\n"
    except OSError:
        changed = True
    if changed and not dry_run:
        folder, name = os.path.split(path)
        temporary = os.path.join(folder, ".%s.%d" % (name, os.getpid()))
        with open(temporary, "w") as handle:
            handle.write(digest + "\n")
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    return {"hash": digest, "changed": changed}
