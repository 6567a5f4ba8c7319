"""No silent hang, planted in real launches: a worker that blocks (locally, --on-stall stop), a
MultiWorkerMirroredStrategy worker that blocks before its first collective and then exits, one
whose tf.data generator blocks on a read off the main thread (the TensorFlow launches), and a
healthy run on the test hosts whose stacks are taken on demand before one of its workers is
stopped with SIGSTOP. Each cause must be named within
--stall-after + 30 s of the fault."""
import os
import re
import signal
import time

import pytest

from support import REPO
from support.cli import Launcher, assert_run_clean, run_record, tfcluster
from support.procs import processes_of_run
from support.ssh import ssh_inventory

pytestmark = pytest.mark.slow

PROGRAMS = os.path.join(REPO, "tests", "programs")
STALL_TASK = "python %s" % os.path.join(PROGRAMS, "stall_task.py")
STALL_AFTER = 3
DEADLINE = STALL_AFTER + 30


def line_of(program, text):
    """The number of the line of PROGRAM (in tests/programs) that holds TEXT."""
    with open(os.path.join(PROGRAMS, program)) as handle:
        return next(n for n, line in enumerate(handle, 1) if text in line)


def test_a_blocked_worker_is_named_and_on_stall_stop_ends_the_run(local_env, tmp_path):
    """worker:1 blocks; worker:0 computes without printing, worker:2 prints, the ps idles: only
    worker:1 is stalled. The user's own sitecustomize still runs in every task."""
    inventory, runs_dir = local_env
    user = tmp_path / "user"
    user.mkdir()
    (user / "sitecustomize.py").write_text("print('user sitecustomize ran', flush=True)\n")
    launcher = Launcher(runs_dir, "--cmd", STALL_TASK, "-i", inventory, "--ps", "1",
                        "--workers", "3", "--chief", "0", "--success", "all_workers",
                        "--stall-after", str(STALL_AFTER), "--on-stall", "stop",
                        "--env", "STALL_WORKER_0=spin", "--env", "STALL_WORKER_1=block",
                        "--env", "PYTHONPATH=%s" % user)
    try:
        blocked = launcher.when(r"\[worker:1 .*\] worker:1 block", 90)
        cause = "worker:1 is stuck in wait_for_data (stall_task.py:%d)" % line_of(
            "stall_task.py", "time.sleep(3600)")
        assert launcher.when(re.escape("tfcluster: " + cause), DEADLINE, blocked) - blocked \
            < DEADLINE
        assert launcher.finish(60) == 1
    finally:
        launcher.kill()
    out = launcher.text()
    assert re.search(r"tfcluster: worker:1 stalled for [3-9] s \(no output, 0\.\d s CPU\)", out), out
    assert not re.search(r"(worker:0|worker:2|ps:0) stalled", out), out
    assert "\n  worker:1  wait_for_data (stall_task.py:%d) < <module>" % line_of(
        "stall_task.py", "time.sleep(3600)") in out
    assert re.search(r"\n  worker:0  spin \(stall_task\.py:\d+\)", out)
    # The report leads with the cause, before the table that says "stopped 143".
    assert out.index("tfcluster: the run stalled: " + cause) < out.index("\nTASK")
    assert out.rstrip().endswith("tfcluster: error: " + cause)
    record = run_record(runs_dir)
    assert record["state"] == "failed" and record["failure"] == cause
    stacks = os.path.join(runs_dir, record["id"], "stacks")
    assert sorted(os.listdir(stacks)) == ["ps-0.txt", "worker-0.txt", "worker-1.txt",
                                          "worker-2.txt"]
    assert "in wait_for_data" in open(os.path.join(stacks, "worker-1.txt")).read()
    for name in ("ps-0", "worker-0", "worker-1", "worker-2"):
        log = open(os.path.join(runs_dir, record["id"], name + ".log")).read()
        assert "user sitecustomize ran" in log, (name, log)
    assert_run_clean(record)


def test_mwms_waits_for_the_worker_stuck_before_its_collective_then_gone(local_env, tmp_path):
    """MultiWorkerMirroredStrategy: worker:1 waits for data before the first all-reduce, so
    worker:0 waits in it; once worker:1 gives up and exits 0, TensorFlow aborts worker:0's
    collective ten seconds later, and the failure names worker:1 and when it left."""
    inventory, runs_dir = local_env
    release = tmp_path / "release"
    launcher = Launcher(runs_dir, "--cmd", "python %s" % os.path.join(PROGRAMS, "mwms_hang.py"),
                        "-i", inventory, "--ps", "0", "--workers", "2", "--chief", "0",
                        "--stall-after", str(STALL_AFTER), "--env", "MWMS_RELEASE=%s" % release)
    try:
        ready = launcher.when(r"worker 1: strategy ready", 120)
        cause = ("tfcluster: worker:0 waits in a collective for worker:1, which is stuck in "
                 "wait_for_data (mwms_hang.py:%d)" % line_of("mwms_hang.py", "time.sleep"))
        named = launcher.when(re.escape(cause), DEADLINE, ready)
        release.touch()
        gone = launcher.when(r"\[worker:1 .*\] worker 1: no data, leaving", 30, named)
        assert launcher.finish(DEADLINE + 30) == 1
        failure = launcher.when(r"tfcluster: error: ", 1)
    finally:
        launcher.kill()
    out = launcher.text()
    assert named - ready < DEADLINE and failure - gone < DEADLINE, out
    assert re.search(r"tfcluster: worker:0 stalled for \d+ s \(no output, 0\.\d+ s CPU\)", out)
    assert re.search(r"\n  worker:0  quick_execute \(tensorflow/python/eager/execute\.py:\d+\)",
                     out)
    assert re.search(r"tfcluster: error: worker:0 waited in a collective for worker:1, which "
                     r"exited 0 at \d\d:\d\d:\d\d, until TensorFlow gave up \(worker:0 exited 1\)$",
                     out), out
    record = run_record(runs_dir)
    assert "tensorflow" in open(os.path.join(runs_dir, record["id"], "stacks",
                                             "worker-0.txt")).read()
    assert_run_clean(record)


def test_mwms_waits_for_the_worker_whose_generator_blocks_on_a_read(local_env, tmp_path):
    """MultiWorkerMirroredStrategy: worker:1's tf.data generator blocks on a read after two
    steps, off the main thread, which waits in TensorFlow for the next element; worker:0 waits
    in the all-reduce. The cause names the generator's frame; once fed, the run succeeds."""
    inventory, runs_dir = local_env
    feed = tmp_path / "feed"
    program = "mwms_generator_hang.py"
    launcher = Launcher(runs_dir, "--cmd", "python %s" % os.path.join(PROGRAMS, program),
                        "-i", inventory, "--ps", "0", "--workers", "2", "--chief", "0",
                        "--stall-after", str(STALL_AFTER), "--env", "MWMS_FEED=%s" % feed)
    try:
        blocked = launcher.when(r"\[worker:1 .*\] step 1: ", 120)
        where = "records (%s:%d)" % (program, line_of(program, "with open("))
        cause = "tfcluster: worker:0 waits in a collective for worker:1, whose input pipeline " \
            "is stuck in " + where
        named = launcher.when(re.escape(cause) + "$", DEADLINE, blocked)
        with open(feed, "w") as writer:
            writer.write("more data\n")
        assert launcher.finish(DEADLINE + 30) == 0
    finally:
        launcher.kill()
    out = launcher.text()
    assert named - blocked < DEADLINE, out
    assert re.search(r"\n  worker:1  iterator_get_next \(tensorflow/python/ops/gen_dataset_ops"
                     r"\.py:\d+\) < .* < <module> \(%s:\d+\)\n +its input pipeline: %s < "
                     r"generator_py_func \(tensorflow/python/data/ops/from_generator_op\.py:\d+\)"
                     % (re.escape(program), re.escape(where)), out), out
    assert "[worker:1 localhost] step 4: " in out
    record = run_record(runs_dir)
    assert record["state"] == "succeeded", out
    assert_run_clean(record)


@pytest.mark.root
def test_stacks_on_demand_then_a_stopped_worker_on_the_test_hosts(testhosts, tmp_path):
    """Over SSH: a healthy run is never called stalled (its ps idles, its workers print) and
    `tfcluster stacks` brings every task's stacks from its host; a worker stopped with SIGSTOP
    is stalled, named as stopped, and no longer stalled once continued."""
    inventory = ssh_inventory(testhosts, tmp_path)
    runs_dir = str(tmp_path / "runs")
    launcher = Launcher(runs_dir, "--cmd", STALL_TASK, "-i", inventory, "--run-id", "hang",
                        "--stall-after", str(STALL_AFTER))
    try:
        launcher.when(r"\[worker:1 .*\] step 3$", 90)
        stacks = tfcluster("stacks", "hang", runs_dir=runs_dir, check=0)
        for label, frame in (("ps:0", r"accept \(socket\.py:\d+\) < "),
                             ("worker:0", r"work \(stall_task\.py:\d+\) < <module>"),
                             ("worker:1", r"work \(stall_task\.py:\d+\) < <module>")):
            assert re.search(r"\n  %s +%s" % (label, frame), stacks.stdout), stacks.stdout
        folder = os.path.join(runs_dir, "hang", "stacks")
        assert sorted(os.listdir(folder)) == ["ps-0.txt", "worker-0.txt", "worker-1.txt"]
        worker1 = open(os.path.join(folder, "worker-1.txt")).read()
        assert worker1.startswith("# worker-1 on %s at " % testhosts.hosts[2][0]), worker1
        assert "stalled" not in launcher.text()
        record = run_record(runs_dir, "hang")
        host = testhosts.hosts[2][0]
        pgid = record["tasks"]["worker:1"]["pid"]
        assert testhosts.ssh(host, "kill -STOP -- -%d" % pgid).returncode == 0
        stopped = time.monotonic()
        launcher.when(r"tfcluster: worker:1 is stopped \(SIGSTOP, or a debugger holds it\)$",
                      DEADLINE, stopped)
        assert testhosts.ssh(host, "kill -CONT -- -%d" % pgid).returncode == 0
        launcher.when(r"tfcluster: worker:1 is no longer stalled: it printed after \d+ s "
                      r"without output", 30, stopped)
        launcher.proc.send_signal(signal.SIGTERM)
        assert launcher.finish(60) == 130
    finally:
        launcher.kill()
    out = launcher.text()
    assert re.search(r"tfcluster: worker:1 stalled for [3-9] s \(no output, 0\.0 s CPU\)", out)
    assert not re.search(r"(worker:0|ps:0) stalled", out), out
    assert_run_clean(run_record(runs_dir, "hang"))
    # The test hosts share this machine's processes: the run's own, not another test's.
    assert processes_of_run("hang") == []
