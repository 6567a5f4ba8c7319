"""Pictures of runs: loss and examples/s against global step and time, one line per task.

Headless (matplotlib's Agg backend): works over SSH and in CI.
"""
import os

from tfcluster import metrics
from tfcluster.errors import UsageError

PANELS = (("loss", "step", "loss against global step"),
          ("loss", "time", "loss against time"),
          ("examples_per_s", "step", "examples/s against global step"),
          ("examples_per_s", "time", "examples/s against time"))


def _series(store):
    """{task label: [records in time order]}, tasks sorted by label."""
    by_task = {}
    for record in sorted(store.records, key=lambda r: r["time"]):
        by_task.setdefault(record["task"], []).append(record)
    return dict(sorted(by_task.items()))


def _cannot_write(path, err):
    return UsageError("cannot write %s: %s (pick another -o FILE)" % (path, err.strerror or err))


def write_png(run_dirs, out_path):
    """Draw the runs in RUN_DIRS into OUT_PATH; returns the legend labels drawn.

    With several runs each label starts with the run id (the folder's name).
    """
    runs = [(os.path.basename(os.path.normpath(d)), _series(metrics.load(d))) for d in run_dirs]
    empty = [run_id for run_id, series in runs if not series]
    if empty:
        raise UsageError("run %s has no metrics (no TFCLUSTER_METRIC points in its "
                         "metrics.jsonl): nothing to plot" % ", ".join(empty))
    try:  # before drawing: a bad -o FILE fails at once
        os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    except OSError as err:
        raise _cannot_write(out_path, err) from None
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(2, 2, figsize=(12, 8))
    labels = []
    for run_id, series in runs:
        start = min(records[0]["time"] for records in series.values())
        for task, records in series.items():
            label = task if len(runs) == 1 else "%s %s" % (run_id, task)
            drawn = False
            for axis, (value, against, _) in zip(axes.flat, PANELS):
                points = [(r["step"] if against == "step" else r["time"] - start, r[value])
                          for r in records
                          if isinstance(r.get(value), (int, float)) and "step" in r]
                if points:
                    xs, ys = zip(*points)
                    axis.plot(xs, ys, marker="." if len(points) < 30 else None, label=label)
                    drawn = True
            if drawn:
                labels.append(label)
    for axis, (value, against, title) in zip(axes.flat, PANELS):
        axis.set_title(title)
        axis.set_xlabel("global step" if against == "step" else "seconds since the first point")
        axis.set_ylabel("loss" if value == "loss" else "examples/s")
        axis.grid(True, alpha=0.3)
        values = [y for line in axis.lines for y in line.get_ydata()]
        # A loss falling by orders of magnitude is flat on a linear axis after the first points.
        if value == "loss" and values and min(values) > 0 and max(values) > 50 * min(values):
            axis.set_yscale("log")
            axis.minorticks_off()  # their labels cost more to lay out than the rest
        if axis.lines:
            axis.legend(fontsize="small", loc="upper right")  # "best" costs a search
    figure.suptitle(", ".join(run_id for run_id, _ in runs))
    figure.subplots_adjust(left=0.07, right=0.98, bottom=0.07, top=0.91, hspace=0.35, wspace=0.2)
    try:
        figure.savefig(out_path, dpi=80, format="png")
    except OSError as err:
        raise _cannot_write(out_path, err) from None
    finally:
        pyplot.close(figure)
    return labels


def write_run_png(run_dir):
    """RUN_DIR/metrics.png, for the end of a run; None (and no file) when it has no points."""
    if not metrics.load(run_dir).records:
        return None
    path = os.path.join(run_dir, "metrics.png")
    partial = path + ".partial"  # drawn in the background: nobody may see half a picture
    write_png([run_dir], partial)
    os.replace(partial, path)
    return path


def draw_in_background(run_dir):
    """Draw RUN_DIR/metrics.png in a process of its own: the prompt does not wait for it."""
    import subprocess
    import sys
    return subprocess.Popen([sys.executable, "-m", "tfcluster.plot", run_dir],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


if __name__ == "__main__":
    import sys
    write_run_png(sys.argv[1])
