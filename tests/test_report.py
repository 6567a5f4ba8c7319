"""The console: quiet by default, the live table, the reporter choice. Synthetic events, no TF."""
import io
import time
import types

import pytest
from rich.console import Console

from support.reporters import make_task, render
import tfcluster.view.live
from tfcluster.cli.main import build_parser
from tfcluster.view.live import LiveReporter
from tfcluster.view.console import make_reporter
from tfcluster.view.report import PlainReporter, is_noise

NOISE = [
    "2026-11-22 06:00:01.1: I tensorflow/core/util/port.cc:153] oneDNN custom operations are on. "
    "You may see slightly different numerical results due to floating-point round-off errors from "
    "different computation orders. To turn them off, set the environment variable "
    "`TF_ENABLE_ONEDNN_OPTS=0`.",
    "I0000 00:00:1795327325.806471   19709 cpu_feature_guard.cc:227] This TensorFlow binary is "
    "optimized to use available CPU instructions in performance-critical operations.",
    "To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow with "
    "the appropriate compiler flags.",
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "W0000 00:00:1795327149.555327    8225 local_rendezvous.cc:412] Local rendezvous is aborting "
    "with status: ABORTED: Cleanup 133735273278776408 "
    "[type.googleapis.com/tensorflow.DerivedStatus='']",
    "W0000 00:00:1795327245.078343   10819 dataset.cc:997] Input of GeneratorDatasetOp::Dataset "
    "will not be optimized because the dataset does not implement the AsGraphDefInternal() "
    "method needed to apply optimizations.",
    "I0000 00:00:1795327335.255199   19709 grpc_server_lib.cc:467] Started server with target: "
    "grpc://localhost:29999",
    "W0000 00:00:1795328033.971640   24837 xplane_to_step_stats.cc:84] GPU trace was not "
    "collected.",
    "E0000 00:00:17953.1 123 cuda_dnn.cc:8579] Unable to register cuDNN factory: Attempting to "
    "register factory for plugin cuDNN when one has already been registered",
]
KEPT = [
    "worker:0: step 50, loss 1.4826",
    "Traceback (most recent call last):",
    "tensorflow.python.framework.errors_impl.UnavailableError: failed to connect to all addresses",
    "E0000 00:00:1795327149.1 8225 master.cc:123] Failed to create session: ABORTED",
    'TFCLUSTER_RESULT {"loss": 0.3, "global_step": 200}',
    'TFCLUSTER_METRIC {"step": oops}',  # malformed: shown, so the user can fix it
]


@pytest.mark.parametrize("line", NOISE)
def test_noise_is_recognised(line):
    assert is_noise(line)


@pytest.mark.parametrize("line", KEPT)
def test_other_lines_are_not_noise(line):
    assert not is_noise(line)


def plain_output(verbose):
    stream = io.StringIO()
    reporter = PlainReporter(stream, verbose=verbose)
    task = make_task()
    for line in NOISE + KEPT:
        reporter.task_line(task, line)
    reporter.task_line(task, 'TFCLUSTER_METRIC {"step": 120, "loss": 0.53, '
                             '"examples_per_s": 840.0}')
    reporter.task_metric(task, {"step": 120, "loss": 0.53, "examples_per_s": 840.0, "time": 1.0})
    return stream.getvalue().splitlines()


def test_plain_reporter_is_quiet_by_default():
    lines = plain_output(verbose=False)
    assert lines[:len(KEPT)] == ["[worker:0 10.0.0.12] " + line for line in KEPT]
    # The raw metric line is replaced by a readable one.
    assert lines[len(KEPT):] == ["[worker:0 10.0.0.12] step 120  loss 0.53  840 examples/s"]


def test_plain_reporter_verbose_shows_everything():
    lines = plain_output(verbose=True)
    assert len(lines) == len(NOISE) + len(KEPT) + 1
    assert lines[-1].startswith("[worker:0 10.0.0.12] TFCLUSTER_METRIC ")


def test_live_reporter_renders_a_row_per_task_and_the_cluster(monkeypatch):
    console = Console(file=io.StringIO(), width=140, color_system=None)
    reporter = LiveReporter(console=console, live=False)
    chief, worker, ps = make_task("chief", 0, "gpu1"), make_task("worker", 0, "gpu2"), \
        make_task("ps", 0, "cpu1")
    for task, pid in ((ps, 11), (chief, 12), (worker, 13)):
        reporter.task_started(task, pid)
    start = time.time() - 10
    # The clock stops at the last point, so the ETA below does not depend on the machine's speed.
    monkeypatch.setattr(tfcluster.view.live, "time", types.SimpleNamespace(time=lambda: start + 10))
    for i, step in enumerate((0, 50, 100)):
        reporter.task_metric(chief, {"step": step, "loss": 2.0 - step / 100, "target_step": 400,
                                     "examples_per_s": 800.0, "time": start + 5 * i})
        reporter.task_metric(worker, {"step": step, "loss": 2.1 - step / 100,
                                      "examples_per_s": 700.0, "time": start + 5 * i})
    for line in NOISE[:3] + ['TFCLUSTER_RESULT {"loss": 0.3}', "chief: scheduled 100 steps"]:
        reporter.task_line(chief, line)
    reporter.task_exited(worker, 1, "failed")
    reporter.task_restarted(worker, 1)
    assert "worker:0  restarting  gpu2" in render(reporter)
    reporter.task_started(worker, 14)
    text = render(reporter)
    reporter.task_exited(chief, 0, "succeeded")
    assert "cluster: 700 examples/s" in render(reporter)   # the ended chief no longer counts
    rows = {line.split()[0]: line.split() for line in text.splitlines() if line.strip()}
    assert rows["chief:0"][1:6] == ["running", "gpu1", "100", "(25%)", "1"]
    assert rows["chief:0"][6] == "800"
    assert rows["worker:0"][1:7] == ["running", "gpu2", "100", "(25%)", "1.1", "700"]
    assert rows["worker:0"][-1] == "1"           # restarts
    assert rows["ps:0"][1:4] == ["running", "cpu1", "-"]
    # 100 steps in 10 s: 10 steps/s, 300 to go, the last point 0 s old: 30 s.
    cluster = [line for line in text.splitlines() if line.startswith("cluster:")]
    assert cluster[0].startswith("cluster: 1,500 examples/s, step 100 of 400, 10 steps/s, ETA ")
    assert cluster[0].split("ETA ")[1] == "30s"
    # The log tail: the task's own line, not the noise.
    assert "[chief:0] chief: scheduled 100 steps" in text
    assert "oneDNN" not in text and "cpu_feature_guard" not in text
    assert "TFCLUSTER_RESULT" not in text
    reporter.close()


def test_a_point_can_name_the_target_step():
    reporter = LiveReporter(console=Console(file=io.StringIO()), live=False)
    worker = make_task()
    reporter.task_started(worker, 1)
    reporter.task_metric(worker, {"step": 30, "target_step": 120, "time": time.time()})
    assert "30 (25%)" in render(reporter)


def test_live_reporter_shows_a_failure_at_once():
    console = Console(file=io.StringIO(), width=140, color_system=None)
    reporter = LiveReporter(console=console, live=False)
    worker = make_task("worker", 1, "gpu2")
    reporter.task_started(worker, 99)
    reporter.task_exited(worker, 1, "failed")
    assert "worker:1 on gpu2 failed (exit 1)" in console.file.getvalue()
    row = [line.split() for line in render(reporter).splitlines() if line.startswith("worker:1")]
    assert row[0][1:5] == ["failed", "1", "gpu2", "-"]
    assert row[0][-2:] == ["-", "0"]    # no "last line" age once the task ended
    reporter.note("stopping every task")
    assert "tfcluster: stopping every task" in console.file.getvalue()


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_make_reporter_picks_live_only_on_a_terminal(monkeypatch):
    monkeypatch.setenv("TERM", "xterm-256color")
    assert type(make_reporter(stream=io.StringIO())) is PlainReporter
    assert type(make_reporter(plain=True, stream=Terminal())) is PlainReporter
    assert type(make_reporter(logs=True, stream=Terminal())) is PlainReporter
    assert make_reporter(verbose=True, stream=io.StringIO()).verbose
    stream = Terminal()
    live = make_reporter(stream=stream)
    try:
        assert isinstance(live, LiveReporter)
        live.note("preflight failed")
        assert render(live).strip() == ""   # no empty table before a task started
        live.task_started(make_task(), 1)
    finally:
        live.close()
    assert "tfcluster: preflight failed" in stream.getvalue()
    assert "worker:0" in stream.getvalue()   # the last frame stays on the terminal
    monkeypatch.setenv("TERM", "dumb")
    assert type(make_reporter(stream=Terminal())) is PlainReporter


def test_launch_has_the_console_flags():
    args = build_parser().parse_args(["launch", "mnist_replica", "--plain", "--verbose", "--logs",
                                      "--baseline"])
    assert (args.plain, args.verbose, args.logs, args.baseline) == (True, True, True, True)
    args = build_parser().parse_args(["launch", "mnist_replica"])
    assert (args.plain, args.verbose, args.logs, args.baseline) == (False, False, False, False)
