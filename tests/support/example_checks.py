"""What every example test checks after `tfcluster launch EXAMPLE --smoke`: the run's outcome,
the one result schema, the live metrics lines in each task's log and the TensorBoard event files
collected into runs/<id>/tensorboard/<task>/."""
import glob
import json
import os
import sys
import types
from xml.etree import ElementTree

from support.cli import assert_run_clean, run_record, tfcluster
from tfcluster_agent import protocol

LAUNCH_TIMEOUT = 300  # the launcher stops everything itself after this long
START_TIMEOUT = 240   # a ps importing TensorFlow on a loaded 2-core machine can take minutes
MIN_POINTS = 5        # metrics points every training task reports, even in --smoke runs


def launch(local_env, example, *trainer_args, run_id=None, options=()):
    """`tfcluster launch EXAMPLE --smoke [OPTIONS] [-- TRAINER_ARGS]`; (run.json, run folder)."""
    inventory, runs_dir = local_env
    run_id = run_id or "test-" + example
    argv = ["launch", example, "-i", inventory, "--smoke", "--run-id", run_id,
            "--timeout", str(LAUNCH_TIMEOUT), "--start-timeout", str(START_TIMEOUT)]
    argv += list(options)
    if trainer_args:
        argv += ["--"] + list(trainer_args)
    tfcluster(*argv, runs_dir=runs_dir, check=0, timeout=LAUNCH_TIMEOUT + 90)
    return run_record(runs_dir, run_id), os.path.join(runs_dir, run_id)


def check_run(record, trainers):
    """Succeeded; a result in the one schema from each of TRAINERS (labels); ps tasks stopped,
    the others exited 0 or were stopped after success; nothing left running."""
    assert record["state"] == "succeeded" and record["exit_code"] == 0, record.get("failure")
    results = record.get("results", {})
    assert sorted(results) == sorted(trainers), sorted(results)
    for label in trainers:
        check_schema(results[label])
        assert record["tasks"][label]["state"] == "succeeded", (label, record["tasks"][label])
    for label, task in record["tasks"].items():
        if task["job"] == "ps":
            assert task["state"] == "stopped", (label, task)
    assert_run_clean(record)
    return results


def check_schema(result):
    for key in protocol.RESULT_KEYS:
        assert isinstance(result.get(key), (int, float)), (key, result)
    assert result["train_time_s"] > 0 and result["examples_per_s"] > 0, result
    # What TensorFlow placed the compute on: this machine has no GPU.
    assert result["num_gpus"] == 0, result
    assert result["devices"] and all(d.startswith("/device:CPU:") for d in result["devices"]), \
        result["devices"]
    for old in ("final_xent", "initial_xent", "final_cost", "initial_cost", "test_accuracy"):
        assert old not in result, old


def assert_learned(result, accuracy, loss_ratio, initial=None):
    """Accuracy at least ACCURACY, the test loss at most LOSS_RATIO x where it started."""
    initial = result["initial_loss"] if initial is None else initial
    assert result["accuracy"] >= accuracy, result
    assert result["loss"] <= loss_ratio * initial, (result["loss"], initial, result)


def metric_points(run_dir, label):
    """The TFCLUSTER_METRIC points in a task's log, in order."""
    points = []
    with open(os.path.join(run_dir, label.replace(":", "-") + ".log"), errors="replace") as log:
        for line in log:
            parsed = protocol.parse_line(line.rstrip("\n"))
            if parsed and parsed[0] == "metric":
                points.append(parsed[1])
    return points


def points_expected(result, tasks):
    """MIN_POINTS, or 2 (the first and the last) for a task that did less than half of its
    share of the run's steps. On a loaded machine an asynchronous run can starve one worker
    (11 of 152 steps for 1 of 3 mnist_async workers beside a busy core): it still logs a point
    every --log_every local steps, but does few of them."""
    if "local_steps" not in result:
        return MIN_POINTS
    share = (result["global_step"] - result["start_step"]) / tasks
    return MIN_POINTS if result["local_steps"] >= share / 2 else 2


def check_metrics(run_dir, record, labels):
    """At least MIN_POINTS points per task (points_expected), global steps never going back,
    the first at the initial loss and the last at the result's loss and step; the same points
    in the run's metrics.jsonl, and drawn in its metrics.svg."""
    wanted = {label: points_expected(record["results"][label], len(labels)) for label in labels}
    check_metrics_file_and_svg(run_dir, wanted)
    for label in labels:
        result = record["results"][label]
        points = metric_points(run_dir, label)
        assert len(points) >= wanted[label], (label, points)
        steps = [p["step"] for p in points]
        assert steps == sorted(steps), (label, steps)
        assert points[0]["loss"] == result["initial_loss"], (label, points[0])
        assert points[-1]["loss"] == result["loss"], (label, points[-1])
        assert points[-1]["step"] == result["global_step"], (label, points[-1])
        assert sum(1 for p in points if p.get("examples_per_s")) >= wanted[label] - 1, points


def check_metrics_file_and_svg(run_dir, wanted):
    """metrics.jsonl holds each task's logged points (step and loss, in order; WANTED: {task:
    how many at least}); metrics.svg, written before the launch returned, draws each task's
    loss at every one of them."""
    from tfcluster.runs import metrics
    stored = metrics.load(run_dir).records
    drawn = picture(os.path.join(run_dir, "metrics.svg"))["loss against global step"].lines
    for label, least in wanted.items():
        logged = [(p["step"], p.get("loss")) for p in metric_points(run_dir, label)]
        kept = [(r["step"], r.get("loss")) for r in stored if r["task"] == label]
        assert len(kept) >= least and kept == logged, (label, kept, logged)
        assert len(drawn[label]) == sum(1 for _, loss in kept if loss is not None), label


SVG = "{http://www.w3.org/2000/svg}"


def picture(path):
    """{panel title: .lines {label: [(x, y) pixels]}, .colours {label: colour}, .legend [labels],
    .texts [every text]} of a metrics.svg, with "" for the figure: its .texts are the title.
    Fails on a file that is not whole SVG."""
    root = ElementTree.parse(path).getroot()
    assert root.tag == SVG + "svg", root.tag
    panels = {"": types.SimpleNamespace(texts=[t.text for t in root.findall(SVG + "text")])}
    for group in root.findall(SVG + "g"):
        assert group.get("class") == "panel", group.attrib
        lines = group.findall(SVG + "polyline")
        legend = group.find(SVG + "g[@class='legend']")
        panels[group.find(SVG + "text").text] = types.SimpleNamespace(
            lines={line.find(SVG + "title").text: [tuple(map(float, xy.split(",")))
                                                   for xy in line.get("points").split()]
                   for line in lines},
            colours={line.find(SVG + "title").text: line.get("stroke") for line in lines},
            legend=[t.text for t in legend.iter(SVG + "text")] if legend is not None else [],
            texts=[t.text for t in group.iter(SVG + "text")])
    return panels


def tensorboard_scalars(run_dir, label):
    """{tag: [(step, value)]} from the task's collected event files, read by TensorFlow's own
    event reader (the format TensorBoard loads)."""
    tf = tensorflow_without_keras3()
    folder = os.path.join(run_dir, "tensorboard", label.replace(":", "-"))
    files = glob.glob(os.path.join(folder, "events.out.tfevents.*"))
    assert files, "no event file in %s (%s)" % (folder, os.listdir(run_dir))
    scalars = {}
    for path in files:
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


def tensorflow_without_keras3():
    """TensorFlow in the test process, imported as the trainers import it (no Keras 3: ~1.4 s of
    CPU less, see trainers.common.bootstrap.main_guard); the environment that later launches
    inherit is left as it was."""
    if "tensorflow" not in sys.modules:
        saved = os.environ.get("TF_USE_LEGACY_KERAS")
        os.environ["TF_USE_LEGACY_KERAS"] = "1"
        try:
            import tensorflow  # noqa: F401
        finally:
            if saved is None:
                del os.environ["TF_USE_LEGACY_KERAS"]
            else:
                os.environ["TF_USE_LEGACY_KERAS"] = saved
    return sys.modules["tensorflow"]


def check_tensorboard(run_dir, record, labels, chief):
    """Each task's loss, accuracy and examples/s curves; the chief's global-step rate too."""
    for label in labels:
        scalars = tensorboard_scalars(run_dir, label)
        assert {"loss", "accuracy", "examples_per_s"} <= set(scalars), (label, sorted(scalars))
        result = record["results"][label]
        assert len(scalars["loss"]) >= points_expected(result, len(labels)), \
            (label, scalars["loss"])
        assert scalars["loss"][-1] == (result["global_step"], pytest_approx(result["loss"]))
        # The chief writes its rate with each point it logs while training: a loss point beside
        # the first and the last, missing only when a loaded machine starved it of steps (an
        # mnist_async run of 2026-11-26: the other workers did the 150 steps in 0.7 s).
        logged_while_training = len(scalars["loss"]) > 2
        assert ("global_steps_per_s" in scalars) == (label == chief and logged_while_training), \
            (label, sorted(scalars), scalars["loss"])


def pytest_approx(value):
    import pytest
    return pytest.approx(value, rel=1e-6)


def result_line(stdout):
    """The TFCLUSTER_RESULT of a trainer run directly."""
    lines = [line for line in stdout.splitlines() if line.startswith(protocol.RESULT_PREFIX)]
    assert len(lines) == 1, stdout[-3000:]
    return json.loads(lines[0][len(protocol.RESULT_PREFIX):])
