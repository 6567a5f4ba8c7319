"""Causes named in real launches on this machine: a straggler and a ps killed mid-run (stand-in
tasks, no TensorFlow), then TensorFlow's own behaviour: gRPC past a dead proxy, and the real
`CreateSession still waiting` line diagnosed. Faults on other hosts: test_causes_hosts.py."""
import os
import re
import signal

import pytest

from support import REPO
from support.cli import Launch, assert_run_clean, run_record
from support.procs import pid_alive, wait_for

pytestmark = pytest.mark.slow

PEER = "python %s" % os.path.join(REPO, "tests", "programs", "peer_task.py")
TF1 = "python %s" % os.path.join(REPO, "tests", "programs", "tf1_session.py")
CLUSTER = ("--ps", "1", "--workers", "2", "--chief", "0", "--success", "all_workers", "--plain")


def test_a_straggler_is_marked_and_a_killed_ps_is_named_before_the_workers_it_took_down(
        local_env):
    inventory, runs_dir = local_env
    launch = Launch(runs_dir, "--cmd", PEER, "-i", inventory, *CLUSTER, "--straggler-after", "3")
    try:
        for label in ("worker:0", "worker:1"):
            launch.line(r"^\[%s localhost\] step \d" % label, 90, label + "'s first points")
        record = run_record(runs_dir)
        tasks = record["tasks"]
        # A stop/continue cycle: worker:1 does nothing, its rate falls under half of worker:0's
        # within the 10 s rate window, and it is marked 3 s later.
        os.killpg(tasks["worker:1"]["pid"], signal.SIGSTOP)
        launch.line(r"^tfcluster: worker:1 is a straggler: .* under half its peers' median",
                    10 + 3 + 15, "worker:1 marked as a straggler")
        os.killpg(tasks["worker:1"]["pid"], signal.SIGCONT)
        launch.line(r"^tfcluster: worker:1 caught up with its peers", 30, "worker:1 to catch up")
        # The ps is killed and both workers fail on their own, while the launcher is stopped:
        # it then receives the three endings in one batch, the ps's first.
        os.kill(launch.proc.pid, signal.SIGSTOP)
        try:
            os.killpg(tasks["ps:0"]["pid"], signal.SIGKILL)
            wait_for(lambda: not any(pid_alive(tasks[w]["pid"]) for w in ("worker:0", "worker:1")),
                     30, "the workers to fail without their ps")
        finally:
            os.kill(launch.proc.pid, signal.SIGCONT)
        output = launch.end()
    finally:
        launch.kill()
    assert launch.proc.returncode == 1, output
    assert "tfcluster: error: ps:0 on localhost ended while the run was active (was killed by " \
           "SIGKILL)" in output
    assert re.search(r"\nworker:0 and worker:1 failed after ps:0 was killed by SIGKILL at "
                     r"\d\d:\d\d:\d\d\n", output), output
    rows = {line.split()[0]: line for line in output.splitlines()
            if re.match(r"\w+:\d +localhost +", line)}
    assert rows["ps:0"].endswith("(first failure)")
    assert rows["worker:0"].endswith("(after ps:0)")
    assert rows["worker:1"].endswith("(after ps:0, straggler)")
    assert re.search(r"\nstraggler: worker:1 ran under half its peers' median rate for \d+s from "
                     r"\d\d:\d\d:\d\d", output), output
    assert_run_clean(run_record(runs_dir))


def test_grpc_reaches_the_cluster_past_a_dead_proxy_and_a_createsession_wait_is_diagnosed(
        local_env):
    """TensorFlow's own behaviour, one launch: the controller's environment names a proxy that
    refuses every connection. worker:0 (a TF1 session) trains through it, thanks to the tasks'
    no_grpc_proxy; worker:1 drops that exemption and waits in CreateSession forever, and the
    real line TensorFlow prints is diagnosed: its ps runs and is reachable."""
    inventory, runs_dir = local_env
    dead = "http://127.0.0.1:9"  # the discard port: nothing listens there
    launch = Launch(runs_dir, "--cmd", TF1, "-i", inventory, *CLUSTER,
                    env={"http_proxy": dead, "https_proxy": dead, "TF1_DROP_EXEMPTION": "worker:1"})
    try:
        launch.line(r"^\[worker:0 localhost\] variable on ps:0 = 42", 150,
                    "worker:0's session through the proxy variables")
        launch.line(r"^tfcluster: worker:1 waits in CreateSession for ps:0: ps:0 is running and "
                    r"worker host localhost reaches it at localhost:\d+, but it does not answer "
                    r"TensorFlow; localhost has proxy variables \(http_proxy, https_proxy\)",
                    60, "worker:1's wait diagnosed")
        launch.proc.send_signal(signal.SIGINT)
        output = launch.end()
    finally:
        launch.kill()
    assert launch.proc.returncode == 130, output
    assert output.count("tfcluster: proxy variables set (http_proxy, https_proxy on localhost): "
                        "tasks get no_grpc_proxy=localhost") == 1, output
    assert re.search(r"\[worker:1 localhost\] I\d{4} .*master\.cc:\d+\] CreateSession still "
                     r"waiting for response from worker: /job:ps/replica:0/task:0", output)
    record = run_record(runs_dir)
    assert record["tasks"]["worker:0"]["exit"] == 0
    # The final report repeats the cause after the summary table.
    assert re.search(r"\nworker:1 waits in CreateSession for ps:0: ", output), output
    assert_run_clean(record)
