"""The packed environment of a wheelhouse (`tfcluster wheelhouse`, tfcluster/deploy/wheelhouse.py): a
venv made with the hosts' base interpreter, installed from the wheelhouse exactly as the
tensorflow role installs, byte-compiled and packed as DEST/venv-pack.tar.zst beside
DEST/venv-pack.json. Standard library only.
"""
import functools
import hashlib
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import tempfile
import time

from tfcluster.deploy import packcache
from tfcluster.errors import CommandFailed, TfclusterError, UsageError
from tfcluster_agent.jsonc import load_file

# The packed environment in DEST: the archive and its metadata (tensorflow_pack_metadata).
PACK_ARCHIVE = "venv-pack.tar.zst"
# The role unpacks only a pack of this format (an older gzip pack is built again).
PACK_FORMAT = "tar+zstd"
PACK_METADATA = "venv-pack.json"


@functools.lru_cache(maxsize=None)
def zstd(path):
    """The role's venv_pack module at PATH (libzstd through ctypes)."""
    spec = importlib.util.spec_from_file_location("venv_pack", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pack_folder(folder, path, zstd_module):
    """FOLDER as a tar.zst at PATH (compressed by ZSTD_MODULE, the role's venv_pack); None, or
    why it failed. Owned by root on the hosts, readable by every user whatever the builder's
    umask (a lab lends one venv to the others), never group- or world-writable."""
    with open(path, "wb") as out:
        tar = subprocess.Popen(["tar", "-c", "-f", "-", "--sort=name", "--owner=0", "--group=0",
                                "--numeric-owner", "--mode=a+rX,go-w", "-C", folder, "."],
                               stdout=subprocess.PIPE)
        try:
            # Level 3 (zstd's default) with long matching: 355 MB in 13 CPU s where level 9 made
            # 319 MB in 33 (the TensorFlow venv, 2026-11-26); hosts inflate both alike.
            zstd_module.compress(tar.stdout, out.write, level=3, window_log=27,
                                 workers=os.cpu_count() or 1)
        except zstd_module.ZstdError as error:
            tar.kill()
            return str(error)
        finally:
            tar.stdout.close()
        if tar.wait() != 0:
            return "tar exit code %d" % tar.returncode
    return None


def requirement_lines(path):
    """A requirements file as the tensorflow role reads it: comments and blank lines dropped."""
    with open(path) as handle:
        lines = [re.sub(r"#.*$", "", line).strip() for line in handle.read().splitlines()]
    return [line for line in lines if line]


def pack_inputs(args, base_python):
    """What the tensorflow role records in the venv's tfcluster-installed (its
    _tensorflow_install_inputs) for a CPU host installing offline from DEST."""
    with open(args.constraints) as handle:
        # Ansible's file lookup strips trailing whitespace before the role hashes the text.
        constraints = hashlib.sha256(handle.read().rstrip().encode()).hexdigest()
    wheels = sorted("%s %d" % (name, os.path.getsize(os.path.join(args.dest, name)))
                    for name in os.listdir(args.dest) if name.endswith(".whl"))
    return {"packages": ["tensorflow-cpu==%s" % args.tf_version] + requirement_lines(args.requirements),
            "no_deps": requirement_lines(args.no_deps_requirements),
            "constraints": constraints, "mode": "offline", "wheels": wheels,
            "base_python": base_python}


def python_version(python):
    """X.Y.Z of an interpreter (as Ansible's python_version fact), or None when it does not run."""
    try:
        out = subprocess.run([python, "--version"], capture_output=True, text=True, timeout=60)
    except OSError:
        return None
    found = re.match(r"Python (\d+\.\d+\.\d+)", out.stdout) if out.returncode == 0 else None
    return found.group(1) if found else None


def call(cmd, failure):
    """Run CMD, shown first; a CommandFailed saying FAILURE with its exit code when it fails."""
    print("wheelhouse: " + " ".join(cmd), flush=True)
    try:
        code = subprocess.call(cmd)
    except OSError as error:
        raise UsageError("%s: cannot run %s: %s" % (failure, cmd[0], error.strerror or error)) \
            from None
    if code != 0:
        raise CommandFailed("%s (exit code %d)" % (failure, code), code)


def matching_pack(folder, wanted):
    """FOLDER's pack metadata when it was built from WANTED and its archive is whole, else None."""
    found = load_file(os.path.join(folder, PACK_METADATA))
    archive = os.path.join(folder, PACK_ARCHIVE)
    if found and {key: found.get(key) for key in wanted} == wanted and (
            os.path.isfile(archive) and os.path.getsize(archive) == found.get("size")):
        return found
    return None


def build_pack(args):
    """The packed environment in DEST, unless one with the same inputs is there. Returns an exit
    code; a pack that cannot be made for a reason the user chose (--no-cpu, another Python) is
    reported and skipped."""
    if not args.cpu:
        print("wheelhouse: no packed environment: GPU hosts (--no-cpu) install with pip")
        return 0
    version = python_version(args.pack_python)
    if version is None:
        print("wheelhouse: no packed environment: %s does not run here; give the hosts' "
              "interpreter with --pack-python (hosts install with pip)" % args.pack_python)
        return 0
    if args.python_version and not (version + ".").startswith(args.python_version + "."):
        print("wheelhouse: no packed environment: %s is Python %s, the wheels are for %s"
              % (args.pack_python, version, args.python_version))
        return 0
    zstd_module = zstd(args.venv_pack)
    try:
        zstd_module.libzstd()
    except zstd_module.ZstdError as error:
        print("wheelhouse: no packed environment: %s (hosts install with pip)" % error)
        return 0
    metadata_path = os.path.join(args.dest, PACK_METADATA)
    archive = os.path.join(args.dest, PACK_ARCHIVE)
    wanted = {"base_python": args.pack_python, "python_version": version, "format": PACK_FORMAT,
              "machine": platform.machine(), "inputs": pack_inputs(args, args.pack_python)}
    if not args.repack and matching_pack(args.dest, wanted):
        print("wheelhouse: packed environment %s is up to date" % archive)
        return 0
    cached = packcache.entry(args.pack_cache, wanted) if args.pack_cache else None
    if cached and not args.repack and matching_pack(cached, wanted):
        packcache.fetch(cached, args.dest, (PACK_ARCHIVE, PACK_METADATA))
        print("wheelhouse: packed environment %s copied from the pack cache %s"
              % (archive, cached))
        return 0
    started = time.monotonic()
    # The metadata goes last: a pack is complete when its metadata names it.
    # venv-pack.tar.gz: the gzip pack of earlier versions.
    for path in (metadata_path, archive, os.path.join(args.dest, "venv-pack.tar.gz")):
        if os.path.exists(path):
            os.remove(path)
    build = tempfile.mkdtemp(prefix=".venv-pack-", dir=args.dest)
    try:
        venv = os.path.join(build, "venv")
        python = os.path.join(venv, "bin", "python")
        source = ["--disable-pip-version-check", "--no-input", "--quiet", "--no-index",
                  "--find-links", args.dest, "-c", args.constraints]
        steps = [[args.pack_python, "-m", "venv", venv],
                 [python, "-m", "pip", "install"] + source + wanted["inputs"]["packages"]]
        if wanted["inputs"]["no_deps"]:
            steps.append([python, "-m", "pip", "install", "--no-deps"] + source
                         + wanted["inputs"]["no_deps"])
        for cmd in steps:
            call(cmd, "building the packed environment failed")
        # Inside the build folder until whole: a failure leaves no 400 MB part in DEST.
        partial = os.path.join(build, PACK_ARCHIVE + ".part")
        failure = pack_folder(venv, partial, zstd_module)
        if failure:
            raise TfclusterError("packing %s failed: %s" % (venv, failure))
        digest = hashlib.sha256()
        with open(partial, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        os.replace(partial, archive)
        metadata = dict(wanted, prefix=venv, archive=PACK_ARCHIVE, size=os.path.getsize(archive),
                        sha256=digest.hexdigest())
        with open(metadata_path + ".part", "w") as handle:
            json.dump(metadata, handle, indent=1)
        os.rename(metadata_path + ".part", metadata_path)
    finally:
        shutil.rmtree(build, ignore_errors=True)
    if cached:
        packcache.store(args.pack_cache, wanted, args.dest, (PACK_ARCHIVE, PACK_METADATA))
    print("wheelhouse: packed environment %s, %.0f MB (%.0f s)"
          % (archive, metadata["size"] / 1e6, time.monotonic() - started))
    return 0
