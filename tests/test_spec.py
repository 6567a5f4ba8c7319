"""Cluster spec rendering and dist_test string parsing."""
import json

import pytest

from support import REPO
from support.cli import run_cli, tfcluster
from tfcluster.errors import UsageError
from tfcluster.hosts.inventory import Machine, Slot
from tfcluster.spec.cluster import build_cluster, format_cluster_spec, parse_cluster_spec, render
from trainers.common import bootstrap


def cluster():
    machine = Machine(address="h1", connection="local")
    return build_cluster([Slot("w0", "worker", machine), Slot("w1", "worker", machine),
                          Slot("p0", "ps", Machine(address="h2"))])


def test_tf_config_and_flags_per_task():
    c = cluster()
    worker1 = c.find("worker:1")
    assert c.tf_config(worker1) == {
        "cluster": {"worker": ["h1:2222", "h1:2223"], "ps": ["h2:2222"]},
        "task": {"type": "worker", "index": 1}}
    assert c.flags(worker1) == ["--ps_hosts=h2:2222", "--worker_hosts=h1:2222,h1:2223",
                                "--job_name=worker", "--task_index=1"]
    assert c.cluster_spec_string() == "worker|h1:2222;h1:2223,ps|h2:2222"


def test_render_formats():
    c = cluster()
    assert render(c, "cluster_spec") == "worker|h1:2222;h1:2223,ps|h2:2222"
    data = json.loads(render(c, "json"))
    assert [t["job"] for t in data["tasks"]] == ["worker", "worker", "ps"]
    assert "--job_name=ps" in render(c, "flags").splitlines()[2]
    assert '"task":{"type":"worker","index":0}' in render(c, "tf_config")


def test_parse_round_trip():
    text = "worker|localhost:2222;foo:2222,ps|bar:2222;qux:2222"
    jobs = parse_cluster_spec(text)
    assert jobs == {"worker": ["localhost:2222", "foo:2222"], "ps": ["bar:2222", "qux:2222"]}
    assert format_cluster_spec(jobs) == text


@pytest.mark.parametrize("text, message", [
    ("", "empty cluster spec"),
    ("worker", "exactly one '|'"),
    ("worker|a:1|b:2", "exactly one '|'"),
    ("|a:1", "empty name"),
    ("worker|", "no tasks"),
    ("Worker|a:1", r"must match \[a-z\]"),
    ("1w|a:1", r"must match \[a-z\]"),
    ("worker|a", "not host:port"),
    ("worker|a:99999", "not host:port"),
    ("worker|a:1,worker|b:2", "appears twice"),
])
def test_parse_rejects(text, message):
    with pytest.raises(UsageError, match=message):
        parse_cluster_spec(text)
    # The trainers' --cluster_spec is the same parser: the same message, in one line.
    with pytest.raises(SystemExit, match="--cluster_spec: .*" + message):
        bootstrap.parse_dist_test_spec(text)


def test_trainers_parse_the_cluster_spec_as_the_controller_does():
    text = "worker|localhost:2222;foo:2222,ps|[::1]:2222"
    assert bootstrap.parse_dist_test_spec(text) == parse_cluster_spec(text) == {
        "worker": ["localhost:2222", "foo:2222"], "ps": ["[::1]:2222"]}


def test_cli_spec_json_and_errors(capsys, monkeypatch):
    code, out, _ = run_cli(capsys, "spec", "--cluster-spec", "worker|a:1;b:2,ps|c:3", "--format",
                           "json")
    assert code == 0 and json.loads(out) == {"worker": ["a:1", "b:2"], "ps": ["c:3"]}
    monkeypatch.chdir(REPO)
    code, out, _ = run_cli(capsys, "spec", "-i", "inventory/local.yml", "--example",
                           "mnist_replica", "--format", "flags")
    assert code == 0 and len(out.strip().splitlines()) == 3
    # The real entry point too: one line, no traceback.
    proc = tfcluster("spec", "--cluster-spec", "worker|", "--format", "json", check=2)
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "no tasks" in proc.stderr


def test_a_move_restarts_every_task_of_synchronous_training():
    """move: job, or the flags that make a trainer synchronous (sync_when, read by its own
    parser): a step waits for every worker, so every task restarts from the checkpoint."""
    from tfcluster.spec.catalog import load_catalog, moves_whole
    examples = load_catalog()
    assert not moves_whole(examples["mnist_replica"])
    assert moves_whole(examples["mnist_replica"], ["--sync_replicas"])
    assert moves_whole(examples["cifar10"], smoke=True)  # --mode=sync, its default
    assert not moves_whole(examples["cifar10"], ["--mode=async"], smoke=True)
    assert moves_whole(examples["cifar10_multi_ps"], ["--mode", "sync"])
    assert not moves_whole(examples["mnist_async"], ["--sync_replicas"])
    for name in ("data_parallel", "multi_worker_mirrored"):
        assert moves_whole(examples[name]), name
    # The ClusterCoordinator takes a moved worker back at its new address (trainers/common/moves).
    assert not moves_whole(examples["ps_strategy"])
