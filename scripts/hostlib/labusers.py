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

from .common import Fail, kill_and_wait, run

PREFIX = "tfc-"
COMMENT = "tfcluster test user"


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
        raise Fail(f"test users are named {PREFIX}*, not {name}", 2)
    found = entry(name)
    if found is not None and not ours(found):
        raise Fail(f"user {name} exists and is not a test user: refusing to touch it", 2)
    try:
        with open(key) as handle:
            public = handle.read()
    except OSError:
        raise Fail(f"no public key {key}: run `scripts/testhosts up N` first", 2) from None
    if found is not None:
        remove(name)
    run(["useradd", "--create-home", "--shell", "/bin/sh", "--password", "*",
         "--comment", COMMENT, name])
    found = entry(name)
    os.chmod(found.pw_dir, 0o700)  # whatever the machine's HOME_MODE: other users stay out
    ssh = os.path.join(found.pw_dir, ".ssh")
    os.mkdir(ssh, 0o700)
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


def remove(name):
    """Remove the test user NAME, their processes and their home; nothing when there is none."""
    found = entry(name)
    if found is None:
        return
    if not ours(found):
        raise Fail(f"user {name} is not a test user: refusing to remove it", 2)
    stuck = kill_and_wait(processes(found.pw_uid), 10.0)
    if stuck:
        raise Fail(f"processes of {name} did not exit: {stuck}")
    # A home may hold an unpacked TensorFlow venv: tens of thousands of files, over a minute
    # to delete on a loaded machine.
    run(["userdel", "--remove", name], timeout=600)


def leftovers():
    return [f"user {p.pw_name}" for p in pwd.getpwall() if ours(p)]


def command(action, name, key):
    """`testhosts user add|remove NAME`: KEY is the client key of `up` (its .pub is added)."""
    if action == "remove":
        remove(name)
        print(f"testhosts: user {name} removed, with their home and processes")
        return 0
    found = add(name, str(key) + ".pub")
    print(f"testhosts: user {name} (uid {found.pw_uid}, no sudo), home {found.pw_dir} on every "
          f"host; ssh -i {key} {name}@HOST")
    return 0
