"""Stragglers: a chief or worker whose step rate stays below half the median of its peers'.

A task's rate is the work its metrics points account for over the last RATE_WINDOW_S seconds:
examples (each point's examples_per_s times the time since its previous point) when the tasks
report examples_per_s, else the steps they report. A task that prints nothing (stopped, stuck)
does no work in the window. Once a task's rate has stayed under half the median of its running
peers' for AFTER seconds, it is marked (the live view's row, a console line) until it catches up,
and the run's summary names it.
"""
import time

from tfcluster.diagnosis import STRAGGLER, Cause, wording
from tfcluster.diagnosis.marks import MarkedTasks
from tfcluster.spec.cluster import TRAINING_JOBS

RATE_WINDOW_S = 10.0
SLOWER_THAN = 0.5   # of the peers' median rate
UNIT = {"examples_per_s": "examples/s", "step": "steps/s"}


class StragglerWatch(MarkedTasks):
    UNMARKED = wording.caught_up
    ROW = "task_straggling"

    def __init__(self, reporter, after=30.0, window=RATE_WINDOW_S):
        super().__init__(reporter)  # named: {"since", "seconds", "worst": lowest rate share}
        self.after = after
        self.window = window
        self.series = {}       # label -> {"examples_per_s": [(time, work)], "step": [...]}
        self.below_since = {}  # label -> time its rate fell under the mark

    def started(self, task):
        if task.job in TRAINING_JOBS:
            self.running[task.label] = task
            self.series.pop(task.label, None)  # a restart starts its rate afresh

    def ended(self, task):
        self.running.pop(task.label, None)
        self._unmark(task.label, time.time(), quiet=True)

    def metric(self, task, point, now=None):
        if task.job not in TRAINING_JOBS:
            return
        now = now or time.time()
        series = self.series.setdefault(task.label, {"examples_per_s": [], "step": []})
        rate, step = point.get("examples_per_s"), point.get("step")
        if _number(rate):
            done = series["examples_per_s"]
            work = done[-1][1] + rate * (now - done[-1][0]) if done else 0.0
            done.append((now, work))
        if _number(step):
            series["step"].append((now, step))
        for points in series.values():  # what the window no longer needs
            while len(points) > 2 and points[1][0] < now - 2 * self.window:
                points.pop(0)

    def rates(self, now):
        """({label: rate over the window} of the running tasks with a full window, its unit)."""
        measure = "examples_per_s" if any(s["examples_per_s"] for s in self.series.values()) \
            else "step"
        found = {}
        for label in self.running:
            points = self.series.get(label, {}).get(measure)
            if not points or points[0][0] > now - self.window:
                continue  # too new to judge: its first point is inside the window
            start = [work for at, work in points if at <= now - self.window][-1]
            found[label] = max(0.0, points[-1][1] - start) / self.window
        return found, measure

    def tick(self, now=None):
        """Mark the tasks that now straggle, unmark those that caught up; the Causes of those
        marked now."""
        now = now or time.time()
        marked = []
        rates, measure = self.rates(now)
        if rates:  # statistics (decimal, fractions, random) only where a median is taken
            import statistics
        for label, rate in rates.items():
            peers = [r for other, r in rates.items() if other != label]
            median = statistics.median(peers) if peers else 0.0
            if median > 0 and rate < SLOWER_THAN * median:
                since = self.below_since.setdefault(label, now)
                named = self.named.get(label)
                if named is not None:
                    named["worst"] = min(named["worst"], rate / median)
                if label not in self.marked and now - since >= self.after:
                    marked.append(self._mark(label, since, now, rate, median, measure))
            else:
                self.below_since.pop(label, None)
                self._unmark(label, now)
        return marked

    def _mark(self, label, since, now, rate, median, measure):
        named = self._mark_on(label, since, worst=1.0)
        named["worst"] = min(named["worst"], rate / median)
        text = wording.straggling(label, rate, UNIT[measure], self.window, median, now - since)
        self.reporter.note(text)
        self.reporter.task_straggling(self.running[label], True)
        return Cause(STRAGGLER, text, (self.running[label],))

    def summary(self, now=None):
        """One line per task that straggled, for the run's summary."""
        now = now or time.time()
        lines = []
        for label, named in sorted(self.named.items()):
            lines.append(wording.straggled(label, self.marked_seconds(label, now), named["since"],
                                           named["worst"]))
        return lines


def _number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)
