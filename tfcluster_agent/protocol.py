"""What crosses the boundary between a host and the controller, standard library only.

Imported by the agent, the trainers and the controller alike, so the two sides cannot drift:
- the lines a task prints to report metrics and its final result;
- the messages the agent and the controller exchange (JSON lines, see `Message`).

A program of your own reports progress by printing, on its standard output, one line per point:

    TFCLUSTER_METRIC {"step": 120, "loss": 0.53, "examples_per_s": 840.0, "accuracy": 0.81}

and at the end one result line with the same keys and its totals:

    TFCLUSTER_RESULT {"loss": 0.31, "initial_loss": 2.30, "accuracy": 0.90, "global_step": 400,
                      "train_time_s": 12.1, "examples_per_s": 1050.0}

or, with this file on its PYTHONPATH (tfcluster puts it there), `protocol.report_metric(...)` and
`protocol.report_result(...)`.

Before tfcluster stops a run's tasks in a drain (SIGTERM or SIGHUP to the launcher, `tfcluster
drain`), it writes the termination notice: the file $TFCLUSTER_DRAIN_FILE names. A program that
sees it (`protocol.drain_requested()`) saves its checkpoint and exits, with DRAINED_EXIT.
"""
import os
import sys

from tfcluster_agent import jsonc as json
from tfcluster_agent.values import as_dict, field, value_class

METRIC_PREFIX = "TFCLUSTER_METRIC "
RESULT_PREFIX = "TFCLUSTER_RESULT "

# The result schema every example reports; example-specific extras may follow.
RESULT_KEYS = ("loss", "initial_loss", "accuracy", "global_step", "train_time_s", "examples_per_s")


def _clean(values):
    """JSON-safe scalars: numbers as floats/ints, NaN and infinities as None."""
    clean = {}
    for key, value in values.items():
        if value is None:
            continue
        if hasattr(value, "item"):  # numpy scalars
            value = value.item()
        if isinstance(value, float) and (value != value or abs(value) == float("inf")):
            value = None
        clean[str(key)] = value
    return clean


def metric_line(step, loss=None, examples_per_s=None, **scalars):
    values = dict(step=int(step), loss=loss, examples_per_s=examples_per_s, **scalars)
    return METRIC_PREFIX + json.dumps(_clean(values), sort_keys=True)


def report_metric(step, loss=None, examples_per_s=None, stream=None, **scalars):
    """Print one metrics point for the controller (and flush: it must arrive now)."""
    stream = stream or sys.stdout
    stream.write(metric_line(step, loss, examples_per_s, **scalars) + "\n")
    stream.flush()


def report_result(results, stream=None):
    stream = stream or sys.stdout
    stream.write(RESULT_PREFIX + json.dumps(_clean(results), sort_keys=True) + "\n")
    stream.flush()


def parse_line(line):
    """("metric" | "result", dict) for a reporting line, else None."""
    for kind, prefix in (("metric", METRIC_PREFIX), ("result", RESULT_PREFIX)):
        if line.startswith(prefix):
            try:
                value = json.loads(line[len(prefix):])
            except ValueError:
                return None
            return (kind, value) if isinstance(value, dict) else None
    return None


# ---------------------------------------------------------------- the termination notice

DRAIN_FILE_ENV = "TFCLUSTER_DRAIN_FILE"
DRAIN_FILE = "drain"  # in the task's host run folder, beside its log
# How a program that drained exits: TensorFlow's own (PreemptionCheckpointHandler's exit_fn
# outside Google's platforms), so that a launcher tells it from a failure.
DRAINED_EXIT = 42


def drain_requested(environ=None):
    """True once tfcluster wrote this task's termination notice: checkpoint and exit."""
    path = (os.environ if environ is None else environ).get(DRAIN_FILE_ENV)
    return bool(path) and os.path.exists(path)


# ---------------------------------------------------------------- a cluster that changed

CLUSTER_FILE_ENV = "TFCLUSTER_CLUSTER_FILE"
# In the task's host run folder: written when some tasks of the run moved to a spare and the
# others go on (a ParameterServerStrategy worker); TF_CONFIG's "cluster", JSON, whole or absent.
CLUSTER_FILE = "cluster.json"


# ---------------------------------------------------------------- the stall watch

# The shortest stall_after the watch takes (watch_stalls, tfcluster_agent/stall.py), which the
# controller checks its settings against: a stall shorter than this could not be seen in time.
MIN_STALL_AFTER = 1.0


# ---------------------------------------------------------------- task names

def task_label(job, index):
    """worker:0: how records, metrics and the console name a task."""
    return "%s:%d" % (job, index)


def task_file_name(job, index):
    """worker-0: a task's name in file names (its log, pid record, TensorBoard folder)."""
    return "%s-%d" % (job, index)


class TaskNames:
    """The two names of a task that has a JOB and an INDEX: its label and its file name."""

    @property
    def label(self):
        return task_label(self.job, self.index)

    @property
    def name(self):
        return task_file_name(self.job, self.index)


# ---------------------------------------------------------------- agent <-> controller messages
#
# One JSON object per line, {"type": KIND, ...fields}. The controller starts one agent per machine
# (`agent.py serve`) and talks to it over the agent's stdin/stdout: a local pipe or one SSH channel.
# Task specs and their environment travel here, never on a command line.

MESSAGES = {}


def message(cls):
    """A message class: a value class (values.py) the decoder knows by its KIND."""
    MESSAGES[cls.kind] = value_class(cls)
    return cls


def encode(msg):
    return json.dumps(dict(as_dict(msg), type=msg.kind), separators=(",", ":")) + "\n"


# Messages defined by the module that uses them, loaded with the first one: the agent's start
# pays nothing for them.
DEFINED_IN = dict.fromkeys(("watch_stalls", "take_stacks", "stalled", "resumed"),
                           "tfcluster_agent.stall")
DEFINED_IN.update(dict.fromkeys(("start_profilers", "trace_profile", "profile_files"),
                                "tfcluster_agent.profiler"))


def decode(line):
    """The message a line carries; ValueError for anything else."""
    data = json.loads(line)
    kind = data.pop("type", None) if isinstance(data, dict) else None
    if kind in DEFINED_IN and kind not in MESSAGES:
        __import__(DEFINED_IN[kind])
    cls = MESSAGES.get(kind)
    if cls is None:
        raise ValueError("not a tfcluster message: %r" % line[:200])
    known = set(cls.field_names)
    return cls(**{k: v for k, v in data.items() if k in known})


# controller -> agent

@message
class Preflight:
    kind = "preflight"
    python: str
    ports: list
    code_dir: str
    cache_dir: str = ""  # "~": the host's cache folder (cachedir.py); "": none
    # [data set, folder] pairs the machine's tasks read from disk (trainers/datafiles.py).
    datasets: list = field(default_factory=list)
    nvidia_smi: str = ""  # the GPU query's program ("": nvidia-smi on the agent's PATH)
    # Lab hosts (shares.py): the workdir whose token to report, the firewall's ruleset to look
    # for ("": do not look).
    workdir: str = ""
    fence_file: str = ""


@message
class ClaimGpus:
    """Claim GPUS ({uuid: [task names]}) for RUN, all or none, until the tasks end; WAIT puts
    the run in the host's queue. Answered by a Report: {"taken": {uuid: holder}, "ahead": [...]}."""
    kind = "claim_gpus"
    run: str
    gpus: dict
    wait: bool = False


@message
class GpuQuery:
    """What the host's GPUs are doing and who holds them; answered by a Report."""
    kind = "gpu_query"
    nvidia_smi: str = ""


@message
class Start:
    """Start TASKS (dicts: name, command, env, env_prepend, cwd, port, await_listening) in a
    new run folder. The agent claims each port for its task's life, and reports when the task
    listens on it unless await_listening is false."""
    kind = "start"
    run_dir: str
    tasks: list
    lease: float = 0.0
    restart: bool = False  # start tasks again in the existing folder (the restart policy)
    # This launch's token when RUN_DIR is this machine's folder inside a run folder that other
    # machines share (shares.make_run_folder); "" otherwise.
    launch: str = ""


@message
class Attach:
    """Watch an existing run folder; stream logs from the start (or only from now)."""
    kind = "attach"
    run_dir: str
    from_start: bool = True


@message
class Stop:
    """Stop the tasks NAMES: TERM, then KILL after GRACE s. With DRAIN s, the termination
    notice (DRAIN_FILE, holding REASON) comes first, and the tasks get DRAIN s to end."""
    kind = "stop"
    names: list
    ports: list
    grace: float = 10.0
    drain: float = 0.0
    reason: str = ""


@message
class NewCluster:
    """Some tasks of the run moved: write CLUSTER (TF_CONFIG's "cluster") to CLUSTER_FILE in the
    run folder, where the tasks of this machine that go on read it."""
    kind = "new_cluster"
    cluster: dict


@message
class Collect:
    """Send the run folder's files under these subfolders (TensorBoard events...)."""
    kind = "collect"
    folders: list


@message
class Listen:
    """Listen on PORTS until the tasks start, for the reachability check (reach.py); answered
    by a Report: {"failed": {port: why}}."""
    kind = "listen"
    ports: list


@message
class Reach:
    """Connect to TARGETS ([key, host, port]) within TIMEOUT s. Answered by a Report
    {"results": {key: "reached" | "refused" | "timed out" | another reason}}; with an ID (while
    tasks run) by a Probed event carrying it, not a reply."""
    kind = "reach"
    targets: list
    timeout: float = 5.0
    id: str = ""


@message
class Ping:
    kind = "ping"


@message
class Detach:
    """The controller leaves; the tasks go on without a lease."""
    kind = "detach"


# agent -> controller

@message
class Hello:
    kind = "hello"
    pid: int
    hostname: str
    boot_id: str


@message
class Report:
    kind = "report"
    report: dict


@message
class Accepted:
    """The request was taken (start, detach); its effects follow as events."""
    kind = "accepted"


@message
class Started:
    kind = "started"
    name: str
    pid: int
    time: float


@message
class Listening:
    kind = "listening"
    name: str
    port: int


@message
class Output:
    """Whole lines a task printed (a partial last line only once it ended)."""
    kind = "output"
    name: str
    text: str


@message
class Exited:
    kind = "exited"
    name: str
    code: int | None
    state: str  # exited | lost
    ended: float | None = None  # when, on the host's clock (its exit status's record)


@message
class Attached:
    kind = "attached"
    tasks: dict = field(default_factory=dict)  # name -> {pid, alive, exit, state}


@message
class Stopped:
    kind = "stopped"
    tasks: dict
    busy_ports: list
    remaining: list


@message
class File:
    kind = "file"
    path: str
    data: str  # base64


@message
class Collected:
    kind = "collected"
    count: int


@message
class Probed:
    kind = "probed"
    id: str
    results: dict


@message
class Heartbeat:
    kind = "heartbeat"


@message
class Error:
    """A request failed; the message says why, in one line."""
    kind = "error"
    message: str
