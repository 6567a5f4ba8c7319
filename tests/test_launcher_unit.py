"""The launcher's stages and policies in-process, on a fake host layer: each agent link answers
from a script, so success policies, failures, timeouts, lost hosts, restarts, GPU assignment and
records are checked in milliseconds, without processes."""
import io
import json
import os
import signal
import threading
import time

import pytest

from support.fakehosts import FakeHosts, cluster_of, run
from tfcluster.spec import catalog
from tfcluster.errors import PreflightError, RunFailed, RunInterrupted, RunTimedOut
from tfcluster.hosts.inventory import Slot
from tfcluster.launch.launcher import Launch, LaunchOptions
from tfcluster.runs import store as runs
from tfcluster.runs.record import RunRecord, RunState
from tfcluster.view.report import PlainReporter
from tfcluster_agent import protocol as P


def test_workers_succeed_then_the_ps_is_stopped(tmp_path):
    outcome, record, console, _ = run(tmp_path, cluster_of(),
                                      {"worker-0": [0], "worker-1": [0]})
    assert outcome is None, console
    assert record["state"] == "succeeded" and record["exit_code"] == 0
    assert record["tasks"]["ps:0"]["state"] == "stopped" and record["tasks"]["ps:0"]["exit"] == 143
    assert (tmp_path / "runs" / "r" / "worker-1.log").read_text().startswith("hello from worker-1")
    assert (tmp_path / "runs" / "r" / "metrics.jsonl").exists()
    assert "run r succeeded" in console


def test_a_failing_worker_fails_the_run_and_shows_its_last_lines(tmp_path):
    outcome, record, console, _ = run(tmp_path, cluster_of(), {"worker-0": [0], "worker-1": [3]})
    assert isinstance(outcome, RunFailed) and outcome.exit_code == 1
    assert "worker:1 on 10.0.0.1 exited with status 3" in str(outcome)
    assert record["state"] == "failed" and record["tasks"]["worker:1"]["exit"] == 3
    assert "last 20 lines of worker:1" in console and "hello from worker-1" in console


def test_a_worker_restarts_when_restarts_allow_it(tmp_path):
    outcome, record, console, hosts = run(tmp_path, cluster_of(),
                                          {"worker-0": [0], "worker-1": [3, 0]}, restarts=1)
    assert outcome is None, console
    assert record["tasks"]["worker:1"]["restarts"] == 1
    link = next(iter(hosts.links.values()))
    assert link.starts == {"ps-0": 1, "worker-0": 1, "worker-1": 2}


def test_a_failed_ps_with_restarts_restarts_the_whole_job(tmp_path):
    outcome, record, console, hosts = run(tmp_path, cluster_of(),
                                          {"ps-0": [1, None], "worker-0": [0], "worker-1": [0]},
                                          restarts=1)
    link = next(iter(hosts.links.values()))
    assert outcome is None, console
    assert "restarting every task from the last checkpoint" in console
    assert link.starts["ps-0"] == 2 and link.starts["worker-0"] == 2
    assert record["restart_log"][0]["scope"] == "job"


def test_chief_policy_stops_the_workers_at_once(tmp_path):
    outcome, record, console, _ = run(tmp_path, cluster_of(chief=1), {"chief-0": [0]},
                                      policy="chief")
    assert outcome is None, console
    assert record["tasks"]["worker:0"]["state"] == "stopped"


def test_timeout(tmp_path):
    outcome, record, _, _ = run(tmp_path, cluster_of(), {}, timeout=0.3)
    assert isinstance(outcome, RunTimedOut) and outcome.exit_code == 124
    assert record["state"] == "timed_out"


def test_a_silent_machine_is_lost(tmp_path):
    cluster = cluster_of()
    example = catalog.custom_example("python train.py", "all_workers")
    hosts = FakeHosts([m for m, _ in cluster.machines()])
    launch = Launch(cluster, LaunchOptions(example=example, runs_dir=str(tmp_path / "runs"),
                                           run_id="r", lost_contact=0.5),
                    "inventory.yml", PlainReporter(stream=io.StringIO()), hosts=hosts)
    # The machine answers the start, then never again.
    threading.Timer(0.2, lambda: [setattr(l, "last_heard", 0) for l in hosts.links.values()]
                    ).start()
    with pytest.raises(RunFailed, match="lost contact with 10.0.0.1"):
        launch.run()


def test_preflight_problems_start_nothing(tmp_path):
    report = {"python_ok": False, "error": "no interpreter at /x", "cpus": 2, "gpus": []}
    outcome, record, _, hosts = run(tmp_path, cluster_of(), {}, report=report)
    assert isinstance(outcome, PreflightError) and outcome.exit_code == 3
    assert record is None and not (tmp_path / "runs" / "r").exists()
    assert all(not link.specs for link in hosts.links.values())


def test_a_port_another_launch_claimed_fails_preflight_naming_it(tmp_path):
    report = {"python_ok": True, "tf_version": "2.21.0", "cpus": 2, "gpus": [], "code_hash": None,
              "port_holders": {"2224": "run 20261122-other"}}
    outcome, record, _, hosts = run(tmp_path, cluster_of(), {}, report=report)
    assert isinstance(outcome, PreflightError) and outcome.exit_code == 3
    assert "port(s) 2224 claimed by run 20261122-other" in str(outcome)
    assert "tfcluster stop" in str(outcome)
    assert record is None and all(not link.specs for link in hosts.links.values())


def test_gpus_are_split_and_secrets_kept_out_of_records(tmp_path):
    report = {"python_ok": True, "tf_version": "2.21.0", "cpus": 8, "hostname": "g",
              "code_hash": None, "gpus": ["GPU 0: A (UUID: GPU-0)", "GPU 1: A (UUID: GPU-1)"]}
    outcome, record, console, hosts = run(tmp_path, cluster_of(), {"worker-0": [0],
                                                                   "worker-1": [0]},
                                          report=report, env={"TOKEN": "s3cr3t"})
    assert outcome is None, console
    specs = {s["name"]: s["env"] for s in next(iter(hosts.links.values())).specs}
    assert {specs["worker-0"]["CUDA_VISIBLE_DEVICES"], specs["worker-1"]["CUDA_VISIBLE_DEVICES"]} \
        == {"0", "1"}
    assert specs["ps-0"]["CUDA_VISIBLE_DEVICES"] == ""
    assert specs["worker-0"]["TOKEN"] == "s3cr3t"
    for path in (tmp_path / "runs" / "r").iterdir():
        assert b"s3cr3t" not in path.read_bytes(), path
    assert "TOKEN" in record["tasks"]["worker:0"]["env_names"]


def test_baseline_then_the_main_run_both_get_the_live_table(tmp_path, monkeypatch):
    """--baseline runs two launches on one reporter: the first must not close it (the command
    does, once), and the main run's table shows its own tasks, not the baseline's."""
    from rich.console import Console

    from tfcluster.launch import launcher
    from tfcluster.view.live import LiveReporter
    cluster = cluster_of()
    slots = sorted({t.slot: Slot(name=t.slot, job=t.job, machine=t.machine, port_base=2222)
                    for t in cluster.tasks}.values(), key=lambda s: s.name)
    monkeypatch.setattr(launcher, "Hosts", lambda machines: FakeHosts(
        machines, {"worker-0": [0], "worker-1": [0]}))
    console = Console(file=io.StringIO(), width=140, color_system=None)
    reporter = LiveReporter(console=console)
    closes = []
    real_close = reporter.close
    monkeypatch.setattr(reporter, "close", lambda: closes.append(1) or real_close())
    try:
        example = catalog.custom_example("python train.py", "all_workers")
        code = launcher.launch("inventory.yml", LaunchOptions(
            example=example, runs_dir=str(tmp_path / "runs"), run_id="r", baseline=True,
            counts={"ps": 1, "worker": 2, "chief": 0}), lambda path: slots, reporter)
        assert code == 0 and not closes
        assert reporter._live is not None  # still drawing when the main run ran
        frame = Console(file=io.StringIO(), width=140, color_system=None)
        frame.print(reporter.render())
        rows = [line.split()[0] for line in frame.file.getvalue().splitlines()
                if line.split() and line.split()[0] in ("ps:0", "worker:0", "worker:1")]
        assert sorted(rows) == ["ps:0", "worker:0", "worker:1"]
    finally:
        reporter.close()
    assert (tmp_path / "runs" / "r-baseline" / "run.json").exists()


def test_sigterm_and_sighup_drain_every_task_before_the_stop_and_ctrl_c_does_not(tmp_path):
    """The stop that SIGTERM or SIGHUP brings carries the termination notice and --drain-grace
    to every machine's agent; Ctrl-C (and any other end) stops at once. Every task was told
    where the notice appears."""
    for signum, drain in ((signal.SIGTERM, 7.0), (signal.SIGHUP, 7.0), (signal.SIGINT, 0.0)):
        cluster = cluster_of()
        hosts = FakeHosts([m for m, _ in cluster.machines()])
        runs_dir = tmp_path / signum.name
        launch = Launch(cluster, LaunchOptions(
            example=catalog.custom_example("python train.py", "all_workers"),
            runs_dir=str(runs_dir), run_id="r", drain_grace=7.0),
            "inventory.yml", PlainReporter(stream=io.StringIO()), hosts=hosts)
        link = next(iter(hosts.links.values()))
        # The signal comes once every task runs (the handler, as the signal would call it).
        threading.Thread(target=lambda: (wait_until(lambda: len(link.specs) == 3),
                                         launch._on_signal(signum, None))).start()
        with pytest.raises(RunInterrupted, match="interrupted by %s" % signum.name):
            launch.run()
        (stop,) = link.stops
        assert (stop.drain, stop.reason) == (drain, signum.name if drain else "")
        assert sorted(stop.names) == ["ps-0", "worker-0", "worker-1"]
        for spec in link.specs:
            assert spec["env"][P.DRAIN_FILE_ENV] == "/opt/t/work/r/" + P.DRAIN_FILE
        record = json.loads((runs_dir / "r" / "run.json").read_text())
        assert record["state"] == "interrupted" and record["ended"]
        # `tfcluster drain` finds this launcher by its record (teardown.launcher_following).
        assert record["launcher"]["pid"] == os.getpid() and record["launcher"]["start"]


def wait_until(condition, seconds=10):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_resume_of_a_checkpoint_folder_another_run_writes_is_refused_naming_it(tmp_path):
    """--resume A while A still runs, or while another run resumes A: refused at preflight in
    one line naming that run, nothing started, no run folder. Once they ended, it goes."""
    runs_dir = tmp_path / "runs"
    for run_id, state, of in (("a", RunState.RUNNING, "a"), ("b", RunState.SUCCEEDED, "a"),
                              ("c", RunState.RUNNING, "c")):
        runs.save(RunRecord(id=run_id, runs_dir=str(runs_dir), state=state, checkpoints_of=of,
                            created="2026-11-28T00:00:0%d+00:00" % len(run_id)))
    outcome, record, _, hosts = run(tmp_path, cluster_of(), {}, resume="a")
    assert isinstance(outcome, PreflightError) and outcome.exit_code == 3
    assert str(outcome) == ("--resume a: its checkpoint folder is being written by run a "
                            "(running): wait for it to end or stop it (`tfcluster stop a`); "
                            "nothing was started")
    assert record is None and all(not link.specs for link in hosts.links.values())
    stale = runs.load(str(runs_dir), "a")
    stale.become(RunState.STOPPED)
    runs.save(stale)
    runs.save(RunRecord(id="d", runs_dir=str(runs_dir), state=RunState.RUNNING,
                        checkpoints_of="a", created="2026-11-28T00:00:09+00:00"))
    outcome, _, _, _ = run(tmp_path, cluster_of(), {}, resume="a")
    assert isinstance(outcome, PreflightError) and "written by run d (running)" in str(outcome)
    finished = runs.load(str(runs_dir), "d")
    finished.become(RunState.FAILED)
    runs.save(finished)
    outcome, record, console, _ = run(tmp_path, cluster_of(), {"worker-0": [0], "worker-1": [0]},
                                      resume="a")
    assert outcome is None, console
    assert record["checkpoints_of"] == "a"
