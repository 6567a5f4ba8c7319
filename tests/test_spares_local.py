"""Spares with real TensorFlow on this machine: three local "machines" (127.0.0.1, .2, .3, each
with its own agent), the third in the [spare] group. A machine is lost when its agent and its
tasks are killed at once."""
import subprocess
import sys
import tempfile
import time

import pytest

from support import REPO
from support.cli import local_vars_text, metrics_points, run_record, tfcluster
from support.ports import free_port_block
from support.procs import stop_leftovers, wait_for
from hostlib.lose import lose_local_machine
from support.moves import assert_fails_naming_the_lost_machine, assert_moved_once

pytestmark = pytest.mark.slow  # real launches, TensorFlow in one

TRAIN = ["--dataset=digits", "--batch_size=32", "--train_steps=300", "--save_every_steps=50",
         "--log_every=10"]


def inventory_text(workdir):
    """Three local machines; their ports apart (they are one machine's ports)."""
    base = free_port_block()
    return local_vars_text(workdir) + """  children:
    worker:
      hosts:
        w0: {{ansible_host: 127.0.0.1, tfcluster_port_base: {port}}}
        w1: {{ansible_host: 127.0.0.2, tfcluster_port_base: {port2}}}
    spare:
      hosts:
        s1: {{ansible_host: 127.0.0.3, tfcluster_port_base: {port3}}}
""".format(port=base, port2=base + 4, port3=base + 8)


@pytest.fixture
def machines(tmp_path, monkeypatch):
    # A lost machine's task and supervisor are killed where they stand: what they leave in
    # their TMPDIR (TensorFlow's autograph modules, the task's own folder) stays in the test's.
    (tmp_path / "tmp").mkdir()
    tempfile.gettempdir()  # this process's own stays as it was (the module caches it)
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(inventory_text(str(tmp_path / "work")))
    yield str(inventory), str(tmp_path / "runs")
    leftovers = stop_leftovers(str(tmp_path))
    assert not leftovers, "processes of the test were still running: %s" % leftovers


def launch_sleepers(inventory, runs_dir, run_id, *args):
    """A launch (in the background) of a task per worker machine that sleeps 600 s."""
    return subprocess.Popen(
        [sys.executable, "-m", "tfcluster", "--runs-dir", runs_dir, "launch", "--cmd",
         "sleep 600", "-i", inventory, "--plain", "--run-id", run_id, *args],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def running(runs_dir, run_id):
    """True once every task of the run has a pid in its record."""
    try:
        return all(t.get("pid") for t in run_record(runs_dir, run_id)["tasks"].values())
    except (OSError, ValueError, KeyError):
        return False


def test_a_lost_worker_machine_moves_to_the_spare_and_the_run_goes_on(machines):
    inventory, runs_dir = machines
    launcher = subprocess.Popen(
        [sys.executable, "-m", "tfcluster", "--runs-dir", runs_dir, "launch",
         "multi_worker_mirrored", "-i", inventory, "--plain", "--run-id", "moved",
         "--lost-contact", "10", "--"] + TRAIN,
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        def trained_past_a_checkpoint():
            steps = [p["step"] for p in metrics_points(runs_dir, "moved") if p["task"] == "worker:1"]
            return steps and max(steps) >= 70
        wait_for(trained_past_a_checkpoint, 300, "worker:1 to train past step 70")
        record = run_record(runs_dir, "moved")
        cut_at = time.time()
        lose_local_machine(record["tasks"]["worker:1"]["pid"], launcher.pid)
        out, _ = launcher.communicate(timeout=400)
    finally:
        launcher.kill()
    record, move = assert_moved_once(launcher, out, runs_dir, "moved", "127.0.0.2", "127.0.0.3",
                                     ["worker:1"])
    assert move["scope"] == "job", move
    assert move["cluster_before"]["worker"][1].startswith("127.0.0.2:")
    assert record["tasks"]["worker:1"]["address"].startswith("127.0.0.3:")
    assert "moved worker:1 from lost 127.0.0.2 to spare 127.0.0.3" in out
    results = record["results"]
    assert {r["global_step"] for r in results.values()} == {300}, results
    # Training goes on on the spare. How soon (45 s on the test hosts, test_spares_hosts.py) is
    # measured by scripts/bench --only recovery: here three workers share this machine's cores.
    assert any(p["task"] == "worker:1" and p["time"] > cut_at
               for p in metrics_points(runs_dir, "moved"))
    assert len({r["param_checksum"] for r in results.values()}) == 1
    # The same steps, uninterrupted: the same accuracy within 0.02.
    tfcluster("launch", "multi_worker_mirrored", "-i", inventory, "--plain", "--run-id",
              "whole", "--", *TRAIN, runs_dir=runs_dir, check=0)
    whole = run_record(runs_dir, "whole")["results"]["worker:0"]["accuracy"]
    assert abs(results["worker:0"]["accuracy"] - whole) <= 0.02, (results, whole)


def test_without_a_spare_a_lost_machine_fails_the_run_naming_it(machines, tmp_path):
    inventory, runs_dir = machines
    text = open(inventory).read().split("    spare:")[0]
    open(inventory, "w").write(text)
    launcher = launch_sleepers(inventory, runs_dir, "nospare")
    try:
        wait_for(lambda: running(runs_dir, "nospare"), 120, "the tasks to run")
    except BaseException:
        launcher.kill()
        raise
    pid = run_record(runs_dir, "nospare")["tasks"]["worker:1"]["pid"]
    assert_fails_naming_the_lost_machine(
        launcher, lambda: lose_local_machine(pid, launcher.pid), "127.0.0.2")
    assert run_record(runs_dir, "nospare")["state"] == "failed"


def test_drain_host_gives_the_notice_then_moves_its_tasks_to_the_spare(machines):
    inventory, runs_dir = machines
    launcher = launch_sleepers(inventory, runs_dir, "drained", "--drain-grace", "2")
    try:
        wait_for(lambda: running(runs_dir, "drained"), 120, "the tasks to run")
        proc = tfcluster("drain", "127.0.0.2", runs_dir=runs_dir, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "moved worker:1 from 127.0.0.2 to 127.0.0.3" in proc.stderr + proc.stdout
        record = run_record(runs_dir, "drained")
        assert record["moves"][0]["why"] == "drained by tfcluster drain 127.0.0.2"
        assert record["tasks"]["worker:1"]["address"].startswith("127.0.0.3:")
        # The only spare is taken: a second drain is refused at once, naming why.
        again = tfcluster("drain", "127.0.0.1", runs_dir=runs_dir, timeout=60)
        assert again.returncode == 1 and "127.0.0.1 not drained: no spare left" in again.stderr, \
            again.stdout + again.stderr
        tfcluster("stop", "drained", runs_dir=runs_dir, check=0)
        out, _ = launcher.communicate(timeout=120)
    finally:
        launcher.kill()
    assert "termination notice to worker:0 and worker:1 (tfcluster drain 127.0.0.2)" in out, out
