"""`tfcluster sync` on a host: the agent's commands `sync-list` and `sync-apply` (standard
library only). The controller compares its files with the list and sends one tar of those that
differ (tfcluster/deploy/sync.py).

  sync-list ROOT SKIP AREA...  -> {"format", "root_id": ROOT's folder token (shares.py) or null,
                                   "areas": {AREA: {"files": {rel: [sha256, mode]}, "folders": [rel]}}}
                                  (SKIP: hostcode.json's pattern of paths never listed, sent or
                                  deleted)
  sync-apply ROOT              <- stdin: one JSON line {"delete": [...], "folders": [...]}, then a tar
                               -> {"hash": the code hash ROOT now has, "written": n, "deleted": n}
"""
import json
import os
import sys

# What sync-list answers; a controller that finds another (an older agent) installs this one.
FORMAT = 1


def inside(root, rel):
    """ROOT/REL, refused (SystemExit) when REL leads out of ROOT."""
    path = os.path.normpath(os.path.join(root, rel))
    if os.path.isabs(rel) or not path.startswith(root.rstrip("/") + "/"):
        raise SystemExit("refusing path outside %s: %s" % (root, rel))
    return path


def listing(root, area, skipped):
    """{"files": {rel: [sha256, mode]}, "folders": [rel]} below ROOT/AREA (links left out)."""
    from tfcluster_agent.hostcode import sha256
    import stat
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
                files[rel] = [sha256(handle.read()).hexdigest(),
                              stat.S_IMODE(os.stat(path).st_mode)]
    return {"files": files, "folders": folders}


def list_command(argv):
    """`sync-list ROOT SKIP AREA...`: the listing on stdout."""
    import re
    from tfcluster_agent.shares import folder_id
    root, skipped = os.path.realpath(argv[0]), re.compile(argv[1]).search
    print(json.dumps({"format": FORMAT, "root_id": folder_id(root, create=False),
                      "areas": {area: listing(root, area, skipped) for area in argv[2:]}}))
    return 0


def unpack(root, stream):
    """The folders, files and deletions STREAM (a header line, then a tar) asks for in ROOT;
    (files written, paths deleted)."""
    import shutil
    import tarfile
    header = json.loads(stream.readline())
    for rel in header["folders"]:
        os.makedirs(inside(root, rel), exist_ok=True)
    written = 0
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        for member in tar:
            if not member.isfile():
                raise SystemExit("refusing tar member %s: not a file" % member.name)
            path = inside(root, member.name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            temporary = path + ".tfcluster-sync"
            with open(temporary, "wb") as out:
                shutil.copyfileobj(tar.extractfile(member), out)
            os.chmod(temporary, member.mode & 0o777)
            os.replace(temporary, path)
            written += 1
    deleted = 0
    for rel in sorted(header["delete"], reverse=True):
        path = inside(root, rel)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.unlink(path)
        deleted += 1
    return written, deleted


def apply_command(root):
    """`sync-apply ROOT`: unpack stdin into ROOT under its lock, then record the code hash."""
    import fcntl
    root = os.path.realpath(root)
    with open(os.path.join(root, ".sync-lock"), "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one writer at a time (two syncs into one home)
        except OSError:
            pass  # a file system without locks
        written, deleted = unpack(root, sys.stdin.buffer)
        # The hash as the code just written defines it: hostcode.py is imported only now.
        import importlib
        importlib.invalidate_caches()
        from tfcluster_agent.hostcode import write_hash
        digest = write_hash(root)["hash"]
    print(json.dumps({"hash": digest, "written": written, "deleted": deleted}))
    return 0
