"""`tfcluster init [DIR] [HOST ...]`: a commented starting inventory, DIR/hosts.yml.

Each HOST is [USER@]ADDRESS[:PORT]. `--layout mwms` makes every host a worker (TensorFlow 2's
MultiWorkerMirroredStrategy needs no parameter server); `--layout ps` makes the first the parameter
server and the others workers (one host alone is both). Without hosts, or without a layout, init
asks on a terminal. `--sample` copies the
full sample inventory instead (a GPU cluster, group_vars/ by topic), which the wheel carries.
"""
import contextlib
import getpass
import os
import re
import shutil
import sys

import yaml

from tfcluster.deploy.playbook import find_content
from tfcluster.errors import UsageError
from tfcluster.spec.catalog import load_catalog, unfit
from tfcluster_agent.clusterspec import host_problem, normal_host

INVENTORY = "hosts.yml"
HOST = re.compile(r"^(?:(?P<user>[^@\s:]+)@)?(?P<address>\[[0-9A-Fa-f:.]+\]|[^@\s:\[\]]+)"
                  r"(?::(?P<port>\d+))?$")

LAYOUTS = {
    "ps": ("the first host is the parameter server (ps), the others are workers",
           "mnist_replica", "1 ps, 2 workers"),
    "mwms": ("every host is a worker (MultiWorkerMirroredStrategy: no parameter server)",
             "multi_worker_mirrored", "2 workers"),
}

HEADER = """\
# tfcluster inventory, written by `tfcluster init --layout {layout}`. One host line is one task
# slot: {shape}; a chief goes in `chief`.
# The examples that fit it: {fits}.
# Next, from this folder:
#   tfcluster wheelhouse                                  # the hosts' TensorFlow, into wheelhouse/
#   tfcluster deploy -i {inventory}                          # provision the hosts over SSH
#   tfcluster launch {first} -i {inventory} --smoke    # a first run: {first_shape}
# Host keys are checked: each host's key must be in known_hosts first (ssh-keyscan, verified).
# Per host: ansible_user, ansible_port, ansible_ssh_private_key_file (a relative path is read
# from this folder) and tfcluster_gpus (~: the free GPUs preflight finds; [0, 1]: those two).
"""

VARS = """\
all:
  vars:
    # The controller folders deploy reads: this folder's wheelhouse/ (tfcluster wheelhouse)
    # and data/ (tfcluster data fetch NAME --dest data/NAME).
    tensorflow_wheelhouse_src: "{{{{ inventory_dir }}}}/wheelhouse"
    datasets_cache_dir: "{{{{ inventory_dir }}}}/data"
    # offline: the hosts install TensorFlow from wheelhouse/ and need no package index;
    # online: pip on every host downloads it.
    tensorflow_install_mode: offline
    # Data sets put on every host, e.g. [mnist] (the smoke runs need none).
    datasets_names: []
    ansible_python_interpreter: /usr/bin/python3
    # Deploy needs root on the hosts: sudo when the SSH user is not root.
    ansible_become: "{{{{ (ansible_user | default('root')) != 'root' }}}}"
{known_hosts}\
  children:
"""


def add_arguments(parser):
    parser.description = "Write a commented starting inventory, DIR/hosts.yml."
    parser.add_argument("dir", nargs="?", default=".", metavar="DIR",
                        help="the cluster's folder (default: this one); created if missing")
    parser.add_argument("hosts", nargs="*", metavar="HOST",
                        help="[USER@]ADDRESS[:PORT] (none: asked on a terminal)")
    parser.add_argument("--layout", choices=sorted(LAYOUTS),
                        help="mwms: every host a worker (MultiWorkerMirroredStrategy); ps: the "
                             "first host the parameter server, the others workers (default: "
                             "asked on a terminal, else ps)")
    parser.add_argument("--user", help="SSH user for hosts without USER@ (default: yours)")
    parser.add_argument("--key", metavar="FILE", help="SSH private key (default: ssh's own)")
    parser.add_argument("--known-hosts", metavar="FILE",
                        help="known_hosts file with the hosts' keys (default: ~/.ssh/known_hosts)")
    parser.add_argument("--sample", action="store_true",
                        help="copy the full sample inventory (GPU cluster, group_vars/) instead")
    parser.add_argument("--force", action="store_true", help="replace an existing hosts.yml")
    parser.set_defaults(spread="hosts")  # hosts after the options too
    return parser


def parse_host(text):
    """(user or None, address, port or None) of [USER@]ADDRESS[:PORT]."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # bytes the locale could not decode (LC_ALL=C)
        raise UsageError("host %r is not text in this locale: use a UTF-8 locale, or the "
                         "host's ASCII name" % text) from None
    match = HOST.match(text.strip())
    if not match or (match.group("port") and not 1 <= int(match.group("port")) <= 65535):
        raise UsageError("host %r is not [USER@]ADDRESS[:PORT], e.g. ubuntu@gpu01.example.com "
                         "or 10.0.0.12:2222" % text)
    port = match.group("port")
    address = match.group("address").strip("[]")
    if normal_host(address) is None:  # what the launcher's inventory reader would refuse
        raise UsageError(host_problem("host", text, "e.g. ubuntu@gpu01.example.com or "
                                                    "10.0.0.12:2222"))
    return match.group("user"), address, int(port) if port else None


def file_path(path, folder):
    """PATH as the inventory writes it: relative to FOLDER when inside it, else absolute."""
    path = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(path):
        raise UsageError("no file %s: give an existing SSH key or known_hosts file" % path)
    inside = os.path.relpath(path, folder)
    return path if inside.startswith(os.pardir) else inside


def yaml_flow(value):
    """VALUE as one line of YAML, quoted where YAML needs it (a YAML writer, not formatting)."""

    class Dumper(yaml.SafeDumper):
        pass
    # None as `~`, the inventory's own way to write "the free GPUs preflight finds".
    Dumper.add_representer(type(None), lambda dumper, _: dumper.represent_scalar(
        "tag:yaml.org,2002:null", "~"))
    # In a list: a lone scalar would end with YAML's document marker.
    text = yaml.dump([value], Dumper=Dumper, default_flow_style=True, sort_keys=False,
                     width=float("inf")).strip()
    return text[1:-1]


def host_line(name, host, default_user, key, gpus):
    user, address, port = host
    fields = {"ansible_host": address, "ansible_user": user or default_user,
              "ansible_port": port or 22}
    if key:
        fields["ansible_ssh_private_key_file"] = key
    if gpus:
        fields["tfcluster_gpus"] = None  # the free GPUs preflight finds
    return "        %s: %s\n" % (name, yaml_flow(fields))


def inventory_text(hosts, user, key, known_hosts, layout="ps"):
    """The inventory for HOSTS (parsed) in LAYOUT: every host a worker (mwms), or the first the
    ps and the others workers (ps)."""
    known = ('    # Host keys: this file (a relative path is read from this folder).\n'
             '    ansible_ssh_common_args: %s\n' % yaml_flow("-o UserKnownHostsFile=" + known_hosts)
             if known_hosts else
             "    # Host keys are read from ~/.ssh/known_hosts; another file:\n"
             '    # ansible_ssh_common_args: "-o UserKnownHostsFile=keys/known_hosts"\n')
    shape, first, first_shape = LAYOUTS[layout]
    workers = hosts if layout == "mwms" else hosts[1:] or hosts[:1]
    text = HEADER.format(inventory=INVENTORY, layout=layout, shape=shape, first=first,
                         first_shape=first_shape, fits=fitting_examples(layout, len(workers)))
    text += VARS.format(known_hosts=known)
    if layout == "ps":
        text += "    ps:\n      hosts:\n" + host_line("ps0", hosts[0], user, key, False)
    text += "    worker:\n      hosts:\n" + "".join(
        host_line("worker%d" % i, host, user, key, True) for i, host in enumerate(workers))
    text += ("    chief:\n      # For the examples with a chief (ps_strategy, data_parallel), e.g.\n"
             "      # chief0: {ansible_host: gpu01.example.com, ansible_user: ubuntu, "
             "ansible_port: 22}\n      hosts: {}\n")
    return text


def fitting_examples(layout, workers):
    """The built-in examples an inventory of LAYOUT with WORKERS worker slots runs."""
    tasks = {"worker": workers, "ps": 1} if layout == "ps" else {"worker": workers}
    return ", ".join(name for name, example in load_catalog().items()
                     if unfit(example, tasks) is None)


def ask(args):
    """Hosts, key and known_hosts from the terminal."""
    print("tfcluster init: the hosts, separated by spaces: the first runs the parameter server, "
          "the others workers ([USER@]ADDRESS[:PORT])")
    args.hosts = input("hosts: ").split()
    args.key = args.key or input("SSH private key file (empty: ssh's default): ").strip() or None
    args.known_hosts = args.known_hosts or input(
        "known_hosts file with their keys (empty: ~/.ssh/known_hosts): ").strip() or None


def run(args):
    if "@" in args.dir and not os.path.isdir(args.dir):
        raise UsageError("%s is a host, but the first argument is the folder: tfcluster init "
                         "DIR HOST ..., e.g. tfcluster init . %s" % (args.dir, " ".join(
                             [args.dir] + args.hosts)))
    folder = os.path.abspath(args.dir)
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise UsageError("%s is a file, not a folder: name the cluster's folder, e.g. "
                         "tfcluster init mycluster HOST ..." % args.dir)
    target = os.path.join(folder, INVENTORY)
    if os.path.exists(target) and not args.force:
        raise UsageError("%s exists: edit it, or pass --force to write a new one" % target)
    if args.sample:
        with new_folder(folder):
            return copy_sample(folder, args.force)
    try:
        if not args.hosts:
            if not sys.stdin.isatty():
                raise UsageError("name the hosts, e.g. tfcluster init %s ubuntu@gpu01 "
                                 "ubuntu@gpu02 ubuntu@gpu03 (or --sample for the full sample)"
                                 % args.dir)
            ask(args)
            if not args.hosts:
                raise UsageError("no hosts given: nothing written")
        if not args.layout:
            args.layout = ask_layout() if sys.stdin.isatty() else "ps"
    except EOFError:  # Ctrl-D at a question
        raise UsageError("no answer: nothing written") from None
    hosts = [parse_host(text) for text in args.hosts]
    user = check_user(args.user) if args.user is not None else None
    for given in hosts:
        if given[0] is not None:
            check_user(given[0])
    with new_folder(folder):
        key = file_path(args.key, folder) if args.key else None
        known = file_path(args.known_hosts, folder) if args.known_hosts else None
        if known and re.search(r"\s", known):
            raise UsageError("--known-hosts %s: a path with white space cannot go into SSH's "
                             "options: copy the file to a path without spaces" % known)
        text = inventory_text(hosts, user or getpass.getuser(), key, known, args.layout)
        write_aside(target, text)
    first = ("every host a worker" if args.layout == "mwms" else "ps0 on %s" % hosts[0][1])
    print("tfcluster: wrote %s (%d host(s): %s). Next, in %s:\n  tfcluster wheelhouse\n"
          "  tfcluster deploy -i %s\n  tfcluster launch %s -i %s --smoke"
          % (target, len(hosts), first, folder, INVENTORY, LAYOUTS[args.layout][1], INVENTORY))
    return 0


USER = re.compile(r"^[A-Za-z_][A-Za-z0-9._-]*\$?$")


def check_user(user):
    """USER as an SSH login name: letters, digits, '.', '_', '-' (never an option)."""
    if not USER.match(user) or len(user) > 64:
        raise UsageError("user %r is not a login name (letters, digits, '.', '_' and '-', not "
                         "starting with '-'): pass --user NAME" % user)
    return user


@contextlib.contextmanager
def new_folder(folder):
    """FOLDER made when missing, and removed again when what is written into it fails; a
    folder that cannot be made is one line."""
    made = not os.path.isdir(folder)
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as err:
        raise UsageError("cannot make the folder %s (%s): name one you can write to"
                         % (folder, err.strerror or err)) from None
    try:
        yield
    except OSError as err:
        raise UsageError("cannot write into %s (%s): name a folder you can write to"
                         % (folder, reason(err))) from None
    finally:
        if made and sys.exc_info()[0] is not None:
            shutil.rmtree(folder, ignore_errors=True)


def reason(err):
    """ERR's cause in words; shutil.copytree's Error lists one (source, target, why) a file."""
    if isinstance(err, shutil.Error) and err.args and isinstance(err.args[0], list):
        why = str(err.args[0][-1][2])
        return why.split("] ", 1)[-1].split(":")[0]
    return err.strerror or err


def write_aside(target, text):
    """TEXT into TARGET whole or not at all: written beside it, then renamed over it."""
    aside = target + ".new"
    try:
        with open(aside, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(aside, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(aside)
        raise


def ask_layout():
    answer = input("layout: mwms (every host a worker, MultiWorkerMirroredStrategy) or ps (the "
                   "first host a parameter server) [ps]: ").strip() or "ps"
    if answer not in LAYOUTS:
        raise UsageError("layout %r: answer mwms or ps" % answer)
    return answer


def copy_sample(folder, force):
    sample = os.path.join(find_content()[1], "inventory", "sample")
    if not os.path.isdir(sample):
        raise UsageError("no sample inventory at %s: reinstall tfcluster from its wheel" % sample)
    if os.path.exists(os.path.join(folder, "group_vars")) and not force:
        raise UsageError("%s/group_vars exists: pass --force to write the sample's over it"
                         % folder)
    shutil.copytree(sample, folder, dirs_exist_ok=True)
    print("tfcluster: copied the sample inventory into %s: describe your machines in its "
          "hosts.yml and group_vars/" % folder)
    return 0
