"""Following a run: the agents' events become task states, log files, metrics and console lines;
the success policy and the first failure are decided from those states."""
import collections
import os
import queue
import signal
import time

from tfcluster.hosts import CLOSED
from tfcluster_agent import protocol as P

TRACKED_JOBS = ("chief", "worker")
TAIL_LINES = 20


class Monitor:
    """Task states of a run, fed by the events of every machine's agent."""

    def __init__(self, hosts, cluster, record_dir, reporter, metrics=None):
        self.hosts = hosts
        self.cluster = cluster
        self.reporter = reporter
        self.metrics = metrics
        self.by_name = {(t.machine.key, t.name): t for t in cluster.tasks}
        self.states = {}           # label -> {"alive", "exit", "state", "pid"}
        self.listening = set()     # labels of ps tasks that listen
        self.started_at = {}       # label -> time.time() of its start
        self.first_step_s = {}     # label -> seconds from start to its first metric
        self.results = {}          # label -> its last TFCLUSTER_RESULT
        self.tails = {t.label: collections.deque(maxlen=TAIL_LINES) for t in cluster.tasks}
        self.closed_links = set()
        self.record_dir = record_dir  # where logs are written; None: nowhere
        self.write_error = None
        self._logs = {}
        if record_dir:
            os.makedirs(record_dir, exist_ok=True)

    # ------------------------------------------------------------ events
    def pump(self, timeout):
        """Handle the next event (waiting up to TIMEOUT) and every one already queued."""
        try:
            item = self.hosts.events.get(timeout=timeout)
        except queue.Empty:
            return
        while True:
            self.handle(*item)
            try:
                item = self.hosts.events.get_nowait()
            except queue.Empty:
                return

    def wake(self):
        self.hosts.events.put((None, None))

    def handle(self, key, msg):
        if key is None:
            return
        if msg == CLOSED:
            self.closed_links.add(key)
            return
        task = self.by_name.get((key, getattr(msg, "name", None)))
        if task is None:
            return
        if isinstance(msg, P.Started):
            self.states[task.label] = {"alive": True, "exit": None, "state": "running",
                                       "pid": msg.pid}
            self.started_at[task.label] = msg.time
            self.reporter.task_started(task, msg.pid)
        elif isinstance(msg, P.Listening):
            self.listening.add(task.label)
        elif isinstance(msg, P.Output):
            self._output(task, msg.text)
        elif isinstance(msg, P.Exited):
            state = dict(self.states.get(task.label, {}), alive=False, exit=msg.code,
                         state=msg.state)
            self.states[task.label] = state
            self.reporter.task_exited(task, msg.code, task_state(task, state))

    def _output(self, task, text):
        if self.record_dir and self.write_error is None:
            try:
                log = self._logs.get(task.label)
                if log is None:
                    path = os.path.join(self.record_dir, task.name + ".log")
                    log = self._logs[task.label] = open(path, "a", encoding="utf-8")
                log.write(text)
                log.flush()
            except OSError as err:  # a full disk: the launcher fails the run, naming it
                self.write_error = err.strerror or str(err)
        for line in text.splitlines():
            self.tails[task.label].append(line)
            self.reporter.task_line(task, line)
            parsed = P.parse_line(line)
            if parsed is None:
                continue
            kind, values = parsed
            if kind == "result":
                self.results[task.label] = values
                continue
            point = dict(values, time=values.get("time") or time.time())
            if task.label not in self.first_step_s and task.label in self.started_at:
                self.first_step_s[task.label] = round(point["time"] - self.started_at[task.label], 3)
            if self.metrics is not None:
                self.metrics.add(task, point)
            self.reporter.task_metric(task, point)

    def close(self):
        for log in self._logs.values():
            try:
                log.close()
            except OSError:
                pass
        self._logs = {}

    # ------------------------------------------------------------ contact
    def lost_machines(self, seconds, ignore=()):
        """Machines not heard from for SECONDS, or whose agent's stream ended."""
        limit = time.monotonic() - seconds
        return [link.machine for key, link in self.hosts.links.items()
                if key not in ignore and link.hello is not None and
                (link.last_heard < limit or key in self.closed_links)]


def tracked(cluster):
    return [t for t in cluster.tasks if t.job in TRACKED_JOBS]


def policy_tasks(cluster, policy):
    chief = cluster.job_tasks("chief")
    workers = cluster.job_tasks("worker")
    if policy == "chief":
        return chief[:1] or workers[:1]
    if policy == "worker0":
        return workers[:1] or chief[:1]
    return chief + workers


def policy_met(cluster, states, policy):
    return all(states.get(t.label, {}).get("exit") == 0 for t in policy_tasks(cluster, policy))


def first_failure(cluster, states, ignore=()):
    """A tracked task that failed, or a ps that ended (workers would hang without it)."""
    for task in cluster.tasks:
        state = states.get(task.label)
        if not state or state.get("alive") or task.label in ignore:
            continue
        code = state.get("exit")
        if task.job in TRACKED_JOBS and code != 0:
            return task, "%s on %s %s" % (task.label, task.machine.address, describe_exit(state))
        if task.job == "ps":
            return task, "%s on %s ended while the run was active (%s)" % (
                task.label, task.machine.address, describe_exit(state))
    return None


def describe_exit(state):
    if state.get("state") == "lost":
        return "disappeared without an exit status"
    code = state.get("exit")
    if code is not None and code > 128:
        try:
            return "was killed by %s" % signal.Signals(code - 128).name
        except ValueError:
            pass
    return "exited with status %s" % code


def task_state(task, state):
    """The word for a task's end in summaries and records."""
    if not state:
        return "not started"
    if state.get("alive"):
        return "running"
    if state.get("state") == "lost":
        return "lost"
    code = state.get("exit")
    if code == 0:
        return "succeeded"
    if task.job == "ps" and code is not None and code >= 128:
        return "stopped"
    if code is not None and code in (128 + signal.SIGTERM, 128 + signal.SIGKILL):
        return "stopped"
    return "failed"
