"""The launcher over SSH on the test hosts, with the checkout's own code (no deploy needed: the
hosts share this machine's filesystem except /opt). Deploy + launch is in test_dockerhosts.py."""
import os
import sys
import time

import pytest

from support import REPO
from support.cli import assert_run_clean, run_record, tfcluster, wait_running
from support.procs import processes_of_run, wait_for
from support.ssh import ssh_inventory

pytestmark = [pytest.mark.slow, pytest.mark.root]

FAKE = "python %s" % os.path.join(REPO, "tests", "programs", "fake_task.py")


def test_unreachable_host_fails_preflight_naming_it(testhosts, tmp_path):
    inventory = ssh_inventory(testhosts, tmp_path, connect_timeout=30)
    name, address = testhosts.hosts[1]
    # Only the host that will be down waits 3 s: a slow but healthy host is never blamed.
    text = open(inventory).read()
    open(inventory, "w").write(text.replace("%s: {ansible_host: %s}" % (name, address),
                                            "%s: {ansible_host: %s, tfcluster_connect_timeout: 3}"
                                            % (name, address)))
    testhosts.link(2, "down")
    try:
        started = time.monotonic()
        proc = tfcluster("launch", "--cmd", FAKE, "-i", inventory, runs_dir=str(tmp_path / "runs"))
        elapsed = time.monotonic() - started
    finally:
        testhosts.link(2, "up")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert address in proc.stderr and "cannot connect within 3s" in proc.stderr
    # Only the unreachable host is blamed, and nothing was started anywhere.
    assert testhosts.hosts[0][1] + ":" not in proc.stderr
    assert not os.path.exists(tmp_path / "runs") or not os.listdir(tmp_path / "runs")
    assert elapsed < 60


def test_sshd_down_fails_preflight_naming_the_host(testhosts, tmp_path):
    inventory = ssh_inventory(testhosts, tmp_path)
    name, address = testhosts.hosts[1]
    testhosts.sshd(2, "stop")
    try:
        proc = tfcluster("launch", "--cmd", FAKE, "-i", inventory, runs_dir=str(tmp_path / "runs"))
    finally:
        testhosts.sshd(2, "start")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    error = proc.stderr.strip()
    assert len(error.splitlines()) == 1 and "Traceback" not in error, error
    assert address in error and "connection refused on port 22: is sshd running?" in error
    assert testhosts.hosts[0][1] + ":" not in error
    assert not os.path.exists(tmp_path / "runs") or not os.listdir(tmp_path / "runs")
    # Back up, the host serves again.
    assert testhosts.ssh(name, "true").returncode == 0


def test_unknown_host_key_is_refused(testhosts, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    inventory = ssh_inventory(testhosts, tmp_path, known_hosts=str(empty))
    proc = tfcluster("check", "-i", inventory)
    assert proc.returncode == 3
    assert "host key not trusted" in proc.stderr


def test_detach_and_stop_over_ssh(testhosts, tmp_path):
    inventory = ssh_inventory(testhosts, tmp_path)
    runs_dir = str(tmp_path / "runs")
    # The controller's environment stays here; --env carries what the remote tasks need.
    run_id = "remote-%d" % os.getpid()  # unique on the machine: other sessions' tasks are not ours
    tfcluster("launch", "--cmd", FAKE, "-i", inventory, "--detach", "--run-id", run_id,
              "--env", "FAKE_WORKER_0=forever", "--env", "FAKE_WORKER_1=forever",
              runs_dir=runs_dir, check=0)
    record = run_record(runs_dir, run_id)
    hosts = {t["host"] for t in record["tasks"].values()}
    assert hosts == {address for _, address in testhosts.hosts[:3]}
    status = tfcluster("status", run_id, runs_dir=runs_dir, check=0)
    assert status.stdout.count("running") >= 3
    assert processes_of_run(run_id), "the check below could not see the run's tasks"
    tfcluster("stop", run_id, runs_dir=runs_dir, check=0)
    record = run_record(runs_dir, run_id)
    assert record["state"] == "stopped"
    for label in ("ps:0", "worker:0", "worker:1"):
        assert os.path.getsize(os.path.join(runs_dir, run_id, label.replace(":", "-") + ".log"))
    # The hosts share this machine's processes: no process, children included, of this run is left.
    assert not processes_of_run(run_id)
    assert_run_clean(record)


def test_a_host_cut_off_mid_run_fails_the_run_and_the_others_are_stopped(testhosts, tmp_path):
    """One host's link goes down: the run fails naming it within the lost-contact deadline, the
    healthy hosts' tasks stop at once with their logs kept, and the cut host's tasks stop by
    their lease once they can no longer hear the controller."""
    import subprocess
    inventory = ssh_inventory(testhosts, tmp_path)
    runs_dir = str(tmp_path / "runs")
    # The controller's environment stays here: --env carries what the remote tasks need.
    argv = [sys.executable, "-m", "tfcluster", "--runs-dir", runs_dir, "launch", "--cmd", FAKE,
            "-i", inventory, "--run-id", "cut", "--lost-contact", "10",
            "--env", "FAKE_WORKER_0=forever", "--env", "FAKE_WORKER_1=forever"]
    launcher = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    cut_name, cut_address = testhosts.hosts[2]
    try:
        wait_running(runs_dir, "cut", 60)
        testhosts.link(3, "down")
        cut_at = time.monotonic()
        out, err = launcher.communicate(timeout=120)
        failed_after = time.monotonic() - cut_at
        cut_task = run_record(runs_dir, "cut")["tasks"]["worker:1"]
    finally:
        launcher.kill()
        testhosts.link(3, "up")
    assert launcher.returncode == 1, out + err
    assert "lost contact with %s" % cut_address in err
    assert failed_after < 10 + 20, failed_after
    record = run_record(runs_dir, "cut")
    for label in ("ps:0", "worker:0"):
        assert record["tasks"][label]["state"] == "stopped", record["tasks"][label]
        log = os.path.join(runs_dir, "cut", label.replace(":", "-") + ".log")
        assert "fake %s starting" % label in open(log).read()
    # Back on the network, the cut host stops its task by itself once its lease (the default
    # 60 s) runs out; the lease's file is aged at each look so that this happens at once.
    aged_then_alive = "touch -d @0 %s/.lease; kill -0 %d" % (cut_task["host_run_dir"],
                                                            cut_task["pid"])
    wait_for(lambda: testhosts.ssh(cut_name, aged_then_alive).returncode != 0, 60,
             "the cut host's task to stop")


def test_an_attached_launch_over_ssh_with_relative_paths_ends_cleanly(testhosts, tmp_path):
    """The inventory names its key and known_hosts relative to its own folder (as Ansible reads
    group_vars), and the launch runs from another folder (the checkout). The run succeeds and
    prints nothing from destructors after it: every SSH channel and file is closed in order."""
    import shutil
    folder = tmp_path / "mycluster"
    (folder / "keys").mkdir(parents=True)
    shutil.copy(testhosts.key, folder / "keys" / "id_ed25519")
    shutil.copy(testhosts.known_hosts, folder / "keys" / "known_hosts")
    inventory = ssh_inventory(testhosts, folder, known_hosts="keys/known_hosts")
    text = open(inventory).read().replace(str(testhosts.key), "keys/id_ed25519")
    open(inventory, "w").write(text)
    proc = tfcluster("launch", "--cmd", FAKE, "-i", inventory, "--plain",
                     runs_dir=str(tmp_path / "runs"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr
    record = run_record(str(tmp_path / "runs"))
    assert {t["host"] for t in record["tasks"].values()} == {a for _, a in testhosts.hosts[:3]}
    assert_run_clean(record)
