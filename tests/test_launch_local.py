"""The launcher end to end on this machine: real TensorFlow runs, failures, signals, detach."""
import os
import signal
import subprocess
import sys
import time

import pytest


from support import REPO
from support.cli import assert_run_clean, run_record, tfcluster, wait_running
from support.procs import pid_alive, wait_for

pytestmark = pytest.mark.slow  # real launches, TensorFlow in two of them

FAKE = "python %s" % os.path.join(REPO, "tests", "programs", "fake_task.py")


def check_mnist_run(runs_dir, sync):
    record = run_record(runs_dir)
    assert record["state"] == "succeeded" and record["exit_code"] == 0
    run_dir = os.path.join(runs_dir, record["id"])
    for name in ("ps-0", "worker-0", "worker-1"):
        assert os.path.getsize(os.path.join(run_dir, name + ".log")) > 0
    assert record["cluster"]["ps"] and len(record["cluster"]["worker"]) == 2
    assert record["machines"][0]["tf_version"].startswith("2.21")
    assert record["tasks"]["ps:0"]["state"] == "stopped"
    # The loss at global step 0, seen by whichever worker evaluated before any update.
    initial = max(r["initial_loss"] for r in record["results"].values())
    assert initial > 1.5
    for label in ("worker:0", "worker:1"):
        result = record["results"][label]
        assert record["tasks"][label]["state"] == "succeeded"
        assert result["sync"] is sync
        assert result["global_step"] >= 60
        # Learned: validation cross entropy far below where it started (ln 10 = 2.3).
        assert result["loss"] < 0.5 * initial, result
        assert result["accuracy"] > 0.5
    with open(os.path.join(run_dir, "worker-0.log")) as handle:
        assert "validation cross entropy" in handle.read()
    assert_run_clean(record)
    return record


def test_mnist_replica_sync(local_env):
    inventory, runs_dir = local_env
    tfcluster("launch", "mnist_replica", "-i", inventory, "--smoke", "--", "--sync_replicas",
              runs_dir=runs_dir, check=0)
    record = check_mnist_run(runs_dir, sync=True)
    steps = {r["global_step"] for r in record["results"].values()}
    assert steps == {60}, "sync workers stop together at exactly the target step"


def test_crashing_worker_stops_everything(local_env):
    inventory, runs_dir = local_env
    started = time.monotonic()
    proc = tfcluster("launch", "--cmd", FAKE, "-i", inventory, "--ps", "1", "--workers", "2",
                     "--chief", "0", runs_dir=runs_dir,
                     env={"FAKE_WORKER_0": "forever", "FAKE_WORKER_1": "exit:3:1"})
    elapsed = time.monotonic() - started
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "worker:1 on localhost exited with status 3" in proc.stderr
    assert "last 20 lines of worker:1" in proc.stdout
    record = run_record(runs_dir)
    assert record["state"] == "failed"
    assert record["tasks"]["worker:0"]["state"] == "stopped"
    assert record["tasks"]["worker:1"]["exit"] == 3
    assert_run_clean(record)
    assert elapsed < 60, "teardown after a failure took %.0fs" % elapsed


def test_custom_command_gets_cluster_and_interpreter(local_env):
    inventory, runs_dir = local_env
    tfcluster("launch", "--cmd", FAKE + " {{ flags }}", "-i", inventory, "--chief", "0",
              runs_dir=runs_dir, check=0)
    record = run_record(runs_dir)
    assert set(record["tasks"]) == {"worker:0", "worker:1", "worker:2", "ps:0", "ps:1"}
    with open(os.path.join(runs_dir, record["id"], "worker-2.log")) as handle:
        log = handle.read()
    # `python` is the host's tfcluster_python, first on PATH.
    assert "python %s" % os.path.dirname(sys.executable) in log
    assert "--job_name=worker --task_index=2" in log
    assert record["results"]["worker:2"] == {"task": "worker:2", "accuracy": 0.5}


def test_custom_command_metrics_reach_the_file_the_plot_and_tensorboard(local_env):
    """A --cmd program printing the documented metrics lines and writing TensorBoard scalars
    where the README says gets what the built-in examples get."""
    from support.example_checks import check_metrics, tensorboard_scalars
    inventory, runs_dir = local_env
    program = "python %s" % os.path.join(REPO, "tests", "programs", "metrics_task.py")
    tfcluster("launch", "--cmd", program, "-i", inventory, "--chief", "0", "--ps", "0",
              "--workers", "2", "--run-id", "own", runs_dir=runs_dir, check=0)
    record = run_record(runs_dir, "own")
    run_dir = os.path.join(runs_dir, "own")
    workers = ["worker:0", "worker:1"]
    assert sorted(record["results"]) == workers
    for label in workers:
        result = record["results"][label]
        assert result["loss"] < 0.1 * result["initial_loss"], result
        scalars = tensorboard_scalars(run_dir, label)
        assert [step for step, _ in scalars["loss"]] == list(range(1, 9)), scalars
    check_metrics(run_dir, record, workers)


def test_timeout_stops_everything(local_env):
    inventory, runs_dir = local_env
    proc = tfcluster("launch", "--cmd", FAKE, "-i", inventory, "--ps", "1", "--workers", "1",
                     "--chief", "0", "--timeout", "3", runs_dir=runs_dir,
                     env={"FAKE_WORKER_0": "forever"})
    assert proc.returncode == 124, proc.stderr
    record = run_record(runs_dir)
    assert record["state"] == "timed_out"
    assert_run_clean(record)


def launcher_argv(inventory, runs_dir, *extra, example=None, trainer_args=()):
    what = [example, "--smoke"] if example else ["--cmd", FAKE]
    argv = [sys.executable, "-m", "tfcluster", "--runs-dir", runs_dir, "launch", *what,
            "-i", inventory, "--ps", "1", "--workers", "2", "--chief", "0"] + list(extra)
    return argv + (["--"] + list(trainer_args) if trainer_args else [])


def fake_env(env=None):
    """The fake tasks' behaviours (tests/programs/fake_task.py): the workers run until stopped
    unless ENV says otherwise."""
    return dict(os.environ, **dict({"FAKE_WORKER_0": "forever", "FAKE_WORKER_1": "forever"},
                                   **(env or {})))


def launcher_process(inventory, runs_dir, *extra, env=None, example=None, trainer_args=()):
    return subprocess.Popen(launcher_argv(inventory, runs_dir, *extra, example=example,
                                          trainer_args=trainer_args),
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=fake_env(env))


def signalled(launcher, signum, runs_dir):
    """SIGNUM to the LAUNCHER once every task of its run runs: (stdout, stderr)."""
    try:
        record = wait_running(runs_dir)
        assert all(pid_alive(t["pid"]) for t in record["tasks"].values())
        launcher.send_signal(signum)
        out, err = launcher.communicate(timeout=90)
    finally:
        launcher.kill()
    return out, err


def test_sigint_stops_every_task(local_env):
    inventory, runs_dir = local_env
    launcher = launcher_process(inventory, runs_dir)
    out, err = signalled(launcher, signal.SIGINT, runs_dir)
    assert launcher.returncode == 130, err
    assert "SIGINT received" in out
    record = run_record(runs_dir)
    assert record["state"] == "interrupted"
    assert_run_clean(record)


def assert_drained(record, runs_dir, drained, stopped, reason, state="interrupted"):
    """The tasks DRAINED ended on the termination notice (saying REASON), before anything was
    stopped; the tasks STOPPED, which ignore it, were stopped (TERM) after it; the run ended
    in STATE."""
    assert record["state"] == state and record["ended"], record
    for label in drained:
        task = record["tasks"][label]
        assert (task["exit"], task["state"]) == (42, "stopped"), (label, task)
        with open(os.path.join(runs_dir, record["id"], task["log"])) as handle:
            assert 'termination notice: {"reason": "%s"' % reason in handle.read(), label
    for label in stopped:
        assert (record["tasks"][label]["exit"], record["tasks"][label]["state"]) == \
            (143, "stopped"), record["tasks"][label]
    assert_run_clean(record)


def test_sigterm_gives_every_task_the_termination_notice_before_the_stop(local_env):
    """SIGTERM to the launcher drains: the notice file reaches the workers (worker:0 watches it
    and ends on it), worker:1, which ignores it, is stopped after --drain-grace; the ps, which
    serves them, is stopped once they ended."""
    inventory, runs_dir = local_env
    launcher = launcher_process(inventory, runs_dir, "--drain-grace", "3", "--stop-grace", "3",
                                env={"FAKE_WORKER_0": "drain"})
    out, err = signalled(launcher, signal.SIGTERM, runs_dir)
    assert launcher.returncode == 130, err
    assert "SIGTERM received: draining every task" in out
    assert "termination notice to every task but the servers (SIGTERM): they get 3s to " \
        "checkpoint and end; then ps:0, serving them, stops" in out, out
    assert_drained(run_record(runs_dir), runs_dir, ["worker:0"], ["worker:1", "ps:0"], "SIGTERM")


def test_a_closed_terminal_drains_and_tears_down(local_env):
    """The launcher's terminal closes (a pty whose other side is closed: SIGHUP, then writes
    that fail): the workers get the notice, nothing runs on past --drain-grace and --stop-grace,
    and run.json reads as ended. Before, the tasks lived on until their lease ran out."""
    import fcntl
    import pty
    import select
    import termios
    inventory, runs_dir = local_env
    master, terminal = pty.openpty()
    launcher = subprocess.Popen(
        launcher_argv(inventory, runs_dir, "--drain-grace", "3", "--stop-grace", "3"),
        cwd=REPO, stdin=terminal, stdout=terminal, stderr=terminal, start_new_session=True,
        # Its own session, with the pty as its controlling terminal, as a login shell's.
        preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),
        env=fake_env({"FAKE_WORKER_0": "drain"}))
    os.close(terminal)
    shown = []

    def running():
        while select.select([master], [], [], 0)[0]:  # the live table, read as it is drawn
            shown.append(os.read(master, 65536))
        try:
            return run_record(runs_dir)["state"] == "running"
        except (AssertionError, OSError, ValueError):
            return False
    try:
        wait_for(running, 90, "the run to be running")
        record = run_record(runs_dir)
        pids = [t["pid"] for t in record["tasks"].values()]
        closed = time.monotonic()
        os.close(master)  # the terminal goes away
        master = None
        wait_for(lambda: not any(pid_alive(p) for p in pids), 3 + 3 + 10, "the tasks to end")
        gone = time.monotonic() - closed
        launcher.wait(timeout=60)
    finally:
        launcher.kill()
        if master is not None:
            os.close(master)
    assert b"tfcluster: run " in b"".join(shown)  # the launcher wrote to its terminal
    assert gone < 3 + 3, "tasks ran %.1fs after the terminal closed" % gone
    assert launcher.returncode == 130
    assert_drained(run_record(runs_dir), runs_dir, ["worker:0"], ["worker:1", "ps:0"], "SIGHUP")


def test_sigterm_drains_multi_worker_mirrored_to_one_checkpoint_a_resume_goes_on_from(local_env):
    """Real TensorFlow: SIGTERM to the launcher of a MultiWorkerMirroredStrategy run. Both
    workers end after the same step (the notice rides the step's all-reduce), the chief commits
    that step's checkpoint, both exit 42; `--resume` restores it and trains on from there."""
    from trainers.common import checkpoints
    inventory, runs_dir = local_env
    launcher = subprocess.Popen(
        launcher_argv(inventory, runs_dir, "--run-id", "first", "--workers", "2", "--ps", "0",
                      example="multi_worker_mirrored", trainer_args=["--train_steps=1000000"]),
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = os.path.join(runs_dir, "first", "worker-1.log")
    try:
        wait_for(lambda: os.path.exists(log) and "TFCLUSTER_METRIC" in open(log).read(), 240,
                 "worker:1 to train")
        launcher.send_signal(signal.SIGTERM)
        out, err = launcher.communicate(timeout=120)
    finally:
        launcher.kill()
    assert launcher.returncode == 130, out[-3000:] + err
    record = run_record(runs_dir, "first")
    steps = {r["global_step"] for r in record["results"].values()}
    assert len(steps) == 1 and all(r["drained"] for r in record["results"].values()), steps
    assert {(t["exit"], t["state"]) for t in record["tasks"].values()} == {(42, "stopped")}
    folder = os.path.join(record["tasks"]["worker:0"]["host_run_dir"], "checkpoints")
    drained_at = steps.pop()
    assert checkpoints.latest(folder).step == drained_at
    assert_run_clean(record)
    tfcluster("launch", "multi_worker_mirrored", "--smoke", "-i", inventory, "--workers", "2",
              "--ps", "0", "--chief", "0", "--run-id", "second", "--resume", "first", "--",
              "--train_steps=%d" % (drained_at + 20), runs_dir=runs_dir, check=0)
    resumed = run_record(runs_dir, "second")["results"]
    assert {(r["start_step"], r["global_step"]) for r in resumed.values()} == \
        {(drained_at, drained_at + 20)}


def test_drain_of_a_run_its_launcher_follows_goes_through_the_launcher(local_env):
    inventory, runs_dir = local_env
    launcher = launcher_process(inventory, runs_dir, "--drain-grace", "3", "--stop-grace", "3",
                                env={"FAKE_WORKER_0": "drain"})
    try:
        record = wait_running(runs_dir)
        drain = tfcluster("drain", runs_dir=runs_dir, check=0)
        out, err = launcher.communicate(timeout=90)
    finally:
        launcher.kill()
    assert "run %s: its launcher (pid %d) drains it" % (record["id"], launcher.pid) \
        in drain.stdout
    assert "run %s: interrupted" % record["id"] in drain.stdout
    assert launcher.returncode == 130 and "SIGTERM received: draining every task" in out, err
    assert_drained(run_record(runs_dir), runs_dir, ["worker:0"], ["worker:1", "ps:0"], "SIGTERM")


def test_drain_of_a_detached_run(local_env):
    inventory, runs_dir = local_env
    tfcluster("launch", "--cmd", FAKE, "-i", inventory, "--ps", "1", "--workers", "2",
              "--chief", "0", "--detach", "--run-id", "bg", runs_dir=runs_dir,
              env={"FAKE_WORKER_0": "drain", "FAKE_WORKER_1": "forever"}, check=0)
    drain = tfcluster("drain", "bg", "--drain-grace", "3", "--grace", "3", runs_dir=runs_dir,
                      check=0)
    assert "termination notice to every task but the servers (tfcluster drain): they get 3s" \
        in drain.stdout, drain.stdout
    assert "run bg: stopped; no task left running, ports free" in drain.stdout
    assert_drained(run_record(runs_dir, "bg"), runs_dir, ["worker:0"], ["worker:1", "ps:0"],
                   "tfcluster drain", state="stopped")


def test_detach_status_logs_stop(local_env):
    inventory, runs_dir = local_env
    proc = tfcluster("launch", "--cmd", FAKE, "-i", inventory, "--ps", "1", "--workers", "2",
                     "--chief", "0", "--detach", "--run-id", "bg", runs_dir=runs_dir,
                     env={"FAKE_WORKER_0": "forever", "FAKE_WORKER_1": "forever"}, check=0)
    assert "tfcluster stop bg" in proc.stdout
    record = run_record(runs_dir, "bg")
    assert record["state"] == "running"
    assert all(pid_alive(t["pid"]) for t in record["tasks"].values())
    host_log = os.path.join(record["tasks"]["worker:1"]["host_run_dir"], "worker-1.log")
    wait_for(lambda: os.path.exists(host_log) and "starting" in open(host_log).read(), 30,
             "worker:1's first line")
    status = tfcluster("status", runs_dir=runs_dir, check=0)
    assert status.stdout.count("running") >= 3
    logs = tfcluster("logs", "bg", "--task", "worker:1", runs_dir=runs_dir, check=0)
    assert "fake worker:1 starting" in logs.stdout
    assert "[" not in logs.stdout.splitlines()[0]
    runs_list = tfcluster("runs", runs_dir=runs_dir, check=0)
    assert "bg" in runs_list.stdout and "running" in runs_list.stdout
    stop = tfcluster("stop", runs_dir=runs_dir, check=0)
    assert "no task left running, ports free" in stop.stdout
    record = run_record(runs_dir, "bg")
    assert record["state"] == "stopped"
    assert os.path.exists(os.path.join(runs_dir, "bg", "worker-1.log"))
    assert_run_clean(record)
    # Idempotent: stopping again finds nothing to do and says so.
    again = tfcluster("stop", "bg", runs_dir=runs_dir, check=0)
    assert "already ended" in again.stdout


def test_busy_port_fails_preflight_and_starts_nothing(local_env):
    import socket
    inventory, runs_dir = local_env
    from tfcluster.hosts.inventory import load_slots
    from tfcluster.spec.cluster import build_cluster
    cluster = build_cluster(load_slots(inventory), {"chief": 0, "worker": 1, "ps": 1,
                                                   "evaluator": 0})
    blocker = socket.socket()
    blocker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    blocker.bind(("", cluster.tasks[-1].port))
    blocker.listen()
    try:
        proc = tfcluster("launch", "--cmd", FAKE, "-i", inventory, "--ps", "1", "--workers", "1",
                         "--chief", "0", runs_dir=runs_dir)
    finally:
        blocker.close()
    assert proc.returncode == 3
    assert "already in use" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not os.path.exists(runs_dir) or not os.listdir(runs_dir)


def test_missing_dataset_fails_preflight_naming_it(local_env):
    inventory, runs_dir = local_env
    proc = tfcluster("launch", "mnist_replica", "-i", inventory, runs_dir=runs_dir)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    error = proc.stderr.strip()
    assert len(error.splitlines()) == 1 and "Traceback" not in error, error
    assert "data set mnist missing in" in error and "train-images-idx3-ubyte.gz" in error
    assert "tfcluster data fetch mnist --dest" in error and "--smoke" in error
    assert not os.path.exists(runs_dir) or not os.listdir(runs_dir)


def test_check_prints_a_table(local_env):
    inventory, _ = local_env
    proc = tfcluster("check", "-i", inventory, check=0)
    assert "localhost" in proc.stdout and "2.21" in proc.stdout and "same" in proc.stdout


def test_a_killed_mnist_worker_restarts_and_the_run_succeeds(local_env):
    """Between-graph replication survives a worker's death: with --restarts 1 the worker is
    started again with the same TF_CONFIG, rejoins the ps, and the run succeeds. The same
    launch is the async mnist_replica run whose learning check_mnist_run proves (resuming from
    a checkpoint, `--resume`: the labs' every-example test, tests/support/example_smoke.py)."""
    inventory, runs_dir = local_env
    launcher = launcher_process(inventory, runs_dir, "--restarts", "1", example="mnist_replica",
                                trainer_args=("--train_steps=400",))
    try:
        record = wait_running(runs_dir)
        log = os.path.join(runs_dir, record["id"], "worker-1.log")
        wait_for(lambda: os.path.exists(log) and "TFCLUSTER_METRIC" in open(log).read(), 180,
                 "worker:1 to train")
        os.killpg(record["tasks"]["worker:1"]["pid"], signal.SIGKILL)
        out, err = launcher.communicate(timeout=300)
    finally:
        launcher.kill()
    assert launcher.returncode == 0, out[-3000:] + err
    assert "worker:1 on localhost was killed by SIGKILL; restarting worker:1" in out
    record = check_mnist_run(runs_dir, sync=False)
    assert "[worker:1 localhost] " in out
    assert "run %s succeeded" % record["id"] in out
    assert record["tasks"]["worker:1"]["restarts"] == 1
    assert record["results"]["worker:0"]["global_step"] >= 400
