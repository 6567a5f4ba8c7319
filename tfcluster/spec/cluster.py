"""The cluster model: tasks with addresses, rendered as TF_CONFIG, classic flags or dist_test string."""
import json

from tfcluster.errors import UsageError
from tfcluster.hosts.inventory import JOBS, SPARE, Machine
from tfcluster_agent import clusterspec, protocol
from tfcluster_agent.clusterspec import format_cluster_spec
from tfcluster_agent.values import replace, value_class

# Jobs that run a gRPC server and so appear in the cluster; an evaluator only reads checkpoints.
SERVER_JOBS = ("chief", "worker", "ps")
# Jobs that train: the success policy follows them, they get GPUs by default, and their stalls,
# lags and failed exits are the run's. A ps only serves them.
TRAINING_JOBS = ("chief", "worker")


@value_class(frozen=True)
class Task(protocol.TaskNames):
    job: str
    index: int
    slot: str
    machine: Machine
    port: int | None
    # None until gpus.assign() decides from preflight; "" means no GPU.
    cuda_visible_devices: str | None = None
    # True when the slot's tfcluster_gpus chose the devices (assign() keeps them).
    gpus_listed: bool = False

    @property
    def address(self):
        """host:port where the other tasks reach this task's server (tfcluster_address's host)."""
        return "%s:%d" % (self.machine.tf_host, self.port)

    def to_dict(self):
        # "host": where SSH goes; "address": where the other tasks reach its server.
        return {"job": self.job, "index": self.index, "slot": self.slot, "host": self.machine.address,
                "port": self.port, "address": self.address if self.port else None,
                "cuda_visible_devices": self.cuda_visible_devices}


class Cluster:
    def __init__(self, tasks, spares=()):
        self.tasks = list(tasks)
        self.spares = list(spares)  # Machines that get no task at the start (docs/spares.md)
        self._jobs = None  # (the tasks' ids, jobs()) as last computed

    def _server_jobs(self):
        key = tuple(map(id, self.tasks))
        if self._jobs is None or self._jobs[0] != key:
            self._jobs = (key, {job: [t.address for t in self.job_tasks(job)]
                                for job in SERVER_JOBS if self.job_tasks(job)})
        return self._jobs[1]

    def job_tasks(self, job):
        return [t for t in self.tasks if t.job == job]

    def jobs(self):
        """{job: [host:port, ...]} for the jobs that run servers, in a stable order. Built once
        for the tasks: every task's TF_CONFIG and flags hold it (128 tasks built it 128 times)."""
        return {job: list(addresses) for job, addresses in self._server_jobs().items()}

    def tf_config(self, task):
        return {"cluster": self.jobs(), "task": {"type": task.job, "index": task.index}}

    def flags(self, task):
        jobs = self.jobs()
        return ["--ps_hosts=" + ",".join(jobs.get("ps", [])),
                "--worker_hosts=" + ",".join(jobs.get("worker", [])),
                "--job_name=" + task.job, "--task_index=%d" % task.index]

    def cluster_spec_string(self):
        return format_cluster_spec(self.jobs())

    def machines(self):
        """Distinct machines with their tasks, in task order."""
        grouped = {}
        for task in self.tasks:
            grouped.setdefault(task.machine.key, (task.machine, []))[1].append(task)
        return list(grouped.values())

    def moved(self, lost, spare):
        """This cluster with the tasks of machine key LOST on Machine SPARE, each with its job
        and index, on its port when the spare has it free (else the next free one)."""
        used = {t.port for t in self.tasks if t.machine.key == spare.key and t.port}
        tasks = []
        for task in self.tasks:
            if task.machine.key == lost:
                port = task.port
                while port is not None and port in used:
                    port += 1
                if port is not None:
                    used.add(port)
                task = replace(task, machine=spare, port=port)
            tasks.append(task)
        return Cluster(tasks, [m for m in self.spares if m.key != spare.key])

    def find(self, label):
        for task in self.tasks:
            if task.label == label or task.name == label:
                return task
        raise UsageError("no task %s in this cluster: tasks are %s"
                         % (label, ", ".join(t.label for t in self.tasks)))


def build_cluster(slots, counts=None, task_per_gpu=True, spares=0):
    """Tasks for SLOTS: GPU expansion, COUNTS (job -> number or None for all), ports, validation.

    TASK_PER_GPU false keeps one task per worker slot that sees all of its GPUs (for programs
    that spread over local devices themselves, like the multi-tower examples). The cluster's
    spares: the machines of the [spare] group, then SPARES more drawn from the slots no task
    took, on machines that run no task."""
    tasks_by_job = {}
    for slot in slots:
        tasks_by_job.setdefault(slot.job, []).extend(_expand(slot, task_per_gpu))
    chosen, unused = [], []
    for job in JOBS:
        available = tasks_by_job.get(job, [])
        wanted = len(available) if not counts or counts.get(job) is None else counts[job]
        if wanted > len(available):
            raise UsageError("the inventory has %d %s task(s) but %d are needed: add hosts to "
                             "its [%s] group or ask for fewer" % (len(available), job, wanted, job))
        chosen.extend(available[:wanted])
        unused.extend(slot for slot, _, _ in available[wanted:])
    tasks = _assign_ports(chosen)
    _check_unique_addresses(tasks)
    return Cluster(tasks, _spare_machines(slots, unused, tasks, spares))


def _spare_machines(slots, unused, tasks, extra):
    """Distinct machines without a task: the [spare] group's, then EXTRA from UNUSED slots."""
    taken = {t.machine.key for t in tasks}
    spares = []
    for slot in [s for s in slots if s.job == SPARE]:
        if slot.machine.key not in taken:
            taken.add(slot.machine.key)
            spares.append(slot.machine)
    drawn = 0
    for slot in unused:  # EXTRA None: every one
        if (extra is None or drawn < extra) and slot.machine.key not in taken:
            taken.add(slot.machine.key)
            spares.append(slot.machine)
            drawn += 1
    if extra is not None and drawn < extra:
        raise UsageError("--spares %d: only %d machine(s) of the inventory are left without a "
                         "task: add hosts to its [spare] group or ask for fewer spares"
                         % (extra, drawn))
    return spares


def job_counts(slots):
    """{job: tasks} the inventory's SLOTS offer (a worker slot listing GPUs: one per GPU)."""
    counts = {}
    for slot in slots:
        counts[slot.job] = counts.get(slot.job, 0) + len(_expand(slot))
    return counts


def _expand(slot, task_per_gpu=True):
    """(slot, devices, listed) per task: one task per listed GPU on a worker with TASK_PER_GPU.

    Devices stay None (decided by gpus.assign from preflight) unless the slot lists GPUs;
    a ps that lists none never sees a GPU."""
    if slot.gpus is None:
        return [(slot, "" if slot.job == "ps" else None, False)]
    if slot.job == "worker" and slot.gpus and task_per_gpu:
        return [(slot, str(gpu), True) for gpu in slot.gpus]
    return [(slot, ",".join(str(g) for g in slot.gpus), True)]


def _port_keys(machine):
    # Servers bind every interface: a port is taken on the SSH machine and on the data address.
    return {("machine", machine.address), ("tf", machine.tf_host)}


def _assign_ports(chosen):
    taken = {}
    for slot, _, _ in chosen:
        if slot.port is not None:
            for key in _port_keys(slot.machine):
                taken.setdefault(key, set()).add(slot.port)
    tasks, index = [], {}
    for slot, devices, listed in chosen:
        job_index = index.get(slot.job, 0)
        index[slot.job] = job_index + 1
        port = None
        if slot.job in SERVER_JOBS:
            if slot.port is not None and slot.gpus is None:
                port = slot.port
            else:
                # The lowest port from the slot's base that no task on its machine has.
                keys = _port_keys(slot.machine)
                used = set().union(*(taken.get(key, set()) for key in keys))
                port = slot.port_base
                while port in used:
                    port += 1
                for key in keys:
                    taken.setdefault(key, set()).add(port)
            if not 1 <= port <= 65535:
                raise UsageError("host %s: port %d is out of range: set tfcluster_port or "
                                 "tfcluster_port_base between 1 and 65535" % (slot.name, port))
        tasks.append(Task(slot.job, job_index, slot.name, slot.machine, port, devices, listed))
    return tasks


def _check_unique_addresses(tasks):
    seen = {}
    for task in tasks:
        if task.port is None:
            continue
        for key in _port_keys(task.machine):
            where = "%s:%d" % (key[1], task.port)
            if (key, task.port) in seen:
                raise UsageError("host %s and host %s both use %s: give one of them another "
                                 "tfcluster_port" % (seen[key, task.port], task.slot, where))
            seen[key, task.port] = task.slot


def parse_cluster_spec(text):
    """dist_test's `job|host:port;host:port,job|...` as {job: [host:port, ...]}."""
    try:
        return clusterspec.parse_cluster_spec(text)
    except clusterspec.ClusterSpecError as err:
        raise UsageError(str(err)) from None


def render(cluster, fmt):
    """Text for `tfcluster spec`: one block per task, or the whole cluster as JSON."""
    if fmt == "json":
        return json.dumps({"cluster": cluster.jobs(), "cluster_spec": cluster.cluster_spec_string(),
                           "tasks": [dict(t.to_dict(), tf_config=cluster.tf_config(t),
                                          flags=cluster.flags(t)) for t in cluster.tasks]},
                          indent=2)
    if fmt == "cluster_spec":
        return cluster.cluster_spec_string()
    lines = []
    for task in cluster.tasks:
        if fmt == "tf_config":
            value = "TF_CONFIG='%s'" % json.dumps(cluster.tf_config(task), separators=(",", ":"))
        else:
            value = " ".join(cluster.flags(task))
        lines.append("%-12s %-22s %s" % (task.label, task.machine.address, value))
    return "\n".join(lines)
