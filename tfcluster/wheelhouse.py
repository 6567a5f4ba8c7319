#!/usr/bin/env python3
"""wheelhouse: pin and download every wheel the hosts need.

    scripts/wheelhouse --lock            # resolve and pin: writes roles/tensorflow/files/constraints.txt
    scripts/wheelhouse [--gpu] [--dest wheelhouse]

`--lock` resolves tensorflow-cpu, tensorflow[and-cuda] (its nvidia-*-cu12 wheels have lower
bounds only), trainers/requirements.txt and trainers/requirements-no-deps.txt (tf-keras) at
`tfcluster_tf_version` (from
roles/tfcluster/defaults/main.yml) with `pip install --dry-run --report`, which reads the index's
metadata and downloads no large wheel, and writes every package's exact version to the
constraints file. The tensorflow role installs with `pip -c` on it, online and offline, so hosts
installed on different days get the same CUDA, cuDNN and NCCL. Commit the file.

Without --lock it runs `pip download --only-binary=:all: -c CONSTRAINTS` on the controller for
TensorFlow (tensorflow-cpu, plus tensorflow[and-cuda] with --gpu) and the requirements (locking
first when the constraints file is missing or for another TensorFlow version), then
`pip download --no-deps` for the no-deps requirements. Then

    ansible-playbook -i INVENTORY playbooks/deploy.yml -e tensorflow_install_mode=offline

copies the folder to every host and installs from it with `pip --no-index --find-links`.

Wheels are picked for the controller's Python unless --python-version is given: give the hosts'
version (Debian 12: 3.11, Ubuntu 24.04: 3.12) when it differs from the controller's. Files
already in DEST are not downloaded again and pip's cache serves the rest, so reruns are fast.

The packed environment (by default, whenever it can be made; --no-pack skips it): after the
download, a venv made with the hosts' base interpreter (--pack-python, default /usr/bin/python3,
which must be the hosts' Python: same path and version) is installed from DEST with --no-index
exactly as the tensorflow role installs (tensorflow-cpu, the requirements, the no-deps ones, pip
-c on the constraints), byte-compiled, and packed as DEST/venv-pack.tar.zst (zstd level 9, long
matching over 128 MB, through libzstd: the hosts inflate it with the libzstd1 every Debian has,
2.5 times as fast as gzip, and it is a quarter smaller) beside DEST/venv-pack.json: the base
interpreter's path and version, the machine, the folder it was built in (the role rewrites it in
the venv's scripts) and the inputs the role records in the venv's `tfcluster-installed`. In
offline mode the role unpacks it on every host whose Python and inputs match, instead of pushing
the wheels and running pip. A rerun with the same inputs keeps the pack (--repack builds it again). No pack is made for
--no-cpu (GPU builds install with pip) or when the base interpreter is missing or is not the
Python the wheels were picked for (--python-version).
Standard library only.
"""

import argparse
import hashlib
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULTS = REPO / "roles" / "tfcluster" / "defaults" / "main.yml"
REQUIREMENTS = REPO / "trainers" / "requirements.txt"
# Installed with pip --no-deps (tf-keras: its `tensorflow` requirement would add a second TensorFlow).
NO_DEPS_REQUIREMENTS = REPO / "trainers" / "requirements-no-deps.txt"
CONSTRAINTS = REPO / "roles" / "tensorflow" / "files" / "constraints.txt"
# The header line the tensorflow role checks against tensorflow_version.
HEADER = "# tfcluster_tf_version: %s"
# The packed environment in DEST: the archive and its metadata (tensorflow_pack_metadata).
PACK_ARCHIVE = "venv-pack.tar.zst"
# The role unpacks only a pack of this format (an older gzip pack is built again).
PACK_FORMAT = "tar+zstd"
# The role's libzstd binding, which also unpacks on the hosts.
VENV_PACK = REPO / "roles" / "tensorflow" / "files" / "venv_pack.py"
PACK_METADATA = "venv-pack.json"


def load_venv_pack():
    spec = importlib.util.spec_from_file_location("venv_pack", VENV_PACK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


zstd = load_venv_pack()


def default_tf_version():
    """tfcluster_tf_version from roles/tfcluster/defaults/main.yml (the one place it is set)."""
    try:
        text = DEFAULTS.read_text()
    except OSError:
        return None
    match = re.search(r"^tfcluster_tf_version:\s*[\"']?([0-9][0-9A-Za-z.+-]*)[\"']?\s*$", text, re.M)
    return match.group(1) if match else None


def default_pip():
    """The repository's venv pip when there is one, else this interpreter's."""
    venv_python = REPO / ".venv" / "bin" / "python"
    python = str(venv_python) if venv_python.exists() else sys.executable
    return [python, "-m", "pip"]


def build_parser():
    parser = argparse.ArgumentParser(
        prog="wheelhouse",
        description="Download the wheels for an offline TensorFlow install on the hosts "
                    "(tensorflow_install_mode=offline).")
    parser.add_argument("--lock", action="store_true",
                        help="resolve and pin every package (no download) into --constraints")
    parser.add_argument("--constraints", default=str(CONSTRAINTS),
                        help="the constraints file (default: %(default)s)")
    parser.add_argument("--dest", default=str(REPO / "wheelhouse"),
                        help="folder to fill (default: %(default)s, git-ignored)")
    parser.add_argument("--gpu", action="store_true",
                        help="also download tensorflow[and-cuda] with its CUDA/cuDNN wheels "
                             "(several GB) for GPU hosts")
    parser.add_argument("--no-cpu", dest="cpu", action="store_false",
                        help="skip tensorflow-cpu (a cluster of GPU hosts only)")
    parser.add_argument("--tf-version", default=default_tf_version(),
                        help="TensorFlow version (default: tfcluster_tf_version, %(default)s)")
    parser.add_argument("--requirements", default=str(REQUIREMENTS),
                        help="the trainers' other packages (default: %(default)s)")
    parser.add_argument("--no-deps-requirements", default=str(NO_DEPS_REQUIREMENTS),
                        help="packages downloaded without their dependencies (default: %(default)s)")
    parser.add_argument("--python-version", default=None,
                        help="the hosts' Python version, e.g. 3.12, when it differs from the "
                             "controller's (wheels are then picked for manylinux x86_64, CPython)")
    parser.add_argument("--platform", default="manylinux2014_x86_64",
                        help="wheel platform used with --python-version (default: %(default)s)")
    parser.add_argument("--pip", default=None,
                        help="pip command to use (default: the repo's .venv pip, else "
                             "`python3 -m pip`)")
    parser.add_argument("--no-pack", dest="pack", action="store_false",
                        help="make no packed environment (hosts then install with pip)")
    parser.add_argument("--repack", action="store_true",
                        help="build the packed environment again even when it is up to date")
    parser.add_argument("--pack-python", default="/usr/bin/python3",
                        help="the hosts' base interpreter the packed venv is made with; it must "
                             "exist here with the hosts' version (default: %(default)s)")
    return parser


def target_options(args):
    if not args.python_version:
        return []
    return ["--python-version", args.python_version, "--implementation", "cp",
            "--platform", args.platform]


def download_command(args, *options):
    """`pip download` of binary wheels pinned by the constraints into DEST, for the hosts."""
    pip = args.pip.split() if args.pip else default_pip()
    return pip + ["download", "--disable-pip-version-check", "--only-binary=:all:", *options,
                  "-c", args.constraints, "--dest", args.dest] + target_options(args)


def pip_command(args):
    packages = []
    if args.cpu:
        packages.append("tensorflow-cpu==%s" % args.tf_version)
    if args.gpu:
        packages.append("tensorflow[and-cuda]==%s" % args.tf_version)
    return download_command(args) + packages + ["-r", args.requirements]


def no_deps_command(args):
    """tf-keras and the like: the wheel alone, at the pinned version."""
    return download_command(args, "--no-deps") + ["-r", args.no_deps_requirements]


def lock_command(args, report):
    """Resolve the CPU and the GPU build together: one consistent set of versions."""
    pip = args.pip.split() if args.pip else default_pip()
    return pip + ["install", "--disable-pip-version-check", "--dry-run", "--ignore-installed",
                  "--only-binary=:all:", "--quiet", "--report", report,
                  # --target lets pip resolve for another Python/platform; nothing is written.
                  "--target", os.path.join(os.path.dirname(report), "target")] + target_options(args) + [
                  "tensorflow-cpu==%s" % args.tf_version,
                  "tensorflow[and-cuda]==%s" % args.tf_version, "-r", args.requirements,
                  "-r", args.no_deps_requirements]


def constraints_text(args, report):
    """The constraints file from pip's installation report: name==version, sorted."""
    pins = sorted("%s==%s" % (item["metadata"]["name"].lower(), item["metadata"]["version"])
                  for item in report["install"])
    return "\n".join([HEADER % args.tf_version,
                      "# Written by `scripts/wheelhouse --lock` for Python %s: every package the"
                      % (args.python_version or "%d.%d" % sys.version_info[:2]),
                      "# tensorflow role installs, pinned (pip -c), online and offline.", ""]
                     + pins) + "\n"


def locked_version(path):
    try:
        with open(path) as handle:
            match = re.match(r"# tfcluster_tf_version: (\S+)", handle.readline())
    except OSError:
        return None
    return match.group(1) if match else None


def lock(args):
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report.json")
        cmd = lock_command(args, report)
        print("wheelhouse: " + " ".join(cmd), flush=True)
        code = subprocess.call(cmd)
        if code != 0:
            print("wheelhouse: pip could not resolve the packages (exit code %d)" % code,
                  file=sys.stderr)
            return code
        try:
            with open(report) as handle:
                text = constraints_text(args, json.load(handle))
        except (OSError, ValueError, KeyError) as error:
            print("wheelhouse: pip wrote no usable report (%s): is %s a pip >= 23?"
                  % (error, " ".join(cmd[:3])), file=sys.stderr)
            return 1
    os.makedirs(os.path.dirname(os.path.abspath(args.constraints)), exist_ok=True)
    with open(args.constraints, "w") as handle:
        handle.write(text)
    print("wheelhouse: %d packages pinned in %s" % (text.count("=="), args.constraints))
    return 0


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
        out = subprocess.run([python, "-c", "import sys; print('.'.join(map(str, sys.version_info[:3])))"],
                             capture_output=True, text=True, timeout=60)
    except OSError:
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def read_metadata(path):
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError):
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
    try:
        zstd.libzstd()
    except zstd.ZstdError as error:
        print("wheelhouse: no packed environment: %s (hosts install with pip)" % error)
        return 0
    metadata_path = os.path.join(args.dest, PACK_METADATA)
    archive = os.path.join(args.dest, PACK_ARCHIVE)
    wanted = {"base_python": args.pack_python, "python_version": version, "format": PACK_FORMAT,
              "machine": platform.machine(), "inputs": pack_inputs(args, args.pack_python)}
    found = None if args.repack else read_metadata(metadata_path)
    if found and {key: found.get(key) for key in wanted} == wanted and (
            os.path.isfile(archive) and os.path.getsize(archive) == found.get("size")):
        print("wheelhouse: packed environment %s is up to date" % archive)
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
            print("wheelhouse: " + " ".join(cmd), flush=True)
            code = subprocess.call(cmd)
            if code != 0:
                print("wheelhouse: building the packed environment failed (exit code %d)" % code,
                      file=sys.stderr)
                return code
        # Inside the build folder until whole: a failure leaves no 400 MB part in DEST.
        partial = os.path.join(build, PACK_ARCHIVE + ".part")
        with open(partial, "wb") as out:
            # Owned by root on the hosts, never group- or world-writable whoever built it.
            tar = subprocess.Popen(["tar", "-c", "-f", "-", "--sort=name", "--owner=0", "--group=0",
                                    "--numeric-owner", "--mode=go-w", "-C", venv, "."],
                                   stdout=subprocess.PIPE)
            try:
                zstd.compress(tar.stdout, out.write, level=9, window_log=27,
                              workers=os.cpu_count() or 1)
            except zstd.ZstdError as error:
                tar.kill()
                print("wheelhouse: packing %s failed: %s" % (venv, error), file=sys.stderr)
                return 1
            finally:
                tar.stdout.close()
            if tar.wait() != 0:
                print("wheelhouse: packing %s failed (tar exit code %d)" % (venv, tar.returncode),
                      file=sys.stderr)
                return 1
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
    print("wheelhouse: packed environment %s, %.0f MB (%.0f s)"
          % (archive, metadata["size"] / 1e6, time.monotonic() - started))
    return 0


def main(argv=None):
    args = build_parser().parse_args(argv)
    if not args.tf_version:
        print("wheelhouse: cannot read tfcluster_tf_version from %s: pass --tf-version"
              % DEFAULTS, file=sys.stderr)
        return 2
    if not args.cpu and not args.gpu:
        print("wheelhouse: --no-cpu without --gpu downloads nothing", file=sys.stderr)
        return 2
    for path in (args.requirements, args.no_deps_requirements):
        if not os.path.isfile(path):
            print("wheelhouse: no requirements file %s" % path, file=sys.stderr)
            return 2
    if args.lock or locked_version(args.constraints) != args.tf_version:
        code = lock(args)
        if code != 0 or args.lock:
            return code
    os.makedirs(args.dest, exist_ok=True)
    started = time.monotonic()
    for cmd in (pip_command(args), no_deps_command(args)):
        print("wheelhouse: " + " ".join(cmd), flush=True)
        code = subprocess.call(cmd)
        if code != 0:
            print("wheelhouse: pip download failed with exit code %d" % code, file=sys.stderr)
            return code
    wheels = sorted(p for p in os.listdir(args.dest) if p.endswith(".whl"))
    size = sum(os.path.getsize(os.path.join(args.dest, p)) for p in wheels)
    print("wheelhouse: %d wheels, %.0f MB in %s (%.0f s)"
          % (len(wheels), size / 1e6, args.dest, time.monotonic() - started))
    return build_pack(args) if args.pack else 0


if __name__ == "__main__":
    sys.exit(main())
