"""The trainers' shared loop in-process: how often it reports, the result schema, seeds and the
TensorBoard event files (the last one imports TensorFlow: slow)."""
import argparse
import os
import time

import numpy as np
import pytest

from tfcluster_agent import protocol
from trainers.common import bootstrap, data, loop


def parsed_lines(text, kind):
    return [value for k, value in filter(None, map(protocol.parse_line, text.splitlines()))
            if k == kind]


@pytest.fixture
def no_tensorflow(monkeypatch):
    """Progress without TensorFlow: no GPU count (and no run folder: no event files)."""
    monkeypatch.setattr(loop, "num_gpus", lambda: 0)


def test_progress_reports_ten_points_by_default_and_the_result_schema(no_tensorflow, capsys):
    info = bootstrap.ClusterInfo({"worker": ["a:1", "b:1"]}, "worker", 0)
    args = argparse.Namespace(log_every=0)
    progress = loop.Progress(info, args, batch_size=10, start_step=0, initial_loss=2.3,
                             initial_accuracy=0.1, expected_steps=50)
    for step in range(1, 51):
        progress.tick(2 * step, loss=2.3 / step)
    result = progress.result(0.2, 0.9, devices=["/device:CPU:0"], dataset="digits")
    points = parsed_lines(capsys.readouterr().out, "metric")
    # The start, one every 5 local steps (50 / 10), the end.
    assert len(points) == 1 + 10 + 1
    assert points[0] == {"step": 0, "loss": 2.3, "accuracy": 0.1}
    assert [p["step"] for p in points[1:-1]] == list(range(10, 101, 10))
    assert all(p["examples_per_s"] > 0 and p["global_steps_per_s"] > 0 for p in points[1:-1])
    assert points[-1]["loss"] == 0.2 and points[-1]["accuracy"] == 0.9
    assert set(protocol.RESULT_KEYS) <= set(result)
    assert result["global_step"] == 100 and result["local_steps"] == 50
    assert result["initial_loss"] == 2.3 and result["task"] == "worker:0"
    assert result["devices"] == ["/device:CPU:0"] and result["num_gpus"] == 0
    assert result["dataset"] == "digits"


def test_only_the_chief_reports_the_global_step_rate(no_tensorflow, capsys):
    info = bootstrap.ClusterInfo({"worker": ["a:1", "b:1"]}, "worker", 1)
    progress = loop.Progress(info, argparse.Namespace(log_every=2), 4, 0, 1.0)
    for step in range(1, 5):
        progress.tick(step, loss=0.5)
    points = parsed_lines(capsys.readouterr().out, "metric")
    assert len(points) == 3 and not any("global_steps_per_s" in p for p in points)


def test_each_point_after_the_first_carries_busy_and_the_timed_wait(no_tensorflow, capsys):
    progress = loop.Progress(None, argparse.Namespace(log_every=1), 32, 0, 2.3)
    deadline = time.monotonic() + 0.2
    while time.monotonic() < deadline:
        pass  # compute: the busy figure grows
    progress.waited(0.1)
    progress.tick(1, 2.0)
    progress.tick(2, 1.9)  # untimed: nothing in the collective since the last point
    first, second, third = parsed_lines(capsys.readouterr().out, "metric")
    assert "busy" not in first and "wait" not in first
    assert second["busy"] > 0.3 and 0 < second["wait"] <= 1.0
    assert "busy" in third and third["wait"] == 0.0


def test_seeded_batches_repeat_and_differ_per_worker():
    x, y = np.arange(40).reshape(20, 2), np.arange(20)
    first = [b[1].tolist() for b, _ in zip(data.batches(x, y, 4, seed=(7, 0)), range(6))]
    again = [b[1].tolist() for b, _ in zip(data.batches(x, y, 4, seed=(7, 0)), range(6))]
    other = [b[1].tolist() for b, _ in zip(data.batches(x, y, 4, seed=(7, 1)), range(6))]
    assert first == again and first != other


def test_trainer_parser_has_seed_and_log_every():
    args = bootstrap.trainer_parser("doc line\nmore").parse_args(["--seed", "4"])
    assert (args.seed, args.log_every, args.dataset) == (4, 0, "mnist")
    assert bootstrap.trainer_parser("d", mnist=False).parse_args([]).seed == bootstrap.DEFAULT_SEED


@pytest.mark.slow
def test_event_files_load_in_tensorflows_reader(tmp_path, capsys):
    import tensorflow as tf
    info = bootstrap.ClusterInfo({"chief": ["a:1"], "worker": ["b:1"]}, "chief", 0,
                                 bootstrap.TaskEnv(run_dir=str(tmp_path)))
    progress = loop.Progress(info, argparse.Namespace(log_every=1), 8, 0, 2.0, 0.1)
    for step in range(1, 4):
        progress.tick(step, loss=np.float32(1.0 / step))  # as sess.run returns it
    progress.result(0.25, 0.75, devices=["/device:CPU:0"])
    (name,) = os.listdir(tmp_path / "tensorboard" / "chief-0")
    scalars = {}
    for event in tf.compat.v1.train.summary_iterator(str(tmp_path / "tensorboard" / "chief-0"
                                                         / name)):
        for value in event.summary.value:
            scalars.setdefault(value.tag, []).append((event.step, round(value.simple_value, 4)))
    assert scalars["loss"] == [(0, 2.0), (1, 1.0), (2, 0.5), (3, 0.3333), (3, 0.25)]
    assert scalars["accuracy"] == [(0, 0.1), (3, 0.75)]
    assert len(scalars["examples_per_s"]) == 4 and len(scalars["global_steps_per_s"]) == 3


@pytest.mark.slow
def test_run_step_takes_a_step_again_only_after_a_refused_resend(capsys, monkeypatch):
    import tensorflow as tf
    waits = []
    monkeypatch.setattr(loop.time, "sleep", waits.append)

    class Session:
        def __init__(self, errors):
            self.errors, self.calls = list(errors), 0

        def run(self, fetches, feed_dict=None):
            self.calls += 1
            if self.errors:
                raise self.errors.pop(0)
            return "done"
    resent = tf.errors.AbortedError(None, None, "The same RunGraph (Worker) request was received twice.")
    session = Session([resent])
    assert loop.run_step(session, ["loss"], {}) == "done" and session.calls == 2
    assert "received twice" in capsys.readouterr().out
    with pytest.raises(tf.errors.AbortedError):
        loop.run_step(Session([tf.errors.AbortedError(None, None, "graph handle not found")]), [], {})
    with pytest.raises(tf.errors.AbortedError):       # at most RESEND_ATTEMPTS tries
        loop.run_step(Session([resent] * loop.RESEND_ATTEMPTS), [], {})
    assert waits == [loop.RESEND_WAIT] + [loop.RESEND_WAIT * n
                                          for n in range(1, loop.RESEND_ATTEMPTS)]
    session = Session([resent] * (loop.RESEND_ATTEMPTS - 1))
    assert loop.run_step(session, ["loss"], {}) == "done"
    assert session.calls == loop.RESEND_ATTEMPTS
