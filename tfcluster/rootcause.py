"""The first failure is the root cause: when several tasks fail, the report names the earliest
(its time, and its exit status or signal) first, and the others as following it.

A TensorFlow cluster fails in cascades: a ps dies, and every worker's next step fails with
UnavailableError a moment later. Naming the task that failed first in the list's order (the
workers come before the ps) blames a victim. Endings are ordered as the controller received
them: one clock for every host, and each host's own events in the order they happened.
"""
import itertools
import signal
import time

from tfcluster_agent.runmodel import TaskState

FAILING_JOBS = ("chief", "worker")  # a ps or evaluator never fails the run by its exit code
_STOPPED_BY_US = (128 + signal.SIGTERM, 128 + signal.SIGKILL)


class EndClock:
    """When each task ended, as the controller saw it: {label: (time, order)}."""

    def __init__(self):
        self.ended = {}
        self.teardown_at = None
        self._order = itertools.count()

    def exited(self, task):
        self.ended[task.label] = (time.time(), next(self._order))

    def started(self, task):
        self.ended.pop(task.label, None)

    def teardown_began(self):
        if self.teardown_at is None:
            self.teardown_at = next(self._order)

    def order(self, label):
        """Sort key: earlier endings first, tasks still running last."""
        return self.ended.get(label, (0.0, float("inf")))[1]


def failures(cluster, states, clock):
    """[(task, its TaskStatus, end time)] of the tasks whose ending failed the run, earliest
    first: a chief or worker that exited non-zero or vanished, a ps that ended, before the
    teardown; during the teardown, only those that failed by themselves (not our SIGTERM or
    the SIGKILL after it)."""
    found = []
    for task in cluster.tasks:
        status = states.get(task.label)
        if status is None or status.alive or task.label not in clock.ended:
            continue
        at, order = clock.ended[task.label]
        lost = status.state == TaskState.LOST
        before_teardown = clock.teardown_at is None or order < clock.teardown_at
        if task.job in FAILING_JOBS:
            failed = lost or status.exit != 0
        else:
            failed = task.job == "ps"
        if failed and (before_teardown or lost or status.exit not in _STOPPED_BY_US):
            found.append((task, status, at))
    found.sort(key=lambda item: clock.order(item[0].label))
    return found


def clock_time(at):
    return time.strftime("%H:%M:%S", time.localtime(at))


def how_it_ended(status, at):
    """"was killed (SIGKILL at 12:00:03)", "exited with status 1 at 12:00:03"..."""
    if status.state == TaskState.LOST:
        return "disappeared without an exit status at %s" % clock_time(at)
    code = status.exit
    if code is not None and code > 128:
        try:
            return "was killed (%s at %s)" % (signal.Signals(code - 128).name, clock_time(at))
        except ValueError:
            pass
    return "exited with status %s at %s" % (code, clock_time(at))


def joined(labels):
    """"a", "a and b", "a, b and c"."""
    return labels[0] if len(labels) == 1 else "%s and %s" % (", ".join(labels[:-1]), labels[-1])


def story(found):
    """The line that names the root cause first, or None for fewer than two failures:
    "worker:0 and worker:1 failed after ps:0 was killed (SIGKILL at 12:00:03)" (those that
    followed in the cluster's order: their own order says little once the first is known)."""
    if len(found) < 2:
        return None
    (root, status, at), rest = found[0], found[1:]
    followers = sorted((task for task, _, _ in rest), key=lambda t: (t.job, t.index))
    return "%s failed after %s %s" % (joined([t.label for t in followers]), root.label,
                                      how_it_ended(status, at))


def row_notes(found):
    """{label: the summary row's note}: the first failure, and what followed it."""
    if len(found) < 2:
        return {}
    root = found[0][0].label
    notes = {label: "after %s" % root for label in (task.label for task, _, _ in found[1:])}
    notes[root] = "first failure"
    return notes
