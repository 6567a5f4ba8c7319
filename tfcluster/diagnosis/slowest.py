"""The slowest worker of synchronous training: the one the others wait for.

In synchronous training (MultiWorkerMirroredStrategy, SyncReplicasOptimizer) every worker takes
the same steps, so their step rates are equal and stragglers.py sees nobody. What differs is the
waiting, read from each task's metrics points (trainers/common/loop.py):
- `wait`, where the trainer times its collective apart (multi_worker_mirrored): the share of the
  time it spent in the all-reduce. The slowest worker waits least; each other one waits its own
  share minus the slowest's (what is left is the transfer itself) for it.
- else `busy`: the seconds its threads ran or waited for a CPU, per second. A worker that finished
  its share of a step early sleeps until the slowest one is done, so the slowest is the busiest;
  each other one waits 1 - its busy / the slowest's of every step.
Both compare waiting, not speed: on a machine whose cores the workers share, a worker that waits
for a CPU is not waiting for its peers.

A run is judged only while its training tasks' rates (the examples_per_s they report, else
stragglers.StragglerWatch.rates) agree within SYNCHRONOUS (asynchronous workers do not wait for
each other). Each task's figure is the median of its points of the last WINDOW_S seconds (at
least MIN_POINTS of them), once it has reported for WINDOW_S (a task's first seconds, its
warm-up, are not like the rest). The slowest task is marked once every other task has waited
at least WAIT_MARK of each step for it (BUSY_MARK where busy alone decides: the threads' time
is a noisier figure than a timed collective), for HOLD_S seconds in a row; it stays marked until
the others' median wait falls under WAIT_CLEAR or another task becomes the slowest (hysteresis:
a healthy run's noise marks nobody).
"""
import time

from tfcluster.diagnosis import SLOWEST, Cause, wording
from tfcluster.diagnosis.marks import MarkedTasks
from tfcluster.spec.cluster import TRAINING_JOBS

WINDOW_S = 10.0
HOLD_S = 5.0
WAIT_MARK = 0.15    # of each step, by every other task: the slowest one is marked (healthy
                    # runs' timed waits differ by 0.12 at most; half a share leaves 0.19+)
BUSY_MARK = 0.3     # the same, judged by busy alone: a healthy run's medians differ up to 0.19
WAIT_CLEAR = 0.1    # of each step, the others' median: the mark goes
SYNCHRONOUS = 0.8   # the slowest rate over the fastest: the tasks step together
MIN_BUSY = 0.05     # busy seconds per second of the busiest task: under it nobody computes
MIN_POINTS = 3      # each task's figures judged at least: the median of fewer is one odd point


class SlowestWatch(MarkedTasks):
    """One task marked at a time; NAMED's "waits": (sum, count) of the others' median wait, each
    tick it was marked."""
    UNMARKED = wording.no_longer_slowest
    ROW = "task_slowest"

    def __init__(self, reporter, window=WINDOW_S, hold=HOLD_S):
        super().__init__(reporter)
        self.window, self.hold = window, hold
        self.points = {}      # label -> [(time, busy, wait, examples_per_s)] of its recent points
        self.first = {}       # label -> the time of its first point: its warm-up is a window long
        self.candidate = None  # (label, since): the busiest, the others waiting enough

    def started(self, task):
        if task.job in TRAINING_JOBS:
            self.running[task.label] = task
            self.points.pop(task.label, None)
            self.first.pop(task.label, None)

    def ended(self, task, now=None):
        self._unmark(task.label, now or time.time(), quiet=True)
        self.running.pop(task.label, None)

    def metric(self, task, point, now=None):
        figures = [point.get(key) for key in ("busy", "wait", "examples_per_s")]
        figures = [f if _share(f) else None for f in figures]
        if task.job not in TRAINING_JOBS or figures[:2] == [None, None]:
            return
        now = now or time.time()
        points = self.points.setdefault(task.label, [])
        self.first.setdefault(task.label, now)
        points.append((now, *figures))
        while len(points) > MIN_POINTS and points[0][0] < now - self.window:
            points.pop(0)  # the newest few stay: a task that reports rarely is still judged

    def waits(self, rates, now):
        """(the slowest task's label, {other label: share of each step it waits for it}, the
        wait that marks it: WAIT_MARK or BUSY_MARK), or None when the running tasks cannot be
        compared now: fewer than two, a figure missing, rates that differ (not synchronous) or
        nobody computing. Each figure is the median of the window's points: one odd point (a
        task's first, which holds its warm-up, or one that a burst of the machine's other work
        fell into) moves it little."""
        import statistics  # here, not at the top: its imports would cost `tfcluster runs`
        busy, wait, reported = {}, {}, {}
        for label in self.running:
            points = self.points.get(label, ())
            if not points or points[-1][0] < now - 3 * self.window \
                    or self.first[label] > now - self.window:
                continue  # no figures, none of late, or its first window: not comparable
            for found, index in ((busy, 1), (wait, 2), (reported, 3)):
                figures = [p[index] for p in points if p[index] is not None]
                if len(figures) >= MIN_POINTS:
                    found[label] = statistics.median(figures)
        if len(reported) == len(self.running):
            rates = reported  # the tasks' own rates: a window of few points counts them unevenly
        if len(self.running) < 2 or set(rates) != set(self.running) or min(rates.values()) <= 0 \
                or min(rates.values()) < SYNCHRONOUS * max(rates.values()):
            return None
        if len(wait) == len(self.running):
            slowest = min(wait, key=wait.get)
            return slowest, {label: share - wait[slowest] for label, share in wait.items()
                             if label != slowest}, WAIT_MARK
        if len(busy) < len(self.running) or max(busy.values()) < MIN_BUSY:
            return None
        slowest = max(busy, key=busy.get)
        return slowest, {label: 1.0 - share / busy[slowest] for label, share in busy.items()
                         if label != slowest}, BUSY_MARK

    def tick(self, rates, now=None):
        """Judge with RATES ({label: rate} of the running training tasks, stragglers.py); the
        Cause (kind SLOWEST) of a task marked now, in a list."""
        import statistics  # here: decimal, fractions and random cost `tfcluster runs` ~20 ms
        now = now or time.time()
        found = self.waits(rates, now)
        if found is None:
            self.candidate = None
            return []  # nothing to judge by: a mark stays as it was
        slowest, waits, mark = found
        median = statistics.median(waits.values())
        if self.marked:
            marked, = self.marked
            if marked != slowest or median < WAIT_CLEAR:
                self._unmark(marked, now)
            else:
                self._count(slowest, median)
                return []
        if min(waits.values()) < mark:
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
        self._mark_on(label, since, waits=(0.0, 0))
        self._count(label, median)
        text = wording.slowest(label, median)
        self.reporter.note(text)
        self.reporter.task_slowest(self.running[label], True)
        return Cause(SLOWEST, text, (self.running[label],))

    def _count(self, label, median):
        total, count = self.named[label]["waits"]
        self.named[label]["waits"] = (total + median, count + 1)

    def summary(self, now=None):
        """One line per task that was the slowest, for the run's summary."""
        now = now or time.time()
        lines = []
        for label, named in sorted(self.named.items()):
            total, count = named["waits"]
            lines.append(wording.was_slowest(label, self.marked_seconds(label, now),
                                             named["since"], total / count))
        return lines


def _share(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0
