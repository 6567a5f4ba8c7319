"""`tfcluster sync`: the host code (tfcluster_agent/, trainers/) and, optionally, a user's own code
folder onto every machine of an inventory, in parallel, only what changed.

Per machine, through its agent link (hosts.py: the launcher's SSH path, host keys checked), two
of the agent's commands (tfcluster_agent/codesync.py): `sync-list` lists the host's files with
their sha256 and mode, and the token of its tfcluster_root; `sync-apply` takes one tar of the
files that differ, with the list of files to delete, and records the code hash of what the host
now holds in trainers.sha256 through the writer the trainers role uses too, so the launcher's
"same code on every host" preflight passes. A host without this controller's agent (none yet,
or an older one) first gets the agent package, unpacked by tar(1).

Machines whose tfcluster_root is one folder (an NFS home: the same token) get it written once,
by the first of them. Where things land on a host: the packages in tfcluster_root (as the
trainers role puts them), the user's folder (--code DIR, or the inventory variable
tfcluster_code_dir) in <tfcluster_root>/code/. Local slots that run this very checkout need
nothing (the user's folder is on this machine already).
"""
import hashlib
import io
import json
import os
import stat
import tarfile
import time

from tfcluster.spec.catalog import code_root
from tfcluster.errors import PreflightError, UsageError
from tfcluster.hosts.fanout import Hosts
from tfcluster.hosts.inventory import require_slots
from tfcluster.launch.preflight import runs_this_checkout
from tfcluster_agent.codesync import FORMAT
from tfcluster_agent.hostcode import code_hash, definition, packages, skipped

# The folder under tfcluster_root that receives the user's own code.
USER_CODE_FOLDER = "code"
# The package a host needs to answer sync's commands.
AGENT_PACKAGE = "tfcluster_agent"


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


class SyncError(Exception):
    """One machine could not be brought up to date; the message says why."""


def _command_error(code, stderr):
    lines = stderr.decode("utf-8", "replace").strip().splitlines()
    return "the agent's sync command failed (exit %d): %s" % (code, lines[-1] if lines else
                                                                "no message")


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


class Target:
    """One machine's tfcluster_root to bring up to date, and the user's folder it gets."""

    def __init__(self, machine, user_code):
        self.machine = machine
        self.user_code = user_code  # controller folder, or None

    @property
    def label(self):
        return self.machine.label


def _listing(code, out):
    """The answer of a `sync-list` that exited with CODE and printed OUT; None when it is not
    this controller's agent's (none there, an older one, or a failure)."""
    if code != 0:
        return None
    try:
        answer = json.loads(out)
    except ValueError:
        return None
    return answer if isinstance(answer, dict) and answer.get("format") == FORMAT else None


def _sync_lock(link):
    """The lock file sync-apply takes (codesync.py), which guards the agent's unpacking too."""
    return os.path.join(link.machine.root, ".sync-lock")


def install_agent(link):
    """This controller's agent package into the machine's tfcluster_root, unpacked by tar(1)
    under the lock sync-apply takes (machines sharing the root may do it at once): the agent
    there is missing or older and cannot answer sync's commands. (files sent, bytes sent)."""
    root = link.machine.root
    if link.run(["test", "-d", root])[0] != 0:
        raise SyncError("no tfcluster_root %s: run the deploy first" % root)
    folder = os.path.join(code_root(), AGENT_PACKAGE)
    files, _ = local_files(folder, AGENT_PACKAGE + "/")
    payload = tar_of({rel: os.path.join(folder, rel[len(AGENT_PACKAGE) + 1:]) for rel in files})
    code, _, err = link.run(["flock", _sync_lock(link), "tar", "-x", "-f", "-", "-C", root],
                            payload)
    if code != 0:
        lines = err.decode("utf-8", "replace").strip().splitlines() or ["exit %s" % code]
        raise SyncError("cannot unpack the agent into %s: %s" % (root, lines[-1]))
    return sorted(files), len(payload)


def list_target(link, areas):
    """(the machine's files in AREAS and its tfcluster_root's token: `sync-list`, the agent's
    files sent, their bytes), after installing this controller's agent where the machine has
    none or an older one."""
    args = ["sync-list", link.machine.root, definition()["skip"], *areas]
    found, sent, size = _listing(*link.command(args)[:2]), [], 0
    if found is None:
        sent, size = install_agent(link)
        # Another machine sharing this root may be unpacking the agent over it right now: list
        # once that is done, not while tar rewrites the modules this command imports.
        code, out, err = link.command(args, shared_lock=_sync_lock(link))
        found = _listing(code, out)
        if found is None:
            raise SyncError(_command_error(code, err))
    return found, sent, size


def sync_target(link, sources, listed, expected_hash):
    """Bring LINK's machine up to date with SOURCES ({area: (local folder, (files, folders))})
    from what list_target found (LISTED); returns (files sent, bytes sent, paths deleted)."""
    remote, installed, installed_size = listed
    send, delete, make, paths = [], [], [], {}
    for area, (folder, listing) in sources.items():
        files, gone, folders = plan(listing, remote["areas"][area])
        send += files
        delete += gone
        make += folders
        for rel in files:
            paths[rel] = os.path.join(folder, rel[len(area) + 1:])
    payload = tar_of(paths)
    header = json.dumps({"delete": delete, "folders": make}).encode() + b"\n"
    code, out, err = link.command(["sync-apply", link.machine.root], header + payload)
    if code != 0:
        raise SyncError(_command_error(code, err))
    result = json.loads(out)
    if result["hash"] != expected_hash:
        raise SyncError("the host's code hash %s differs from this checkout's %s after the sync: "
                        "files were changed on the host while it ran?"
                        % (result["hash"][:12], expected_hash[:12]))
    return len(set(send) | set(installed)), installed_size + len(payload), len(delete)


def one_writer_per_root(targets, tokens):
    """(the targets that write, a line for each other): of TARGETS whose tfcluster_root is one
    folder (the same token in TOKENS, {machine key: the root's token}), only the first writes,
    so a shared home gets the code once, from one writer. A target whose root has no token (an
    older deploy's root) writes."""
    first, writers, lines = {}, [], []
    for target in targets:
        token = tokens.get(target.machine.key)
        if token in first:
            lines.append("%-22s shares tfcluster_root %s with %s, which writes it" % (
                target.label, target.machine.root, first[token].label))
            continue
        if token:
            first[token] = target
        writers.append(target)
    return writers, lines


def targets_of(slots, user_code):
    """One target per machine; local slots running this checkout need none. USER_CODE (a
    controller folder) wins over each slot's tfcluster_code_dir."""
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
        known = targets.get(machine.key)
        if known is not None and known.machine.root != machine.root:
            raise UsageError("slots of machine %s name different tfcluster_root values (%s, %s): "
                             "a machine has one" % (machine.label, known.machine.root, machine.root))
        if known is not None and known.user_code != folder:
            raise UsageError("slots %s of machine %s name different tfcluster_code_dir values: "
                             "a machine has one code folder" % (slot.name, machine.label))
        targets.setdefault(machine.key, Target(machine, folder))
    return list(targets.values())


def sync(inventory, user_code=None, out=print):
    """`tfcluster sync`: every machine of INVENTORY up to date; PreflightError naming each
    machine that could not be, after trying them all."""
    slots = require_slots(inventory)
    targets = targets_of(slots, user_code)
    by_key = {t.machine.key: t for t in targets}
    started = time.monotonic()
    root = code_root()
    host_code = {package: (os.path.join(root, package),
                           local_files(os.path.join(root, package), package + "/"))
                 for package in packages()}
    expected = code_hash(root)
    listings = {folder: local_files(folder, USER_CODE_FOLDER + "/")
                for folder in {t.user_code for t in targets if t.user_code}}

    def sources_of(target):
        sources = dict(host_code)
        if target.user_code:
            sources[USER_CODE_FOLDER] = (target.user_code, listings[target.user_code])
        return sources

    with Hosts([t.machine for t in targets]) as hosts:
        found = hosts.each(lambda link: list_target(link, list(sources_of(by_key[
            link.machine.key]))))
        # Machines sharing a tfcluster_root (an NFS home) get it written once, by the first.
        writers, shared = one_writer_per_root(
            [t for t in targets if t.machine.key in found.succeeded],
            {key: listed[0]["root_id"] for key, listed in found.succeeded.items()})
        for line in shared:
            out("sync: " + line)
        written = hosts.each(lambda link: sync_target(
            link, sources_of(by_key[link.machine.key]), found.succeeded[link.machine.key],
            expected), [t.machine for t in writers]) if writers else None
    reported = [t for t in targets if t in writers or t.machine.key in found.failed]
    failed = []
    for target in reported:
        key = target.machine.key
        error = found.failed.get(key) or written.failed.get(key)
        if error is not None:
            failed.append("%s: %s" % (target.label, error.reason))
            continue
        sent, size, deleted = written.succeeded[key]
        out("sync: %-22s %d file(s) sent (%s), %d deleted%s" % (
            target.label, sent, _size(size), deleted,
            ", code in " + target.machine.root + "/" + USER_CODE_FOLDER if target.user_code else ""))
    if failed:
        raise PreflightError("sync failed on %d of %d host(s): %s" % (
            len(failed), len(reported), "; ".join(failed)))
    out("sync: %d host(s) up to date in %.1fs, code %s" % (
        len(reported), time.monotonic() - started, expected[:12]))
    return reported


def _size(count):
    return "%d B" % count if count < 10240 else "%.0f kB" % (count / 1024)
