"""Causes of hangs on the test hosts. A firewall between them, planted before a launch (the
preflight refuses it, naming both ends) and in the middle of one (the workers' CreateSession
wait is diagnosed from their hosts): th1 runs ps:0, th2 and th3 a worker each; the rules live
in th1's network namespace: th2's connections to the ps port are dropped (a timeout), th3's
rejected (refused). And a MultiWorkerMirroredStrategy worker stuck before its collective."""
import os
import re
import signal
import subprocess
import time

import pytest

from support import REPO
from support.cli import Launch, assert_run_clean, run_record, tfcluster, wait_running
from support.ssh import ssh_inventory

pytestmark = [pytest.mark.slow, pytest.mark.root]

PEER = "python %s" % os.path.join(REPO, "tests", "programs", "peer_task.py")
PS_PORT = 24000  # ssh_inventory's tfcluster_port_base: ps:0's port on th1
TABLE = "tfc_causes_test"


@pytest.fixture
def ps_fence(testhosts):
    """plant(): th1 drops th2's connections to the ps port and rejects th3's, until the test
    ends. Returns (plant, the hosts' addresses)."""
    (_, ps), (_, worker0), (_, worker1) = testhosts.hosts[:3]
    rules = ("table inet %s {\n chain input {\n  type filter hook input priority -10;\n"
             "  ip saddr %s tcp dport %d drop\n  ip saddr %s tcp dport %d reject with tcp reset\n"
             " }\n}\n" % (TABLE, worker0, PS_PORT, worker1, PS_PORT))
    nft = testhosts.netns_argv("th1") + ["nft"]

    def plant():
        subprocess.run(nft + ["-f", "-"], input=rules, text=True, check=True, timeout=30)
    try:
        yield plant, (ps, worker0, worker1)
    finally:
        subprocess.run(nft + ["delete", "table", "inet", TABLE], capture_output=True, timeout=30)


def test_a_fenced_ps_port_is_refused_by_the_preflight_naming_both_ends(testhosts, tmp_path,
                                                                        ps_fence):
    plant, (ps, worker0, worker1) = ps_fence
    plant()
    started = time.monotonic()
    proc = tfcluster("launch", "--cmd", PEER, "-i", ssh_inventory(testhosts, tmp_path),
                     runs_dir=str(tmp_path / "runs"))
    assert proc.returncode == 3, proc.stdout + proc.stderr
    error = proc.stderr.strip()
    assert len(error.splitlines()) == 1 and "Traceback" not in error, error
    assert "worker host %s cannot reach ps:0 at %s:%d: timed out" % (worker0, ps, PS_PORT) in error
    assert "worker host %s cannot reach ps:0 at %s:%d: refused" % (worker1, ps, PS_PORT) in error
    assert "cannot reach worker:" not in error  # the workers reach each other
    assert time.monotonic() - started < 60  # the reach timeout (5 s), not a hang
    assert not os.path.exists(tmp_path / "runs") or not os.listdir(tmp_path / "runs")


def test_a_ps_fenced_mid_run_is_named_from_each_waiting_workers_host(testhosts, tmp_path,
                                                                     ps_fence):
    plant, (ps, worker0, worker1) = ps_fence
    marker = tmp_path / "wait-in-createsession"  # the hosts share this machine's /tmp
    runs_dir = str(tmp_path / "runs")
    waiting = "createsession:%s" % marker
    launch = Launch(runs_dir, "--cmd", PEER, "-i", ssh_inventory(testhosts, tmp_path),
                    "--plain", "--env", "PEER_WORKER_0=" + waiting,
                    "--env", "PEER_WORKER_1=" + waiting)
    try:
        wait_running(runs_dir)
        launch.line(r"^\[ps:0 %s\] listening on %d" % (re.escape(ps), PS_PORT), 30,
                    "the ps to listen")
        plant()
        marker.write_text("")
        started = time.monotonic()
        for worker, host, outcome in (("worker:0", worker0, "timed out"),
                                      ("worker:1", worker1, "refused")):
            launch.line(r"^tfcluster: %s waits in CreateSession for ps:0: ps:0 is running, but "
                        r"worker host %s cannot reach ps:0 at %s:%d: %s$" % (
                            worker, re.escape(host), re.escape(ps), PS_PORT, outcome),
                        30, "%s's wait diagnosed" % worker)
        assert time.monotonic() - started < 30
        launch.proc.send_signal(signal.SIGINT)
        output = launch.end()
    finally:
        launch.kill()
    assert launch.proc.returncode == 130, output
    # The final report repeats both causes.
    assert len(re.findall(r"\nworker:\d waits in CreateSession for ps:0: ", output)) == 2, output
    assert_run_clean(run_record(runs_dir))


def test_mwms_on_the_test_hosts_names_the_worker_stuck_before_its_collective(testhosts,
                                                                             tmp_path):
    """MultiWorkerMirroredStrategy over SSH (worker:0 on th2, worker:1 on th3): worker:1 waits
    for data before the first all-reduce, so worker:0 waits in it. The stall is found on th2 and
    the cause, named from the stacks taken on both hosts, within --stall-after + 30 s; once
    worker:1 leaves, the run fails naming it."""
    stall_after = 3
    release = tmp_path / "release"  # the hosts share this machine's /tmp
    runs_dir = str(tmp_path / "runs")
    program = os.path.join(REPO, "tests", "programs", "mwms_hang.py")
    launch = Launch(runs_dir, "--cmd", "python " + program, "-i",
                    ssh_inventory(testhosts, tmp_path), "--plain", "--ps", "0",
                    "--stall-after", str(stall_after), "--env", "MWMS_RELEASE=%s" % release)
    try:
        launch.line(r"worker 1: strategy ready", 120, "worker 1's strategy")
        ready = time.monotonic()
        line = next(n for n, text in enumerate(open(program), 1) if "time.sleep" in text)
        launch.line(r"^tfcluster: worker:0 waits in a collective for worker:1, which is stuck in "
                    r"wait_for_data \(mwms_hang\.py:%d\)$" % line, stall_after + 30,
                    "the collective's cause")
        assert time.monotonic() - ready < stall_after + 30
        release.touch()
        output = launch.end(120)
    finally:
        launch.kill()
    assert launch.proc.returncode == 1, output
    assert re.search(r"tfcluster: worker:0 stalled for \d+ s \(no output, [\d.]+ s CPU\)", output)
    assert re.search(r"tfcluster: error: worker:0 waited in a collective for worker:1, which "
                     r"exited 0 at \d\d:\d\d:\d\d, until TensorFlow gave up \(worker:0 exited 1\)",
                     output), output
    record = run_record(runs_dir)
    assert {t["host"] for t in record["tasks"].values()} == {a for _, a in testhosts.hosts[1:3]}
    assert "tensorflow" in open(os.path.join(runs_dir, record["id"], "stacks",
                                             "worker-0.txt")).read()
    assert_run_clean(record)
