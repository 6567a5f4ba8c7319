"""Read an Ansible inventory with ansible-core's own managers into task slots.

Groups are TensorFlow job names. Every inventory host in a job group is one slot; several slots
may point at the same machine through `ansible_host`.
"""
import contextlib
import io
import math
import os
import pickle
import re
import sys
from importlib.machinery import PathFinder

from tfcluster.hosts import sshfiles
from tfcluster.hosts.ansibleapi import ansible_api
from tfcluster.errors import UsageError
from tfcluster_agent import clusterspec
from tfcluster_agent.cachedir import home_cache
from tfcluster_agent.hostcode import sha256
from tfcluster_agent.protocol import MIN_STALL_AFTER
from tfcluster_agent.values import field, value_class

JOBS = ("chief", "worker", "ps", "evaluator")
# Machines that get no task at the start: a lost machine's tasks move to one (docs/spares.md).
SPARE = "spare"
DEFAULT_ROOT = "/opt/tfcluster"
DEFAULT_PORT_BASE = 2222
# The firewall role's ruleset file (firewall_rules_file's default).
FENCE_FILE = "/etc/tfcluster-firewall.nft"


def default_root(user, become=False):
    """tfcluster_root's default, as roles/tfcluster/defaults/main.yml computes it: root's (or a
    deploy that becomes root) /opt/tfcluster; an ordinary user's ~/tfcluster, in /home/USER
    (USER: ansible_user, else whoever runs tfcluster), where no root is needed."""
    user = user or os.environ.get("USER") or "root"
    if user == "root" or become:
        return DEFAULT_ROOT
    return "/home/%s/tfcluster" % user


@value_class(frozen=True)
class Machine:
    """How to reach one machine: enough to open a connection and find tfcluster there.

    ADDRESS (with ssh_port, user...) is where SSH goes; DATA_ADDRESS, from tfcluster_address,
    is where the other tasks reach this machine's TensorFlow ports (None: ADDRESS)."""

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
    data_address: str | None = None
    # GPU settings (docs/gpus.md): nvidia-smi's path, how many GPUs the machine
    # must show (None: no check), memory (MiB) another process may hold on a GPU still handed
    # out, and whether busy GPUs may be shared knowingly.
    nvidia_smi: str = "nvidia-smi"
    gpu_count: int | None = None
    gpu_busy_mib: int = 300
    gpu_share: bool = False
    # Seconds a training task may print nothing and use almost no CPU before it is stalled
    # (tfcluster/diagnosis/stall.py); 0: not watched.
    stall_after: float = 120.0
    # Lab hosts (docs/labs.md): the firewall role's ruleset, whose absence a launch reports
    # ("": fenced by other means, tfcluster_fenced), and, once preflight found the workdir
    # shared with another machine of the run, this machine's folder inside each run's folder.
    fence_file: str = FENCE_FILE
    run_subdir: str | None = None

    @property
    def tf_host(self):
        """The host part of this machine's TensorFlow addresses (host:port)."""
        return self.data_address or self.address

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


@value_class(frozen=True)
class Slot:
    name: str
    job: str
    machine: Machine
    port: int | None = None
    port_base: int = DEFAULT_PORT_BASE
    gpus: tuple | None = None
    # tfcluster_code_dir: a controller folder `tfcluster sync` pushes to <tfcluster_root>/code.
    code_dir: str | None = None
    # tfcluster_deploy: deploy.yml and teardown.yml provision its machine (false: it is ready).
    deploy: bool = True
    extra: dict = field(default_factory=dict, compare=False)


def _parse_failure_reason(warnings):
    for line in warnings.splitlines():
        line = line.strip()
        if line and not line.startswith(("[WARNING]", "<<<", "Failed to parse", "Origin")):
            return line
    return "not valid YAML or INI inventory"


# Templates whose value can change while the files do not: such inventories are read every time.
VOLATILE = re.compile(rb"lookup\(|query\(|\bq\(|now\(|random|^\s*plugin\s*:", re.M)


def require_slots(path):
    """load_slots(PATH), refused when it has no slot (no host in a job group: nothing to act
    on)."""
    slots = load_slots(path)
    if not slots:
        raise UsageError("inventory %s has no hosts in ps, worker, chief or evaluator groups: "
                         "add some" % path)
    return slots


def load_slots(path):
    """Every slot of every job group in PATH, in inventory order, with resolved variables.

    Reading an inventory costs over a second of ansible-core imports, more than the rest of a
    launch's overhead: the slots of an inventory whose files have not changed (and that uses no
    lookups, plugins or scripts) come from tfcluster's cache folder (~/.cache/tfcluster:
    tfcluster_agent/cachedir.py)."""
    key = _cache_key(path)
    folder = home_cache() if key else None
    cache = os.path.join(folder, "inventory-%s.pickle" % key) if folder else None
    if cache:
        try:
            with open(cache, "rb") as handle:
                return pickle.load(handle)
        except (OSError, pickle.PickleError, EOFError, AttributeError, ImportError):
            pass
    slots = read_slots(path)
    if cache:
        try:
            tmp = "%s.%d.tmp" % (cache, os.getpid())
            with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as handle:
                pickle.dump(slots, handle)
            os.replace(tmp, cache)
        except OSError:
            pass  # no cache, no harm
        _prune_cache(folder)
    return slots


def _prune_cache(folder, keep=100):
    """Only the KEEP newest cached inventories stay: each edit of an inventory writes another."""
    try:
        paths = [os.path.join(folder, name) for name in os.listdir(folder)
                 if name.startswith("inventory-") and name.endswith(".pickle")]
        if len(paths) > keep:
            for path in sorted(paths, key=os.path.getmtime)[:-keep]:
                os.remove(path)
    except OSError:
        pass  # another launch pruned first: it is its job then


def _inventory_files(path):
    """The files ansible-core reads for PATH: itself (or its tree) and group_vars/host_vars."""
    base = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    tops = [path] if os.path.isdir(path) else []
    tops += [os.path.join(base, "group_vars"), os.path.join(base, "host_vars")]
    files = [path] if os.path.isfile(path) else []
    for top in tops:
        for root, dirs, names in os.walk(top):
            dirs.sort()
            files += [os.path.join(root, n) for n in sorted(names)]
    return sorted(set(files))


def _cache_key(path):
    if not path or not os.path.exists(path):
        return None
    digest = sha256()
    try:
        ansible = PathFinder.find_spec("ansible")  # its version, without importing it
        with open(os.path.join(os.path.dirname(ansible.origin), "release.py"), "rb") as handle:
            ansible_version = handle.read()
        with open(__file__, "rb") as handle:
            digest.update(handle.read())
        # The current folder: a relative key path may be read from it (sshfiles.resolve).
        digest.update(repr((os.path.abspath(path), os.getcwd(), sys.executable, ansible_version,
                            sorted((k, v) for k, v in os.environ.items()
                                   if k.startswith("ANSIBLE_")))).encode())
        for name in _inventory_files(path):
            if os.access(name, os.X_OK):
                return None  # a script inventory: its output may change at any time
            with open(name, "rb") as handle:
                content = handle.read()
            if VOLATILE.search(content):
                return None
            digest.update(name.encode() + b"\0" + sha256(content).digest())
    except OSError:
        return None
    return digest.hexdigest()[:32]


def read_slots(path):
    """load_slots without the cache."""
    if not path:
        raise UsageError("no inventory given: pass -i INVENTORY (for example -i inventory/local.yml)")
    if not os.path.exists(path):
        raise UsageError("inventory %s does not exist: pass -i with the path of an Ansible "
                         "inventory file or directory" % path)
    if os.path.isfile(path) and not os.access(path, os.R_OK):
        raise UsageError("inventory %s is not readable: check its permissions" % path)
    AnsibleError, InventoryManager, DataLoader, Templar, VariableManager = ansible_api()
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
    folder = sshfiles.inventory_folder(path)
    slots = []
    for job in JOBS + (SPARE,):
        for hostname in groups.get(job, []):
            host = inventory.get_host(hostname)
            host_vars = variables.get_vars(host=host)
            templar = Templar(loader=loader, variables=host_vars)
            try:
                slots.append(_slot(hostname, job, host_vars, templar, folder))
            except AnsibleError as err:
                raise UsageError("inventory %s: host %s: cannot resolve its variables: %s"
                                 % (path, hostname, str(err).splitlines()[0])) from None
    return slots


def _slot(hostname, job, host_vars, templar, folder):
    def get(name, default=None):
        if name not in host_vars:
            return default
        return templar.template(host_vars[name])

    root = _path(get("tfcluster_root", default_root(
        get("ansible_user"), _flag(get("ansible_become", False), "ansible_become", hostname))),
        "tfcluster_root", hostname)
    address = str(get("ansible_host", hostname))
    machine = Machine(
        address=address,
        connection=str(get("ansible_connection", "ssh")),
        ssh_port=_ssh_port(get("ansible_port", 22), hostname),
        user=get("ansible_user"),
        key_file=sshfiles.resolve(get("ansible_ssh_private_key_file"), folder),
        known_hosts=sshfiles.resolve(get("tfcluster_known_hosts") or sshfiles.known_hosts_from(
            get("ansible_ssh_common_args")), folder),
        connect_timeout=_seconds(get("tfcluster_connect_timeout", 10), "tfcluster_connect_timeout",
                                 hostname),
        root=root,
        python=_path(get("tfcluster_python", root + "/venv/bin/python"), "tfcluster_python", hostname),
        workdir=_path(get("tfcluster_workdir", root + "/work"), "tfcluster_workdir", hostname),
        data_dir=_path(get("tfcluster_data_dir", root + "/data"), "tfcluster_data_dir", hostname),
        data_address=_data_address(get("tfcluster_address"), address, hostname),
        nvidia_smi=str(get("tfcluster_nvidia_smi", "nvidia-smi")),
        gpu_count=None if get("tfcluster_gpu_count") is None else
        _int(get("tfcluster_gpu_count"), "tfcluster_gpu_count", hostname),
        gpu_busy_mib=_int(get("tfcluster_gpu_busy_mib", 300), "tfcluster_gpu_busy_mib", hostname),
        gpu_share=_flag(get("tfcluster_gpu_share", False), "tfcluster_gpu_share", hostname),
        stall_after=_stall_after(get("tfcluster_stall_after", 120), hostname),
        fence_file="" if _flag(get("tfcluster_fenced", False), "tfcluster_fenced", hostname)
        else str(get("firewall_rules_file", FENCE_FILE)),
    )
    port = get("tfcluster_port")
    return Slot(
        name=str(hostname), job=str(job), machine=machine,
        port=None if port is None else _int(port, "tfcluster_port", hostname),
        port_base=_int(get("tfcluster_port_base", DEFAULT_PORT_BASE), "tfcluster_port_base", hostname),
        gpus=_gpus(get("tfcluster_gpus"), hostname),
        code_dir=get("tfcluster_code_dir"),
        deploy=_flag(get("tfcluster_deploy", True), "tfcluster_deploy", hostname),
    )


def _int(value, name, hostname):
    # YAML's true/false are ints to Python: `tfcluster_port: true` would become port 1.
    if isinstance(value, bool):
        value = str(value).lower()
    try:
        return int(value)
    except (TypeError, ValueError):
        raise UsageError("host %s: %s must be a whole number, not %r: fix %s"
                         % (hostname, name, value, name)) from None


def _flag(value, name, hostname):
    if isinstance(value, bool):
        return value
    if str(value).lower() in ("true", "yes", "1", "false", "no", "0"):
        return str(value).lower() in ("true", "yes", "1")
    raise UsageError("host %s: %s must be true or false, not %r: fix %s"
                     % (hostname, name, value, name))


def _ssh_port(value, hostname):
    port = _int(value, "ansible_port", hostname)
    if not 1 <= port <= 65535:
        raise UsageError("host %s: ansible_port %d is out of range: fix ansible_port (1 to 65535)"
                         % (hostname, port))
    return port


def _seconds(value, name, hostname, zero=None):
    """A number of seconds above 0; ZERO (what 0 means) allows 0 too."""
    try:
        seconds = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not zero):
        raise UsageError("host %s: %s must be a number of seconds above 0%s, not %r: fix %s"
                         % (hostname, name, " (%s)" % zero if zero else "", value, name))
    return seconds


def _stall_after(value, hostname):
    seconds = _seconds(value, "tfcluster_stall_after", hostname, zero="0 turns the watch off")
    if 0 < seconds < MIN_STALL_AFTER:
        raise UsageError("host %s: tfcluster_stall_after must be 0 (off) or at least %g s (how "
                         "often the watch looks), not %r: fix tfcluster_stall_after"
                         % (hostname, MIN_STALL_AFTER, value))
    return seconds


def _gpus(value, hostname):
    if value is None:
        return None
    if isinstance(value, (int, str)) and not isinstance(value, bool):
        value = [g for g in str(value).split(",") if g.strip()]
    if not isinstance(value, (list, tuple)):
        raise UsageError("host %s: tfcluster_gpus must be a list of GPU ids like [0, 1]" % hostname)
    gpus = tuple(_int(g, "tfcluster_gpus", hostname) for g in value)
    for gpu in gpus:
        if gpu < 0:
            raise UsageError("host %s: tfcluster_gpus lists GPU %d, but ids start at 0 as "
                             "nvidia-smi -L numbers them: fix tfcluster_gpus" % (hostname, gpu))
    if len(set(gpus)) != len(gpus):
        raise UsageError("host %s: tfcluster_gpus lists a GPU twice (%s): list each once"
                         % (hostname, ", ".join(map(str, gpus))))
    return gpus


def _path(value, name, hostname):
    """An absolute path that a shell command (quoted), PATH and PYTHONPATH can carry."""
    path = str(value)
    if not path.startswith("/"):
        raise UsageError("host %s: %s must be an absolute path, not %r: fix %s"
                         % (hostname, name, path, name))
    if any(ord(c) < 32 or ord(c) == 127 for c in path):
        raise UsageError("host %s: %s %r contains a control character: choose another path"
                         % (hostname, name, path))
    if ":" in path and name in ("tfcluster_root", "tfcluster_python"):
        raise UsageError("host %s: %s %r contains ':', which separates PYTHONPATH and PATH "
                         "entries: choose another path" % (hostname, name, path))
    return path


def check_host(host, what, fix):
    """HOST as TensorFlow's host:port needs it: a name, an IPv4 address or a bracketed IPv6 one."""
    normal = clusterspec.normal_host(host)
    if normal is None:
        raise UsageError(clusterspec.host_problem(what, str(host), fix))
    return normal


def _data_address(value, ssh_address, hostname):
    if value is None:
        host = check_host(ssh_address, "host %s: ansible_host" % hostname,
                          "fix it, or set tfcluster_address to the address tasks use")
        return None if host == ssh_address else host
    return check_host(value, "host %s: tfcluster_address" % hostname, "fix tfcluster_address")
