"""Controller files an inventory names for SSH (the private key, known_hosts).

A relative path is read from the inventory's own folder, as Ansible reads the inventory's
group_vars/, so an inventory works from whatever folder tfcluster runs in. The launcher reads
them this way (inventory.py), and `tfcluster deploy` hands ansible-playbook, whose SSH would
read them from the current folder, the same files by absolute path (`overlay`).
"""
import contextlib
import io
import json
import os
import re

from tfcluster.hosts.ansibleapi import ansible_api

KNOWN_HOSTS_OPTION = re.compile(r"(UserKnownHostsFile=)(\S+)")


def inventory_folder(inventory):
    """The folder relative paths in INVENTORY (a file or a folder) are read from."""
    path = os.path.abspath(inventory)
    return path if os.path.isdir(path) else os.path.dirname(path)


def resolve(value, folder):
    """VALUE as an absolute path: ~ expanded, a relative path taken from FOLDER."""
    if not value:
        return value
    path = os.path.expanduser(str(value))
    if os.path.isabs(path):
        return path
    beside = os.path.join(folder, path)
    # An inventory written for the folder it was run from (the rule before this one) keeps
    # working where no file of that name lies beside it.
    if not os.path.exists(beside) and os.path.exists(path):
        return os.path.abspath(path)
    return beside


def known_hosts_from(ssh_args):
    match = KNOWN_HOSTS_OPTION.search(str(ssh_args or ""))
    return match.group(2) if match else None


def resolved_ssh_args(ssh_args, folder):
    """ansible_ssh_common_args with its UserKnownHostsFile resolved."""
    return KNOWN_HOSTS_OPTION.sub(lambda m: m.group(1) + resolve(m.group(2), folder),
                                  str(ssh_args))


def changed_connection_vars(inventory):
    """{host: {variable: absolute value}} for the hosts of INVENTORY whose SSH key or
    known_hosts option names a relative path. {} when the inventory cannot be read here:
    ansible-playbook then says why."""
    AnsibleError, InventoryManager, DataLoader, Templar, VariableManager = ansible_api()
    folder = inventory_folder(inventory)
    loader = DataLoader()
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # Ansible's warnings: its own run prints them
            manager = InventoryManager(loader=loader, sources=[os.path.abspath(inventory)])
        variables = VariableManager(loader=loader, inventory=manager)
    except AnsibleError:
        return {}
    changed = {}
    for host in manager.get_hosts():
        host_vars = variables.get_vars(host=host)
        templar = Templar(loader=loader, variables=host_vars)
        for name, fix in (("ansible_ssh_private_key_file", resolve),
                          ("ansible_ssh_common_args", resolved_ssh_args)):
            if name not in host_vars:
                continue
            try:
                value = templar.template(host_vars[name])
            except AnsibleError:
                continue  # facts or lookups: Ansible resolves it in the play
            if isinstance(value, str) and fix(value, folder) != value:
                changed.setdefault(host.name, {})[name] = fix(value, folder)
    return changed


@contextlib.contextmanager
def overlay(inventory):
    """A second inventory source (a temporary folder, removed afterwards) whose host_vars give
    ansible-playbook the absolute paths of INVENTORY's relative SSH files; None when none."""
    changed = changed_connection_vars(inventory) if "," not in inventory else {}
    if not changed:
        yield None
        return
    import shutil
    import tempfile  # here: every launch imports this module, only deploy needs these
    folder = tempfile.mkdtemp(prefix="tfcluster-paths-")
    try:
        os.mkdir(os.path.join(folder, "host_vars"))
        with open(os.path.join(folder, "hosts.yml"), "w") as handle:
            handle.write("all: {}\n")  # an empty source: host_vars/ is what counts
        for host, values in changed.items():
            with open(os.path.join(folder, "host_vars", host + ".yml"), "w") as handle:
                json.dump(values, handle)  # JSON is YAML
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
