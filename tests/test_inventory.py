"""Inventory reading through ansible-core: formats, ranges, group_vars, GPUs, ports, errors."""
import pytest

from tfcluster.errors import UsageError
from tfcluster.inventory import load_slots
from tfcluster.spec import build_cluster


def write(tmp_path, name, text):
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


def test_ini_with_ranges_and_group_vars(tmp_path):
    inventory = write(tmp_path, "inv/hosts.ini", """
[ps]
ps1 ansible_host=10.0.0.1

[worker]
gpu[01:03] ansible_host=10.0.0.1

[all:vars]
ansible_user=trainer
""")
    write(tmp_path, "inv/group_vars/worker.yml", "tfcluster_port_base: 3000\n")
    slots = load_slots(inventory)
    assert [(s.name, s.job) for s in slots] == [
        ("gpu01", "worker"), ("gpu02", "worker"), ("gpu03", "worker"), ("ps1", "ps")]
    assert {s.machine.user for s in slots} == {"trainer"}
    assert slots[0].port_base == 3000 and slots[-1].port_base == 2222
    cluster = build_cluster(slots)
    # All four slots share one machine: distinct ports, no collision.
    assert cluster.jobs() == {"worker": ["10.0.0.1:3000", "10.0.0.1:3001", "10.0.0.1:3002"],
                              "ps": ["10.0.0.1:2222"]}


def test_yaml_defaults_and_templated_vars(tmp_path):
    inventory = write(tmp_path, "hosts.yml", """
all:
  vars:
    tfcluster_root: /srv/tf
  children:
    ps:
      hosts:
        a: {ansible_host: 192.0.2.1, tfcluster_port: 5000}
    worker:
      hosts:
        b: {ansible_host: 192.0.2.2, tfcluster_python: "{{ tfcluster_root }}/py/bin/python"}
""")
    ps, = [s for s in load_slots(inventory) if s.job == "ps"]
    worker, = [s for s in load_slots(inventory) if s.job == "worker"]
    assert ps.port == 5000
    assert ps.machine.python == "/srv/tf/venv/bin/python"
    assert ps.machine.workdir == "/srv/tf/work"
    assert worker.machine.python == "/srv/tf/py/bin/python"
    assert worker.machine.connection == "ssh" and worker.machine.ssh_port == 22


def test_gpu_expansion(tmp_path):
    inventory = write(tmp_path, "hosts.yml", """
ps:
  hosts:
    p: {ansible_host: h1}
worker:
  hosts:
    w: {ansible_host: h2, tfcluster_gpus: [0, 1, 3]}
""")
    cluster = build_cluster(load_slots(inventory))
    workers = cluster.job_tasks("worker")
    assert [t.cuda_visible_devices for t in workers] == ["0", "1", "3"]
    assert [t.address for t in workers] == ["h2:2222", "h2:2223", "h2:2224"]
    assert cluster.job_tasks("ps")[0].cuda_visible_devices == ""


def test_counts_take_the_first_slots_and_reject_too_few(tmp_path):
    inventory = write(tmp_path, "hosts.yml", """
ps:
  hosts:
    p[1:2]: {ansible_host: localhost}
worker:
  hosts:
    w1: {ansible_host: localhost}
""")
    slots = load_slots(inventory)
    cluster = build_cluster(slots, {"ps": 1, "worker": 1})
    assert [t.slot for t in cluster.tasks] == ["w1", "p1"]
    with pytest.raises(UsageError, match=r"1 worker task\(s\) but 2 are needed"):
        build_cluster(slots, {"ps": 1, "worker": 2})


@pytest.mark.parametrize("text, message", [
    ("ps:\n  hosts:\n    a: {tfcluster_port: 5000}\n    b: {ansible_host: a, tfcluster_port: 5000}\n",
     "both use a:5000"),
    ("worker:\n  hosts:\n    a: {tfcluster_port: 70000}\n", "port 70000 is out of range"),
    ("worker:\n  hosts:\n    a: {tfcluster_port: twelve}\n", "tfcluster_port must be a whole number"),
    ("worker:\n  hosts:\n    a: {tfcluster_gpus: {x: 1}}\n", "tfcluster_gpus must be a list"),
])
def test_validation_errors(tmp_path, text, message):
    inventory = write(tmp_path, "hosts.yml", text)
    with pytest.raises(UsageError, match=message):
        build_cluster(load_slots(inventory))


def test_missing_and_unparsable_inventory(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        load_slots(str(tmp_path / "nope.yml"))
    bad = write(tmp_path, "bad.yml", "all: [\n")
    with pytest.raises(UsageError, match="cannot parse inventory"):
        load_slots(bad)


def test_shipped_local_inventory_covers_every_example():
    import os
    from tfcluster.catalog import load_catalog
    from conftest import REPO
    slots = load_slots(os.path.join(REPO, "inventory", "local.yml"))
    assert {s.machine.connection for s in slots} == {"local"}
    assert {s.machine.root for s in slots} == {REPO}
    for example in load_catalog().values():
        counts = {job: example.topology.get(job, 0) for job in ("chief", "worker", "ps", "evaluator")}
        build_cluster(slots, counts)


def test_multi_device_examples_keep_one_task_per_gpu_host(tmp_path):
    inventory = write(tmp_path, "hosts.yml", """
worker:
  hosts:
    w: {ansible_host: h2, tfcluster_gpus: [0, 1]}
""")
    cluster = build_cluster(load_slots(inventory), {"worker": 1}, task_per_gpu=False)
    assert [t.cuda_visible_devices for t in cluster.tasks] == ["0,1"]
    from tfcluster.catalog import load_catalog
    assert load_catalog()["mnist_towers"].task_per_gpu is False
