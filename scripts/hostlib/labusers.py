"""Ordinary users on the test hosts, as a lab has them: no root, no sudo, one home for every host.

The network-namespace test hosts (testhosts) share this machine's /etc and /home, so a user
made here is a user of every test host, and their home is one folder all hosts see: a home
shared the way an NFS home is. The user gets no password (`*`: no password login, but not
"locked", which sshd would refuse even with a key) and no group but their own. The test hosts'
sshd reads a user's ~/.ssh/authorized_keys (as that user: root's state folder may be closed to
them), where add() puts the public key it is given: the client key of `testhosts up`, so the
inventory's ansible_ssh_private_key_file works for them too.

    add(name, key)  make the user and their home (/home/NAME, 0700) that KEY (a public key
                    file) logs in to; returns its passwd entry
    remove(name)    end the user's processes (by their uid: the user is ours alone) and remove
                    the user with their home; safe to repeat
    leftovers()     users this module made and did not remove

Users are named tfc-*, marked by their comment (GECOS) field; nothing else is touched. Needs
root. Python 3 standard library only.
"""
import os
import pwd
import signal
import subprocess
import time

PREFIX = "tfc-"
COMMENT = "tfcluster test user"


class Fail(Exception):
    """A user-facing error: one line."""


def run(argv):
    proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=60)
    if proc.returncode != 0:
        raise Fail("%s failed (%d): %s" % (" ".join(argv), proc.returncode,
                                           (proc.stderr or proc.stdout).strip()))
    return proc


def entry(name):
    try:
        return pwd.getpwnam(name)
    except KeyError:
        return None


def ours(found):
    return found is not None and found.pw_name.startswith(PREFIX) and found.pw_gecos == COMMENT


def add(name, key):
    """A new ordinary user NAME (tfc-...) with a home of their own that the public key file KEY
    logs in to; its pwd entry. One left by a crashed run is removed first; any other user of
    that name is refused."""
    if not name.startswith(PREFIX):
        raise Fail("test users are named %s*, not %s" % (PREFIX, name))
    found = entry(name)
    if found is not None and not ours(found):
        raise Fail("user %s exists and is not a test user: refusing to touch it" % name)
    if found is not None:
        remove(name)
    run(["useradd", "--create-home", "--shell", "/bin/sh", "--password", "*",
         "--comment", COMMENT, name])
    found = entry(name)
    os.chmod(found.pw_dir, 0o700)  # whatever the machine's HOME_MODE: other users stay out
    ssh = os.path.join(found.pw_dir, ".ssh")
    os.mkdir(ssh, 0o700)
    with open(key) as handle:
        public = handle.read()
    authorized = os.path.join(ssh, "authorized_keys")
    with open(os.open(authorized, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as handle:
        handle.write(public)
    for path in (ssh, authorized):
        os.chown(path, found.pw_uid, found.pw_gid)
    return found


def processes(uid):
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat("/proc/" + name).st_uid == uid:
                    pids.append(int(name))
            except FileNotFoundError:
                pass
    return pids


def remove(name, timeout=10):
    """Remove the test user NAME, their processes and their home; nothing when there is none."""
    found = entry(name)
    if found is None:
        return
    if not ours(found):
        raise Fail("user %s is not a test user: refusing to remove it" % name)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in processes(found.pw_uid):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + timeout
        while processes(found.pw_uid) and time.monotonic() < deadline:
            time.sleep(0.05)  # a signalled process takes a moment to go
    run(["userdel", "--remove", name])


def leftovers():
    return ["user %s" % p.pw_name for p in pwd.getpwall() if ours(p)]
