"""Read an Ansible inventory with ansible-core's own managers into task slots.

Groups are TensorFlow job names. Every inventory host in a job group is one slot; several slots
may point at the same machine through `ansible_host`.
"""
import contextlib
import io
import os
import re
from dataclasses import dataclass, field

from tfcluster.errors import UsageError

JOBS = ("chief", "worker", "ps", "evaluator")
DEFAULT_ROOT = "/opt/tfcluster"
DEFAULT_PORT_BASE = 2222


@dataclass(frozen=True)
class Machine:
    """How to reach one machine: enough to open a connection and find tfcluster there."""

    address: str
    connection: str = "ssh"
    ssh_port: int = 22
    user: str | None = None
    key_file: str | None = None
    known_hosts: str | None = None
    connect_timeout: float = 10.0
    root: str = DEFAULT_ROOT
    python: str = DEFAULT_ROOT + "/venv/bin/python"
    workdir: str = DEFAULT_ROOT + "/work"
    data_dir: str = DEFAULT_ROOT + "/data"

    @property
    def is_local(self):
        return self.connection == "local"

    @property
    def key(self):
        """Slots with the same key share a machine, its ports and its cores."""
        return (self.connection, self.address, self.ssh_port, self.user)

    @property
    def label(self):
        return self.address if self.ssh_port == 22 else "%s:%d" % (self.address, self.ssh_port)

    def to_dict(self):
        return dict(self.__dict__)


@dataclass(frozen=True)
class Slot:
    name: str
    job: str
    machine: Machine
    port: int | None = None
    port_base: int = DEFAULT_PORT_BASE
    gpus: tuple | None = None
    extra: dict = field(default_factory=dict, compare=False)


def _ansible_imports():
    # ansible is imported lazily: `tfcluster --help` should not pay for it.
    from ansible import constants
    from ansible.errors import AnsibleError
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar
    from ansible.vars.manager import VariableManager
    constants.INVENTORY_UNPARSED_IS_FAILED = True
    return AnsibleError, InventoryManager, DataLoader, Templar, VariableManager


def _parse_failure_reason(warnings):
    for line in warnings.splitlines():
        line = line.strip()
        if line and not line.startswith(("[WARNING]", "<<<", "Failed to parse", "Origin")):
            return line
    return "not valid YAML or INI inventory"


def load_slots(path):
    """Every slot of every job group in PATH, in inventory order, with resolved variables."""
    if not path:
        raise UsageError("no inventory given: pass -i INVENTORY (for example -i inventory/local.yml)")
    if not os.path.exists(path):
        raise UsageError("inventory %s does not exist: pass -i with the path of an Ansible "
                         "inventory file or directory" % path)
    if os.path.isfile(path) and not os.access(path, os.R_OK):
        raise UsageError("inventory %s is not readable: check its permissions" % path)
    AnsibleError, InventoryManager, DataLoader, Templar, VariableManager = _ansible_imports()
    loader = DataLoader()
    warnings = io.StringIO()
    try:
        with contextlib.redirect_stderr(warnings):
            inventory = InventoryManager(loader=loader, sources=[os.path.abspath(path)])
    except AnsibleError:
        raise UsageError("cannot parse inventory %s: %s (check it with: ansible-inventory -i %s "
                         "--list)" % (path, _parse_failure_reason(warnings.getvalue()), path)) from None
    variables = VariableManager(loader=loader, inventory=inventory)
    groups = inventory.get_groups_dict()
    slots = []
    for job in JOBS:
        for hostname in groups.get(job, []):
            host = inventory.get_host(hostname)
            host_vars = variables.get_vars(host=host)
            templar = Templar(loader=loader, variables=host_vars)
            try:
                slots.append(_slot(hostname, job, host_vars, templar))
            except AnsibleError as err:
                raise UsageError("inventory %s: host %s: cannot resolve its variables: %s"
                                 % (path, hostname, str(err).splitlines()[0])) from None
    return slots


def _slot(hostname, job, host_vars, templar):
    def get(name, default=None):
        if name not in host_vars:
            return default
        return templar.template(host_vars[name])

    root = str(get("tfcluster_root", DEFAULT_ROOT))
    machine = Machine(
        address=str(get("ansible_host", hostname)),
        connection=str(get("ansible_connection", "ssh")),
        ssh_port=_int(get("ansible_port", 22), "ansible_port", hostname),
        user=get("ansible_user"),
        key_file=get("ansible_ssh_private_key_file"),
        known_hosts=get("tfcluster_known_hosts") or _known_hosts_from(get("ansible_ssh_common_args")),
        connect_timeout=float(get("tfcluster_connect_timeout", 10)),
        root=root,
        python=str(get("tfcluster_python", root + "/venv/bin/python")),
        workdir=str(get("tfcluster_workdir", root + "/work")),
        data_dir=str(get("tfcluster_data_dir", root + "/data")),
    )
    port = get("tfcluster_port")
    gpus = get("tfcluster_gpus")
    if gpus is not None:
        if isinstance(gpus, (int, str)):
            gpus = [g for g in str(gpus).split(",") if g.strip()]
        if not isinstance(gpus, (list, tuple)):
            raise UsageError("host %s: tfcluster_gpus must be a list of GPU ids like [0, 1]" % hostname)
        gpus = tuple(_int(g, "tfcluster_gpus", hostname) for g in gpus)
    return Slot(
        name=hostname, job=job, machine=machine,
        port=None if port is None else _int(port, "tfcluster_port", hostname),
        port_base=_int(get("tfcluster_port_base", DEFAULT_PORT_BASE), "tfcluster_port_base", hostname),
        gpus=gpus,
    )


def _int(value, name, hostname):
    try:
        return int(value)
    except (TypeError, ValueError):
        raise UsageError("host %s: %s must be a whole number, not %r" % (hostname, name, value)) from None


def _known_hosts_from(ssh_args):
    match = re.search(r"UserKnownHostsFile=(\S+)", str(ssh_args or ""))
    return match.group(1) if match else None
