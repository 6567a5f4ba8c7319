"""Folders that several machines share (a home on NFS, one workdir for all), and the run folders
inside them. Standard library only.

A folder is named by a marker file in it, `.tfcluster-folder-id`, holding a random token: the
first machine to look makes it (atomically: link(2), which NFS keeps atomic too), every machine
reads it back, so machines that read the same token see the same folder whatever its path or
file system. deploy.yml's module folder_tokens imports this file (plugins/module_utils/shares.py
links to it: the deploy writes code and data once per shared folder), `tfcluster sync` reads
tfcluster_root's token in the agent's `sync-list`, the agent's `shares` runs main() below; the
agent's preflight reports its workdir's token, and a machine whose workdir another machine of the
run shares gets a run folder of its own inside the run's (`<workdir>/<run-id>/<host>/`).
"""
import os
import sys

MARKER = ".tfcluster-folder-id"
# What a file name made from a host, run or GPU name may hold; the rest becomes "_".
SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
# In a shared run folder: the launch that made it (a run id in use is refused, not adopted).
LAUNCH_FILE = ".launch"


def safe_name(text):
    """TEXT with every character a file name should not hold as "_" (no re: the agent's start
    imports none)."""
    return "".join(c if c in SAFE else "_" for c in text)


def read_token(path):
    """The token in the file PATH; None when it has none; OSError when it cannot be read."""
    try:
        with open(path) as handle:
            return handle.read().strip() or None
    except FileNotFoundError:
        return None


def claim_token(path, token):
    """Write TOKEN to PATH unless PATH exists; the token PATH holds afterwards (whoever wrote
    it). Readers never see a half-written file: it is complete before it gets its name."""
    temporary = "%s.%s-%d" % (path, token[:16], os.getpid())
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.fchmod(fd, 0o644)  # other users' launches read a shared workdir's marker
        os.write(fd, token.encode() + b"\n")
    finally:
        os.close(fd)
    try:
        os.link(temporary, path)
    except FileExistsError:
        pass
    finally:
        os.unlink(temporary)
    return read_token(path)


def folder_id(path, create=True):
    """PATH's token, made (with PATH) when it has none and CREATE; None when there is none or
    the folder cannot hold one (not writable: every machine then counts as apart)."""
    marker = os.path.join(path, MARKER)
    try:
        found = read_token(marker)
        if found or not create:
            return found
        os.makedirs(path, exist_ok=True)
        return claim_token(marker, os.urandom(12).hex())
    except OSError:
        return None


def run_id(run_dir, launch=""):
    """The run's id: RUN_DIR's name, or its parent's when RUN_DIR is this machine's folder in
    a run folder machines share (a launch token is given then)."""
    folder = run_dir.rstrip("/")
    return os.path.basename(os.path.dirname(folder) if launch else folder)


def make_run_folder(run_dir, launch=""):
    """Create RUN_DIR (0700) for a new run, or refuse with ValueError: a run never adopts a
    folder another run made. LAUNCH (the launch's token) is given when RUN_DIR is this machine's
    folder inside a run folder other machines share: that one is made by the first machine of
    the launch and must name this launch, or the run id belongs to another run."""
    parent = os.path.dirname(run_dir.rstrip("/")) or "/"
    refusal = ("run folder %s exists already: another run has this id; choose another "
               "--run-id")
    if launch:
        os.makedirs(os.path.dirname(parent) or "/", exist_ok=True)
        try:
            os.mkdir(parent, 0o700)
        except FileExistsError:
            pass
        try:
            found = claim_token(os.path.join(parent, LAUNCH_FILE), launch)
        except PermissionError:  # another user's run folder in a workdir users share
            found = None
        if found != launch:
            raise ValueError(refusal % parent)
    else:
        os.makedirs(parent, exist_ok=True)
    try:
        os.mkdir(run_dir, 0o700)
    except FileExistsError:
        raise ValueError(refusal % run_dir) from None
    except PermissionError:
        if os.path.lexists(run_dir):  # another user's folder
            raise ValueError(refusal % run_dir) from None
        raise


def preflight_facts(workdir, fence_file):
    """What a launch asks besides the preflight: the token of WORKDIR (made when missing; None:
    no WORKDIR asked), and whether FENCE_FILE, the firewall role's ruleset, is there (None: not
    asked, the inventory says the host is fenced by other means)."""
    return {"workdir_id": folder_id(workdir) if workdir else None,
            "fenced": os.path.exists(fence_file) if fence_file else None}


def main(argv):
    """`ensure [--read-only] PATH...`: {PATH: token or null}, made where missing."""
    import json  # here: the agent's start pays for no JSON module of its own (jsonc.py)
    create = "--read-only" not in argv
    paths = [p for p in argv[1:] if p != "--read-only"]
    if argv[:1] != ["ensure"]:
        sys.stderr.write(__doc__)
        return 2
    print(json.dumps({path: folder_id(path, create) for path in paths}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
