"""Following a run: the agents' events become task states, log files, metrics and console lines;
the success policy is decided from those states, and every event goes on to the run's Diagnosis
(tfcluster/diagnosis/entry.py), which names the first failure, stalls and stragglers.

The monitor is the only writer of task state: the agents' events, the restarts the launcher
decides and the attach answers of status/logs/stop all go through it, and so do the task entries
of the run's record."""
import collections
import os
import queue
import time
import types

from tfcluster.diagnosis import rootcause
from tfcluster.diagnosis.entry import Diagnosis
from tfcluster.runs import store as runs
from tfcluster.hosts.links import CLOSED
from tfcluster.runs.record import RestartEntry, RunState, TaskState, TaskStatus, check_transition
from tfcluster.spec.cluster import TRAINING_JOBS
from tfcluster_agent import protocol as P
from tfcluster_agent.values import as_dict, replace

TAIL_LINES = 20


class Monitor:
    """Task states of a run, fed by the events of every machine's agent."""

    def __init__(self, hosts, cluster, record_dir, reporter, metrics=None):
        self.hosts = hosts
        self.reporter = reporter
        self.metrics = metrics
        self.placed(cluster)
        self._states = {}          # label -> TaskStatus; written by _set() alone
        self.listening = set()     # labels of ps tasks that listen
        self.started_at = {}       # label -> time.time() of its start
        self.ended_at = {}         # label -> time.time() its end was heard
        self.first_step_s = {}     # label -> seconds from start to its first metric
        self.results = {}          # label -> its last TFCLUSTER_RESULT
        self.tails = {t.label: collections.deque(maxlen=TAIL_LINES) for t in cluster.tasks}
        self.closed_links = set()
        self.record_dir = record_dir  # where logs are written; None: nowhere
        self.write_error = None
        self._logs = {}
        self.diagnosis = Diagnosis(self)  # why tasks wait, stall, lag or fail
        if record_dir:
            os.makedirs(record_dir, exist_ok=True)

    def placed(self, cluster):
        """Follow CLUSTER's tasks where they are now (again after a move to a spare)."""
        self.cluster = cluster
        self.by_name = {(t.machine.key, t.name): t for t in cluster.tasks}

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
        if isinstance(msg, P.Probed):
            self.diagnosis.probed(msg)
            return
        task = self.by_name.get((key, getattr(msg, "name", None)))
        if task is None:
            return
        if isinstance(msg, P.Started):
            self._set(task, state=TaskState.RUNNING, alive=True, exit=None, pid=msg.pid)
            self.started_at[task.label] = msg.time
            self.diagnosis.started(task)
            self.reporter.task_started(task, msg.pid)
        elif isinstance(msg, P.Listening):
            self.listening.add(task.label)
        elif isinstance(msg, P.Output):
            self._output(task, msg.text)
        elif isinstance(msg, P.Exited):
            self.ended_at[task.label] = time.time()
            state = self._set(task, alive=False, exit=msg.code, state=TaskState(msg.state))
            self.diagnosis.exited(task, msg.ended)
            self.reporter.task_exited(task, msg.code, str(task_state(task, state)))
        elif msg.kind in ("stalled", "resumed"):
            self.diagnosis.stall_event(task, msg)

    # ------------------------------------------------------------ task state
    def _set(self, task, **changes):
        """The one place a task's state changes (checked against TaskState's transitions)."""
        old = self._states.get(task.label)
        new = replace(old or TaskStatus(), **changes)
        check_transition(task.label, old.state if old else None, new.state)
        self._states[task.label] = new
        return new

    @property
    def states(self):
        """{label: TaskStatus}, to read: changes go through the methods below."""
        return types.MappingProxyType(self._states)

    def attached(self, answers):
        """The states the agents gave on attach: {label: their Attached entry}."""
        for task in self.cluster.tasks:
            if task.label in answers:
                answer = TaskStatus.from_agent(answers[task.label])
                self._set(task, **as_dict(answer))

    def restarting(self, task):
        self._set(task, state=TaskState.RESTARTING, alive=True, exit=None)
        if task.job == "ps":
            self.listening.discard(task.label)

    def alive(self, task):
        state = self.states.get(task.label)
        return bool(state and state.alive)

    def unfinished(self, task):
        """Alive, or started by its agent and not heard from yet: on a loaded machine a task's
        start can come after another task's end."""
        return task.label not in self.states or self.alive(task)

    # ------------------------------------------------------------ the record's task entries
    def record_started(self, record):
        """Every task's pid, and the run running."""
        for task in self.cluster.tasks:
            state = self.states.get(task.label)
            entry = record.tasks[task.label]
            entry.pid = state.pid if state else None
            entry.state = check_transition(task.label, entry.state, TaskState.RUNNING)
        record.become(RunState.RUNNING)
        record.started = runs.now()
        runs.save(record)

    def record_restart(self, record, task, why, whole):
        """Count a restart of TASK (of every task when WHOLE); returns the count."""
        entry = record.tasks[task.label]
        entry.restarts += 1
        record.restart_log.append(RestartEntry(task=task.label, why=why,
                                               scope="job" if whole else "task",
                                               time=runs.now()))
        return entry.restarts

    def record_end(self, record):
        """Every task's end in RECORD (not saved: the caller adds the run's end)."""
        for task in self.cluster.tasks:
            entry = record.tasks[task.label]
            state = self.states.get(task.label)
            entry.state = check_transition(task.label, entry.state, task_state(task, state))
            entry.exit = state.exit if state else None
            if state and state.pid is not None:
                entry.pid = state.pid
            entry.log = task.name + ".log"
            if task.label in self.first_step_s:
                entry.first_step_s = self.first_step_s[task.label]
            if task.label in self.results:
                record.results[task.label] = self.results[task.label]

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
            self.diagnosis.line(task, line)
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
            self.diagnosis.metric(task, point)
            self.reporter.task_metric(task, point)

    def close(self):
        for log in self._logs.values():
            try:
                log.close()
            except OSError:
                pass
        self._logs = {}

    # ------------------------------------------------------------ contact
    def lost_machines(self, seconds, spares=()):
        """Machines not heard from for SECONDS, or whose agent's stream ended; of the run's
        machines, and of the spares (SPARES: their keys) still waiting."""
        limit = time.monotonic() - seconds
        keys = {m.key for m, _ in self.cluster.machines()} | set(spares)
        return [link.machine for key, link in self.hosts.links.items()
                if key in keys and link.hello is not None and
                (link.last_heard < limit or key in self.closed_links)]


def tracked(cluster):
    return [t for t in cluster.tasks if t.job in TRAINING_JOBS]


def policy_tasks(cluster, policy):
    chief = cluster.job_tasks("chief")
    workers = cluster.job_tasks("worker")
    if policy == "chief":
        return chief[:1] or workers[:1]
    if policy == "worker0":
        return workers[:1] or chief[:1]
    return chief + workers


def chief_trains_alone(cluster, policy):
    """A run whose chief alone trains, its workers serving it (ParameterServerStrategy)."""
    return policy == "chief" and bool(cluster.job_tasks("chief"))


def serving_tasks(cluster, policy):
    """The tasks that serve the others and end only when stopped: every ps, and the workers of
    a run whose chief alone trains."""
    alone = chief_trains_alone(cluster, policy)
    return [t for t in cluster.tasks if t.job == "ps" or (alone and t.job == "worker")]


def policy_met(cluster, states, policy):
    """STATES: {label: TaskStatus}."""
    return all(states.get(t.label) is not None and states[t.label].exit == 0
               for t in policy_tasks(cluster, policy))


def task_state(task, state):
    """How a task ended (TaskStatus STATE), for summaries and records."""
    if not state:
        return TaskState.NOT_STARTED
    if state.alive:
        return TaskState.RUNNING
    if state.state == TaskState.LOST:
        return TaskState.LOST
    code = state.exit
    if code == 0:
        return TaskState.SUCCEEDED
    if task.job == "ps" and code is not None and code >= 128:
        return TaskState.STOPPED
    if code in rootcause.STOPPED_BY_US:
        return TaskState.STOPPED
    return TaskState.FAILED
