"""A folder of packed venvs keyed by what each was built from (`tfcluster wheelhouse
--pack-cache DIR`, or TFCLUSTER_PACK_CACHE): a wheelhouse whose pack has the same inputs as one
in the cache gets it as a hard link (a copy across file systems) instead of building it again,
and a second wheelhouse at the same time waits for the first (a lock on the folder) instead of
building the same pack beside it. Standard library only.
"""
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import sys
import tempfile

LOCK = ".lock"


@contextlib.contextmanager
def locked(cache):
    """CACHE's lock held (made first when missing); says so when it must wait for another."""
    os.makedirs(cache, exist_ok=True)
    fd = os.open(os.path.join(cache, LOCK), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print("wheelhouse: waiting for another wheelhouse using the pack cache %s" % cache,
                  flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def entry(cache, wanted):
    """The folder of CACHE that holds the pack built from WANTED (interpreter, format, inputs)."""
    return os.path.join(cache, hashlib.sha256(json.dumps(wanted, sort_keys=True).encode())
                        .hexdigest()[:32])


def link(source, target):
    """TARGET made SOURCE's file, whole or not at all."""
    part = target + ".part"
    if os.path.lexists(part):
        os.remove(part)
    try:
        os.link(source, part)
    except OSError:  # another file system, or links refused
        shutil.copyfile(source, part)
    os.replace(part, target)


def fetch(folder, dest, names):
    """NAMES (the archive first, the metadata last: a pack is whole when its metadata names it)
    linked from FOLDER into DEST."""
    for name in names:
        link(os.path.join(folder, name), os.path.join(dest, name))


def store(cache, wanted, dest, names):
    """DEST's pack (NAMES) into CACHE under WANTED's key, replacing an older one of that key."""
    final = entry(cache, wanted)
    build = tempfile.mkdtemp(prefix=".store-", dir=cache)
    try:
        fetch(dest, build, names)
        if os.path.isdir(final):
            shutil.rmtree(final)
        os.rename(build, final)
    except OSError as error:
        # The pack in DEST is whole: a cache that cannot take it costs the next build, no more.
        print("wheelhouse: could not keep the pack in the cache %s: %s" % (cache, error),
              file=sys.stderr)
        shutil.rmtree(build, ignore_errors=True)
