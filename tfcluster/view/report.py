"""The console: every line a launch or a management command shows goes through one reporter.

`PlainReporter` prints today's prefixed lines (`[worker:1 10.0.0.12] ...`), which is what pipes,
CI and `--plain` get. `tfcluster.view.live.LiveReporter` implements the same methods as a live table;
`tfcluster.view.console.make_reporter` picks one (rich is imported only for a terminal).

Quiet by default: the lines in NOISE (TensorFlow's harmless start-up and shutdown chatter) stay in
the log files but are not shown unless `verbose`. Raw TFCLUSTER_METRIC lines are not shown either:
the plain reporter prints each point as a short readable line instead; TFCLUSTER_RESULT lines are
shown as they are (they are the task's final word, and scripts grep for them).
"""
import functools
import re
import sys
import threading

from tfcluster_agent.protocol import parse_line

# Each is harmless and says nothing about the run; matched anywhere in the line.
NOISE = (
    # oneDNN and CPU instruction notices at import (and the notice's second line).
    r"oneDNN custom operations are on",
    r"cpu_feature_guard\.cc",
    r"This TensorFlow binary is optimized to use available CPU instructions",
    r"^To enable the following instructions: .* rebuild TensorFlow with the appropriate compiler",
    # absl's notice before logging is set up.
    r"All log messages before absl::InitializeLog\(\) is called are written to STDERR",
    # CUDA libraries probed on a machine without a GPU.
    r"Could not find cuda drivers on your machine",
    r"Unable to register cu(DNN|FFT|BLAS) factory",
    r"computation placer already registered",
    r"TF-TRT Warning: Could not find TensorRT",
    r"failed call to cuInit",
    r"cuda_executor\.cc.*(NUMA node|successful NUMA)",
    # gRPC server start (tfcluster prints its own "serving at" line).
    r"grpc_server_lib\.cc.*Started server with target",
    # Rendezvous, collective and coordination aborts while tasks shut down after success;
    # a real failure shows in the task's exit status and its own error lines.
    r"Local rendezvous is aborting with status: (ABORTED|OUT_OF_RANGE|CANCELLED)",
    r"local_rendezvous\.cc.*(ABORTED|OUT_OF_RANGE|CANCELLED|End of sequence)",
    r"Collective ops is aborted by",
    r"collective_ops.*(Cancelled|CANCELLED|ABORTED)",
    r"coordination_service_agent\.cc.*(Shutdown|shut down|heartbeat)",
    # tf.data notices about generator datasets and iterators closed at the end.
    r"dataset\.cc.*will not be optimized because the dataset does not implement",
    r"OUT_OF_RANGE: End of sequence",
    r"Your input ran out of data; interrupting training",
    # Every other INFO line of TensorFlow's C++ log (tasks run at TF_CPP_MIN_LOG_LEVEL=0), but
    # the one that tells a task waits for a peer: tfcluster.diagnosis.causes names why.
    r"^(I\d{4} \d\d:\d\d:\d+\.\d+ +\d+|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: I) "
    r"\S+:\d+\] (?!CreateSession still waiting)",
    # Step statistics collected on a machine without a GPU.
    r"xplane_to_step_stats\.cc.*GPU trace was not collected",
    # Grappler's placement notes.
    r"devices\.cc.*Number of eligible GPUs",
    r"single_machine\.cc.*Starting new session",
)


@functools.lru_cache(maxsize=1)
def noise_pattern():
    """NOISE as one pattern, compiled at the first line a task prints (a launch whose tasks print
    nothing never pays for it)."""
    return re.compile("|".join("(?:%s)" % pattern for pattern in NOISE))


def is_noise(line):
    return noise_pattern().search(line) is not None


# A TensorFlow log message goes on over several lines, without the log prefix, when it prints
# a protobuf as text (`SessionOptions: ...` then `device_count {`, `  key: "CPU"`, `}`...) or
# a list of tasks (`Example stragglers:` then `/job:worker/replica:0/task:1`). A field's value
# is one word or a quoted string: a program's own `chief: 2 workers, ...` is not a field.
CONTINUED = re.compile(r'^\s*(\w+ \{|\w+: (?:"[^"]*"|\S+)|\}|/job:\S+|)$')


class NoiseFilter:
    """is_noise() per task, with memory: the lines that continue a hidden message are hidden
    with it."""

    def __init__(self):
        self._continuing = set()  # labels of tasks whose last line was hidden noise

    def hides(self, label, line):
        if is_noise(line) or (label in self._continuing and CONTINUED.match(line)):
            self._continuing.add(label)
            return True
        self._continuing.discard(label)
        return False


def is_metric(line):
    """A well-formed TFCLUSTER_METRIC line (a malformed one is shown, so it can be fixed)."""
    parsed = parse_line(line)
    return parsed is not None and parsed[0] == "metric"


def _point_order(item):
    first = ("loss", "examples_per_s")
    return (first.index(item[0]) if item[0] in first else len(first), item[0])


def format_point(point):
    """A metrics point as a short line: "step 120  loss 0.5300  840 examples/s  accuracy 0.81"."""
    parts = ["step %s" % point.get("step", "?")]
    for key, value in sorted(point.items(), key=_point_order):
        if key in ("step", "time") or value is None:
            continue
        if key == "examples_per_s" and isinstance(value, (int, float)):
            parts.append("%.0f examples/s" % value)
        elif isinstance(value, float):
            parts.append("%s %.4g" % (key, value))
        else:
            parts.append("%s %s" % (key, value))
    return "  ".join(parts)


class Reporter:
    """What the launcher tells the console. Every method may be called from any thread."""

    def note(self, message):
        """A controller message: "tfcluster: MESSAGE"."""

    def out(self, text=""):
        """A line of a table or report, printed as it is."""

    def task_started(self, task, pid):
        """TASK (a spec.Task) was started with PID."""

    def task_line(self, task, line):
        """A line TASK printed (metrics and result lines included)."""

    def task_metric(self, task, point):
        """A parsed TFCLUSTER_METRIC point of TASK, with "time" (seconds since the epoch)."""

    def task_exited(self, task, code, state):
        """TASK ended with exit CODE; STATE is succeeded, failed, stopped or lost."""

    def task_restarted(self, task, restarts):
        """TASK was restarted; RESTARTS is how often so far."""

    def task_stalled(self, task, stalled):
        """TASK stalled (STALLED true) or goes on again; a note says so too."""

    def task_straggling(self, task, straggling):
        """TASK became a straggler (STRAGGLING true) or caught up; a note says so too."""

    def task_slowest(self, task, slowest):
        """TASK became the worker a synchronous run waits for (SLOWEST true) or no longer is; a
        note says so too."""

    def new_run(self):
        """Another run's tasks follow (--baseline runs two): forget the last one's."""

    def close(self):
        """The command is over: leave the terminal as a plain one. Its caller closes it, once."""


class PlainReporter(Reporter):
    def __init__(self, stream=None, prefix=True, echo=True, verbose=False):
        self.stream = stream or sys.stdout
        self.prefix = prefix
        self.echo = echo
        self.verbose = verbose
        self._noise = NoiseFilter()
        self._lock = threading.Lock()  # one whole line at a time from every thread
        self.task_lines = 0  # the tasks' lines shown

    def _write(self, text):
        with self._lock:
            self.stream.write(text + "\n")
            self.stream.flush()

    def _task_write(self, task, text):
        self.task_lines += 1
        self._write(("[%s %s] " % (task.label, task.machine.address) if self.prefix else "") + text)

    def note(self, message):
        self._write("tfcluster: " + message)

    def out(self, text=""):
        self._write(text)

    def task_line(self, task, line):
        if not self.echo:
            return
        if not self.verbose and (self._noise.hides(task.label, line) or is_metric(line)):
            return
        self._task_write(task, line)

    def task_metric(self, task, point):
        # Verbose mode already showed the raw line.
        if self.echo and not self.verbose:
            self._task_write(task, format_point(point))
