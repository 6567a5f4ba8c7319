"""`tfcluster deploy`: run a tfcluster playbook with the project's Ansible settings, from wherever
tfcluster is installed.

With the wheel installed, the playbooks are the collection tfcluster.cluster in site-packages
(ansible_collections/tfcluster/cluster/, put there by setup.py); from a checkout (an editable
install) they are the checkout's playbooks/. Either way ansible-playbook runs with the settings
file that came with them (ANSIBLE_CONFIG: the checkout's ansible.cfg, copied into the wheel), so
neither a checkout nor the current directory's ansible.cfg is needed.
"""
import os
import shlex
import sys

import tfcluster
from tfcluster.errors import UsageError
from tfcluster.hosts import sshfiles
from tfcluster.hosts.inventory import load_slots
from tfcluster.spec.catalog import inventory_shape, load_catalog
from tfcluster.spec.cluster import job_counts

COLLECTION = os.path.join("ansible_collections", "tfcluster", "cluster")
PLAYBOOKS = ("deploy", "stop", "teardown", "validate")


def add_arguments(parser):
    """The options of `tfcluster deploy`."""
    parser.add_argument("-i", "--inventory", required=True)
    parser.add_argument("--playbook", choices=PLAYBOOKS, default="deploy",
                        help="which of tfcluster's playbooks (default: deploy)")
    parser.add_argument("-e", "--extra-vars", action="append", default=[], metavar="VARS")
    parser.add_argument("-l", "--limit", metavar="PATTERN")
    parser.add_argument("-t", "--tags")
    parser.add_argument("--skip-tags")
    parser.add_argument("--system", action="store_true",
                        help="only the administrator's half, which needs root on the hosts (OS "
                             "packages, the service group, the firewall, the NVIDIA driver; "
                             "docs/labs.md)")
    parser.add_argument("-C", "--check", action="store_true", help="dry run")
    parser.add_argument("-D", "--diff", action="store_true")
    parser.add_argument("-v", "--verbose", action="count", default=0)
    parser.epilog = "Arguments after a bare -- go to ansible-playbook; exits with its status"
    return parser


def find_content(search_path=None):
    """(collections dir, content root): the installed collection on SEARCH_PATH (default
    sys.path), else the checkout this tfcluster runs from (collections dir None)."""
    for entry in search_path if search_path is not None else sys.path:
        root = os.path.join(entry or os.getcwd(), COLLECTION)
        if os.path.isfile(os.path.join(root, "playbooks", "deploy.yml")):
            return os.path.abspath(entry or os.getcwd()), root
    # The folder holding the tfcluster package: a checkout's root for an editable install.
    root = os.path.dirname(os.path.dirname(os.path.abspath(tfcluster.__file__)))
    if os.path.isfile(os.path.join(root, "playbooks", "deploy.yml")):
        return None, root
    raise UsageError("tfcluster's playbooks are not installed beside it (no %s on sys.path and "
                     "no checkout at %s): reinstall tfcluster from its wheel" % (COLLECTION, root))


def controller_dir(collections_dir, root):
    """The folder deploy.yml takes wheelhouse/ and data/ from (tfcluster_controller_dir's
    default): a checkout's root (the one with scripts/wheelhouse), else the current folder."""
    if not collections_dir and os.path.isfile(os.path.join(root, "scripts", "wheelhouse")):
        return root
    return os.getcwd()


def playbook_command(args, collections_dir, root, paths=None):
    """The ansible-playbook command line for ARGS (the `deploy` subcommand's options); PATHS: a
    second inventory source with the inventory's SSH files by absolute path (sshfiles.overlay)."""
    if collections_dir:
        playbook = "tfcluster.cluster." + args.playbook
    else:
        playbook = os.path.join(root, "playbooks", args.playbook + ".yml")
    # This interpreter's Ansible: the one installed with tfcluster, whatever PATH says.
    cmd = [sys.executable, "-m", "ansible", "playbook", playbook, "-i", args.inventory]
    cmd += ["-i", paths] if paths else []
    cmd += system_half(args)
    for value in args.extra_vars:
        cmd += ["-e", value]
    for flag, value in (("--limit", args.limit), ("--tags", args.tags),
                        ("--skip-tags", args.skip_tags)):
        if value:
            cmd += [flag, value]
    cmd += ["--check"] * args.check + ["--diff"] * args.diff
    if args.verbose:
        cmd.append("-" + "v" * args.verbose)
    return cmd + list(args.trainer_args)


def system_half(args):
    """The -e that limits deploy.yml to the administrator's half (--system: packages, the
    service group, the firewall, the NVIDIA driver; docs/labs.md)."""
    if not getattr(args, "system", False):
        return []
    if args.playbook != "deploy":
        raise UsageError("--system is a part of the deploy playbook, not of %s: drop --system "
                         "or --playbook" % args.playbook)
    return ["-e", "tfcluster_deploy_scope=system"]


def playbook_env(collections_dir, root, environ=None):
    """The environment ansible-playbook runs in: the project's settings file, and only the
    installed collection (a copy in ~/.ansible/collections must not shadow it)."""
    env = dict(os.environ if environ is None else environ)
    env["ANSIBLE_CONFIG"] = os.path.join(root, "ansible.cfg")
    # tfcluster_controller_dir outside a checkout (wheelhouse/, data/), whoever started us.
    env["PWD"] = os.getcwd()
    if collections_dir:
        env["ANSIBLE_COLLECTIONS_PATH"] = collections_dir
    return env


# The playbooks that provision the machines of slots with tfcluster_deploy true, and their verb.
PROVISIONING = {"deploy": "deploy", "teardown": "tear down"}


def check_inventory(inventory, playbook="deploy"):
    """A UsageError, before Ansible starts, for an inventory that is not there or does not parse
    (as `tfcluster spec` says it), or that leaves PLAYBOOK nothing to provision."""
    if "," in inventory:  # "host1,host2,": an inline host list, not a file
        return
    if not os.path.exists(inventory):
        raise UsageError("inventory %s: no such file or folder (pass -i INVENTORY, e.g. the "
                         "hosts.yml that `tfcluster init` writes)" % inventory)
    slots = load_slots(inventory)
    if playbook not in PROVISIONING:
        return
    if not slots:
        raise UsageError("inventory %s has no hosts in ps, worker, chief or evaluator groups: "
                         "nothing to %s (start from inventory/sample/hosts.yml)"
                         % (inventory, PROVISIONING[playbook]))
    if not any(slot.deploy for slot in slots):
        raise UsageError("inventory %s: every slot has tfcluster_deploy: false, so there is "
                         "nothing to %s: set tfcluster_deploy: true for the machines to provision"
                         % (inventory, PROVISIONING[playbook]))
    if playbook == "deploy":  # what the machines will run, before minutes of provisioning
        print("tfcluster: %s: %s" % (inventory, inventory_shape(job_counts(slots), load_catalog())),
              flush=True)


def run(args):
    check_inventory(args.inventory, args.playbook)
    collections_dir, root = find_content()
    print("tfcluster: ansible-playbook %s"
          % shown(playbook_command(args, collections_dir, root)[4:]), flush=True)
    import subprocess  # here: `tfcluster` reads PLAYBOOKS for every command's --help
    # Relative SSH key and known_hosts paths are read from the inventory's folder, as the
    # launcher reads them, not from the folder ansible-playbook runs in.
    with sshfiles.overlay(args.inventory) as paths:
        cmd = playbook_command(args, collections_dir, root, paths)
        playbook = subprocess.Popen(cmd, env=playbook_env(collections_dir, root))
        try:
            return playbook.wait()
        except KeyboardInterrupt:
            # Ctrl-C reached ansible-playbook too: let it finish its own stop.
            return playbook.wait()


def shown(argv):
    """ARGV for the terminal: -e values may hold passwords, so only @FILE ones are shown."""
    hidden = [value if previous != "-e" or value.startswith("@") else "..."
              for previous, value in zip([None] + argv, argv)]
    return shlex.join(hidden)
