"""metrics.jsonl, cluster totals, efficiency, metrics.svg, `tfcluster plot` and `tensorboard`."""
import io
import json
import os
import sys

import pytest

from support.example_checks import picture
from tfcluster.cli import main as cli
from tfcluster.runs import metrics
from tfcluster.view import plot
from tfcluster.runs import store as runs
from tfcluster.view import tensorboard
from tfcluster.errors import UsageError
from tfcluster.view.report import PlainReporter


def fake_run(runs_dir, run_id, tasks=("worker:0", "worker:1"), points=6, rate=100.0):
    """A run folder as a launch leaves it: run.json and metrics.jsonl with POINTS per task."""
    record = runs.create(str(runs_dir), run_id)
    record.state, record.created = "succeeded", runs.now()
    runs.save(record)
    store = metrics.MetricsStore(record.dir)
    for i in range(points):
        for n, task in enumerate(tasks):
            store.add(task, {"step": 10 * i, "loss": 2.0 / (i + 1) + n * 0.1,
                             "examples_per_s": rate + n, "accuracy": 0.1 * i,
                             "time": 1000.0 + i})
    store.close()
    return record.dir


def test_store_writes_jsonl_and_keeps_the_latest(tmp_path):
    store = metrics.MetricsStore(str(tmp_path))
    store.add("worker:0", {"step": 10, "loss": 1.5, "examples_per_s": 400.0, "time": 100.0})
    # Line-buffered: on disk before close, for `tfcluster status` of a running run.
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[0]) == {"task": "worker:0", "time": 100.0, "step": 10, "loss": 1.5,
                                    "examples_per_s": 400.0}
    store.add("worker:1", {"step": 20, "loss": 1.2, "examples_per_s": 300.0, "time": 110.0})
    store.add("worker:0", {"step": 30, "loss": 1.0, "examples_per_s": 500.0, "time": 120.0})
    store.close()
    assert {t: r["step"] for t, r in store.latest().items()} == {"worker:0": 30, "worker:1": 20}
    total = store.aggregate(target_step=130, now=120.0)
    assert total["examples_per_s"] == 800.0 and total["step"] == 30
    assert total["steps_per_s"] == pytest.approx(1.0)       # 20 steps in 20 s
    assert total["eta_s"] == pytest.approx(100.0)
    assert store.aggregate(tasks={"worker:1"})["examples_per_s"] == 300.0
    loaded = metrics.load(str(tmp_path))
    assert loaded.latest() == store.latest()
    assert len(loaded.records) == 3
    assert metrics.load(str(tmp_path / "none")).records == []


def test_points_from_log():
    text = 'hello\nTFCLUSTER_METRIC {"step": 5, "loss": 1.0}\nTFCLUSTER_RESULT {"loss": 1}\n'
    assert metrics.points_from_log(text) == [{"step": 5, "loss": 1.0}]


def test_efficiency():
    assert metrics.efficiency(1600.0, 1000.0, 2) == pytest.approx(0.8)
    good = metrics.efficiency_message(1600.0, 1000.0, 2)
    assert good[0].startswith("distribution efficiency 0.80:") and len(good) == 1
    bad = metrics.efficiency_message(1200.0, 1000.0, 4)
    assert bad[0].startswith("distribution efficiency 0.30:")
    assert bad[1].startswith("warning: efficiency below 0.5, communication dominates")
    assert metrics.efficiency(1000.0, None, 2) is None


PANELS = ["loss against global step", "loss against time", "examples/s against global step",
          "examples/s against time"]


def test_metrics_svg_draws_each_task_in_every_panel_in_one_colour(tmp_path):
    run_dir = fake_run(tmp_path, "r1", tasks=("chief:0", "worker:0", 'odd<&>"task'))
    store = metrics.load(run_dir)
    # Left out: where the panel's value is missing (60) or not finite (70); without a step.
    store.add("chief:0", {"step": 60, "loss": 0.1, "time": 1006.0})
    store.add("chief:0", {"loss": 9.0, "examples_per_s": 9.0, "time": 1007.0})
    store.add("chief:0", {"step": 70, "loss": float("nan"), "examples_per_s": 1.0, "time": 1008.0})
    out = tmp_path / "r1" / "metrics.svg"
    assert plot.write_run_svg(run_dir, store, PlainReporter()) == str(out)
    assert sorted(p.name for p in out.parent.iterdir()) == ["metrics.jsonl", "metrics.svg",
                                                            "run.json"]   # no part file left
    drawn = picture(out)
    assert list(drawn) == [""] + PANELS and drawn[""].texts == ["r1"]
    labels = ["chief:0", 'odd<&>"task', "worker:0"]
    for title in PANELS:
        panel = drawn[title]
        assert list(panel.lines) == labels and panel.legend == labels, title
        assert panel.colours == drawn[PANELS[0]].colours, title
        assert [len(points) for points in panel.lines.values()] == [7, 6, 6], title
        axis = "global step" if "step" in title else "seconds since the first point"
        assert axis in panel.texts and ("loss" if "loss" in title else "examples/s") in panel.texts
    assert len(set(drawn[PANELS[0]].colours.values())) == 3
    assert out.read_text().count("<circle") == 4 * (7 + 6 + 6)   # a dot on each point: < 30


def ticks(panel):
    return [float(text) for text in panel.texts if text.replace(".", "").isdigit()]


def test_loss_falling_far_is_drawn_on_a_log_axis(tmp_path):
    run_dir = fake_run(tmp_path, "far", tasks=("worker:0",), points=40)
    store = metrics.MetricsStore()
    for i in range(40):   # from 100 by 0.8 a step: 0.017 at the end, 5800x lower
        store.add("worker:0", {"step": i, "loss": 100 * 0.8 ** i, "examples_per_s": 100.0 + i,
                               "time": 1000.0 + i})
    plot.write_run_svg(run_dir, store, PlainReporter())
    drawn = picture(tmp_path / "far" / "metrics.svg")
    for title in PANELS:
        ys = [y for _, y in drawn[title].lines["worker:0"]]
        gaps = [after - before for before, after in zip(ys, ys[1:])]
        # On a log axis a geometric fall is a straight line; on a linear one a rise is too.
        assert max(gaps) - min(gaps) < 0.21 and (gaps[0] > 0) == title.startswith("loss"), title
    assert {0.01, 0.1, 1, 10, 100} <= set(ticks(drawn["loss against global step"]))
    assert "<circle" not in (tmp_path / "far" / "metrics.svg").read_text()   # 40 points: a line


def test_loss_falling_less_stays_on_a_linear_axis(tmp_path):
    run_dir = fake_run(tmp_path, "near", tasks=("worker:0",))   # loss 2.0 to 0.33: 6x
    plot.write_run_svg(run_dir, metrics.load(run_dir), PlainReporter())
    panel = picture(tmp_path / "near" / "metrics.svg")["loss against global step"]
    ys = [y for _, y in panel.lines["worker:0"]]
    losses = [2.0 / (i + 1) for i in range(6)]
    scale = (ys[-1] - ys[0]) / (losses[-1] - losses[0])
    assert all(abs(y - ys[0] - (loss - losses[0]) * scale) < 0.2 for y, loss in zip(ys, losses))
    steps = ticks(panel)
    assert set(steps) >= {0.5, 1.0, 1.5, 2.0} and len(steps) >= 8   # 1-2-5 steps on both axes


def test_run_without_points_gets_no_svg(tmp_path):
    record = runs.create(str(tmp_path), "empty")
    runs.save(record)
    assert plot.write_run_svg(record.dir, metrics.load(record.dir), PlainReporter()) is None
    assert not (tmp_path / "empty" / "metrics.svg").exists()
    with pytest.raises(UsageError, match="run empty has no metrics"):
        plot.write_svg([record.dir], str(tmp_path / "x.svg"))


def test_a_refused_picture_is_a_warning_not_the_runs_outcome(tmp_path):
    run_dir = fake_run(tmp_path, "r1")
    (tmp_path / "r1" / "metrics.svg").mkdir()   # os.replace cannot put a file there
    stream = io.StringIO()
    assert plot.write_run_svg(run_dir, metrics.load(run_dir), PlainReporter(stream)) is None
    assert "WARNING cannot write %s/metrics.svg" % run_dir in stream.getvalue()
    assert sorted(os.listdir(tmp_path / "r1")) == ["metrics.jsonl", "metrics.svg", "run.json"]


def test_plot_command_overlays_two_runs(tmp_path, capsys):
    fake_run(tmp_path / "runs", "one-worker", tasks=("worker:0",), rate=100.0)
    fake_run(tmp_path / "runs", "two-workers", rate=180.0)
    out = tmp_path / "compare.svg"
    code = cli.main(["--runs-dir", str(tmp_path / "runs"), "plot", "one-worker", "two-workers",
                     "-o", str(out)])
    assert code == 0 and "wrote %s" % out in capsys.readouterr().out
    drawn = picture(out)
    assert drawn[""].texts == ["one-worker, two-workers"]
    labels = ["one-worker worker:0", "two-workers worker:0", "two-workers worker:1"]
    assert all(drawn[title].legend == labels == list(drawn[title].lines) for title in PANELS)
    assert cli.main(["--runs-dir", str(tmp_path / "runs"), "plot", "one-worker"]) == 0
    assert list(picture(tmp_path / "runs" / "one-worker" / "metrics.svg")[PANELS[0]].lines) == [
        "worker:0"]


def test_plot_bad_input_is_one_line_exit_2(tmp_path, capsys):
    assert cli.main(["--runs-dir", str(tmp_path), "plot", "nope"]) == 2
    err = capsys.readouterr().err
    assert "no run nope" in err and len(err.strip().splitlines()) == 1
    fake_run(tmp_path, "r1", points=1)
    (tmp_path / "file").write_text("")
    assert cli.main(["--runs-dir", str(tmp_path), "plot", "r1", "-o",
                     str(tmp_path / "file" / "x.svg")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tfcluster: error: cannot write ") and err.count("\n") == 1
    assert cli.main(["--runs-dir", str(tmp_path), "plot", "r1", "-o",
                     str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ending in .svg" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "r1"]


def test_tensorboard_missing_is_one_line_exit_2(tmp_path, capsys, monkeypatch):
    run_dir = fake_run(tmp_path, "r1")
    (tmp_path / "r1" / "tensorboard" / "worker-0").mkdir(parents=True)
    monkeypatch.setitem(sys.modules, "tensorboard", None)   # as if not installed
    assert cli.main(["--runs-dir", str(tmp_path), "tensorboard", "r1"]) == 2
    err = capsys.readouterr().err
    assert err == "tfcluster: error: tensorboard is not installed: pip install 'tfcluster[viz]'\n"
    assert run_dir


def test_tensorboard_serves_each_run_by_its_id(tmp_path):
    first, second = fake_run(tmp_path, "a"), fake_run(tmp_path, "b")
    with pytest.raises(UsageError, match="run a has no tensorboard folder"):
        tensorboard.logdir_spec([first])
    for run_dir in (first, second):
        (tmp_path / run_dir / "tensorboard" / "worker-0").mkdir(parents=True)
    assert tensorboard.logdir_spec([first, second]) == "a:%s/tensorboard,b:%s/tensorboard" % (
        first, second)
