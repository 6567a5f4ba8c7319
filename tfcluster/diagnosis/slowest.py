"""The slowest worker of synchronous training: the one the others wait for.

In synchronous training (MultiWorkerMirroredStrategy, SyncReplicasOptimizer) every worker takes
the same steps, so their step rates are equal and stragglers.py sees nobody. What differs is the
waiting: each metrics point carries the task's `busy` figure (trainers/common/loop.py: the seconds
its threads ran or waited for a CPU, per second), and a worker that finishes its share of a step
early sleeps in the collective until the slowest one is done. The slowest worker is the busiest
one; each other worker waits 1 - its busy / the slowest's busy of every step. Comparing waiting,
not speed, holds on a machine whose cores the workers share: a worker that waits for a CPU
counts as busy.

A run is judged only while its training tasks' rates (stragglers.StragglerWatch.rates) agree
within SYNCHRONOUS (asynchronous workers do not wait for each other). The busiest task is marked
once every other task has waited at least WAIT_MARK of each step, over the last WINDOW_S seconds
of points, for HOLD_S seconds in a row; it stays marked until the others' median wait falls under
WAIT_CLEAR or another task becomes the busiest (hysteresis: a healthy run's noise marks nobody).
"""
import time

from tfcluster.diagnosis import SLOWEST, Cause, wording
from tfcluster.spec.cluster import TRAINING_JOBS

WINDOW_S = 10.0
HOLD_S = 10.0
WAIT_MARK = 0.25    # of each step, by every other task: the busiest one is marked
WAIT_CLEAR = 0.12   # of each step, the others' median: the mark goes
SYNCHRONOUS = 0.8   # the slowest rate over the fastest: the tasks step together
MIN_BUSY = 0.05     # busy seconds per second of the busiest task: under it nobody computes


class SlowestWatch:
    def __init__(self, reporter, window=WINDOW_S, hold=HOLD_S):
        self.reporter = reporter
        self.window, self.hold = window, hold
        self.busy = {}        # label -> [(time, busy)] of its recent points
        self.running = {}     # label -> task, while it runs
        self.candidate = None  # (label, since): the busiest, the others waiting enough
        self.marked = None     # (label, since) of the task marked now
        self.named = {}        # label -> {"since", "seconds", "waits": [the others' median]}

    def started(self, task):
        if task.job in TRAINING_JOBS:
            self.running[task.label] = task
            self.busy.pop(task.label, None)

    def ended(self, task, now=None):
        self.running.pop(task.label, None)
        if self.marked and self.marked[0] == task.label:
            self._unmark(now or time.time(), quiet=True)

    def metric(self, task, point, now=None):
        busy = point.get("busy")
        if task.job not in TRAINING_JOBS or not isinstance(busy, (int, float)) \
                or isinstance(busy, bool) or busy < 0:
            return
        now = now or time.time()
        points = self.busy.setdefault(task.label, [])
        points.append((now, float(busy)))
        while len(points) > 1 and points[0][0] < now - self.window:
            points.pop(0)  # the newest point stays: a task that reports rarely is still judged

    def waits(self, rates, now):
        """(the busiest task's label, {other label: share of each step it waits}), or None when
        the running tasks cannot be compared now: fewer than two, a busy figure missing, rates
        that differ (not synchronous) or nobody computing."""
        recent = {}
        for label in self.running:
            points = [b for at, b in self.busy.get(label, ()) if at >= now - 3 * self.window]
            if not points:
                return None
            recent[label] = sum(points) / len(points)
        if len(recent) < 2 or set(rates) != set(recent) or min(rates.values()) <= 0 \
                or min(rates.values()) < SYNCHRONOUS * max(rates.values()):
            return None
        slowest = max(recent, key=recent.get)
        top = recent[slowest]
        if top < MIN_BUSY:
            return None
        return slowest, {label: 1.0 - busy / top for label, busy in recent.items()
                         if label != slowest}

    def tick(self, rates, now=None):
        """Judge with RATES ({label: rate} of the running training tasks, stragglers.py); the
        Cause (kind SLOWEST) of a task marked now, in a list."""
        import statistics
        now = now or time.time()
        found = self.waits(rates, now)
        if found is None:
            self.candidate = None
            return []  # nothing to judge by: a mark stays as it was
        slowest, waits = found
        median = statistics.median(waits.values())
        if self.marked is not None:
            if self.marked[0] != slowest or median < WAIT_CLEAR:
                self._unmark(now)
            else:
                self.named[slowest]["waits"].append(median)
                return []
        if min(waits.values()) < WAIT_MARK:
            self.candidate = None
            return []
        if self.candidate is None or self.candidate[0] != slowest:
            self.candidate = (slowest, now)
        since = self.candidate[1]
        if now - since < self.hold:
            return []
        self.candidate = None
        return [self._mark(slowest, since, now, median)]

    def _mark(self, label, since, now, median):
        self.marked = (label, since)
        named = self.named.setdefault(label, {"since": since, "seconds": 0.0, "waits": []})
        named["waits"].append(median)
        text = wording.slowest(label, median)
        self.reporter.note(text)
        self.reporter.task_slowest(self.running[label], True)
        return Cause(SLOWEST, text, (self.running[label],))

    def _unmark(self, now, quiet=False):
        label, since = self.marked
        self.marked = None
        self.named[label]["seconds"] += now - since
        if not quiet:
            self.reporter.note(wording.no_longer_slowest(label))
            self.reporter.task_slowest(self.running[label], False)

    def summary(self, now=None):
        """One line per task that was the slowest, for the run's summary."""
        import statistics
        now = now or time.time()
        lines = []
        for label, named in sorted(self.named.items()):
            seconds = named["seconds"]
            if self.marked and self.marked[0] == label:
                seconds += now - self.marked[1]
            lines.append(wording.was_slowest(label, seconds, named["since"],
                                             statistics.median(named["waits"])))
        return lines
