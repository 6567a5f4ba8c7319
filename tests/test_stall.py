"""No silent hang, in-process: the agent's stall watch, the stacks a task's sitecustomize lets
the agent take, the cause read from them, and --on-stall stop on a fake host layer. The real
launches are in test_stall_launch.py."""
import io
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from rich.console import Console

from support import REPO
from support.cli import run_cli, run_record
from support.fakehosts import FakeLink, StallingLink, cluster_of, run
from support.procs import wait_for
from support.reporters import make_task, render
from support.task_output import CREATE_SESSION, IN_COLLECTIVE, WAITING, stack_of, states
from tfcluster.diagnosis import stacks as diagnose
from tfcluster.view.live import LiveReporter
from tfcluster.diagnosis.stall import StallFollower
from tfcluster.diagnosis import STALL
from tfcluster.errors import RunStalled, RunTimedOut
from tfcluster_agent import protocol as P
from tfcluster_agent import stall
from tfcluster_agent import supervisor as S

STACKS_DIR = os.path.join(REPO, "tfcluster_agent", "stacks")


# ---------------------------------------------------------------- the agent's watch

class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class Task:
    def __init__(self, name):
        self.name, self.exit_sent = name, False


def watch(tmp_path, monkeypatch, cpu, stall_after=10):
    """A StallWatch of task worker-0 on a fake clock, its group's CPU what CPU[0] says."""
    clock = Clock()
    monkeypatch.setattr(stall.time, "monotonic", clock)
    monkeypatch.setattr(stall, "scan_groups", lambda pgids: {p: (cpu[0], [p]) for p in pgids})
    (tmp_path / "worker-0.pid").write_text(json.dumps({"pid": 4242}))
    (tmp_path / "worker-0.log").write_text("starting\n")
    sent = []
    tasks = {"worker-0": Task("worker-0"), "ps-0": Task("ps-0")}
    return stall.StallWatch(str(tmp_path), tasks, ["worker-0"], stall_after, sent.append), \
        clock, sent


def advance(watcher, clock, seconds):
    for _ in range(int(seconds / watcher.interval)):
        clock.now += watcher.interval
        watcher.poll()


def test_a_quiet_idle_task_stalls_once_and_resumes_when_it_prints(tmp_path, monkeypatch):
    cpu = [5.0]
    watcher, clock, sent = watch(tmp_path, monkeypatch, cpu)
    watcher.poll()
    advance(watcher, clock, 9)
    assert sent == []
    cpu[0] += 0.05  # an idle process's few ticks: still no CPU to speak of
    advance(watcher, clock, 3)
    assert [type(m) for m in sent] == [stall.Stalled]
    assert sent[0].name == "worker-0" and 10 <= sent[0].seconds <= 12 and sent[0].cpu == 0.05
    advance(watcher, clock, 30)
    assert len(sent) == 1  # said once per stall
    with open(tmp_path / "worker-0.log", "a") as log:
        log.write("step 1\n")
    advance(watcher, clock, 1)
    assert isinstance(sent[1], stall.Resumed) and sent[1].why == "output"
    assert sent[1].seconds >= 40


def test_a_quiet_task_that_computes_is_not_stalled(tmp_path, monkeypatch):
    cpu = [5.0]
    watcher, clock, sent = watch(tmp_path, monkeypatch, cpu)
    for _ in range(60):
        cpu[0] += 0.5
        advance(watcher, clock, 1)
    assert sent == []


def test_a_stalled_task_that_computes_again_resumes(tmp_path, monkeypatch):
    cpu = [5.0]
    watcher, clock, sent = watch(tmp_path, monkeypatch, cpu)
    advance(watcher, clock, 12)
    cpu[0] += 2
    advance(watcher, clock, 1)
    assert [type(m) for m in sent] == [stall.Stalled, stall.Resumed] and sent[1].why == "CPU"
    advance(watcher, clock, 12)  # idle again: the burst has left the window
    assert [type(m) for m in sent] == [stall.Stalled, stall.Resumed, stall.Stalled]


def test_members_that_exit_are_no_idleness(tmp_path, monkeypatch):
    """A computing task's group loses a member (its CPU leaves the live members' sum), then every
    member (the task is being stopped): neither reads as a stall."""
    group = {"cpu": 5.0, "members": [4242, 4243]}
    watcher, clock, sent = watch(tmp_path, monkeypatch, [0.0])
    monkeypatch.setattr(stall, "scan_groups", lambda pgids: {
        pgid: (group["cpu"], list(group["members"])) for pgid in pgids})
    for _ in range(12):
        group["cpu"] += 0.5
        advance(watcher, clock, 1)
    group["cpu"], group["members"] = group["cpu"] - 8.0, [4242]  # reaped by no member
    for _ in range(12):
        group["cpu"] += 0.5
        advance(watcher, clock, 1)
    group["cpu"], group["members"] = 0.0, []
    advance(watcher, clock, 30)
    assert sent == []


def test_the_watch_looks_rarely_and_needs_a_run():
    assert stall.poll_interval(120) == 5 and stall.poll_interval(3) == 1
    with pytest.raises(ValueError, match="started no run"):
        stall.StallWatch(None, {}, ["worker-0"], 120, print)


def test_scan_groups_counts_the_cpu_of_the_whole_group():
    child = subprocess.Popen(
        ["/bin/sh", "-c", "%s -c 'while True: pass' & exec sleep 60" % sys.executable],
        start_new_session=True)
    try:
        first = stall.scan_groups([child.pid])[child.pid][0]
        wait_for(lambda: stall.scan_groups([child.pid])[child.pid][0] - first >= 0.1, 30,
                 "the spinning child's CPU to show")
        assert len(stall.scan_groups([child.pid])[child.pid][1]) == 2  # sleep and its sibling
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()


def test_the_stall_messages_load_with_their_first_use():
    """The agent's start imports none of stall.py; decoding its first message does."""
    line = P.encode(stall.Stalled(name="worker-0", seconds=120, cpu=0.1))
    code = ("import sys; from tfcluster_agent import protocol as P; "
            "assert 'tfcluster_agent.stall' not in sys.modules; m = P.decode(sys.argv[1]); "
            "print(type(m).__module__, m.name, m.seconds, m.cpu)")
    out = subprocess.run([sys.executable, "-c", code, line], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout
    assert out == "tfcluster_agent.stall worker-0 120 0.1\n"


# ---------------------------------------------------------------- stacks on the host

BLOCKED = """
import os, threading, time
def helper():
    time.sleep(60)
def wait_for_data():
    open(os.environ["READY"], "w").close()
    time.sleep(60)
threading.Thread(target=helper, daemon=True).start()
wait_for_data()
"""


def test_stacks_of_a_task_with_a_sitecustomize_of_its_own(tmp_path):
    """A Python task writes every thread's stack on the agent's signal, with nothing added to
    it, while the user's sitecustomize still runs; its shell wrapper is named, not signalled."""
    run_dir, user = tmp_path / "run", tmp_path / "user"
    run_dir.mkdir()
    user.mkdir()
    (user / "sitecustomize.py").write_text(
        "import os\nopen(os.environ['USER_MARK'], 'w').close()\n")
    (tmp_path / "blocked.py").write_text(BLOCKED)
    env = dict(os.environ, TFCLUSTER_RUN_DIR=str(run_dir), PYTHONPATH="%s:%s" % (STACKS_DIR, user),
               READY=str(tmp_path / "ready"), USER_MARK=str(tmp_path / "user-ran"))
    task = subprocess.Popen(["/bin/sh", "-c", "%s %s; true" % (sys.executable,
                                                             tmp_path / "blocked.py")],
                            env=env, start_new_session=True)
    try:
        (run_dir / "worker-1.pid").write_text(json.dumps(
            {"pid": task.pid, "start": S.start_time(task.pid), "boot": S.boot_id()}))
        wait_for((tmp_path / "ready").exists, 30, "the task to block")
        texts = stall.take_stacks(str(run_dir), ["worker-1", "worker-2"], "host1")
        assert task.poll() is None  # a stack dump stops nothing
    finally:
        os.killpg(task.pid, signal.SIGKILL)
        task.wait()
    assert (tmp_path / "user-ran").exists()
    text = texts["worker-1"]
    assert (run_dir / "stacks" / "worker-1.txt").read_text() == text
    assert "(sh)" in text and "no Python stacks" in text
    assert "in helper" in text  # every thread
    frames = diagnose.main_thread(text)
    assert (frames[0].function, frames[0].short_file) == ("wait_for_data", "blocked.py")
    assert diagnose.innermost(frames).startswith("wait_for_data (blocked.py:7) < <module>")
    assert texts["worker-2"] == "worker-2 is not running\n"


# ---------------------------------------------------------------- naming the cause


def test_a_collective_waits_for_the_worker_stuck_outside_tensorflow():
    cluster = cluster_of(ps=0, workers=3)
    stacks = {"worker:0": IN_COLLECTIVE, "worker:1": WAITING, "worker:2": IN_COLLECTIVE}
    cause = diagnose.stall_cause(cluster, states(worker_0=1, worker_1=1, worker_2=1), {},
                                 stacks, {"worker:0", "worker:1", "worker:2"})
    assert cause == ("worker:0 and worker:2 wait in a collective for worker:1, which is stuck "
                     "in wait_for_data (train.py:14)")
    deep = stack_of(*[("/v/lib/python3.11/site-packages/tensorflow/python/x.py", n, "f%d" % n)
                      for n in range(1, 6)] + [("/home/u/train.py", 30, "train")])
    assert diagnose.innermost(diagnose.main_thread(deep)) == \
        "f1 (tensorflow/python/x.py:1) < f2 (tensorflow/python/x.py:2) < ... < train (train.py:30)"


def test_a_collective_waits_for_the_worker_that_exited():
    cluster = cluster_of(ps=0, workers=2)
    ended = time.mktime((2026, 1, 2, 12, 1, 7, 0, 0, -1))
    cause = diagnose.stall_cause(cluster, states(worker_0=1, worker_1=0), {"worker:1": ended},
                                 {"worker:0": IN_COLLECTIVE}, {"worker:0"})
    assert cause == "worker:0 waits in a collective for worker:1, which exited 0 at 12:01:07"


def test_without_collectives_each_stalled_task_says_where_it_is():
    cluster = cluster_of(ps=1, workers=3)
    held = "# pid 12 (sh) state T\n# pid 13 (python) state T: its stacks did not come\n"
    stacks = {"worker:0": IN_COLLECTIVE, "worker:1": WAITING, "worker:2": held, "ps:0": ""}
    cause = diagnose.stall_cause(cluster, states(worker_0=1, worker_1=1, worker_2=1, ps_0=1), {},
                                 stacks, {"worker:0", "worker:1", "worker:2", "ps:0"})
    assert cause == ("worker:0 waits in TensorFlow, called from <module> (train.py:30); "
                     "worker:1 is stuck in wait_for_data (train.py:14); "
                     "worker:2 is stopped (SIGSTOP, or a debugger holds it); "
                     "ps:0 stalled with no Python stack")


ABORTED = ["tensorflow.python.framework.errors_impl.UnavailableError: Graph execution error:",
           "Collective ops is aborted by: Error reported from /job:worker/task:1: The following "
           "tasks are unhealthy (stopped sending heartbeats):", "/job:worker/replica:0/task:1"]


def test_a_collective_aborted_by_tensorflow_names_the_worker_that_left():
    cluster = cluster_of(ps=0, workers=2)
    ended = time.mktime((2026, 1, 2, 12, 1, 7, 0, 0, -1))
    now = states(worker_0=0, worker_1=0)
    now["worker:0"].exit = 1
    worker0 = cluster.find("worker:0")
    cause = diagnose.collective_abort_cause(
        cluster, now, {"worker:1": ended, "worker:0": ended + 10}, worker0, ABORTED)
    assert cause == ("worker:0 waited in a collective for worker:1, which exited 0 at 12:01:07, "
                     "until TensorFlow gave up (worker:0 exited 1)")
    assert diagnose.collective_abort_cause(cluster, now, {}, worker0, ["Killed"]) is None


# ---------------------------------------------------------------- the controller's follower

@pytest.fixture
def stalling(monkeypatch):
    """Fake hosts whose worker-1 stalls at once; the stacks are taken without waiting for other
    stalls to come in (the real launches wait)."""
    monkeypatch.setattr("support.fakehosts.FakeLink", StallingLink)
    monkeypatch.setattr(StallFollower, "settle_seconds", lambda self: 0.1)


def test_on_stall_stop_ends_the_run_leading_with_the_cause(tmp_path, stalling):
    cluster = cluster_of(ps=1, workers=2)
    outcome, record, console, hosts = run(tmp_path, cluster, {}, stall_after=3,
                                          on_stall="stop")
    link = next(iter(hosts.links.values()))
    assert link.watched.names == ["worker-0", "worker-1"] and link.watched.stall_after == 3
    assert isinstance(outcome, RunStalled) and outcome.exit_code == 1
    cause = "worker:1 is stuck in wait_for_data (train.py:14)"
    assert str(outcome) == cause and record["failure"] == cause
    assert "tfcluster: worker:1 stalled for 3 s (no output, 0.0 s CPU)\n" in console
    assert "  worker:1  wait (threading.py:320) < wait_for_data (train.py:14) < <module> " \
        "(train.py:40)\n" in console
    report = console[console.index("the run stalled"):]
    assert report.index(cause) < report.index("TASK")
    assert "stopped" in report  # the table comes after the cause
    stacks = os.path.join(tmp_path, "runs", "r", "stacks")
    assert sorted(os.listdir(stacks)) == ["worker-0.txt", "worker-1.txt"]


class FinishingLink(StallingLink):
    """worker-1 reports its result, then is quiet while it shuts down, then exits."""

    def send(self, msg):
        if isinstance(msg, stall.WatchStalls):
            self.watched = msg
            self.emit(P.Output(name="worker-1", text=P.RESULT_PREFIX + '{"loss": 0.1}\n'))
            self.emit(stall.Stalled(name="worker-1", seconds=3.2, cpu=0.01))
            self.alive.discard("worker-1")
            self.emit(P.Exited(name="worker-1", code=0, state="exited"))


def test_a_task_quiet_after_its_result_is_not_stalled(tmp_path, stalling, monkeypatch):
    """TensorFlow's shutdown after the last step can be quiet for longer than --stall-after."""
    monkeypatch.setattr("support.fakehosts.FakeLink", FinishingLink)
    outcome, record, console, _ = run(tmp_path, cluster_of(ps=1, workers=2), {"worker-0": [0]},
                                      stall_after=3, on_stall="stop")
    assert outcome is None and record["state"] == "succeeded", console
    assert "stalled" not in console and not os.path.exists(tmp_path / "runs" / "r" / "stacks")


class WaitingLink(StallingLink):
    """worker-1 repeats TF1's CreateSession wait for ps:0 (its log grows, so its agent never
    calls it quiet); from its host, ps:0's port times out."""

    def send(self, msg):
        if isinstance(msg, stall.WatchStalls):
            self.emit(P.Output(name="worker-1", text=CREATE_SESSION + "\n"))
        elif isinstance(msg, P.Reach):
            self.emit(P.Probed(id=msg.id, results={"ps:0": "timed out"}))


def test_a_task_repeating_the_createsession_wait_stalls_and_on_stall_stop_ends_the_run(
        tmp_path, stalling, monkeypatch):
    monkeypatch.setattr("support.fakehosts.FakeLink", WaitingLink)
    outcome, record, console, _ = run(tmp_path, cluster_of(ps=1, workers=2), {},
                                      stall_after=0.5, on_stall="stop")
    assert isinstance(outcome, RunStalled), console
    cause = ("worker:1 waits in CreateSession for ps:0: ps:0 is running, but worker host "
             "10.0.0.1 cannot reach ps:0 at 10.0.0.1:")
    assert str(outcome).startswith(cause) and record["failure"] == str(outcome)
    assert "tfcluster: worker:1 stalled for 0 s (it only repeats TensorFlow's CreateSession " \
        "wait for ps:0)\n" in console
    report = console[console.index("the run stalled"):]
    assert report.index(cause) < report.index("TASK")


def test_stall_after_0_watches_nothing(tmp_path, stalling):
    outcome, _, _, hosts = run(tmp_path, cluster_of(ps=1, workers=1), {"worker-0": [0]},
                               stall_after=0, on_stall="stop")
    assert outcome is None
    assert not hasattr(next(iter(hosts.links.values())), "watched")


@pytest.mark.parametrize("args, message", [
    (["launch", "--cmd", "true", "--stall-after", "-1"], "must be 0 (off) or more seconds"),
    (["launch", "--cmd", "true", "--on-stall", "kill"], "invalid choice: 'kill'"),
])
def test_stall_flags_refuse_bad_values(tmp_path, capsys, args, message):
    code, _, err = run_cli(capsys, "--runs-dir", str(tmp_path), *args)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_stacks_of_an_ended_run_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("support.fakehosts.FakeLink", FakeLink)
    run(tmp_path, cluster_of(ps=1, workers=1), {"worker-0": [0]})
    assert run_record(str(tmp_path / "runs"), "r")["state"] == "succeeded"
    code, _, err = run_cli(capsys, "--runs-dir", str(tmp_path / "runs"), "stacks", "r")
    assert code == 2 and "run r has ended (succeeded)" in err


def test_the_inventory_sets_stall_after(tmp_path):
    from tfcluster.errors import UsageError
    from tfcluster.hosts.inventory import read_slots
    path = tmp_path / "hosts.yml"
    path.write_text("worker:\n  hosts:\n    w1: {ansible_host: 10.0.0.1, "
                    "tfcluster_stall_after: 0}\n    w2: {ansible_host: 10.0.0.2}\n")
    assert [s.machine.stall_after for s in read_slots(str(path))] == [0, 120]
    path.write_text("worker:\n  hosts:\n    w1: {ansible_host: 10.0.0.1, "
                    "tfcluster_stall_after: soon}\n")
    with pytest.raises(UsageError, match="tfcluster_stall_after must be a number of seconds"):
        read_slots(str(path))


def test_the_live_table_marks_a_stalled_task():
    reporter = LiveReporter(console=Console(file=io.StringIO(), width=140), live=False)
    worker = make_task("worker", 1, "gpu2")
    reporter.task_started(worker, 99)
    reporter.task_stalled(worker, True)
    assert render(reporter).split("\n")[1].split()[:2] == ["worker:1", "stalled"]
    reporter.task_stalled(worker, False)
    assert render(reporter).split("\n")[1].split()[:2] == ["worker:1", "running"]


def test_a_run_timed_out_while_stalled_leads_with_the_cause(tmp_path, stalling):
    outcome, record, console, _ = run(tmp_path, cluster_of(ps=1, workers=2), {},
                                      stall_after=3, timeout=1)
    assert outcome.exit_code == 124 and record["state"] == "timed_out"
    cause = "worker:1 is stuck in wait_for_data (train.py:14)"
    assert console.index("tfcluster: the run stalled: " + cause) < console.index("TASK")


def test_the_outcome_is_built_with_the_stall_cause(tmp_path, stalling):
    """--on-stall stop fails the run with the stall's Cause; a run stopped while stalled
    carries it; a run stopped in no stall carries none."""
    stalled, _, _, _ = run(tmp_path / "stop", cluster_of(ps=1, workers=2), {}, stall_after=3,
                           on_stall="stop")
    assert stalled.cause.kind == STALL and stalled.task is None
    assert [t.label for t in stalled.cause.tasks] == ["worker:1"]
    assert stalled.cause.text == str(stalled) == "worker:1 is stuck in wait_for_data (train.py:14)"
    timed_out, _, _, _ = run(tmp_path / "timeout", cluster_of(ps=1, workers=2), {},
                             stall_after=3, timeout=1)
    assert isinstance(timed_out, RunTimedOut) and timed_out.cause == stalled.cause
    quiet, _, console, _ = run(tmp_path / "quiet", cluster_of(ps=1, workers=2), {},
                               stall_after=0, timeout=0.5)
    assert isinstance(quiet, RunTimedOut) and quiet.cause is None
    assert "the run stalled" not in console
