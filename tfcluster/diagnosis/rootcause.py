"""The first failure is the root cause: when several tasks fail, the report names the earliest
(its time, and its exit status or signal) first, and the others as following it.

A TensorFlow cluster fails in cascades: a ps dies, and every worker's next step fails with
UnavailableError a moment later. Naming the task that failed first in the list's order (the
workers come before the ps) blames a victim. Endings are ordered as the controller heard them
(one clock for every host, whose clocks may disagree), and each host's own ends by the times that
host recorded them.
"""
import signal

from tfcluster.diagnosis import END, Cause, wording
from tfcluster_agent import protocol as P
from tfcluster.runs.record import TaskState
from tfcluster.spec.cluster import TRAINING_JOBS

# The exit codes of our own stop: SIGTERM, and the SIGKILL after its grace.
# The last: a task that saved and ended on the termination notice (a drain).
STOPPED_BY_US = (128 + signal.SIGTERM, 128 + signal.SIGKILL, P.DRAINED_EXIT)


# A ps's end time is when its supervisor recorded it, which a loaded host may run a moment late:
# the workers it took down can be recorded first. A ps never ends because of a worker, so before
# the teardown its end counts as this much earlier among its host's ends.
PS_SLACK = 2.0


class EndOrder:
    """In which order the tasks ended, and where the teardown began among them: as the
    controller heard them, except that a host's own ends keep the order of their times on that
    host (an agent reports each end on its own, and a worker's can overtake its ps's)."""

    TEARDOWN = None

    def __init__(self):
        self._ends = []  # (label, machine key, host time or None), and TEARDOWN, in order
        self._places = {}  # label -> its index in _ends (the launcher asks on every tick)

    def exited(self, task, at=None):
        """TASK ended, at AT on its host's clock when known."""
        self._forget(task.label)
        place = len(self._ends)
        if at is not None and task.job == "ps" and self.TEARDOWN not in self._ends:
            at -= PS_SLACK
        if at is not None:
            place = next((i for i, end in enumerate(self._ends)
                          if end is not self.TEARDOWN and end[1] == task.machine.key
                          and end[2] is not None and end[2] > at), place)
        self._ends.insert(place, (task.label, task.machine.key, at))
        self._index()

    def started(self, task):
        self._forget(task.label)
        self._index()

    def _forget(self, label):
        self._ends = [end for end in self._ends if end is self.TEARDOWN or end[0] != label]

    def teardown_began(self):
        if self.TEARDOWN not in self._ends:
            self._ends.append(self.TEARDOWN)
            self._index()

    def _index(self):
        self._places = {end[0] if end is not self.TEARDOWN else self.TEARDOWN: i
                        for i, end in enumerate(self._ends)}

    def order(self, label):
        """Sort key: earlier ends first, tasks still running last."""
        return self._places.get(label, float("inf"))

    def ended(self, label):
        return self.order(label) != float("inf")

    def before_teardown(self, label):
        """Whether LABEL's end came before the teardown began (or no teardown began)."""
        return self.order(label) < self._places.get(self.TEARDOWN, float("inf"))


def first_failure(cluster, states, order=None):
    """The Cause (kind END) of a chief or worker that failed, or of a ps that ended (workers
    would hang without it), while the run goes on: the one that ended first when ORDER (label ->
    sort key, EndOrder.order) is given; None when none did."""
    for task in sorted(cluster.tasks, key=lambda t: order(t.label)) if order else cluster.tasks:
        state = states.get(task.label)
        if not state or state.alive:
            continue
        if (task.job in TRAINING_JOBS and state.exit != 0) or task.job == "ps":
            return Cause(END, wording.task_failed(task, state), (task,))
    return None


def failures(cluster, states, ended_at, ends):
    """[(task, its TaskStatus, end time)] of the tasks whose end failed the run, earliest
    first: a chief or worker that exited non-zero or vanished, a ps that ended, before the
    teardown; during the teardown, only those that failed by themselves (not our SIGTERM or
    the SIGKILL after it). ENDED_AT: {label: time}, ENDS: an EndOrder."""
    found = []
    for task in cluster.tasks:
        status = states.get(task.label)
        if status is None or status.alive or not ends.ended(task.label):
            continue
        lost = status.state == TaskState.LOST
        failed = (lost or status.exit != 0) if task.job in TRAINING_JOBS else task.job == "ps"
        before_teardown = ends.before_teardown(task.label)
        if failed and (before_teardown or lost or status.exit not in STOPPED_BY_US):
            found.append((task, status, ended_at.get(task.label)))
    found.sort(key=lambda item: ends.order(item[0].label))
    return found


def story(found):
    """The line that names the root cause first, or None for fewer than two failures:
    "worker:0 and worker:1 failed after ps:0 was killed by SIGKILL at 12:00:03" (those that
    followed in the cluster's order: their own order says little once the first is known)."""
    if len(found) < 2:
        return None
    (root, status, at), rest = found[0], found[1:]
    followers = sorted((task for task, _, _ in rest), key=lambda t: (t.job, t.index))
    return wording.story([t.label for t in followers], root.label, status, at)


def row_notes(found):
    """{label: the summary row's note}: the first failure, and what followed it."""
    if len(found) < 2:
        return {}
    root = found[0][0].label
    notes = {task.label: wording.after(root) for task, _, _ in found[1:]}
    notes[root] = wording.FIRST_FAILURE
    return notes
