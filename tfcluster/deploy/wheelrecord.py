"""The download record of a wheelhouse (`tfcluster wheelhouse`, tfcluster/deploy/wheelhouse.py):
DEST/wheelhouse.json names what decided the last successful `pip download` and the wheels DEST
then held, with their sizes. A rerun whose inputs and wheels match skips pip: its resolution
against the index alone costs seconds of CPU when nothing is missing. Standard library only.

The deploy reads none of it: the tensorflow role and the deploy stamp look at *.whl and
venv-pack.json only.
"""
import hashlib
import json
import os
import shutil

from tfcluster.data.fetch import sha256_of
from tfcluster.errors import UsageError

RECORD = "wheelhouse.json"


def pip_settings_hash(program):
    """One hash of the pip settings in force for pip run by PROGRAM (its Python): every PIP_*
    variable and the pip.conf files pip reads. Hashed, never stored: an index URL may hold a
    password."""
    digest = hashlib.sha256()
    for name in sorted(os.environ):
        if name.startswith("PIP_"):
            digest.update(("env %s=%s\0" % (name, os.environ[name])).encode())
    # pip's own list on Linux: global, user, the venv's (PROGRAM at VENV/bin/python), the named one.
    folders = (os.environ.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(":") + [
        os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")]
    paths = [os.path.join(folder, "pip", "pip.conf") for folder in folders]
    paths += ["/etc/pip.conf", os.path.expanduser("~/.pip/pip.conf"),
              os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(program))), "pip.conf"),
              os.environ.get("PIP_CONFIG_FILE", "")]
    for path in paths:
        if os.path.isfile(path):
            digest.update(("file %s %s\0" % (path, sha256_of(path))).encode())
    return digest.hexdigest()


def interpreter(program):
    """PROGRAM's file, followed through links, with its size and time: wheels are picked for
    pip's Python when no --python-version is given."""
    path = os.path.realpath(program)
    try:
        stat = os.stat(path)
    except OSError:
        return [path]
    return [path, stat.st_size, stat.st_mtime_ns]


def inputs(args):
    """What decides the files `pip download` puts in DEST (args as wheelhouse.complete fills them)."""
    program = shutil.which(args.pip[0]) or args.pip[0]
    return {"constraints": sha256_of(args.constraints),
            "requirements": sha256_of(args.requirements),
            "no_deps_requirements": sha256_of(args.no_deps_requirements),
            "tf_version": args.tf_version, "cpu": args.cpu, "gpu": args.gpu,
            "python_version": args.python_version, "platform": args.platform,
            "pip": interpreter(program) + args.pip[1:], "machine": os.uname().machine,
            "pip_settings": pip_settings_hash(program)}


def wheels(dest):
    """{name: size} of DEST's wheels."""
    return {name: os.path.getsize(os.path.join(dest, name))
            for name in os.listdir(dest) if name.endswith(".whl")}


def up_to_date(dest, wanted):
    """The recorded wheels ({name: size}) when DEST's record was written for the inputs WANTED
    and every wheel it names is there with its size, else None."""
    try:
        with open(os.path.join(dest, RECORD)) as handle:
            record = json.load(handle)
        if record.get("inputs") != wanted:
            return None
        recorded = record["wheels"]
        for name, size in recorded.items():
            if os.path.getsize(os.path.join(dest, name)) != size:
                return None
    except (OSError, ValueError, KeyError, AttributeError, TypeError):
        return None
    return recorded


def forget(dest):
    """No record while pip runs: a download that fails or is cut short leaves none."""
    path = os.path.join(dest, RECORD)
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
    except OSError as error:
        raise UsageError("cannot replace %s (%s): remove it, or pass another --dest"
                         % (path, error.strerror or error)) from None


def write(dest, done):
    """DEST's record of a download that succeeded with the inputs DONE, written whole or not at
    all; returns the wheels it names."""
    found = wheels(dest)
    path = os.path.join(dest, RECORD)
    with open(path + ".tmp", "w") as handle:
        json.dump({"inputs": done, "wheels": found}, handle, indent=1, sort_keys=True)
    os.replace(path + ".tmp", path)
    return found
