"""Training metrics on the controller: runs/<id>/metrics.jsonl, per-task latest, cluster totals.

Every TFCLUSTER_METRIC point a task prints becomes one JSON line
`{"task": "worker:1", "time": 1795327149.5, "step": 120, "loss": 0.53, "examples_per_s": 840.0}`.
"""
import json
import os
import threading
import time

from tfcluster.spec.cluster import TRAINING_JOBS
from tfcluster_agent.protocol import parse_line

FILE = "metrics.jsonl"
# The cluster's step rate is measured over this many seconds of recent points.
RATE_WINDOW_S = 30.0


def _label(task):
    return task if isinstance(task, str) else task.label


class MetricsStore:
    """Points of one run, written to RUN_DIR/metrics.jsonl as they come (no RUN_DIR: in memory)."""

    def __init__(self, run_dir=None):
        self.path = os.path.join(run_dir, FILE) if run_dir else None
        self.records = []
        self._latest = {}
        self._steps = []  # (time, highest step so far), for the step rate
        self._lock = threading.Lock()
        self._file = None

    def add(self, task, point):
        """Store POINT (a dict with "step") of TASK (a spec.Task or a label); returns the record."""
        record = dict(point, task=_label(task))
        record.setdefault("time", time.time())
        with self._lock:
            self._remember(record)
            if self.path:
                if self._file is None:
                    os.makedirs(os.path.dirname(self.path), exist_ok=True)
                    self._file = open(self.path, "a", buffering=1)
                self._file.write(json.dumps(record, sort_keys=True) + "\n")
        return record

    def _remember(self, record):
        self.records.append(record)
        self._latest[record["task"]] = record
        step = record.get("step")
        if isinstance(step, (int, float)):
            top = max(step, self._steps[-1][1]) if self._steps else step
            self._steps.append((record["time"], top))

    def close(self):
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def latest(self):
        """{task label: its newest record}, for `tfcluster status` and the live view."""
        with self._lock:
            return dict(self._latest)

    def aggregate(self, target_step=None, now=None, tasks=None):
        """The cluster as a whole: {"examples_per_s", "step", "steps_per_s", "eta_s"}.

        examples_per_s sums the newest figure of every task (of TASKS, labels, when given: those
        still training); the step is the highest any task reported;
        the step rate is measured over the last RATE_WINDOW_S seconds; eta_s needs TARGET_STEP.
        """
        with self._lock:
            rates = [r.get("examples_per_s") for label, r in self._latest.items()
                     if tasks is None or label in tasks]
            steps = list(self._steps)
        rates = [rate for rate in rates if isinstance(rate, (int, float))]
        result = {"examples_per_s": sum(rates) if rates else None,
                  "step": steps[-1][1] if steps else None, "steps_per_s": None, "eta_s": None}
        if len(steps) >= 2:
            end_time, end_step = steps[-1]
            recent = [s for s in steps if s[0] >= end_time - RATE_WINDOW_S]
            start_time, start_step = recent[0] if len(recent) >= 2 else steps[0]
            if end_time > start_time and end_step > start_step:
                result["steps_per_s"] = (end_step - start_step) / (end_time - start_time)
        if target_step and result["steps_per_s"]:
            remaining = max(0.0, target_step - result["step"])
            since_last = max(0.0, (now or time.time()) - steps[-1][0])
            result["eta_s"] = max(0.0, remaining / result["steps_per_s"] - since_last)
        return result


def load(run_dir):
    """The stored points of a run as a MetricsStore (empty when the run has none)."""
    store = MetricsStore()
    path = os.path.join(run_dir, FILE)
    if os.path.exists(path):
        with open(path) as handle:
            for line in handle:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue  # a line cut short by a crash
                if isinstance(record, dict) and "task" in record:
                    record.setdefault("time", 0.0)
                    store._remember(record)
    return store


def points_from_log(text):
    """The TFCLUSTER_METRIC points in a task's log (no times: logs have none)."""
    points = []
    for line in text.splitlines():
        parsed = parse_line(line)
        if parsed and parsed[0] == "metric":
            points.append(parsed[1])
    return points


def efficiency(cluster_examples_per_s, single_examples_per_s, cores_used):
    """Distribution efficiency: the cluster's examples/s per core used, over one task's on one slot.

    CORES_USED is how many times the single task's cores the cluster used (e.g. 4 workers on the
    same kind of slot: 4). 1.0 is perfect scaling; below 0.5 communication dominates.
    """
    if not single_examples_per_s or not cores_used:
        return None
    return cluster_examples_per_s / (single_examples_per_s * cores_used)


def efficiency_message(cluster_examples_per_s, single_examples_per_s, cores_used):
    """The summary lines for --baseline: the figure, and a warning when it is below 0.5."""
    value = efficiency(cluster_examples_per_s, single_examples_per_s, cores_used)
    if value is None:
        return ["distribution efficiency: unknown (the single-task baseline reported no "
                "examples_per_s)"]
    lines = ["distribution efficiency %.2f: %.0f examples/s on %gx the cores of one task, "
             "which alone did %.0f examples/s (speed-up %.2fx)"
             % (value, cluster_examples_per_s, cores_used, single_examples_per_s,
                cluster_examples_per_s / single_examples_per_s)]
    if value < 0.5:
        lines.append("warning: efficiency below 0.5, communication dominates: fewer, larger "
                     "tasks or a bigger batch per step may train faster")
    return lines


def efficiency_lines(base, main):
    """The cluster's examples/s against the single task's, per core used."""
    def training(record):
        return [(label, entry) for label, entry in record.tasks.items()
                if entry.job in TRAINING_JOBS]

    def throughput(record):
        return sum((record.results.get(label) or {}).get("examples_per_s") or 0
                   for label, _ in training(record))

    cores = sum(e.intra_op_threads for _, e in training(main)) / max(
        1, sum(e.intra_op_threads for _, e in training(base)))
    return efficiency_message(throughput(main), throughput(base), cores)
