"""`tfcluster sync`: the host code (tfcluster_agent/, trainers/) and, optionally, a user's own code
folder onto every machine of an inventory, in parallel, only what changed.

Per machine, over the launcher's SSH path (hosts.py: Fabric, host keys checked), two exchanges:
the host lists its files with their sha256 and mode (one small script, one answer), then one tar
stream carries the files that differ, with the list of files to delete. The host unpacks it,
deletes what is stale and writes the code hash of what it now holds to trainers.sha256, the file
deploy.yml's trainers role keeps, so the launcher's "same code on every host" preflight passes.

Where things land on a host: the packages in tfcluster_root (as the trainers role puts them), the
user's folder (--code DIR, or the inventory variable tfcluster_code_dir) in
<tfcluster_root>/code/. Local slots that run this very checkout need nothing (the user's folder
is on this machine already).
"""
import hashlib
import io
import json
import os
import shlex
import stat
import subprocess
import tarfile
import threading
import time

from tfcluster.launch import sharing
from tfcluster.spec.catalog import code_root
from tfcluster.errors import PreflightError, UsageError
from tfcluster.hosts.links import describe_connection_error, no_python
from tfcluster.hosts.ssh import ssh_connection
from tfcluster_agent.hostcode import code_hash, definition, packages, skipped

# The folder under tfcluster_root that receives the user's own code.
USER_CODE_FOLDER = "code"
# Seconds one exchange with a host may take (the tar stream of a large user folder included).
EXCHANGE_SECONDS = 120


def local_files(top, prefix=""):
    """{relpath: (sha256, mode)} of the files below TOP (symlinks followed), and its folders;
    what is no host code (hostcode.skipped: caches, compiled and hidden files) is left out, in
    the user's folder too."""
    files, folders = {}, set()
    for root, dirs, names in os.walk(top, followlinks=True):
        rel_root = os.path.relpath(root, top).replace(os.sep, "/")
        rel_root = prefix + ("" if rel_root == "." else rel_root + "/")
        dirs[:] = sorted(d for d in dirs if not skipped(rel_root + d))
        folders.update(rel_root + d for d in dirs)
        for name in sorted(names):
            rel = rel_root + name
            path = os.path.join(root, name)
            if skipped(rel) or not os.path.isfile(path):
                continue
            with open(path, "rb") as handle:
                digest = hashlib.sha256(handle.read()).hexdigest()
            files[rel] = (digest, stat.S_IMODE(os.stat(path).st_mode))
    return files, folders


# Runs on the host with its tfcluster_python (standard library only, Python 3.8+).
# argv: list ROOT SKIP AREA... -> JSON {area: {"files": {rel: [sha256, mode]}, "folders": [rel]}}
#                              (SKIP: hostcode.json's pattern of paths never listed, sent or deleted)
#       apply ROOT           <- stdin: one JSON line {"delete": [...], "folders": [...]}, then a tar
#                            -> JSON {"hash": code hash of ROOT, "written": n, "deleted": n}
HOST_SCRIPT = r'''
import hashlib, json, os, re, shutil, stat, sys, tarfile
sys.dont_write_bytecode = True  # no __pycache__ in the host code, as the agent

def inside(root, rel):
    path = os.path.normpath(os.path.join(root, rel))
    if os.path.isabs(rel) or not path.startswith(root.rstrip("/") + "/"):
        raise SystemExit("refusing path outside %s: %s" % (root, rel))
    return path

def listing(root, area, skipped):
    files, folders, top = {}, [], os.path.join(root, area)
    for here, dirs, names in os.walk(top):
        rel_here = os.path.relpath(here, root)
        dirs[:] = [d for d in dirs if not skipped(rel_here + "/" + d)]
        folders += [rel_here + "/" + d for d in dirs]
        for name in names:
            rel = rel_here + "/" + name
            path = os.path.join(here, name)
            if skipped(rel) or not os.path.isfile(path) or os.path.islink(path):
                continue
            with open(path, "rb") as handle:
                files[rel] = [hashlib.sha256(handle.read()).hexdigest(),
                              stat.S_IMODE(os.stat(path).st_mode)]
    return {"files": files, "folders": folders}

def apply(root):
    import fcntl
    lock = open(os.path.join(root, ".sync-lock"), "a")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one writer at a time (two syncs into one home)
    except OSError:
        pass  # a file system without locks
    header = json.loads(sys.stdin.buffer.readline())
    for rel in header["folders"]:
        os.makedirs(inside(root, rel), exist_ok=True)
    written = 0
    with tarfile.open(fileobj=sys.stdin.buffer, mode="r|") as tar:
        for member in tar:
            if not member.isfile():
                raise SystemExit("refusing tar member %s: not a file" % member.name)
            path = inside(root, member.name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = path + ".tfcluster-sync"
            with open(tmp, "wb") as out:
                shutil.copyfileobj(tar.extractfile(member), out)
            os.chmod(tmp, member.mode & 0o777)
            os.replace(tmp, path)
            written += 1
    deleted = 0
    for rel in sorted(header["delete"], reverse=True):
        path = inside(root, rel)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.unlink(path)
        deleted += 1
    sys.path.insert(0, root)
    from tfcluster_agent.hostcode import code_hash
    digest = code_hash(root)
    tmp = os.path.join(root, ".trainers.sha256.tfcluster-sync")
    with open(tmp, "w") as out:
        out.write(digest + "\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, os.path.join(root, "trainers.sha256"))
    print(json.dumps({"hash": digest, "written": written, "deleted": deleted}))

root = os.path.realpath(sys.argv[2])
if not os.path.isdir(root):
    raise SystemExit("no tfcluster_root %s: run the deploy first" % sys.argv[2])
if sys.argv[1] == "list":
    skipped = re.compile(sys.argv[3]).search
    print(json.dumps({area: listing(root, area, skipped) for area in sys.argv[4:]}))
else:
    apply(root)
'''


class Target:
    """One machine and tfcluster_root to bring up to date, and how to run a command there."""

    def __init__(self, machine, user_code):
        self.machine = machine
        self.user_code = user_code  # controller folder, or None
        self._connection = None

    @property
    def label(self):
        return self.machine.label

    def run(self, args, stdin=b"", script=HOST_SCRIPT):
        """(exit code, stdout, stderr) of SCRIPT (the host script) with ARGS, fed STDIN."""
        argv = [self.machine.python, "-c", script, *args]
        if self.machine.is_local:
            try:
                proc = subprocess.run(argv, input=stdin, capture_output=True,
                                      timeout=EXCHANGE_SECONDS)
            except FileNotFoundError:
                raise SyncError(no_python(self.machine)) from None
            return proc.returncode, proc.stdout, proc.stderr
        if self._connection is None:
            try:
                self._connection = ssh_connection(self.machine)
                self._connection.open()
            except Exception as err:  # paramiko, socket and OS errors all mean "unreachable"
                raise SyncError(describe_connection_error(err, self.machine)) from None
        channel = self._connection.client.get_transport().open_session(
            timeout=self.machine.connect_timeout)
        channel.settimeout(EXCHANGE_SECONDS)
        try:
            channel.exec_command(shlex.join(argv))
            # The host may answer (an error) before reading everything: read while sending.
            out, err = bytearray(), bytearray()
            reader = threading.Thread(target=_drain, args=(channel, out, err), daemon=True)
            reader.start()
            try:
                channel.sendall(stdin)
            except OSError:
                pass  # the host stopped reading: its exit status and stderr say why
            channel.shutdown_write()
            reader.join(EXCHANGE_SECONDS)
            if not channel.status_event.wait(5):
                raise SyncError("no answer within %ds" % EXCHANGE_SECONDS)
            code = channel.recv_exit_status()
        finally:
            channel.close()
        if code == 127:
            raise SyncError(no_python(self.machine))
        return code, bytes(out), bytes(err)

    def close(self):
        if self._connection is not None:
            self._connection.close()
            self._connection = None


def _drain(channel, out, err):
    while True:
        data = channel.recv(65536)
        if not data:
            break
        out += data
    while True:
        data = channel.recv_stderr(65536)
        if not data:
            break
        err += data


class SyncError(Exception):
    """One machine could not be brought up to date; the message says why."""


def _script_error(code, stderr):
    lines = stderr.decode("utf-8", "replace").strip().splitlines()
    return "the sync script failed (exit %d): %s" % (code, lines[-1] if lines else "no message")


def plan(local, remote):
    """(files to send, paths to delete, folders to make) for one area."""
    send = sorted(rel for rel, key in local[0].items() if tuple(remote["files"].get(rel, ())) != key)
    delete = sorted(set(remote["files"]) - set(local[0]))
    stale_folders = set(remote["folders"]) - local[1]
    # A stale folder goes whole; files inside it need no entry of their own.
    delete = sorted(set(rel for rel in delete if not any(rel.startswith(f + "/") for f in stale_folders))
                    | {f for f in stale_folders if not any(f.startswith(g + "/") for g in stale_folders)})
    make = sorted(local[1] - set(remote["folders"]))
    return send, delete, make


def tar_of(files):
    """An uncompressed tar (code compresses little next to its transfer time on a LAN) of
    {arcname: local path}."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for arcname, path in sorted(files.items()):
            info = tar.gettarinfo(path, arcname)
            info.type = tarfile.REGTYPE
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            with open(path, "rb") as handle:
                tar.addfile(info, handle)
    return buffer.getvalue()


def sync_target(target, sources, expected_hash):
    """Bring TARGET up to date with SOURCES ({area: (local folder, (files, folders))});
    returns (files sent, bytes sent, paths deleted)."""
    code, out, err = target.run(["list", target.machine.root, definition()["skip"], *sources])
    if code != 0:
        raise SyncError(_script_error(code, err))
    remote = json.loads(out)
    send, delete, make, paths = [], [], [], {}
    for area, (folder, listing) in sources.items():
        files, gone, folders = plan(listing, remote[area])
        send += files
        delete += gone
        make += folders
        for rel in files:
            paths[rel] = os.path.join(folder, rel[len(area) + 1:])
    payload = tar_of(paths)
    header = json.dumps({"delete": delete, "folders": make}).encode() + b"\n"
    code, out, err = target.run(["apply", target.machine.root], header + payload)
    if code != 0:
        raise SyncError(_script_error(code, err))
    result = json.loads(out)
    if result["hash"] != expected_hash:
        raise SyncError("the host's code hash %s differs from this checkout's %s after the sync: "
                        "files were changed on the host while it ran?"
                        % (result["hash"][:12], expected_hash[:12]))
    return len(send), len(payload), len(delete)


def targets_of(slots, user_code):
    """One target per machine and tfcluster_root; local slots running this checkout need none.
    USER_CODE (a controller folder) wins over each slot's tfcluster_code_dir."""
    from tfcluster.launch.preflight import runs_this_checkout
    targets = {}
    for slot in slots:
        machine = slot.machine
        folder = user_code or slot.code_dir
        if folder:
            folder = os.path.abspath(os.path.expanduser(folder))
            if not os.path.isdir(folder):
                raise UsageError("%s %s is not a folder: give the folder of your own code"
                                 % ("--code" if user_code else "tfcluster_code_dir of " + slot.name,
                                    folder))
        if runs_this_checkout(machine):
            continue
        key = (machine.key, machine.root)
        if key in targets and targets[key].user_code != folder:
            raise UsageError("slots %s of machine %s name different tfcluster_code_dir values: "
                             "a machine has one code folder" % (slot.name, machine.label))
        targets.setdefault(key, Target(machine, folder))
    return list(targets.values())


def sync(inventory, user_code=None, out=print):
    """`tfcluster sync`: every machine of INVENTORY up to date; PreflightError naming each
    machine that could not be, after trying them all."""
    from tfcluster.hosts.inventory import require_slots
    slots = require_slots(inventory)
    targets = targets_of(slots, user_code)
    started = time.monotonic()
    root = code_root()
    host_code = {package: (os.path.join(root, package),
                           local_files(os.path.join(root, package), package + "/"))
                 for package in packages()}
    expected = code_hash(root)
    outcomes = {}

    listings = {folder: local_files(folder, USER_CODE_FOLDER + "/")
                for folder in {t.user_code for t in targets if t.user_code}}
    # Machines sharing a tfcluster_root (an NFS home) get it written once, by the first of them.
    targets, shared, unreached = sharing.one_writer_per_root(targets)
    for line in shared:
        out("sync: " + line)
    outcomes.update({t: err if isinstance(err, SyncError) else
                     SyncError(describe_connection_error(err, t.machine))
                     for t, err in unreached.items()})

    def run(target):
        sources = dict(host_code)
        if target.user_code:
            sources[USER_CODE_FOLDER] = (target.user_code, listings[target.user_code])
        try:
            outcomes[target] = sync_target(target, sources, expected)
        except SyncError as err:
            outcomes[target] = err
        except Exception as err:  # a broken channel mid-transfer: this host failed, not the rest
            outcomes[target] = SyncError(describe_connection_error(err, target.machine))
        finally:
            target.close()

    threads = [threading.Thread(target=run, args=(t,), daemon=True) for t in targets
               if t not in outcomes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    failed = []
    for target in targets:
        outcome = outcomes.get(target, SyncError("no answer"))
        if isinstance(outcome, Exception):
            failed.append("%s: %s" % (target.label, outcome))
            continue
        sent, size, deleted = outcome
        out("sync: %-22s %d file(s) sent (%s), %d deleted%s" % (
            target.label, sent, _size(size), deleted,
            ", code in " + target.machine.root + "/" + USER_CODE_FOLDER if target.user_code else ""))
    if failed:
        raise PreflightError("sync failed on %d of %d host(s): %s" % (
            len(failed), len(targets), "; ".join(failed)))
    out("sync: %d host(s) up to date in %.1fs, code %s" % (
        len(targets), time.monotonic() - started, expected[:12]))
    return targets


def _size(count):
    return "%d B" % count if count < 10240 else "%.0f kB" % (count / 1024)
