"""Pictures of runs: loss and examples/s against global step and time, one line per task, as an
SVG file that any browser opens (no display needed).

Written in-process in a few milliseconds: at a run's end (runs/<id>/metrics.svg) and by
`tfcluster plot`.
"""
import math
import os

from tfcluster.runs import metrics
from tfcluster.view import svgchart
from tfcluster.errors import UsageError
from tfcluster_agent.supervisor import write_atomic

FILE = "metrics.svg"
PANELS = (("loss", "step", "loss against global step"),
          ("loss", "time", "loss against time"),
          ("examples_per_s", "step", "examples/s against global step"),
          ("examples_per_s", "time", "examples/s against time"))
AXIS_TITLES = {"loss": "loss", "examples_per_s": "examples/s", "step": "global step",
               "time": "seconds since the first point"}
WIDTH, HEIGHT, TITLE_BAND = 960, 640, 36
LOG_RATIO = 50  # a loss falling by more than this is flat on a linear axis after its first points


def _series(store):
    """{task label: [records in time order]}, tasks sorted by label."""
    by_task = {}
    for record in sorted(store.records, key=lambda r: r["time"]):
        by_task.setdefault(record["task"], []).append(record)
    return dict(sorted(by_task.items()))


def _number(value):
    return type(value) in (int, float) and math.isfinite(value)  # not bool: True is no measure


def _tasks(runs):
    """[(legend label, records with a step, start)] of every task of RUNS [(run id, series)];
    START is the time of its run's first point. With several runs each label starts with the
    run id."""
    tasks = []
    for run_id, series in runs:
        start = min(records[0]["time"] for records in series.values())
        for task, records in series.items():
            tasks.append((task if len(runs) == 1 else "%s %s" % (run_id, task),
                          [r for r in records if _number(r.get("step"))], start))
    return tasks


def _points(records, value, against, start):
    """(x, y) of RECORDS that have VALUE; x is the step or the seconds since START."""
    if against == "step":
        return [(r["step"], r[value]) for r in records if _number(r.get(value))]
    return [(r["time"] - start, r[value]) for r in records if _number(r.get(value))]


def _falls_far(value, series):
    ys = [y for _, _, points in series for _, y in points]
    return value == "loss" and bool(ys) and min(ys) > 0 and max(ys) > LOG_RATIO * min(ys)


def render(runs):
    """The SVG text of RUNS [(run id, {task: records})]: a task has one colour in every panel."""
    tasks = _tasks(runs)
    colours = {label: svgchart.PALETTE[n % len(svgchart.PALETTE)]
               for n, (label, _, _) in enumerate(tasks)}
    width, height = WIDTH / 2, (HEIGHT - TITLE_BAND) / 2
    panels = []
    for n, (value, against, title) in enumerate(PANELS):
        series = [(label, colours[label], _points(records, value, against, start))
                  for label, records, start in tasks]
        series = [line for line in series if line[2]]
        box = (n % 2 * width, TITLE_BAND + n // 2 * height, width, height)
        panels.append(svgchart.panel(box, (title, AXIS_TITLES[against], AXIS_TITLES[value]),
                                     series, log_y=_falls_far(value, series)))
    return svgchart.document(WIDTH, HEIGHT, ", ".join(run_id for run_id, _ in runs), panels)


def _run_id(run_dir):
    return os.path.basename(os.path.normpath(run_dir))


def write_svg(run_dirs, out_path):
    """Draw the runs in RUN_DIRS into OUT_PATH, for `tfcluster plot`."""
    runs = [(_run_id(d), _series(metrics.load(d))) for d in run_dirs]
    empty = [run_id for run_id, series in runs if not series]
    if empty:
        raise UsageError("run %s has no metrics (no TFCLUSTER_METRIC points in its "
                         "metrics.jsonl): nothing to plot" % ", ".join(empty))
    try:
        os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
        write_atomic(out_path, render(runs))
    except OSError as err:
        raise UsageError("cannot write %s: %s (pick another -o FILE)"
                         % (out_path, err.strerror or err)) from None


def write_run_svg(run_dir, store, reporter):
    """RUN_DIR/metrics.svg of the points in STORE (a MetricsStore) at a run's end: its path, or
    None for a run without points. A disk that refuses it is a warning to REPORTER: the picture
    never changes a run's outcome."""
    if not store.records:
        return None
    path = os.path.join(run_dir, FILE)
    try:
        write_atomic(path, render([(_run_id(run_dir), _series(store))]))
    except OSError as err:
        reporter.note("WARNING cannot write %s: %s" % (path, err.strerror or err))
        return None
    return path
