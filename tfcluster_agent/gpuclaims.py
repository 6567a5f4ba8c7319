"""GPU claims every user's runs on a host see, and the host's queue of runs waiting for GPUs.

A claim is an exclusive flock on one file per GPU (named by its UUID, so the same board is the
same claim whatever index or network namespace a run sees). The kernel drops the lock when its
holder dies, however it dies: a dead run's claim cannot outlive it or hang anyone. Its holder is
the agent from the claim to the start, then the supervisor of each task using the GPU until the
task has exited (like the port claims in hostinfo.py).

The folder is shared by every user, hence the choices (see ANCHORS.md on lock tools):
- not /var/lock (root only on many systems) and not a home: /var/tmp, made world-writable with
  the sticky bit, whoever comes first;
- lock files 0666 whatever the creator's umask, so the next user can open them;
- never opened with O_CREAT when they exist: with fs.protected_regular (the default on
  systemd systems) O_CREAT on another user's file in a sticky folder fails with EACCES.

Standard library only.
"""
import errno
import fcntl
import os
import pwd
import stat
import time

from tfcluster_agent import jsonc as json
from tfcluster_agent.shares import safe_name

# One folder for every user's runs. TFCLUSTER_GPU_CLAIMS_DIR is for tests: each test session
# its own claims and queue, which concurrent sessions on one machine would otherwise share.
CLAIMS_DIR = os.environ.get("TFCLUSTER_GPU_CLAIMS_DIR") or "/var/tmp/tfcluster-gpu-claims"
# A probe takes a shared lock for an instant: a claim that meets one tries again a few times.
CLAIM_TRIES = 20
LABEL_BYTES = 1024


def user_name():
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def shared_dir(*parts):
    """CLAIMS_DIR (or a folder in it), created world-writable and sticky when missing; an
    OSError when what is there is no such folder (a symlink someone planted, say)."""
    path = CLAIMS_DIR
    for part in ("",) + parts:
        path = os.path.join(path, part) if part else path
        try:
            os.mkdir(path, 0o700)
            os.chmod(path, 0o1777)  # after mkdir: the umask must not narrow it
        except FileExistsError:
            if not sticky_folder(path):
                raise OSError(errno.EPERM, "%s is not a sticky folder: remove it" % path)
    return path


def sticky_folder(path, settle=1.0):
    """True when PATH is a sticky folder. A folder without the bit may be one another run has
    just made and not yet chmod'ed (mkdir, then chmod): it gets SETTLE seconds to become one."""
    deadline = time.monotonic() + settle
    while True:
        found = os.lstat(path)
        if not stat.S_ISDIR(found.st_mode):
            return False
        if found.st_mode & stat.S_ISVTX:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)


def open_shared(path):
    """A read-write descriptor of the lock file PATH, made 0666 if this call creates it."""
    for _ in range(10):
        try:
            return os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        except FileNotFoundError:
            pass
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
        except FileExistsError:
            continue  # another run made it in between: open theirs
        os.fchmod(fd, 0o666)
        return fd
    raise OSError(errno.EAGAIN, "cannot open " + path)


def claim_path(uuid):
    return os.path.join(shared_dir(), "gpu-" + safe_name(uuid))


def read_label(fd):
    """The label in a lock file (anyone may write one: only a dict of strings is believed)."""
    try:
        found = json.loads(os.pread(fd, LABEL_BYTES, 0).decode(errors="replace") or "{}")
    except ValueError:
        return {}
    return {k: str(v) for k, v in found.items()} if isinstance(found, dict) else {}


def write_label(fd, label):
    data = json.dumps(label, sort_keys=True).encode()
    os.pwrite(fd, data.ljust(LABEL_BYTES), 0)


def label(run, task="", **extra):
    return dict(extra, run=run, task=task, user=user_name(), pid=os.getpid(),
                host=os.uname().nodename)


def holder(uuid):
    """The label of the run holding UUID's claim, or None when it is free."""
    try:
        fd = os.open(claim_path(uuid), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return read_label(fd) or {"run": "?"}
    except OSError:
        return None
    finally:
        os.close(fd)
    return None


def try_lock(path):
    """(descriptor holding PATH's exclusive lock, None) or (None, the holder's label)."""
    fd = open_shared(path)
    for attempt in range(CLAIM_TRIES):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd, None
        except BlockingIOError:
            if attempt == CLAIM_TRIES - 1:
                found = read_label(fd) or {"run": "?"}
                os.close(fd)
                return None, found
            time.sleep(0.005)


class GpuClaims:
    """The GPU claims an agent holds, {uuid: descriptor}, until task supervisors take them."""

    def __init__(self):
        self.held = {}
        self.ticket = None  # (path, descriptor): our place in the host's queue
        self.touched = time.monotonic()

    def claim(self, wanted, run, wait=False):
        """Claim every UUID of WANTED ({uuid: task names}) for RUN, all or none.

        Returns {"taken": {uuid: holder label}, "ahead": [labels of runs queued before us]}; both
        empty when the claim is ours. WAIT puts this run in the host's queue until it gets them."""
        for uuid in set(self.held) - set(wanted):  # a new plan replaces the last one
            os.close(self.held.pop(uuid))
        ahead = self.queue_ahead(run, wait)
        if ahead or not wanted:  # nothing wanted: WAIT only takes (or keeps) our place
            return {"taken": {}, "ahead": ahead}
        new, taken = [], {}
        for uuid in sorted(wanted):
            if uuid in self.held:
                continue
            fd, other = try_lock(claim_path(uuid))
            if fd is None:
                taken[uuid] = other
            else:
                self.held[uuid] = fd
                new.append(uuid)
        if taken:
            for uuid in new:
                os.close(self.held.pop(uuid))
            return {"taken": taken, "ahead": []}
        for uuid, tasks in wanted.items():
            write_label(self.held[uuid], label(run, ",".join(tasks)))
        self.leave_queue()
        return {"taken": {}, "ahead": []}

    def queue_ahead(self, run, wait):
        """Labels of live runs that began waiting on this host before us (all of them when we
        do not wait: a run that does not queue does not jump the queue either)."""
        folder = shared_dir("queue")
        if wait and self.ticket is None:
            name = "%020d-%d-%s" % (time.time_ns(), os.getpid(), safe_name(run))
            path = os.path.join(folder, name)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            os.fchmod(fd, 0o644)  # other users' runs read it, whatever our umask
            fcntl.flock(fd, fcntl.LOCK_EX)
            write_label(fd, label(run))
            self.ticket = (path, fd)
        mine = os.path.basename(self.ticket[0]) if self.ticket else None
        ahead = []
        for name in sorted(os.listdir(folder)):
            if mine is not None and name >= mine:
                break
            path = os.path.join(folder, name)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                ahead.append(read_label(fd))
            else:
                try:
                    os.unlink(path)  # its waiter died: its ticket goes
                except OSError:
                    pass  # another user's (sticky folder): it stays, ignored
            finally:
                os.close(fd)
        return ahead

    def leave_queue(self):
        if self.ticket is not None:
            path, fd = self.ticket
            self.ticket = None
            try:
                os.unlink(path)
            except OSError:
                pass
            os.close(fd)

    def take(self, uuids):
        """New descriptors of UUIDS' claims for a task's supervisor, the caller's to close (a
        GPU two tasks share stays claimed until both have ended)."""
        return [os.dup(self.held[u]) for u in uuids if u in self.held]

    def touch(self, every=3600):
        """Mark our lock files used (at most once per EVERY seconds): cleaners of /var/tmp
        (systemd-tmpfiles, 30 days) delete only what has not been touched for long."""
        if time.monotonic() - self.touched < every:
            return
        self.touched = time.monotonic()
        for fd in list(self.held.values()) + ([self.ticket[1]] if self.ticket else []):
            try:
                os.utime(fd)
            except OSError:
                pass  # a file we may not touch: the cleaner's age is all there is

    def release(self, keep=()):
        for uuid in set(self.held) - set(keep):
            os.close(self.held.pop(uuid))
        self.leave_queue()
