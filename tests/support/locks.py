"""Machine-wide resources of the suite (the test hosts, the containers, the wheelhouse), one
pytest session (or scripts/bench) at a time."""
import fcntl
import os
import shutil
import subprocess
import sys

from support import REPO
from support.procs import wait_for

TESTHOSTS_LOCK = "/run/lock/tfc-testhosts.session.lock"
DOCKERHOSTS_LOCK = "/run/lock/tfc-dockerhosts.session.lock"
WHEELHOUSE_LOCK = "/run/lock/tfc-wheelhouse.lock"


def ready_wheelhouse(timeout=1800, copy_to=None):
    """`tfcluster wheelhouse` (the wheels and the packed venv in REPO/wheelhouse), one caller at
    a time: the container session and the lab tests deploy from it side by side, and the second
    finds it made (a rerun with the same inputs downloads nothing and keeps the pack). COPY_TO:
    a folder that gets its files as made (hard links), for deploys that must see one wheelhouse
    while the other session replaces the checkout's (share_wheelhouse)."""
    fd = hold_lock(WHEELHOUSE_LOCK, timeout)
    try:
        proc = subprocess.run([sys.executable, "-m", "tfcluster", "wheelhouse"],
                              cwd=REPO, capture_output=True, text=True, timeout=timeout)
        if proc.returncode == 0 and copy_to:
            link_files(os.path.join(REPO, "wheelhouse"), copy_to)
        return proc
    finally:
        os.close(fd)


def share_wheelhouse(source):
    """The checkout's wheelhouse gets SOURCE's files (a wheelhouse made elsewhere): a later
    wheelhouse there finds the wheels and the pack already made."""
    fd = hold_lock(WHEELHOUSE_LOCK, timeout=1800)
    try:
        link_files(source, os.path.join(REPO, "wheelhouse"))
    finally:
        os.close(fd)


def link_files(source, dest):
    """DEST/ gets SOURCE/'s files as hard links (replacing those of the same name)."""
    os.makedirs(dest, exist_ok=True)
    for name in os.listdir(source):
        path = os.path.join(source, name)
        target = os.path.join(dest, name)
        if not os.path.isfile(path) or (os.path.exists(target) and os.path.samefile(path, target)):
            continue
        try:
            os.link(path, target + ".link")
        except OSError:  # another file system (a --basetemp elsewhere): a copy
            shutil.copy2(path, target + ".link")
        os.replace(target + ".link", target)


def hold_lock(path, timeout):
    """A descriptor holding PATH's exclusive lock (closing it lets go); fails the test when
    another session keeps it past TIMEOUT seconds."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)

    def taken():
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False
    try:
        wait_for(taken, timeout, "the lock %s, held by another test session or bench" % path,
                 interval=0.5)
    except BaseException:
        os.close(fd)
        raise
    return fd
