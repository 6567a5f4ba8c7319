"""`tfcluster wheelhouse`: pin and download every wheel the hosts need, and pack their venv.

    tfcluster wheelhouse [--gpu] [--dest DIR]   # into the folder `tfcluster deploy` reads
    tfcluster wheelhouse --lock                 # (a checkout) pin: writes the constraints file

`--lock` resolves tensorflow-cpu, tensorflow[and-cuda] (its nvidia-*-cu12 wheels have lower
bounds only) and the trainers' requirements at `tfcluster_tf_version` (roles/tfcluster/defaults)
with `pip install --dry-run --report`, which downloads no large wheel, and writes every package's
exact version to roles/tensorflow/files/constraints.txt. The tensorflow role installs with
`pip -c` on it, online and offline, so hosts installed on different days get the same CUDA, cuDNN
and NCCL. Commit the file.

Without --lock: `pip download --only-binary=:all: -c CONSTRAINTS` of TensorFlow (tensorflow-cpu,
plus tensorflow[and-cuda] with --gpu) and the requirements, then `pip download --no-deps` of the
no-deps ones (tf-keras), into DEST; `-e tensorflow_install_mode=offline` (or the inventory
`tfcluster init` writes) makes deploy.yml install from it with `pip --no-index`. Wheels are picked
for the controller's Python unless --python-version names the hosts'. Files already in DEST are
not downloaded again and pip's cache serves the rest. After both succeed, DEST/wheelhouse.json
(tfcluster/deploy/wheelrecord.py) records their inputs (the constraints and requirements files' hashes,
the TensorFlow version, --gpu/--no-cpu, --python-version/--platform, pip's interpreter and one
hash of the PIP_* variables and pip.conf files, never their values) and DEST's wheels with their
sizes. A rerun whose inputs match and whose recorded wheels are all there at those sizes runs no
pip (its resolution costs seconds of CPU for nothing) and says the wheels are up to date; any
other rerun, or one after a failed download, runs pip and records again. The constraints pin
every package the lock resolved for its Python, so pip would pick the same versions again (wheels
for another --python-version may need a package they leave unpinned: the record keeps the
version pip first picked). What the record cannot see (a wheel added to a --find-links folder or
to a pinned version on the index, a file pip.conf names changed in place) needs pip: delete
DEST/wheelhouse.json to run it.

Then the packed environment (--no-pack skips it): a venv made with the hosts' base interpreter
(--pack-python, default /usr/bin/python3: same path and version as the hosts'), installed from DEST
with --no-index exactly as the tensorflow role installs, byte-compiled and packed as
DEST/venv-pack.tar.zst (zstd through libzstd, which every Debian host has) beside
DEST/venv-pack.json (the interpreter, machine, build folder and the inputs the role records in
the venv's `tfcluster-installed`). In offline mode the role unpacks it on every host whose Python
and inputs match instead of running pip. A rerun with the same inputs keeps the pack (--repack
builds it again). With --pack-cache DIR (or $TFCLUSTER_PACK_CACHE) a pack is also kept in DIR by
its inputs: another wheelhouse with the same inputs links it from there instead of building it,
and one started while another uses DIR waits for it. No pack for --no-cpu (GPU hosts install
with pip) or when the base interpreter is missing or is not the Python the wheels were picked
for.

The files it reads (the constraints, the requirements, the TensorFlow version) are those of the
checkout or wheel this tfcluster runs from. Standard library only: scripts/wheelhouse runs it
with any Python 3.
"""
import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time

import tfcluster
from tfcluster.deploy import wheelrecord
from tfcluster.deploy.packcache import locked
from tfcluster.deploy.playbook import controller_dir, find_content
from tfcluster.deploy.wheelpack import build_pack, call
from tfcluster.errors import TfclusterError, UsageError
from tfcluster.runs.store import folder_for

# The header line the tensorflow role checks against tensorflow_version.
HEADER = "# tfcluster_tf_version: %s"
# The pack cache's folder when --pack-cache is not given (make test: one per run).
PACK_CACHE_ENV = "TFCLUSTER_PACK_CACHE"


class Content:
    """The files the wheelhouse is made from, in the checkout or the installed wheel."""

    def __init__(self):
        self.installed, self.root = find_content()
        # trainers/ beside the tfcluster package: the checkout, or site-packages.
        code = os.path.dirname(os.path.dirname(os.path.abspath(tfcluster.__file__)))
        self.defaults = os.path.join(self.root, "roles", "tfcluster", "defaults", "main.yml")
        self.constraints = os.path.join(self.root, "roles", "tensorflow", "files", "constraints.txt")
        # The collection's libzstd binding, which also unpacks on the hosts (module venv_unpack).
        self.venv_pack = os.path.join(self.root, "plugins", "module_utils", "venv_pack.py")
        self.requirements = os.path.join(code, "trainers", "requirements.txt")
        # Installed with pip --no-deps (tf-keras: its `tensorflow` requirement would add a second
        # TensorFlow).
        self.no_deps_requirements = os.path.join(code, "trainers", "requirements-no-deps.txt")
        self.dest = os.path.join(controller_dir(self.installed, self.root), "wheelhouse")

    def tf_version(self):
        """tfcluster_tf_version from roles/tfcluster/defaults/main.yml (the one place it is set)."""
        try:
            with open(self.defaults) as handle:
                text = handle.read()
        except OSError:
            return None
        match = re.search(r"^tfcluster_tf_version:\s*[\"']?([0-9][0-9A-Za-z.+-]*)[\"']?\s*$",
                          text, re.M)
        return match.group(1) if match else None

    def pip(self):
        """A checkout's venv pip when there is one (scripts/wheelhouse may run with a system
        Python), else this interpreter's."""
        venv_python = os.path.join(self.root, ".venv", "bin", "python")
        python = venv_python if not self.installed and os.path.exists(venv_python) else sys.executable
        return [python, "-m", "pip"]


def add_arguments(parser):
    """The options of `tfcluster wheelhouse` (and scripts/wheelhouse); defaults come from the
    checkout or wheel at run time."""
    parser.description = ("Download the wheels for an offline TensorFlow install on the hosts "
                          "(tensorflow_install_mode=offline) and pack their venv.")
    parser.add_argument("--lock", action="store_true",
                        help="resolve and pin every package (no download) into --constraints, "
                             "a new file or the one there")
    parser.add_argument("--constraints",
                        help="the constraints file (default: the roles'); it must exist, unless "
                             "--lock writes it")
    parser.add_argument("--dest", help="folder to fill (default: wheelhouse/ in the folder "
                        "`tfcluster deploy` reads: a checkout's root, else the current folder)")
    parser.add_argument("--gpu", action="store_true",
                        help="also download tensorflow[and-cuda] with its CUDA/cuDNN wheels "
                             "(several GB) for GPU hosts")
    parser.add_argument("--no-cpu", dest="cpu", action="store_false",
                        help="skip tensorflow-cpu (a cluster of GPU hosts only)")
    parser.add_argument("--tf-version", help="TensorFlow version (default: tfcluster_tf_version)")
    parser.add_argument("--requirements", help="the trainers' other packages (default: "
                        "trainers/requirements.txt)")
    parser.add_argument("--no-deps-requirements", help="packages downloaded without their "
                        "dependencies (default: trainers/requirements-no-deps.txt)")
    parser.add_argument("--python-version", default=None,
                        help="the hosts' Python version, e.g. 3.12, when it differs from the "
                             "controller's (wheels are then picked for manylinux x86_64, CPython)")
    parser.add_argument("--platform", default="manylinux2014_x86_64",
                        help="wheel platform used with --python-version (default: %(default)s)")
    parser.add_argument("--pip", default=None,
                        help="pip command to use (default: a checkout's .venv pip, else "
                             "this Python's)")
    parser.add_argument("--no-pack", dest="pack", action="store_false",
                        help="make no packed environment (hosts then install with pip)")
    parser.add_argument("--repack", action="store_true",
                        help="build the packed environment again even when it is up to date")
    parser.add_argument("--pack-cache", metavar="DIR",
                        help="a folder of packs kept by their inputs: a pack built from the same "
                             "inputs is linked from it instead of built, and a second wheelhouse "
                             "using it waits for the first (default: $%s, else none)" % PACK_CACHE_ENV)
    parser.add_argument("--pack-python", default="/usr/bin/python3",
                        help="the hosts' base interpreter the packed venv is made with; it must "
                             "exist here with the hosts' version (default: %(default)s)")
    return parser


def complete(args, content):
    """ARGS with every default filled in from CONTENT."""
    for name in ("constraints", "dest", "requirements", "no_deps_requirements"):
        if getattr(args, name) is None:
            setattr(args, name, getattr(content, name))
    args.tf_version = args.tf_version or content.tf_version()
    if args.pip is not None and not (args.pip.split() and shutil.which(args.pip.split()[0])):
        raise UsageError("--pip %r: no such program: pass a pip command that runs here, e.g. "
                         "--pip 'python3 -m pip'" % args.pip)
    args.pip = args.pip.split() if args.pip else content.pip()
    args.venv_pack = content.venv_pack
    args.pack_cache = args.pack_cache or os.environ.get(PACK_CACHE_ENV) or None
    return args


def target_options(args):
    if not args.python_version:
        return []
    return ["--python-version", args.python_version, "--implementation", "cp",
            "--platform", args.platform]


def download_command(args, *options):
    """`pip download` of binary wheels pinned by the constraints into DEST, for the hosts."""
    return args.pip + ["download", "--disable-pip-version-check", "--only-binary=:all:", *options,
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
    return args.pip + ["install", "--disable-pip-version-check", "--dry-run", "--ignore-installed",
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
    with folder_for(os.path.dirname(os.path.abspath(args.constraints)), "--constraints' folder"), \
            tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report.json")
        cmd = lock_command(args, report)
        call(cmd, "pip could not resolve the packages")
        try:
            with open(report) as handle:
                text = constraints_text(args, json.load(handle))
        except (OSError, ValueError, KeyError) as error:
            raise TfclusterError("pip wrote no usable report (%s): is %s a pip >= 23?"
                                 % (error, " ".join(cmd[:3]))) from None
        try:
            with open(args.constraints + ".tmp", "w") as handle:
                handle.write(text)
            os.replace(args.constraints + ".tmp", args.constraints)
        except OSError as error:
            raise UsageError("cannot write --constraints %s (%s): pass a file you can write"
                             % (args.constraints, error.strerror or error)) from None
    print("wheelhouse: %d packages pinned in %s" % (text.count("=="), args.constraints))
    return 0


def main(argv=None, prog="wheelhouse"):
    """scripts/wheelhouse: the same command with its own parser."""
    try:
        return run(add_arguments(argparse.ArgumentParser(prog=prog)).parse_args(argv))
    except TfclusterError as error:
        print("%s: error: %s" % (prog, error), file=sys.stderr)
        return error.exit_code


def run(args):
    """The command; a TfclusterError (UsageError: nothing was done) when it cannot be done."""
    content = Content()
    if args.lock and content.installed and args.constraints is None:
        raise UsageError("--lock rewrites the constraints file the deploy installs with, which "
                         "belongs to the installed tfcluster: run it in a checkout, or pass "
                         "--constraints FILE")
    args = complete(args, content)
    if not args.tf_version:
        raise UsageError("cannot read tfcluster_tf_version from %s: pass --tf-version"
                         % content.defaults)
    if not args.cpu and not args.gpu:
        raise UsageError("--no-cpu without --gpu downloads nothing: drop --no-cpu or add --gpu")
    for path in (args.requirements, args.no_deps_requirements):
        if not os.path.isfile(path):
            raise UsageError("no requirements file %s: pass the path of one" % path)
    if args.lock:
        return lock(args)
    if not os.path.isfile(args.constraints):  # a mistyped path must not start a full lock
        raise UsageError("no constraints file %s: check the path, or pass --lock to write a new "
                         "one" % args.constraints)
    with folder_for(args.dest, "--dest"):
        if locked_version(args.constraints) != args.tf_version:
            lock(args)
        if not (args.pack and args.pack_cache):
            return download_and_pack(args)
        with folder_for(args.pack_cache, "the pack cache (--pack-cache or $%s)" % PACK_CACHE_ENV):
            # Held from the download on: the second of two wheelhouses started together finds
            # the first's pack in the cache instead of building the same one beside it.
            with locked(args.pack_cache):
                return download_and_pack(args)


def download_and_pack(args):
    download(args)
    return build_pack(args) if args.pack else 0


def download(args):
    """The two `pip download`s, unless DEST's record (tfcluster/deploy/wheelrecord.py) says they ran
    with these inputs and left every wheel still there."""
    started = time.monotonic()
    inputs = wheelrecord.inputs(args)
    wheels = wheelrecord.up_to_date(args.dest, inputs)
    if wheels is not None:
        print("wheelhouse: %d wheels, %.0f MB in %s are up to date (pip not run)"
              % (len(wheels), sum(wheels.values()) / 1e6, args.dest))
        return 0
    wheelrecord.forget(args.dest)
    for cmd in (pip_command(args), no_deps_command(args)):
        call(cmd, "pip download failed")
    wheels = wheelrecord.write(args.dest, inputs)
    print("wheelhouse: %d wheels, %.0f MB in %s (%.0f s)"
          % (len(wheels), sum(wheels.values()) / 1e6, args.dest, time.monotonic() - started))
    return 0
