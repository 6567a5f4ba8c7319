"""The fault matrix on this machine, with a stand-in task (no TensorFlow, so each case takes
seconds): every case ends with a report naming the task, a teardown, no process of the run
left, and every log that existed kept. Cases that need other hosts are in test_ssh.py."""
import os
import signal
import stat
import subprocess
import sys

import pytest

from support import REPO
from support.cli import assert_run_clean, run_record, stopped_by_lease, tfcluster, wait_running
from support.procs import pid_alive, processes_matching, wait_for

pytestmark = pytest.mark.slow  # every case is a real launch of several processes

FAKE = "python %s" % os.path.join(REPO, "tests", "programs", "fake_task.py")
CLUSTER = ("--ps", "1", "--workers", "2", "--chief", "0")


def launch_in_background(inventory, runs_dir, *extra, env=None):
    argv = [sys.executable, "-m", "tfcluster", "--runs-dir", runs_dir, "launch", "--cmd", FAKE,
            "-i", inventory, *CLUSTER, "--success", "all_workers", *extra]
    environ = dict(os.environ, FAKE_WORKER_0="forever", FAKE_WORKER_1="forever")
    environ.update(env or {})
    return subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=environ)


def kill_task(record, label, sig=signal.SIGKILL):
    os.killpg(record["tasks"][label]["pid"], sig)


@pytest.mark.parametrize("victim", ["ps:0", "worker:1"])
def test_a_task_killed_mid_run_fails_the_run_naming_it(local_env, victim):
    inventory, runs_dir = local_env
    launcher = launch_in_background(inventory, runs_dir)
    try:
        record = wait_running(runs_dir)
        ps_log = os.path.join(runs_dir, record["id"], "ps-0.log")
        wait_for(lambda: os.path.exists(ps_log) and "listening" in open(ps_log).read(), 60,
                 "the ps to listen")
        kill_task(record, victim)
        out, err = launcher.communicate(timeout=90)
    finally:
        launcher.kill()
    assert launcher.returncode == 1, out + err
    assert "%s on localhost" % victim in err and "killed by SIGKILL" in err
    record = run_record(runs_dir)
    assert record["state"] == "failed" and record["tasks"][victim]["exit"] == 128 + 9
    for name in ("ps-0", "worker-0", "worker-1"):
        assert os.path.exists(os.path.join(runs_dir, record["id"], name + ".log"))
    assert "listening" in open(os.path.join(runs_dir, record["id"], "ps-0.log")).read()
    assert_run_clean(record)


def test_a_killed_worker_with_restarts_rejoins_and_the_run_succeeds(local_env, tmp_path):
    inventory, runs_dir = local_env
    marker = tmp_path / "worker-1.started"
    # worker:1 runs until it is killed; its restart (the marker exists then) exits 0.
    launcher = launch_in_background(inventory, runs_dir, "--restarts", "1",
                                    env={"FAKE_WORKER_1": "foreveronce:%s" % marker,
                                         "FAKE_WORKER_0": "exit:0:1"})
    try:
        record = wait_running(runs_dir)
        wait_for(marker.exists, 60, "worker:1 to run")
        kill_task(record, "worker:1")
        out, err = launcher.communicate(timeout=120)
    finally:
        launcher.kill()
    assert launcher.returncode == 0, out + err
    assert "worker:1 on localhost was killed by SIGKILL; restarting worker:1 (restart 1 of 1)" \
        in out
    record = run_record(runs_dir)
    assert record["state"] == "succeeded"
    assert record["tasks"]["worker:1"]["restarts"] == 1
    assert record["restart_log"][0]["task"] == "worker:1"
    assert "(restarted 1 time(s))" in out
    assert_run_clean(record)


def test_restarts_run_out(local_env, tmp_path):
    inventory, runs_dir = local_env
    proc = tfcluster("launch", "--cmd", FAKE, "-i", inventory, *CLUSTER, "--restarts", "1",
                     runs_dir=runs_dir, env={"FAKE_WORKER_1": "exit:3:0.2"})
    assert proc.returncode == 1
    assert "restart 1 of 1" in proc.stdout and "worker:1 on localhost exited with status 3" \
        in proc.stderr
    assert run_record(runs_dir)["tasks"]["worker:1"]["restarts"] == 1


def test_two_runs_with_one_id_leave_each_other_alone(local_env, tmp_path):
    """Another controller (its own runs dir) reusing a run id must not touch the first run."""
    inventory, runs_dir = local_env
    tfcluster("launch", "--cmd", FAKE, "-i", inventory, *CLUSTER, "--detach", "--run-id", "same",
              runs_dir=runs_dir, check=0,
              env={"FAKE_WORKER_0": "forever", "FAKE_WORKER_1": "forever"})
    first = run_record(runs_dir, "same")
    other_runs = str(tmp_path / "other-runs")
    second = tfcluster("launch", "--cmd", FAKE, "-i", inventory, *CLUSTER, "--run-id", "same",
                       runs_dir=other_runs)
    assert second.returncode != 0
    assert "claimed by run same" in second.stderr  # its ports, before its folder
    assert all(pid_alive(t["pid"]) for t in first["tasks"].values())
    host_log = os.path.join(first["tasks"]["worker:0"]["host_run_dir"], "worker-0.log")
    wait_for(lambda: os.path.exists(host_log) and os.path.getsize(host_log) > 0, 30,
             "worker:0's first line")
    log = os.path.join(runs_dir, "same", "worker-0.log")
    tfcluster("stop", "same", runs_dir=runs_dir, check=0)
    assert os.path.getsize(log) > 0
    assert_run_clean(run_record(runs_dir, "same"))


def test_secrets_reach_the_task_but_no_file(local_env, tmp_path):
    inventory, runs_dir = local_env
    secret, other = "hunter2-%d" % os.getpid(), "s3cond-%d" % os.getpid()
    env_file = tmp_path / "secrets.env"
    env_file.write_text("# a comment\nOTHER=%s\n" % other)
    program = ("python -c \"import os, hashlib; print('digest', hashlib.sha256("
               "(os.environ['SECRET'] + os.environ['OTHER']).encode()).hexdigest())\"")
    proc = tfcluster("launch", "--cmd", program, "-i", inventory, "--ps", "0", "--workers", "1",
                     "--chief", "0", "--env", "SECRET=" + secret, "--env-file", str(env_file),
                     runs_dir=runs_dir, check=0)
    import hashlib
    assert hashlib.sha256((secret + other).encode()).hexdigest() in proc.stdout
    record = run_record(runs_dir)
    assert record["tasks"]["worker:0"]["env_names"].count("SECRET") == 1
    workdir = os.path.join(os.path.dirname(runs_dir), "work")
    for folder in (runs_dir, workdir):
        found = subprocess.run(["grep", "-rlE", "%s|%s" % (secret, other), folder],
                               capture_output=True, text=True)
        assert found.stdout == "", "secret written to %s" % found.stdout
    run_dir = os.path.join(runs_dir, record["id"])
    host_dir = record["tasks"]["worker:0"]["host_run_dir"]
    for folder in (run_dir, host_dir):
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700, folder
        for name in os.listdir(folder):
            path = os.path.join(folder, name)
            assert stat.S_IMODE(os.stat(path).st_mode) & 0o077 == 0, path


def test_controller_runs_dir_full(local_env, tmp_path):
    """A full disk on the controller: the run fails with a one-line error, nothing is left."""
    inventory, _ = local_env
    mount = tmp_path / "small"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)],
                      capture_output=True).returncode != 0:
        pytest.skip("needs root to mount a small tmpfs")
    try:
        (mount / "filler").write_bytes(b"x" * (64 * 1024 - 4096))
        runs_dir = str(mount / "runs")
        proc = tfcluster("launch", "--cmd", FAKE, "-i", inventory, *CLUSTER, runs_dir=runs_dir,
                         env={"FAKE_WORKER_0": "exit:0:2"})
        assert proc.returncode != 0
        assert "Traceback" not in proc.stderr and "No space left" in proc.stderr
        assert not processes_matching(str(tmp_path / "work"))
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def test_a_stale_run_record_is_closed_by_stop(local_env):
    """A launcher killed with SIGKILL: its tasks stop by themselves once the lease runs out;
    run.json still says running, status tells, and `tfcluster stop` closes the run."""
    inventory, runs_dir = local_env
    launcher = launch_in_background(inventory, runs_dir)  # the default lease, 60 s
    try:
        record = wait_running(runs_dir)
        launcher.kill()
        launcher.wait(timeout=30)
        wait_for(lambda: stopped_by_lease(record), 60, "the lease to stop the tasks")
    finally:
        launcher.kill()
    status = tfcluster("status", runs_dir=runs_dir, check=0)
    assert status.stdout.count("exited") + status.stdout.count("lost") == 3, status.stdout
    assert "no worker is running any more" in status.stdout
    tfcluster("stop", runs_dir=runs_dir, check=0)
    record = run_record(runs_dir)
    assert record["state"] == "stopped"
    assert_run_clean(record)
