"""`tfcluster init [DIR] [HOST ...]`: a commented starting inventory, DIR/hosts.yml.

Each HOST is [USER@]ADDRESS[:PORT]; the first is the parameter server, the others are workers
(one host alone is both). Without hosts, init asks for them on a terminal. `--sample` copies the
full sample inventory instead (a GPU cluster, group_vars/ by topic), which the wheel carries.
"""
import os
import re
import sys

from tfcluster.errors import UsageError

INVENTORY = "hosts.yml"
HOST = re.compile(r"^(?:(?P<user>[^@\s:]+)@)?(?P<address>\[[0-9A-Fa-f:.]+\]|[^@\s:\[\]]+)"
                  r"(?::(?P<port>\d+))?$")

HEADER = """\
# tfcluster inventory, written by `tfcluster init`. One host line is one task slot: the first
# host is the parameter server (ps), the others are workers; a chief goes in `chief`.
# Next, from this folder:
#   tfcluster wheelhouse                                  # the hosts' TensorFlow, into wheelhouse/
#   tfcluster deploy -i {inventory}                          # provision the hosts over SSH
#   tfcluster launch mnist_replica -i {inventory} --smoke    # a first run: 1 ps, 2 workers
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
                        help="[USER@]ADDRESS[:PORT]: the first is the ps, the others workers "
                             "(none: asked on a terminal)")
    parser.add_argument("--user", help="SSH user for hosts without USER@ (default: yours)")
    parser.add_argument("--key", metavar="FILE", help="SSH private key (default: ssh's own)")
    parser.add_argument("--known-hosts", metavar="FILE",
                        help="known_hosts file with the hosts' keys (default: ~/.ssh/known_hosts)")
    parser.add_argument("--sample", action="store_true",
                        help="copy the full sample inventory (GPU cluster, group_vars/) instead")
    parser.add_argument("--force", action="store_true", help="replace an existing hosts.yml")
    return parser


def parse_host(text):
    """(user or None, address, port or None) of [USER@]ADDRESS[:PORT]."""
    match = HOST.match(text.strip())
    if not match or (match.group("port") and not 1 <= int(match.group("port")) <= 65535):
        raise UsageError("host %r is not [USER@]ADDRESS[:PORT], e.g. ubuntu@gpu01.example.com "
                         "or 10.0.0.12:2222" % text)
    port = match.group("port")
    return match.group("user"), match.group("address").strip("[]"), int(port) if port else None


def file_path(path, folder):
    """PATH as the inventory writes it: relative to FOLDER when inside it, else absolute."""
    path = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(path):
        raise UsageError("no file %s: give an existing SSH key or known_hosts file" % path)
    inside = os.path.relpath(path, folder)
    return path if inside.startswith(os.pardir) else inside


def host_line(name, host, default_user, key, gpus):
    user, address, port = host
    fields = ["ansible_host: %s" % address, "ansible_user: %s" % (user or default_user),
              "ansible_port: %d" % (port or 22)]
    if key:
        fields.append("ansible_ssh_private_key_file: %s" % key)
    if gpus:
        fields.append("tfcluster_gpus: ~")
    return "        %s: {%s}\n" % (name, ", ".join(fields))


def inventory_text(hosts, user, key, known_hosts):
    """The inventory for HOSTS (parsed), the first one the ps."""
    known = ('    # Host keys: this file (a relative path is read from this folder).\n'
             '    ansible_ssh_common_args: "-o UserKnownHostsFile=%s"\n' % known_hosts
             if known_hosts else
             "    # Host keys are read from ~/.ssh/known_hosts; another file:\n"
             '    # ansible_ssh_common_args: "-o UserKnownHostsFile=keys/known_hosts"\n')
    workers = hosts[1:] or hosts[:1]
    text = HEADER.format(inventory=INVENTORY) + VARS.format(known_hosts=known)
    text += "    ps:\n      hosts:\n" + host_line("ps0", hosts[0], user, key, False)
    text += "    worker:\n      hosts:\n" + "".join(
        host_line("worker%d" % i, host, user, key, True) for i, host in enumerate(workers))
    text += ("    chief:\n      # For the examples with a chief (ps_strategy, data_parallel), e.g.\n"
             "      # chief0: {ansible_host: gpu01.example.com, ansible_user: ubuntu, "
             "ansible_port: 22}\n      hosts: {}\n")
    return text


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
    target = os.path.join(folder, INVENTORY)
    if os.path.exists(target) and not args.force:
        raise UsageError("%s exists: edit it, or pass --force to write a new one" % target)
    if args.sample:
        return copy_sample(folder, args.force)
    if not args.hosts:
        if not sys.stdin.isatty():
            raise UsageError("name the hosts, e.g. tfcluster init %s ubuntu@gpu01 ubuntu@gpu02 "
                             "ubuntu@gpu03 (or --sample for the full sample)" % args.dir)
        ask(args)
        if not args.hosts:
            raise UsageError("no hosts given: nothing written")
    hosts = [parse_host(text) for text in args.hosts]
    os.makedirs(folder, exist_ok=True)
    key = file_path(args.key, folder) if args.key else None
    known = file_path(args.known_hosts, folder) if args.known_hosts else None
    import getpass
    text = inventory_text(hosts, args.user or getpass.getuser(), key, known)
    with open(target, "w") as handle:
        handle.write(text)
    print("tfcluster: wrote %s (%d host(s): ps0 on %s). Next, in %s:\n  tfcluster wheelhouse\n"
          "  tfcluster deploy -i %s\n  tfcluster launch mnist_replica -i %s --smoke"
          % (target, len(hosts), hosts[0][1], folder, INVENTORY, INVENTORY))
    return 0


def copy_sample(folder, force):
    import shutil
    from tfcluster.deploy.playbook import find_content
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
