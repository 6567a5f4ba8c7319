"""The launcher's stages and policies in-process, on a fake host layer: each agent link answers
from a script, so success policies, failures, timeouts, lost hosts, restarts, GPU assignment and
records are checked in milliseconds, without processes."""
import io
import json
import os
import re
import signal
import threading
import time

import pytest

from support.cli import run_record
from support.fakehosts import FakeHosts, FakeLink, cluster_of, run
from support.procs import wait_for
from tfcluster.spec import catalog
from tfcluster.errors import PreflightError, RunFailed, RunInterrupted, RunTimedOut
from tfcluster.hosts.inventory import Machine, Slot
from tfcluster.launch.launcher import Launch
from tfcluster.launch.options import LaunchOptions
from tfcluster.launch.teardown import Drain, drain_note, stop_tasks
from tfcluster.runs import store as runs
from tfcluster.runs.record import RunRecord, RunState
from tfcluster.spec.cluster import Cluster, build_cluster
from tfcluster.view.report import PlainReporter
from tfcluster_agent import protocol as P
from tfcluster_agent.values import replace


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


class LateStartLink(FakeLink):
    """worker-1's start is heard LATE seconds after the others' (a loaded machine forks its
    supervisor late); then it prints and exits 0."""
    LATE = 0.5

    def request(self, msg, timeout, what="", collect=None):
        if not isinstance(msg, P.Start):
            return super().request(msg, timeout, what, collect)
        late = [s for s in msg.tasks if s["name"] == "worker-1"]
        answer = super().request(replace(msg, tasks=[s for s in msg.tasks if s not in late]),
                                 timeout, what, collect)
        if late:
            def start_late():
                self.emit(P.Started(name="worker-1", pid=2000, time=time.time()))
                self.emit(P.Output(name="worker-1", text="late but here\n"))
                self.emit(P.Exited(name="worker-1", code=0, state="exited"))
            threading.Timer(self.LATE, start_late).start()
        return answer


def test_a_worker_whose_start_is_heard_after_the_chief_ended_is_waited_for(tmp_path):
    """The chief policy, met before worker:1's start is heard: worker:1 is not over before it
    began. The run waits for it (finish grace), and keeps its output."""
    cluster = cluster_of(ps=0, workers=2)
    hosts = FakeHosts([m for m, _ in cluster.machines()], {"worker-0": [0]})
    hosts.links = {key: LateStartLink(link.machine, hosts.events, link.exits, link.report)
                   for key, link in hosts.links.items()}
    console = io.StringIO()
    launch = Launch(cluster, LaunchOptions(example=catalog.custom_example("true", "chief"),
                                           runs_dir=str(tmp_path / "runs"), run_id="r"),
                    "inventory.yml", PlainReporter(stream=console), hosts=hosts)
    launch.run()
    record = run_record(str(tmp_path / "runs"), "r")
    assert record["tasks"]["worker:1"]["state"] == "succeeded", console.getvalue()
    assert (tmp_path / "runs" / "r" / "worker-1.log").read_text() == "late but here\n"


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
    to every machine's agent, for the workers; the ps, which never ends by itself, is stopped
    after them (at once: the workers may checkpoint through it, and it has nothing to save).
    Ctrl-C (and any other end) stops at once. Every task was told where the notice appears."""
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
        if drain:
            workers, ps = link.stops
            assert (workers.drain, workers.reason) == (drain, signum.name)
            assert sorted(workers.names) == ["worker-0", "worker-1"]
            assert (ps.drain, ps.names) == (0.0, ["ps-0"])
        else:
            (stop,) = link.stops
            assert (stop.drain, stop.reason) == (0.0, "")
            assert sorted(stop.names) == ["ps-0", "worker-0", "worker-1"]
        for spec in link.specs:
            assert spec["env"][P.DRAIN_FILE_ENV] == "/opt/t/work/r/" + P.DRAIN_FILE
        record = json.loads((runs_dir / "r" / "run.json").read_text())
        assert record["state"] == "interrupted" and record["ended"]
        # `tfcluster drain` finds this launcher by its record (teardown.launcher_following).
        assert record["launcher"]["pid"] == os.getpid() and record["launcher"]["start"]


def test_a_drained_parameter_server_strategy_run_keeps_its_servers_until_the_chief_ended(
        tmp_path):
    """ParameterServerStrategy (success: chief): only the chief trains and checkpoints; its
    workers and ps serve it and never end by themselves, so the notice goes to the chief and
    the servers are stopped once it ended."""
    cluster = cluster_of(ps=1, workers=2, chief=1)
    hosts, console = FakeHosts([m for m, _ in cluster.machines()]), io.StringIO()
    launch = Launch(cluster, LaunchOptions(
        example=catalog.custom_example("python train.py", "chief"),
        runs_dir=str(tmp_path / "runs"), run_id="r", drain_grace=7.0),
        "inventory.yml", PlainReporter(stream=console), hosts=hosts)
    link = next(iter(hosts.links.values()))
    threading.Thread(target=lambda: (wait_until(lambda: len(link.specs) == 4),
                                     launch._on_signal(signal.SIGTERM, None))).start()
    with pytest.raises(RunInterrupted):
        launch.run()
    chief, servers = link.stops
    assert (chief.names, chief.drain) == (["chief-0"], 7.0)
    assert (sorted(servers.names), servers.drain) == (["ps-0", "worker-0", "worker-1"], 0.0)
    assert "termination notice to every task but the servers (SIGTERM): they get 7s to " \
        "checkpoint and end; then worker:0, worker:1 and ps:0, serving them, stop" \
        in console.getvalue(), console.getvalue()
    # A drained host whose tasks all serve: they alone are stopped, without a notice (an empty
    # first step once sent its stop, with no names, to every machine: every task drained).
    link.stops.clear()
    worker = [t for t in cluster.tasks if t.label == "worker:1"]
    assert stop_tasks(hosts, Cluster(worker), 5.0, drain=Drain(7.0, "r"),
                      serving={"worker:1", "ps:0"}) == []
    assert [(stop.names, stop.drain) for stop in link.stops] == [(["worker-1"], 0.0)]
    assert drain_note(Drain(7.0, "r"), ["worker:1"], {"worker:1", "ps:0"}) == \
        "stopping worker:1 at once: it serves the others, with nothing to checkpoint"
    assert drain_note(Drain(7.0, "r"), ["chief:0", "worker:1"], {"worker:1"}) == \
        "termination notice to chief:0 (r): they get 7s to checkpoint and end; then worker:1, " \
        "serving them, stops"


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


# ------------------------------------------------------------ spares (docs/spares.md)

def spare_cluster(workers=2, ps=0, chief=0, spares=1):
    """One machine per task, and SPARES machines in the [spare] group."""
    slots = []
    for job, n in (("chief", chief), ("worker", workers), ("ps", ps)):
        for i in range(n):
            machine = Machine(address="10.0.1.%d" % (len(slots) + 1), root="/opt/t",
                              python="/opt/t/venv/bin/python", workdir="/opt/t/work")
            slots.append(Slot(name="%s%d" % (job, i), job=job, machine=machine))
    for i in range(spares):
        slots.append(Slot(name="spare%d" % i, job="spare", machine=Machine(
            address="10.0.9.%d" % (i + 1), root="/opt/t", python="/opt/t/venv/bin/python",
            workdir="/opt/t/work")))
    return build_cluster(slots, {"ps": ps, "worker": workers, "chief": chief, "evaluator": 0})


def run_losing(tmp_path, cluster, exits, lose, example=None, spare_exits=None, **options):
    """Run CLUSTER on fake hosts (the spares' tasks end as SPARE_EXITS says); the machine LOSE
    (an address) goes silent once its tasks started. Returns (outcome, record, console, hosts, seconds from the loss to the outcome)."""
    example = example or catalog.custom_example("python train.py", "all_workers")
    hosts = FakeHosts([m for m, _ in cluster.machines()] + cluster.spares, exits)
    console = io.StringIO()
    launch = Launch(cluster, LaunchOptions(example=example, runs_dir=str(tmp_path / "runs"),
                                           run_id="r", **options),
                    "inventory.yml", PlainReporter(stream=console), hosts=hosts)
    lost = next(link for link in hosts.links.values() if link.machine.address == lose)
    for link in hosts.links.values():
        if link.machine in cluster.spares:
            link.exits = spare_exits or {}
    cut, done = {}, threading.Event()

    def heartbeat():  # the agents that are not lost answer the pings
        while not done.wait(0.05):
            for link in hosts.links.values():
                if link is not lost:
                    link.last_heard = time.monotonic()
    threading.Thread(target=heartbeat, daemon=True).start()

    def silence():
        deadline = time.monotonic() + 10
        while not lost.alive and time.monotonic() < deadline:
            time.sleep(0.01)
        cut["at"] = time.monotonic()
        lost.last_heard = 0
        lost.report = None  # a silent agent: it would answer nothing more
    threading.Thread(target=silence, daemon=True).start()
    outcome = None
    try:
        launch.run()
    except Exception as err:
        outcome = err
    done.set()
    record = json.loads((tmp_path / "runs" / "r" / "run.json").read_text())
    return outcome, record, console.getvalue(), hosts, time.monotonic() - cut["at"]


def test_spare_group_machines_get_no_task_at_the_start():
    cluster = spare_cluster(workers=2, spares=1)
    assert [m.address for m in cluster.spares] == ["10.0.9.1"]
    assert all(t.machine.address != "10.0.9.1" for t in cluster.tasks)


def test_spares_drawn_from_unused_slots_and_refused_beyond_them():
    machines = [Machine(address="10.0.2.%d" % i) for i in range(3)]
    slots = [Slot(name="w%d" % i, job="worker", machine=m) for i, m in enumerate(machines)]
    cluster = build_cluster(slots, {"worker": 2}, spares=1)
    assert [m.address for m in cluster.spares] == ["10.0.2.2"]
    with pytest.raises(Exception, match="--spares 2: only 1 machine"):
        build_cluster(slots, {"worker": 2}, spares=2)


def test_a_lost_worker_of_a_job_that_moves_whole_restarts_every_task_on_the_spare(tmp_path):
    cluster = spare_cluster(workers=3, spares=1)
    # Every task runs until stopped, then ends 0 once started again.
    exits = {"worker-0": [None, 0], "worker-1": [None], "worker-2": [None, 0]}
    outcome, record, console, hosts, _ = run_losing(tmp_path, cluster, exits, "10.0.1.2",
                                                    spare_exits={"worker-1": [0]},
                                                    lost_contact=0.5)
    assert outcome is None, console
    spare = next(l for l in hosts.links.values() if l.machine.address == "10.0.9.1")
    assert [s["name"] for s in spare.specs] == ["worker-1"]
    moved_config = json.loads(spare.specs[0]["env"]["TF_CONFIG"])
    assert moved_config["cluster"]["worker"][1].startswith("10.0.9.1:")
    assert moved_config["task"] == {"type": "worker", "index": 1}
    # Every other task started again, with the new cluster.
    for address in ("10.0.1.1", "10.0.1.3"):
        link = next(l for l in hosts.links.values() if l.machine.address == address)
        assert len(link.specs) == 2
        assert json.loads(link.specs[1]["env"]["TF_CONFIG"])["cluster"] == moved_config["cluster"]
    move, = record["moves"]
    assert (move["lost"], move["spare"], move["tasks"], move["scope"]) == \
        ("10.0.1.2", "10.0.9.1", ["worker:1"], "job")
    assert move["cluster_before"]["worker"][1].startswith("10.0.1.2:")
    assert move["cluster_after"]["worker"][1].startswith("10.0.9.1:")
    assert record["tasks"]["worker:1"]["address"].startswith("10.0.9.1:")
    assert record["state"] == "succeeded"
    assert "moved worker:1 from lost 10.0.1.2 to spare 10.0.9.1" in console
    # The summary says it again, and the task's row shows the spare.
    assert "moved worker:1 from 10.0.1.2 to spare 10.0.9.1 at " in console
    assert re.search(r"^worker:1\s+10\.0\.9\.1\s+succeeded", console, re.M), console
    # run.json reads back with both placements.
    loaded = runs.load(str(tmp_path / "runs"), "r")
    assert loaded.moves[0].cluster_before != loaded.moves[0].cluster_after


def test_a_lost_worker_of_async_training_moves_alone(tmp_path):
    cluster = spare_cluster(workers=2, ps=1, spares=1)
    example = replace(catalog.custom_example("python train.py", "all_workers"), move="task")
    outcome, record, console, hosts, _ = run_losing(
        tmp_path, cluster, {"worker-0": [None], "worker-1": [None]}, "10.0.1.2",
        example=example, spare_exits={"worker-1": [0]}, lost_contact=0.5, timeout=3)
    worker0 = next(l for l in hosts.links.values() if l.machine.address == "10.0.1.1")
    ps = next(l for l in hosts.links.values() if l.machine.address == "10.0.1.3")
    spare = next(l for l in hosts.links.values() if l.machine.address == "10.0.9.1")
    assert worker0.starts == {"worker-0": 1} and ps.starts == {"ps-0": 1}, console
    assert spare.starts == {"worker-1": 1}
    assert record["moves"][0]["scope"] == "task"
    assert "the other tasks go on" in console
    # The machines whose tasks go on are told the new cluster; the spare starts with it.
    assert worker0.clusters == ps.clusters == [record["cluster"]], (worker0.clusters, record)
    assert record["cluster"]["worker"][1].startswith("10.0.9.1:")
    assert spare.clusters == []


def test_a_task_killed_a_moment_before_its_machine_goes_silent_moves_with_the_machine(tmp_path):
    """A reboot or a power cut: the agent reports its task's SIGKILL, then says nothing more.
    The machine's loss decides (a move), not the task's failure; a task whose machine goes on
    answering is a task failure all the same."""
    cluster = spare_cluster(workers=2, spares=1)
    example = replace(catalog.custom_example("python train.py", "all_workers"), move="task")
    hosts = FakeHosts([m for m, _ in cluster.machines()] + cluster.spares,
                      {"worker-0": [0], "worker-1": [-9]})
    hosts.links[cluster.spares[0].key].exits = {"worker-1": [0]}
    dying = next(l for l in hosts.links.values() if l.machine.address == "10.0.1.2")
    dying.last_heard = time.monotonic()  # its last word is the kill's report

    def silence():
        wait_for(lambda: dying.starts, 10, "worker-1 to start")
        time.sleep(0.3)
        dying.last_heard = 0
        dying.report = None
    threading.Thread(target=silence, daemon=True).start()
    console = io.StringIO()
    Launch(cluster, LaunchOptions(example=example, runs_dir=str(tmp_path / "runs"), run_id="r",
                                  lost_contact=0.5, timeout=5),
           "inventory.yml", PlainReporter(stream=console), hosts=hosts).run()
    record = json.loads((tmp_path / "runs" / "r" / "run.json").read_text())
    assert [m["lost"] for m in record["moves"]] == ["10.0.1.2"], console.getvalue()
    assert record["state"] == "succeeded"

    answering = FakeHosts([m for m, _ in cluster.machines()] + cluster.spares,
                          {"worker-0": [0], "worker-1": [-9]})
    with pytest.raises(RunFailed, match="worker:1"):
        Launch(cluster, LaunchOptions(example=example, runs_dir=str(tmp_path / "runs"),
                                      run_id="r2", lost_contact=0.5, timeout=5),
               "inventory.yml", PlainReporter(stream=io.StringIO()), hosts=answering).run()
    assert not run_record(str(tmp_path / "runs"), "r2").get("moves")


def test_without_a_spare_the_run_fails_naming_the_lost_machine_in_time(tmp_path):
    cluster = spare_cluster(workers=2, spares=0)
    outcome, record, console, _, seconds = run_losing(tmp_path, cluster, {}, "10.0.1.2",
                                                      lost_contact=0.5)
    assert isinstance(outcome, RunFailed)
    assert "lost machine 10.0.1.2" in str(outcome) and "no spare machine left" in str(outcome)
    assert record["state"] == "failed" and seconds < 5


def test_a_task_that_failed_its_restarts_moves_its_machine_to_a_spare(tmp_path):
    cluster = spare_cluster(workers=2, spares=1)
    example = replace(catalog.custom_example("python train.py", "all_workers"), move="task")
    hosts = FakeHosts([m for m, _ in cluster.machines()] + cluster.spares,
                      {"worker-0": [0], "worker-1": [3, 3]})
    hosts.links[cluster.spares[0].key].exits = {"worker-1": [0]}
    console = io.StringIO()
    launch = Launch(cluster, LaunchOptions(example=example, runs_dir=str(tmp_path / "runs"),
                                           run_id="r", restarts=1),
                    "inventory.yml", PlainReporter(stream=console), hosts=hosts)
    launch.run()
    record = json.loads((tmp_path / "runs" / "r" / "run.json").read_text())
    spare = next(l for l in hosts.links.values() if l.machine.address == "10.0.9.1")
    assert spare.starts == {"worker-1": 1}
    assert "worker:1 failed 2 time(s) on 10.0.1.2" in record["moves"][0]["why"]
    assert record["state"] == "succeeded"


def test_a_drained_host_gets_the_notice_then_its_tasks_move_to_a_spare(tmp_path):
    cluster = spare_cluster(workers=2, spares=1)
    example = replace(catalog.custom_example("python train.py", "all_workers"), move="task")
    hosts = FakeHosts([m for m, _ in cluster.machines()] + cluster.spares,
                      {"worker-0": [None], "worker-1": [None]})
    spare = hosts.links[cluster.spares[0].key]
    spare.exits = {"worker-1": [0]}
    console = io.StringIO()
    launch = Launch(cluster, LaunchOptions(example=example, runs_dir=str(tmp_path / "runs"),
                                           run_id="r", drain_grace=7, timeout=5),
                    "inventory.yml", PlainReporter(stream=console), hosts=hosts)
    drained = next(l for l in hosts.links.values() if l.machine.address == "10.0.1.2")

    def ask():  # as `tfcluster drain 10.0.1.2` does: the file, then the signal
        deadline = time.monotonic() + 10
        while not drained.alive and time.monotonic() < deadline:
            time.sleep(0.01)
        (tmp_path / "runs" / "r" / "drain-hosts.json").write_text('["10.0.1.2"]')
        os.kill(os.getpid(), signal.SIGUSR1)
    threading.Thread(target=ask, daemon=True).start()
    with pytest.raises(RunTimedOut):  # worker-0 runs on until the --timeout
        launch.run()
    record = json.loads((tmp_path / "runs" / "r" / "run.json").read_text())
    notice, = [stop for stop in drained.stops if stop.drain]
    assert notice.drain == 7 and notice.names == ["worker-1"]
    assert "tfcluster drain 10.0.1.2" in notice.reason
    assert spare.starts == {"worker-1": 1}
    assert record["moves"][0]["why"] == "drained by tfcluster drain 10.0.1.2"
    assert record["tasks"]["worker:1"]["state"] == "succeeded"


def test_a_lost_ps_of_async_training_restarts_every_task_on_the_new_cluster(tmp_path):
    cluster = spare_cluster(workers=2, ps=1, spares=1)
    example = replace(catalog.custom_example("python train.py", "all_workers"), move="task")
    outcome, record, console, hosts, _ = run_losing(
        tmp_path, cluster, {"worker-0": [None, 0], "worker-1": [None, 0]}, "10.0.1.3",
        example=example, spare_exits={"ps-0": [None]}, lost_contact=0.5)
    assert outcome is None, console
    assert record["moves"][0]["tasks"] == ["ps:0"] and record["moves"][0]["scope"] == "job"
    for address in ("10.0.1.1", "10.0.1.2"):
        link = next(l for l in hosts.links.values() if l.machine.address == address)
        assert json.loads(link.specs[-1]["env"]["TF_CONFIG"])["cluster"]["ps"] == \
            [record["tasks"]["ps:0"]["address"]] and len(link.specs) == 2
