"""The live view of a launch on a terminal: one table, a row per task, redrawn in place (rich).

    TASK       STATE     HOST        STEP          LOSS   EXAMPLES/S   LAST LINE  RESTARTS
    worker:0   running   10.0.0.12   120 (30%)     0.53   840          1s         0
    cluster: 1,680 examples/s, step 120 of 400, 4.1 steps/s, ETA 1m08s

with the last few log lines under it. Notes, failures and tables print above it at once.
"""
import collections
import sys
import threading
import time

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from tfcluster.runs.metrics import MetricsStore
from tfcluster.view.report import NoiseFilter, Reporter, is_metric
from tfcluster_agent.protocol import RESULT_PREFIX

TAIL_LINES = 6
STATE_STYLE = {"starting": "yellow", "restarting": "yellow", "running": "cyan",
               "stalled": "bold yellow",
               "succeeded": "green", "failed": "bold red", "lost": "bold red", "stopped": "dim"}


def _age(seconds):
    if seconds is None:
        return "-"
    seconds = int(max(0, seconds))
    if seconds < 60:
        return "%ds" % seconds
    if seconds < 3600:
        return "%dm%02ds" % divmod(seconds, 60)
    return "%dh%02dm" % (seconds // 3600, seconds % 3600 // 60)


def _number(value):
    if not isinstance(value, (int, float)):
        return "-"
    if abs(value) >= 100:
        return "{:,.0f}".format(value)
    return "%.4g" % value if isinstance(value, float) else str(value)


class _Row:
    def __init__(self, task):
        self.task = task
        self.state = "starting"
        self.pid = None
        self.exit = None
        self.restarts = 0
        self.last_line = None
        self.straggler = False
        self.slowest = False  # the worker a synchronous run waits for (diagnosis/slowest.py)


class LiveReporter(Reporter):
    def __init__(self, stream=None, verbose=False, console=None, live=True):
        self.console = console or Console(file=stream or sys.stdout)
        self.verbose = verbose
        self._noise = NoiseFilter()
        self.metrics = MetricsStore()  # in memory: the launcher keeps the run's metrics.jsonl
        self.target = None
        self._rows = {}
        self._tail = collections.deque(maxlen=TAIL_LINES)
        self._lock = threading.RLock()
        self._live = None
        if live:
            # Anything else printed meanwhile (warnings) goes above the table, not through it.
            self._live = Live(console=self.console, get_renderable=self.render,
                              refresh_per_second=4, transient=False, redirect_stdout=True,
                              redirect_stderr=True)
            self._live.start()

    def new_run(self):
        with self._lock:
            self._rows, self.target = {}, None
            self._tail.clear()
            self.metrics = MetricsStore()

    def _row(self, task):
        with self._lock:
            if task.label not in self._rows:
                self._rows[task.label] = _Row(task)
            return self._rows[task.label]

    def _print(self, renderable):
        # Through Live's console, lines land above the table, which is then redrawn.
        self.console.print(renderable, highlight=False, markup=False, soft_wrap=True)

    def note(self, message):
        self._print("tfcluster: " + message)

    def out(self, text=""):
        self._print(text)

    def task_started(self, task, pid):
        row = self._row(task)
        with self._lock:
            row.task = task  # where it runs now: a spare after a move
            row.state, row.pid, row.exit = "running", pid, None

    def task_line(self, task, line):
        row = self._row(task)
        with self._lock:
            row.last_line = time.time()
            # Result lines are long JSON and the summary table shows them.
            if self.verbose or not (self._noise.hides(task.label, line) or is_metric(line)
                                    or line.startswith(RESULT_PREFIX)):
                self._tail.append((task.label, line))

    def task_metric(self, task, point):
        self._row(task)
        self.metrics.add(task, point)
        # A program may say where it ends (the first point that says wins).
        if not self.target and isinstance(point.get("target_step"), (int, float)):
            self.target = int(point["target_step"])

    def task_exited(self, task, code, state):
        row = self._row(task)
        with self._lock:
            row.state, row.exit = state, code
        if state in ("failed", "lost"):
            self._print(Text("%s on %s %s (exit %s)" % (task.label, task.machine.address, state,
                                                        code), style="bold red"))

    def task_restarted(self, task, restarts):
        row = self._row(task)
        with self._lock:
            row.task = task
            row.restarts, row.state, row.exit = restarts, "restarting", None

    def task_stalled(self, task, stalled):
        row = self._row(task)
        with self._lock:
            if row.exit is None:
                row.state = "stalled" if stalled else "running"

    def task_straggling(self, task, straggling):
        row = self._row(task)
        with self._lock:
            row.straggler = straggling

    def task_slowest(self, task, slowest):
        row = self._row(task)
        with self._lock:
            row.slowest = slowest

    def render(self):
        """The table, the cluster line and the log tail, as one rich renderable."""
        now = time.time()
        latest = self.metrics.latest()
        with self._lock:
            if not self._rows:
                return Group()  # before any task started (preflight, or its error): no table
        table = Table(box=None, pad_edge=False, header_style="bold")
        for name, justify in (("TASK", "left"), ("STATE", "left"), ("HOST", "left"),
                              ("STEP", "right"), ("LOSS", "right"), ("EXAMPLES/S", "right"),
                              ("LAST LINE", "right"), ("RESTARTS", "right")):
            table.add_column(name, justify=justify, no_wrap=True)
        with self._lock:
            rows = list(self._rows.values())
            tail = list(self._tail)
        for row in rows:
            point = latest.get(row.task.label, {})
            step = point.get("step")
            step_text = "-"
            if isinstance(step, (int, float)):
                step_text = str(int(step))
                if self.target:
                    step_text += " (%d%%)" % min(100, int(100 * step / self.target))
            state = row.state if row.exit is None else "%s %s" % (row.state, row.exit)
            marks = [word for word, marked in (("straggler", row.straggler),
                                               ("slowest", row.slowest)) if marked]
            if marks and row.exit is None:
                state = ", ".join([state] + marks)
            table.add_row(row.task.label, Text(state, style="bold yellow" if marks and
                                               row.exit is None else
                                               STATE_STYLE.get(row.state, "")),
                          row.task.machine.address, step_text, _number(point.get("loss")),
                          _number(point.get("examples_per_s")),
                          # Silence matters while a task runs (a hang), not once it ended.
                          _age(now - row.last_line if row.last_line and row.exit is None
                               else None),
                          str(row.restarts))
        parts = [table, Text(self.cluster_line(now), style="bold")]
        parts += [Text("[%s] %s" % item, style="dim", no_wrap=True, overflow="ellipsis")
                  for item in tail]
        return Group(*parts)

    def cluster_line(self, now=None):
        with self._lock:
            running = {label for label, row in self._rows.items() if row.exit is None}
        # While some task trains, those that ended add nothing to the throughput.
        total = self.metrics.aggregate(self.target, now, running or None)
        parts = ["cluster: %s examples/s" % ("{:,.0f}".format(total["examples_per_s"])
                                             if total["examples_per_s"] is not None else "-")]
        if total["step"] is not None:
            parts.append("step %d" % total["step"]
                         + (" of %d" % self.target if self.target else ""))
        if total["steps_per_s"]:
            parts.append("%.3g steps/s" % total["steps_per_s"])
        if total["eta_s"] is not None:
            parts.append("ETA " + _age(total["eta_s"]))
        return ", ".join(parts)

    def close(self):
        if self._live is not None:
            self._live.stop()
            self._live = None
