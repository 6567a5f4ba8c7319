"""The controller's run model: TaskState and TaskStatus are a task's life as the monitor sees it;
PreflightReport is a machine's answer to the preflight; RunRecord is runs/<run-id>/run.json, read
and written only through to_json/from_json. (What the agent starts, TaskSpec, is host code:
tfcluster_agent/taskspec.py.)
"""
import enum
import os
from tfcluster.runs.provenance import Provenance
from tfcluster_agent.values import field, fields, value_class

FORMAT_VERSION = 2  # 1: the untyped records before this module (no "format" key)


class RecordError(ValueError):
    """A run.json this code cannot use; the message is one line saying why."""


class _Word(str, enum.Enum):
    """A state, written in records and summaries as its value."""

    def __str__(self):
        return self.value


class TaskState(_Word):
    PENDING = "pending"          # in the record, not started yet
    RUNNING = "running"
    RESTARTING = "restarting"    # started again by the restart policy, not confirmed yet
    EXITED = "exited"            # the agent saw it end (its exit code says how)
    LOST = "lost"                # its supervisor vanished: the end is unknown
    # How a task ended, as the record and the summary say it.
    NOT_STARTED = "not started"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"

    @property
    def is_running(self):
        return self in (TaskState.RUNNING, TaskState.RESTARTING)

    @property
    def is_terminal(self):
        """An ending the record keeps: nothing follows it."""
        return self in ENDINGS

    def can_become(self, new):
        return new in TRANSITIONS[self]


ENDINGS = frozenset((TaskState.NOT_STARTED, TaskState.SUCCEEDED, TaskState.FAILED,
                     TaskState.STOPPED))
_LIVE = frozenset((TaskState.RUNNING, TaskState.RESTARTING, TaskState.EXITED, TaskState.LOST))
# An agent replays a run folder's history on attach, and a restarted task's start may follow its
# old end: every live state may follow another; PENDING is only a beginning, endings are final.
# A task still alive when its run is recorded ends as RUNNING (its machine was unreachable).
TRANSITIONS = {state: _LIVE | ENDINGS for state in (TaskState.PENDING,) + tuple(_LIVE)}
TRANSITIONS.update({state: frozenset() for state in ENDINGS})


def check_transition(label, old, new):
    """The one place a task's state change is checked; returns NEW."""
    new = TaskState(new)
    if old is not None and not TaskState(old).can_become(new):
        raise ValueError("task %s cannot go from %s to %s" % (label, old, new))
    return new


@value_class
class TaskStatus:
    """A task as the monitor knows it."""
    state: TaskState = TaskState.PENDING
    alive: bool = False
    exit: int | None = None
    pid: int | None = None

    @classmethod
    def from_agent(cls, answer):
        """From an agent's Attached entry: {pid, alive, exit, state}."""
        return cls(state=TaskState(answer.get("state") or "lost"), alive=bool(answer.get("alive")),
                   exit=answer.get("exit"), pid=answer.get("pid"))


@value_class
class PreflightReport:
    """A machine's preflight answer. A new fact is one field here (with a default)."""
    python_ok: bool = False
    error: str | None = None
    tf_version: str | None = None
    python_version: str | None = None
    agent_python: str | None = None
    hostname: str | None = None
    cpus: int | None = None
    gpus: list = field(default_factory=list)
    code_hash: str | None = None
    ports: dict = field(default_factory=dict)          # "port" -> free
    port_holders: dict = field(default_factory=dict)   # "port" -> the run that claimed it
    missing_data: dict = field(default_factory=dict)   # folder -> [missing files]
    # gpuinfo.host_gpus(): driver, gpus, error, warning, absent
    gpu_facts: dict = field(default_factory=dict)
    proxy_env: dict = field(default_factory=dict)      # hostinfo.proxy_facts(): names, no_proxy
    workdir_id: str | None = None                      # shares.folder_id of the workdir
    fenced: bool | None = None                         # the firewall's ruleset is there
    cache_warning: str | None = None                   # cachedir.cache_folder's, when any
    # What the tasks run with (tfcluster_agent/provenance.py): the task interpreter's
    # distributions {name: version} and their hash, library and driver versions, and
    # {path: sha256} of the data files the tasks read.
    packages: dict = field(default_factory=dict)
    packages_hash: str | None = None
    versions: dict = field(default_factory=dict)
    data_hashes: dict = field(default_factory=dict)
    reached: bool = True

    def to_json(self):
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, data):
        return cls(**{f.name: data[f.name] for f in fields(cls)
                      if f.name in data and data[f.name] is not None})

    @classmethod
    def unreachable(cls, reason):
        return cls(error=reason, reached=False)


# The preflight facts a run's record keeps about each machine.
RECORDED_FACTS = ("tf_version", "hostname", "cpus", "gpus", "python_version", "code_hash",
                  "packages_hash", "versions", "data_hashes")
# Machine settings that identify it (inventory.Machine.key).
KEY_FIELDS = ("connection", "address", "ssh_port", "user")


def machine_key(settings):
    return (settings.get("connection", "ssh"), settings["address"],
            int(settings.get("ssh_port", 22)), settings.get("user"))


@value_class
class MachineRecord:
    settings: dict                                   # inventory.Machine.to_dict()
    facts: dict = field(default_factory=dict)        # RECORDED_FACTS from its preflight

    @property
    def key(self):
        return machine_key(self.settings)

    def to_json(self):
        return dict(self.settings, **self.facts)

    @classmethod
    def from_json(cls, data):
        if not isinstance(data, dict) or not isinstance(data.get("address"), str):
            raise RecordError("bad machines")
        return cls({k: v for k, v in data.items() if k not in RECORDED_FACTS},
                   {k: data[k] for k in RECORDED_FACTS if k in data})


@value_class
class TaskRecord:
    job: str
    index: int
    slot: str
    machine: tuple                    # its machine's key (connection, address, ssh_port, user)
    port: int | None = None
    address: str | None = None        # host:port of its server
    cuda_visible_devices: str | None = None
    name: str = ""
    command: str = ""
    host_run_dir: str | None = None
    env_names: list = field(default_factory=list)
    intra_op_threads: int = 1
    state: TaskState = TaskState.PENDING
    exit: int | None = None
    pid: int | None = None
    restarts: int = 0
    log: str | None = None
    first_step_s: float | None = None

    def to_json(self):
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data.update(machine=list(self.machine), state=self.state.value,
                    host=self.machine[1])  # the address, for people and older readers
        return {k: v for k, v in data.items() if v is not None or k in ("exit", "port")}

    @classmethod
    def from_json(cls, label, data, machines):
        if not isinstance(data, dict) or not {"job", "index", "slot", "port"} <= set(data):
            raise RecordError("task %s incomplete" % label)
        values = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        if "machine" in data:
            key = tuple(data["machine"]) if isinstance(data["machine"], list) else None
            if key not in machines:
                raise RecordError("task %s on unknown machine %s" % (label, data["machine"]))
        else:
            # Format 1 named the machine by its address alone.
            same = [k for k in machines if k[1] == data.get("host")]
            if not same:
                raise RecordError("task %s on unknown machine %s" % (label, data.get("host")))
            if len(same) > 1:
                raise RecordError("task %s: %d machines share the address %s and this older "
                                  "record does not say which" % (label, len(same), data["host"]))
            key = same[0]
        try:
            values.update(machine=key, state=TaskState(data.get("state") or "pending"))
        except ValueError:
            raise RecordError("task %s has an unknown state %r" % (label, data.get("state"))) \
                from None
        return cls(**values)


@value_class
class RestartEntry:
    task: str
    why: str
    scope: str   # task | job
    time: str

    @classmethod
    def from_json(cls, data):
        return cls(**{f.name: data.get(f.name) for f in fields(cls)})


@value_class
class MoveEntry:
    """A lost machine's tasks moved to a spare: both placements ({job: [host:port]})."""
    lost: str     # the lost machine's label
    spare: str    # the spare's label
    tasks: list   # the labels of the tasks that moved
    why: str
    scope: str    # task (the moved tasks restarted) | job (every task restarted)
    time: str
    cluster_before: dict
    cluster_after: dict

    @classmethod
    def from_json(cls, data):
        return cls(**{f.name: data.get(f.name) for f in fields(cls)})


class RunState(_Word):
    """The run's own state; RunRecord.become is its one writer."""
    STARTING = "starting"
    WAITING = "waiting"          # `launch --wait`, for its GPUs: nothing started yet
    RUNNING = "running"
    # How it ended.
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"          # by `tfcluster stop` (or its waiting launcher died)
    TIMED_OUT = "timed_out"
    INTERRUPTED = "interrupted"

    @property
    def is_active(self):
        """A run still going."""
        return self not in RUN_ENDINGS


RUN_ENDINGS = frozenset((RunState.SUCCEEDED, RunState.FAILED, RunState.STOPPED,
                         RunState.TIMED_OUT, RunState.INTERRUPTED))
# A new run may wait for its GPUs first; any run still going may end; an ending is final.
RUN_TRANSITIONS = {RunState.STARTING: RUN_ENDINGS | {RunState.WAITING, RunState.RUNNING},
                   RunState.WAITING: RUN_ENDINGS | {RunState.STARTING},
                   RunState.RUNNING: RUN_ENDINGS}
RUN_TRANSITIONS.update({state: frozenset() for state in RUN_ENDINGS})


@value_class
class RunRecord:
    """runs/<run-id>/run.json."""
    id: str
    example: str | None = None
    state: RunState = RunState.STARTING
    created: str | None = None
    started: str | None = None
    ended: str | None = None
    inventory: str | None = None
    success_policy: str = "all_workers"
    smoke: bool = False
    user_args: list = field(default_factory=list)
    detach: bool = False
    cluster: dict = field(default_factory=dict)
    cluster_spec: str | None = None
    code_hash: str | None = None
    machines: list = field(default_factory=list)          # [MachineRecord]
    tasks: dict = field(default_factory=dict)             # label -> TaskRecord
    results: dict = field(default_factory=dict)           # label -> its TFCLUSTER_RESULT
    restart_log: list = field(default_factory=list)       # [RestartEntry]
    moves: list = field(default_factory=list)             # [MoveEntry]: tasks moved to spares
    leftovers: list = field(default_factory=list)
    collection_problems: list = field(default_factory=list)
    exit_code: int | None = None
    failure: str | None = None
    # The run whose checkpoint folder this one writes: its own id, or the run it resumes.
    checkpoints_of: str | None = None
    # The launcher that follows the run (none for --detach): its pid, start time and boot id,
    # for `tfcluster drain` to signal it while it is still that process.
    launcher: dict | None = None
    # While `launch --wait` waits for GPUs (state "waiting"): the launcher's pid and start time.
    waiting: dict | None = None
    provenance: Provenance | None = None                  # what exactly ran (provenance.py)
    # Where it lives on the controller, and whether this process created (owns) its folder.
    runs_dir: str | None = field(default=None, repr=False, metadata={"local": True})
    claimed: bool = field(default=False, repr=False, metadata={"local": True})

    @property
    def dir(self):
        return os.path.join(self.runs_dir, self.id)

    @property
    def path(self):
        return os.path.join(self.dir, "run.json")

    @property
    def active(self):
        return RunState(self.state).is_active

    def become(self, state):
        """The one writer of the run's state; ValueError for a change RUN_TRANSITIONS forbids
        (staying in a state is no change)."""
        state = RunState(state)
        if state != self.state and state not in RUN_TRANSITIONS[self.state]:
            raise ValueError("run %s cannot go from %s to %s" % (self.id, self.state, state))
        self.state = state

    def machine(self, key):
        return next(m for m in self.machines if m.key == tuple(key))

    def to_json(self):
        data = {f.name: getattr(self, f.name) for f in fields(self) if not f.metadata.get("local")}
        data.update(format=FORMAT_VERSION, state=RunState(self.state).value,
                    machines=[m.to_json() for m in self.machines],
                    tasks={label: t.to_json() for label, t in self.tasks.items()},
                    restart_log=[vars(e) for e in self.restart_log],
                    moves=[vars(e) for e in self.moves] or None,  # absent: nothing moved
                    provenance=self.provenance and self.provenance.to_json())
        return {k: v for k, v in data.items() if v is not None or k == "exit_code"}

    @classmethod
    def from_json(cls, data, runs_dir=None):
        """A record from its JSON (this format or format 1); RecordError says why not."""
        if not isinstance(data, dict):
            raise RecordError("not a JSON object")
        version = data.get("format", 1)
        if not isinstance(version, int) or version > FORMAT_VERSION:
            raise RecordError("format %r is newer than this tfcluster reads (%d): upgrade "
                              "tfcluster" % (version, FORMAT_VERSION))
        if not isinstance(data.get("id"), str):
            raise RecordError("no run id")
        machines = data.get("machines", [])
        tasks = data.get("tasks", {})
        if not isinstance(machines, list):
            raise RecordError("bad machines")
        if not isinstance(tasks, dict):
            raise RecordError("bad tasks")
        machines = [MachineRecord.from_json(m) for m in machines]
        keys = {m.key for m in machines}
        values = {f.name: data[f.name] for f in fields(cls)
                  if f.name in data and not f.metadata.get("local")}
        try:
            values["state"] = RunState(data.get("state") or "starting")
        except (ValueError, TypeError):
            raise RecordError("unknown run state %r" % data.get("state")) from None
        try:
            values.update(
                runs_dir=runs_dir, claimed=True, machines=machines,
                tasks={label: TaskRecord.from_json(label, t, keys) for label, t in tasks.items()},
                restart_log=[RestartEntry.from_json(e) for e in data.get("restart_log", [])],
                moves=[MoveEntry.from_json(e) for e in data.get("moves", [])],
                results=data.get("results") or {},
                provenance=data.get("provenance") and Provenance.from_json(data["provenance"]))
            return cls(**values)
        except (TypeError, AttributeError, ValueError) as err:
            raise RecordError("unexpected content (%s)" % err) from None
