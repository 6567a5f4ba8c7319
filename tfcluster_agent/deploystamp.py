"""tfcluster's deploy stamp (playbooks/deploy.yml): is a machine still as the last complete
deploy left it? Standard library only: the agent's command `stamp`, which deploy.yml runs on a
host with the Python Ansible uses there (`python3 -B ROOT/tfcluster_agent stamp ...`), and on
the controller for the inputs.

  stamp inputs --content DIR... [--roles DIR] [--code DIR] [--wheels DIR] [--file FILE...]
      (controller) prints {"hash": what this deploy is made from, "roles": [role names]}
  stamp check STAMP INPUTS [--forget-stale]
      (host) prints {"ready": bool, "why": str}; --forget-stale removes a stamp that does not match
  stamp write STAMP INPUTS SPEC
      (host) records the state SPEC describes (a JSON list of probes) and INPUTS in STAMP
  stamp forget STAMP
      (host) removes STAMP

The state is metadata, never content: mode, owner, size, mtime and ctime of files, which paths
exist, the lines a user and a group have in /etc/passwd and /etc/group, Debian packages' status
and version, the output of a few read-only commands. Probes, each [kind, ...]:
  ["tree", PATH, [PRUNED...], DEPTH]  PATH and below (DEPTH levels; null: all); a pruned path's
                                      own metadata only; __pycache__ and *.pyc are left out
  ["stat", PATH]                      one path (not followed)
  ["names", GLOB]                     the entry names of each folder GLOB matches
  ["lines", FILE, PREFIX]             FILE's lines starting with PREFIX
  ["dpkg", [PACKAGE...]]              status and version of each package
  ["run", [ARGV...]]                  exit code and output of a read-only command
  ["env", NAME]                       the first word of an environment variable
"""
import glob
import hashlib
import json
import os
import stat
import subprocess
import sys

VERSION = 1


def skipped(name):
    # Stamps are no state: machines sharing tfcluster_root each keep theirs beside the others.
    return name == "__pycache__" or name.endswith(".pyc") or name.startswith(".deploy-stamp")


def metadata(path):
    try:
        found = os.lstat(path)
    except OSError:
        return None
    fields = [stat.S_IFMT(found.st_mode), stat.S_IMODE(found.st_mode), found.st_uid, found.st_gid]
    if stat.S_ISREG(found.st_mode):
        # ctime changes with any write, chmod or chown, even one that puts mtime back.
        fields += [found.st_size, found.st_mtime_ns, found.st_ctime_ns]
    elif stat.S_ISLNK(found.st_mode):
        fields.append(os.readlink(path))
    return fields


def walk(path, pruned, depth, state, leave_out):
    if path in leave_out:
        return
    state[path] = found = metadata(path)
    if found is None or found[0] != stat.S_IFDIR or path in pruned or depth == 0:
        return
    try:
        names = sorted(os.listdir(path))
    except OSError as error:
        state[path] = found + ["unreadable: %s" % error.strerror]
        return
    for name in names:
        if not skipped(name):
            walk(os.path.join(path, name), pruned, None if depth is None else depth - 1, state,
                 leave_out)


def dpkg_status(packages, status_file="/var/lib/dpkg/status"):
    wanted, found = set(packages), {}
    try:
        with open(status_file, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return {name: None for name in packages}
    for stanza in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines()
                      if ": " in line and not line.startswith(" "))
        name = fields.get("Package")
        if name in wanted:
            found.setdefault(name, []).append([fields.get("Architecture"), fields.get("Status"),
                                               fields.get("Version")])
    return {name: sorted(found.get(name, [])) for name in packages}


def run(argv):
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
    except OSError as error:
        return ["not run", error.strerror]
    except subprocess.TimeoutExpired:
        return ["timed out"]
    return [proc.returncode, proc.stdout.decode("utf-8", "replace")]


def probe(spec, leave_out):
    """{key: what the probe saw} for every probe of SPEC."""
    state = {}
    for item in spec:
        kind, args = item[0], item[1:]
        if kind == "tree":
            walk(args[0], set(args[1]), args[2], state, leave_out)
        elif kind == "stat":
            state[args[0]] = metadata(args[0])
        elif kind == "names":
            for folder in sorted(glob.glob(args[0])) or [args[0]]:
                try:
                    state["names " + folder] = sorted(n for n in os.listdir(folder) if not skipped(n))
                except OSError:
                    state["names " + folder] = None
        elif kind == "lines":
            try:
                with open(args[0], encoding="utf-8", errors="replace") as handle:
                    lines = [line.rstrip("\n") for line in handle if line.startswith(args[1])]
            except OSError:
                lines = None
            state["lines %s %s" % (args[0], args[1])] = lines
        elif kind == "dpkg":
            for name, found in dpkg_status(args[0]).items():
                state["dpkg " + name] = found
        elif kind == "run":
            state["run " + " ".join(args[0])] = run(args[0])
        elif kind == "env":
            state["env " + args[0]] = os.environ.get(args[0], "").split()[:1]
        else:
            raise SystemExit("deploy stamp: unknown probe %r" % kind)
    return state


def read_stamp(path):
    try:
        with open(path) as handle:
            stamp = json.load(handle)
    except FileNotFoundError:
        return None, "no stamp (never deployed completely, or changed since)"
    except (OSError, ValueError) as error:
        return None, "unreadable stamp (%s)" % error
    if not isinstance(stamp, dict) or stamp.get("version") != VERSION:
        return None, "stamp of another version"
    return stamp, ""


def check(path, inputs, forget_stale):
    stamp, why = read_stamp(path)
    if stamp is not None and stamp.get("inputs") != inputs:
        why = "the deploy's inputs changed (roles, playbooks, variables, trainer code or wheels)"
    elif stamp is not None:
        now = probe(stamp["spec"], {path})
        recorded = stamp["state"]
        differ = sorted(k for k in set(now) | set(recorded) if now.get(k) != recorded.get(k))
        if not differ:
            return {"ready": True, "why": "as the last complete deploy left it"}
        why = "changed since the last deploy: %s%s" % (
            ", ".join(differ[:5]), " and %d more" % (len(differ) - 5) if len(differ) > 5 else "")
    if forget_stale:
        forget(path)
    return {"ready": False, "why": why}


def forget(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def write(path, inputs, spec):
    stamp = {"version": VERSION, "inputs": inputs, "spec": spec, "state": probe(spec, {path})}
    temporary = path + ".new"
    forget(temporary)
    # Root's alone: it says which files exist where, and a forged one would skip a deploy.
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        json.dump(stamp, handle, sort_keys=True)
    os.replace(temporary, path)
    return {"written": path, "entries": len(stamp["state"])}


def tree_digest(digest, top):
    for root, dirs, files in os.walk(top):
        dirs[:] = sorted(d for d in dirs if not skipped(d))
        for name in sorted(f for f in files if not skipped(f)):
            full = os.path.join(root, name)
            with open(full, "rb") as handle:
                digest.update(os.path.relpath(full, top).encode() + b"\0"
                              + hashlib.sha256(handle.read()).digest())


def inputs(argv):
    """Hash of the controller files a deploy is made from."""
    import argparse
    parser = argparse.ArgumentParser(prog="tfcluster_agent stamp inputs")
    parser.add_argument("--content", action="append", default=[], help="folder hashed by content")
    parser.add_argument("--roles", help="roles folder: its role names are printed too")
    parser.add_argument("--code", help="folder holding the host packages (agent's code hash)")
    parser.add_argument("--wheels", help="wheelhouse: names and sizes of its wheels")
    parser.add_argument("--file", action="append", default=[], help="file hashed by content")
    args = parser.parse_args(argv)
    digest = hashlib.sha256()
    for top in args.content:
        digest.update(b"content " + top.encode() + b"\0")
        tree_digest(digest, top)
    if args.code:
        from tfcluster_agent import hostcode
        digest.update(b"code " + hostcode.code_hash(args.code).encode())
    if args.wheels:
        wheels = sorted(glob.glob(os.path.join(args.wheels, "*.whl")))
        digest.update(json.dumps([[os.path.basename(w), os.path.getsize(w)] for w in wheels]).encode())
    for path in args.file:
        digest.update(b"file " + path.encode() + b"\0")
        if os.path.isfile(path):
            with open(path, "rb") as handle:
                digest.update(hashlib.sha256(handle.read()).digest())
    roles = sorted(os.listdir(args.roles)) if args.roles else []
    return {"hash": digest.hexdigest(), "roles": roles}


def main(argv):
    if argv[:1] == ["inputs"]:
        result = inputs(argv[1:])
    elif argv[:1] == ["check"] and len(argv) in (3, 4):
        result = check(argv[1], argv[2], argv[3:] == ["--forget-stale"])
    elif argv[:1] == ["write"] and len(argv) == 4:
        result = write(argv[1], argv[2], json.loads(argv[3]))
    elif argv[:1] == ["forget"] and len(argv) == 2:
        forget(argv[1])
        result = {"forgotten": argv[1]}
    else:
        sys.stderr.write(__doc__)
        return 2
    print(json.dumps(result))
    return 0

