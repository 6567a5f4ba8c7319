"""tfcluster profile, in-process: the profiler hook every task's Python loads (a real process,
a stand-in TensorFlow), the agent's side of starting the servers, the task list and the files
matched to their tasks, and the command line's refusals. Real traces of real runs are in
test_profile_launch.py."""
import json
import os
import signal
import subprocess
import sys

import pytest

from support import REPO
from support.cli import local_inventory_text, run_cli, run_record, tfcluster
from support.fakehosts import FakeLink, cluster_of, run
from support.procs import wait_for
from tfcluster.errors import UsageError
from tfcluster.launch import profiling
from tfcluster_agent import profiler
from tfcluster_agent import protocol as P
from tfcluster_agent import supervisor as S

STACKS_DIR = os.path.join(REPO, "tfcluster_agent", "stacks")

# A task whose main thread blocks in C for good; "tensorflow" is a stand-in that records the port
# its profiler server was started on (or is never imported, with NO_TF).
TASK = """
import os, sys, threading, types
if not os.environ.get("NO_TF"):
    tf = types.ModuleType("tensorflow")
    def start(port):
        open(os.environ["STARTED"], "a").write("%d\\n" % port)
    tf.profiler = types.SimpleNamespace(experimental=types.SimpleNamespace(
        server=types.SimpleNamespace(start=start)))
    sys.modules["tensorflow"] = tf
open(os.environ["READY"], "w").close()
lock = threading.Lock(); lock.acquire(); lock.acquire()
"""


def start_task(tmp_path, no_tf=False):
    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    (tmp_path / "task.py").write_text(TASK)
    env = dict(os.environ, TFCLUSTER_RUN_DIR=str(run_dir), PYTHONPATH=STACKS_DIR,
               READY=str(tmp_path / "ready"), STARTED=str(tmp_path / "started"))
    if no_tf:
        env["NO_TF"] = "1"
    task = subprocess.Popen([sys.executable, str(tmp_path / "task.py")], env=env,
                            start_new_session=True)
    (run_dir / "worker-0.pid").write_text(json.dumps(
        {"pid": task.pid, "start": S.start_time(task.pid), "boot": S.boot_id()}))
    wait_for((tmp_path / "ready").exists, 30, "the task to start")
    return task, str(run_dir)


def stop(task):
    os.killpg(task.pid, signal.SIGKILL)
    task.wait()


def test_a_task_blocked_in_c_starts_its_profiler_once_on_the_agents_signal(tmp_path):
    task, run_dir = start_task(tmp_path)
    try:
        first = profiler.start_profilers(run_dir, {"worker-0": 27000, "worker-1": 27001})
        again = profiler.start_profilers(run_dir, {"worker-0": 27000})
        assert task.poll() is None  # the signal stops nothing
    finally:
        stop(task)
    port = first["worker-0"]["port"]
    assert profiler.PORT_OFFSET + 27000 <= port < 27000 + profiler.PORT_OFFSET + \
        profiler.PORT_TRIES
    assert again["worker-0"]["port"] == port
    # One server, started once, on the port the agent claimed.
    assert (tmp_path / "started").read_text() == "%d\n" % port
    assert first["worker-1"] == {"error": "it is not running"}


def test_a_task_without_tensorflow_says_so(tmp_path):
    task, run_dir = start_task(tmp_path, no_tf=True)
    try:
        answer = profiler.start_profilers(run_dir, {"worker-0": 27000})
    finally:
        stop(task)
    assert answer["worker-0"] == {
        "error": "TensorFlow is not imported in this process (yet)"}


def test_a_process_without_the_hook_is_named(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    task = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        (run_dir / "worker-0.pid").write_text(json.dumps(
            {"pid": task.pid, "start": S.start_time(task.pid), "boot": S.boot_id()}))
        answer = profiler.start_profilers(str(run_dir), {"worker-0": 27000})
    finally:
        stop(task)
    assert "loaded tfcluster's sitecustomize" in answer["worker-0"]["error"]


def test_the_profiler_messages_load_with_their_first_use():
    msg = P.decode(P.encode(profiler.StartProfilers(run_dir="/r", ports={"ps-0": 2222})))
    assert msg.ports == {"ps-0": 2222}
    assert P.DEFINED_IN["trace_profile"] == "tfcluster_agent.profiler"


def test_tasks_are_chosen_by_label():
    cluster = cluster_of(ps=1, workers=2)
    assert [t.label for t in profiling.parse_tasks(None, cluster)] == \
        ["worker:0", "worker:1", "ps:0"]
    assert [t.label for t in profiling.parse_tasks("ps:0, worker:1,ps:0", cluster)] == \
        ["ps:0", "worker:1"]
    with pytest.raises(UsageError, match="this run has no task 'worker:5'; its tasks are "
                                         "worker:0, worker:1, ps:0"):
        profiling.parse_tasks("worker:5", cluster)


def test_each_trace_file_is_matched_to_its_task():
    servers = {"worker:0": "10.0.0.1:2272", "ps:0": "10.0.0.1:2274"}
    assert profiling.trace_file_task("/x/10.0.0.1_2274.xplane.pb", servers) == "ps:0"
    assert profiling.trace_file_task("/x/10.0.0.1_22720.xplane.pb", servers) is None


def test_a_task_without_a_trace_is_named_with_why():
    cluster = cluster_of(ps=1, workers=2)
    taken = profiling.Profile("/runs/r/profile/1")
    taken.traced["worker:0"] = "/runs/r/profile/1/a.xplane.pb"
    taken.problems.update({"worker:1": "it is not running",
                           "ps:0": "TensorFlow is not imported in this process (yet)"})
    lines = []

    class Reporter:
        def note(self, text):
            lines.append(text)
    profiling.report_profile(Reporter(), taken, cluster.tasks)
    assert lines == ["profile of 1 task(s) in /runs/r/profile/1 (`tfcluster tensorboard` "
                     "shows it)",
                     "worker:1: not traced: it is not running",
                     "ps:0: not traced: TensorFlow is not imported in this process (yet)"]


@pytest.mark.parametrize("args, message", [
    (["profile", "r", "--duration", "0"], "--duration: must be more than 0"),
    (["profile", "r", "--duration", "601"], "--duration 601 is out of range"),
    (["profile", "r", "--tasks", "worker:9"], "this run has no task 'worker:9'"),
    (["profile", "r"], "run r has ended (succeeded): only a running run can be profiled"),
    (["launch", "--cmd", "true", "--detach", "--profile-at", "5"],
     "--profile-at needs the launcher"),
    (["launch", "--cmd", "true", "--profile-at", "-1"], "--profile-at: must not be negative"),
])
def test_profile_refuses_bad_input_in_one_line(tmp_path, capsys, monkeypatch, args, message):
    monkeypatch.setattr("support.fakehosts.FakeLink", FakeLink)
    run(tmp_path, cluster_of(ps=1, workers=1), {"worker-0": [0]})
    assert run_record(str(tmp_path / "runs"), "r")["state"] == "succeeded"
    code, _, err = run_cli(capsys, "--runs-dir", str(tmp_path / "runs"), *args)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_a_run_that_trains_with_collectives_is_traced_only_when_asked_knowingly(
        tmp_path, capsys, monkeypatch):
    """TensorFlow's profiler can crash a task of an all-reduce run when a trace ends
    (docs/profile.md): --profile-at refuses before anything starts, `tfcluster profile` before
    any host is asked; the flag that says 'knowingly' lets both through."""
    workers_only, with_ps = cluster_of(ps=0, workers=2), cluster_of(ps=1, workers=2)
    assert profiling.trains_with_collectives(workers_only)
    assert not profiling.trains_with_collectives(with_ps)
    assert not profiling.trains_with_collectives(cluster_of(ps=0, workers=1))
    with pytest.raises(UsageError, match="add --profile-unsafe to trace it anyway"):
        run(tmp_path, workers_only, {}, profile_at=5)
    assert not (tmp_path / "runs" / "r").exists()
    monkeypatch.setattr(profiling.ProfileAt, "_take", lambda self: None)
    run(tmp_path, workers_only, {"worker-0": [0], "worker-1": [0]}, profile_at=5,
        profile_unsafe=True)
    record = run_record(str(tmp_path / "runs"), "r")
    assert record["state"] == "succeeded"
    record["state"] = "running"  # as while it trains
    (tmp_path / "runs" / "r" / "run.json").write_text(json.dumps(record))
    asked = []
    monkeypatch.setattr(profiling, "take_profile",
                        lambda *a: asked.append(a) or profiling.Profile("f"))
    code, _, err = run_cli(capsys, "--runs-dir", str(tmp_path / "runs"), "profile", "r")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "run r trains with collective ops (2 tasks, no ps)" in err and "--unsafe" in err
    assert asked == []
    code, _, err = run_cli(capsys, "--runs-dir", str(tmp_path / "runs"), "profile", "r",
                           "--unsafe")
    assert len(asked) == 1 and "collective" not in err


def test_a_multi_worker_mirrored_launch_with_profile_at_is_refused_before_it_starts(tmp_path):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(local_inventory_text(str(tmp_path / "work"), ps=0, workers=2))
    runs_dir = tmp_path / "runs"
    done = tfcluster("launch", "multi_worker_mirrored", "-i", str(inventory), "--smoke",
                     "--run-id", "m", "--profile-at", "40", runs_dir=str(runs_dir), timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "tfcluster: error: run m trains with collective ops (2 tasks, no ps): TensorFlow's "
        "profiler can crash such a task when its trace ends (docs/profile.md); add "
        "--profile-unsafe to trace it anyway"]
    assert not (runs_dir / "m").exists() and not (tmp_path / "work").exists()
    # With --baseline, before the single task's run too.
    done = tfcluster("launch", "multi_worker_mirrored", "-i", str(inventory), "--smoke",
                     "--run-id", "b", "--baseline", "--profile-at", "40",
                     runs_dir=str(runs_dir), timeout=60)
    assert done.returncode == 2 and "add --profile-unsafe" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (runs_dir / "b-baseline").exists() and not (tmp_path / "work").exists()


def test_profile_at_starts_one_trace_at_its_step(monkeypatch):
    taken = []
    monkeypatch.setattr(profiling.ProfileAt, "_take", lambda self: taken.append(self.step))

    class Reporter:
        def note(self, text):
            taken.append(text)
    at = profiling.ProfileAt(20, cluster_of(), "r", "/runs/r", Reporter())
    at.poll({"worker:0": {"step": 19}, "worker:1": {"loss": 1.0}})
    assert taken == []
    at.poll({"worker:0": {"step": 19}, "worker:1": {"step": 21}})
    at.wait(5)
    at.poll({"worker:0": {"step": 40}})
    assert taken == ["step 21 reached: tracing every task for 2s (--profile-at)", 20]
    profiling.ProfileAt(None, cluster_of(), "r", "/runs/r", Reporter()).poll({"w": {"step": 9}})
    assert len(taken) == 2


def test_tensorboard_serves_one_run_with_profiles_from_its_folder(tmp_path, monkeypatch):
    from tfcluster.view import tensorboard
    monkeypatch.setattr(tensorboard.importlib.util, "find_spec", lambda name: object())
    traced, other = tmp_path / "a", tmp_path / "b"
    (traced / "profile" / "20261128-095606").mkdir(parents=True)
    for run_dir in (traced, other):
        (run_dir / "tensorboard" / "worker-0").mkdir(parents=True)
    assert tensorboard.command([str(traced)])[3:5] == ["--logdir", str(traced)]
    assert tensorboard.command([str(traced), str(other)])[3:5] == [
        "--logdir_spec", "a:{0}/tensorboard,b:{1}/tensorboard".format(traced, other)]


def test_a_host_sends_only_the_files_of_a_trace_folder_of_its_run(tmp_path):
    trace = tmp_path / "run" / "profile" / "20261128-101500" / "plugins" / "profile" / "t"
    trace.mkdir(parents=True)
    (trace / "10.0.0.2_2272.xplane.pb").write_bytes(b"xspace")
    files = profiler.read_files(str(tmp_path / "run"), str(tmp_path / "run" / "profile" /
                                                           "20261128-101500"))
    assert files == {"profile/20261128-101500/plugins/profile/t/10.0.0.2_2272.xplane.pb":
                     "eHNwYWNl"}
    with pytest.raises(ValueError, match="is not a trace folder of the run"):
        profiler.read_files(str(tmp_path / "run"), str(tmp_path))


def test_the_converter_the_tests_unpack_is_the_plugin_the_viz_extra_pins():
    """tensorboard-plugin-profile X.Y.Z requires xprof X.Y.Z, whose converter `make xprof`
    unpacks for the tests that read traces as the plugin shows them."""
    import re
    with open(os.path.join(REPO, "Makefile")) as handle:
        unpacked = re.search(r"^XPROF := (\S+)$", handle.read(), re.M).group(1)
    with open(os.path.join(REPO, "pyproject.toml")) as handle:
        pinned = re.search(r'"tensorboard-plugin-profile==([^"]+)"', handle.read()).group(1)
    assert unpacked == pinned
