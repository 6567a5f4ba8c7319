"""The console: every line a launch or a management command shows goes through one reporter.

`PlainReporter` prints today's prefixed lines (`[worker:1 10.0.0.12] ...`), which is what pipes,
CI and `--plain` get. Other reporters (a live view) implement the same methods.
"""
import sys


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

    def close(self):
        """The run is over: leave the terminal as a plain one."""


class PlainReporter(Reporter):
    def __init__(self, stream=None, prefix=True, echo=True):
        self.stream = stream or sys.stdout
        self.prefix = prefix
        self.echo = echo

    def _write(self, text):
        self.stream.write(text + "\n")
        self.stream.flush()

    def note(self, message):
        self._write("tfcluster: " + message)

    def out(self, text=""):
        self._write(text)

    def task_line(self, task, line):
        if self.echo:
            self._write(("[%s %s] " % (task.label, task.machine.address) if self.prefix else "")
                        + line)
