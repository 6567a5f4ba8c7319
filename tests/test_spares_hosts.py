"""Spares on the network-namespace test hosts: three hosts and a spare (th1..th4). A worker
host's link is cut (its veth down) in the middle of a MultiWorkerMirroredStrategy run; a
ParameterServerStrategy worker is killed, then another's link is cut; a cut without a spare
fails the run."""
import os
import signal
import subprocess
import sys
import time

import pytest

from support import REPO
from support.cli import metrics_points, run_record, tfcluster, wait_running
from support.moves import assert_fails_naming_the_lost_machine, assert_moved_once
from support.procs import wait_for
from support.ssh import hosts_inventory
from support.testhosts import HostSet, exclusive

pytestmark = [pytest.mark.slow, pytest.mark.root]

PSS_STEPS = 3000
TRAIN = ["--dataset=digits", "--batch_size=30", "--train_steps=300", "--save_every_steps=50",
         "--log_every=10"]


@pytest.fixture
def four_hosts():
    with exclusive():
        hosts = HostSet(4)
        hosts.up()
        try:
            yield hosts
        finally:
            for i in range(1, 5):
                try:
                    hosts.link(i, "up")
                except RuntimeError:
                    pass
            hosts.down(check=False)


def inventory(hosts, tmp_path, groups, workdir=None):
    """GROUPS: {group: [host number]}; each host's own /opt holds the run folders, or WORKDIR
    that every host shares."""
    return hosts_inventory(hosts, tmp_path / "hosts.yml", groups,
                           workdir or "/opt/tfc-spares/%s/work" % tmp_path.name, port_base=24100)


def launch(runs_dir, *args):
    # The hosts' teardown kills a cut-off host's supervisors with their tasks, before they can
    # remove the tasks' TMPDIR folders: those are made in the test's folder, not in /tmp.
    tmp = os.path.join(os.path.dirname(runs_dir), "tmp")
    os.makedirs(tmp, exist_ok=True)
    return subprocess.Popen([sys.executable, "-m", "tfcluster", "--runs-dir", runs_dir,
                             "launch", "--plain", "--env", "TMPDIR=" + tmp, *args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_a_cut_worker_link_moves_the_run_to_the_spare(four_hosts, tmp_path):
    hosts, runs_dir = four_hosts, str(tmp_path / "runs")
    path = inventory(hosts, tmp_path, {"worker": [1, 2, 3], "spare": [4]})
    launcher = launch(runs_dir, "multi_worker_mirrored", "-i", path, "--workers", "3",
                      "--run-id", "cut", "--lost-contact", "10", "--", *TRAIN)
    try:
        wait_for(lambda: launcher.poll() is not None or any(
            p["task"] == "worker:2" and p["step"] >= 70 for p in metrics_points(runs_dir, "cut")),
            400, "step 70")
        assert launcher.poll() is None, launcher.communicate()[0][-3000:]
        cut_at = time.time()
        hosts.link(3, "down")
        out, _ = launcher.communicate(timeout=500)
    finally:
        launcher.kill()
    record, _ = assert_moved_once(launcher, out, runs_dir, "cut", hosts.addr(3), hosts.addr(4),
                                  ["worker:2"])
    results = record["results"]
    on_spare = [p["time"] for p in metrics_points(runs_dir, "cut")
                if p["task"] == "worker:2" and p["time"] > cut_at]
    assert on_spare and min(on_spare) - cut_at <= 45, min(on_spare or [0]) - cut_at
    assert {r["global_step"] for r in results.values()} == {300}
    # The same steps uninterrupted, on the three hosts that still have a link.
    (tmp_path / "whole").mkdir()
    whole_path = inventory(hosts, tmp_path / "whole", {"worker": [1, 2, 4]})
    tfcluster("launch", "multi_worker_mirrored", "-i", whole_path, "--workers", "3", "--plain",
              "--run-id", "whole", "--", *TRAIN, runs_dir=runs_dir, check=0)
    whole = run_record(runs_dir, "whole")["results"]["worker:0"]["accuracy"]
    assert abs(results["worker:0"]["accuracy"] - whole) <= 0.02, (results, whole)


def test_a_ps_strategy_worker_restarts_alone_and_moves_alone(four_hosts, tmp_path):
    """A killed worker restarts in place, then a worker whose host's link is cut moves to the
    spare: neither restarts any other task, and the coordinator takes the moved worker back."""
    hosts, runs_dir = four_hosts, str(tmp_path / "runs")
    # ParameterServerStrategy saves each variable on its ps's machine: one folder for all.
    path = inventory(hosts, tmp_path, {"chief": [1], "worker": [2, 3], "ps": [1, 3],
                                       "spare": [4]}, workdir=str(tmp_path / "work"))
    launcher = launch(runs_dir, "ps_strategy", "-i", path, "--smoke", "--restarts", "1",
                      "--start-timeout", "300", "--lost-contact", "10", "--run-id", "pss",
                      "--", "--train_steps=%d" % PSS_STEPS)

    def chief_at(step):
        return lambda: launcher.poll() is not None or any(
            p["task"] == "chief:0" and p["step"] >= step for p in metrics_points(runs_dir, "pss"))

    try:
        wait_for(chief_at(100), 400, "step 100")
        assert launcher.poll() is None, launcher.communicate()[0][-3000:]
        pid = run_record(runs_dir, "pss")["tasks"]["worker:1"]["pid"]
        os.killpg(os.getpgid(pid), signal.SIGKILL)  # the task's shell and its Python
        wait_for(lambda: launcher.poll() is not None or
                 run_record(runs_dir, "pss")["tasks"]["worker:1"]["restarts"] == 1, 120,
                 "worker:1 restarted")
        restarted_at = max(p["step"] for p in metrics_points(runs_dir, "pss"))
        wait_for(chief_at(restarted_at + 200), 300, "200 steps after the restart")
        assert launcher.poll() is None, launcher.communicate()[0][-3000:]
        hosts.link(2, "down")  # worker:0's machine
        out, _ = launcher.communicate(timeout=600)
    finally:
        launcher.kill()
    assert launcher.returncode == 0, out[-4000:]
    record = run_record(runs_dir, "pss")
    assert [(e["task"], e["scope"]) for e in record["restart_log"]] == [("worker:1", "task")]
    move, = record["moves"]
    assert (move["lost"], move["spare"], move["tasks"], move["scope"]) == \
        (hosts.addr(2), hosts.addr(4), ["worker:0"], "task"), move
    assert {label: t["restarts"] for label, t in record["tasks"].items()
            if label != "worker:0"} == {"chief:0": 0, "worker:1": 1, "ps:0": 0, "ps:1": 0}
    chief_log = (tmp_path / "runs" / "pss" / "chief-0.log").read_text()
    assert "chief: the cluster changed; workers now at %s:" % hosts.addr(4) in chief_log
    # The coordinator opened its context on the moved worker, and the chief applied every step:
    # a step that was running on a lost worker runs again elsewhere (at least once, TensorFlow's
    # contract), so each of the two losses may add one.
    moved_log = os.path.join(record["tasks"]["worker:0"]["host_run_dir"], "worker-0.log")
    assert "Creating sync eager service context" in open(moved_log).read()
    applied = record["results"]["chief:0"]["steps_applied"]
    assert PSS_STEPS <= applied <= PSS_STEPS + 2, record["results"]


def test_a_cut_link_without_a_spare_fails_the_run_naming_the_machine(four_hosts, tmp_path):
    hosts, runs_dir = four_hosts, str(tmp_path / "runs")
    path = inventory(hosts, tmp_path, {"worker": [1, 2, 3]})
    launcher = launch(runs_dir, "--cmd", "sleep 600", "-i", path, "--run-id", "nospare")
    try:
        wait_running(runs_dir, "nospare", 120)
    except BaseException:
        launcher.kill()
        raise
    assert_fails_naming_the_lost_machine(launcher, lambda: hosts.link(2, "down"),
                                         hosts.addr(2))
