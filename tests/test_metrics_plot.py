"""metrics.jsonl, cluster totals, efficiency, metrics.png, `tfcluster plot` and `tensorboard`."""
import json
import struct
import sys

import pytest

from tfcluster import cli, metrics, plot, runs, tensorboard
from tfcluster.errors import UsageError


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


def png_size(path):
    with open(path, "rb") as handle:
        header = handle.read(24)
    assert header[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", header[16:24])


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


def spy_on_labels(monkeypatch):
    """The legend labels of every write_png call."""
    drawn = []
    real = plot.write_png
    monkeypatch.setattr(plot, "write_png", lambda dirs, out: drawn.append(real(dirs, out)))
    return drawn


def test_metrics_png_is_a_png_with_one_line_per_task(tmp_path, monkeypatch):
    run_dir = fake_run(tmp_path, "r1", tasks=("chief:0", "worker:0", "worker:1"))
    drawn = spy_on_labels(monkeypatch)
    out = tmp_path / "r1" / "metrics.png"
    assert plot.write_run_png(run_dir) == str(out)
    assert drawn == [["chief:0", "worker:0", "worker:1"]]
    width, height = png_size(out)
    assert (width, height) == (960, 640)
    assert out.stat().st_size > 20000   # four panels of curves, not an empty canvas


def test_run_without_points_gets_no_png(tmp_path):
    record = runs.create(str(tmp_path), "empty")
    runs.save(record)
    assert plot.write_run_png(record.dir) is None
    with pytest.raises(UsageError, match="run empty has no metrics"):
        plot.write_png([record.dir], str(tmp_path / "x.png"))


def test_plot_command_overlays_two_runs(tmp_path, capsys, monkeypatch):
    fake_run(tmp_path / "runs", "one-worker", tasks=("worker:0",), rate=100.0)
    fake_run(tmp_path / "runs", "two-workers", rate=180.0)
    drawn = spy_on_labels(monkeypatch)
    out = tmp_path / "compare.png"
    code = cli.main(["--runs-dir", str(tmp_path / "runs"), "plot", "one-worker", "two-workers",
                     "-o", str(out)])
    assert code == 0
    assert drawn == [["one-worker worker:0", "two-workers worker:0", "two-workers worker:1"]]
    assert png_size(out) == (960, 640)
    assert "wrote %s" % out in capsys.readouterr().out


def test_plot_bad_input_is_one_line_exit_2(tmp_path, capsys):
    assert cli.main(["--runs-dir", str(tmp_path), "plot", "nope"]) == 2
    err = capsys.readouterr().err
    assert "no run nope" in err and len(err.strip().splitlines()) == 1
    fake_run(tmp_path, "r1", points=1)
    (tmp_path / "file").write_text("")
    assert cli.main(["--runs-dir", str(tmp_path), "plot", "r1", "-o",
                     str(tmp_path / "file" / "x.png")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tfcluster: error: cannot write ") and err.count("\n") == 1


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
