"""Inventory reading through ansible-core: formats, ranges, group_vars, GPUs, ports, errors."""
import pytest

from tfcluster.errors import UsageError
from tfcluster.hosts.inventory import load_slots
from tfcluster.spec.cluster import build_cluster


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
    ("worker:\n  hosts:\n    a: {ansible_port: 0}\n", "host a: ansible_port 0 is out of range"),
    ("worker:\n  hosts:\n    a: {tfcluster_address: 'h;rm'}\n", "tfcluster_address 'h;rm' is not a host name"),
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
    from tfcluster.spec.catalog import load_catalog
    from support import REPO
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
    from tfcluster.spec.catalog import load_catalog
    assert load_catalog()["mnist_towers"].task_per_gpu is False


DATA_NETWORK = """
ps:
  hosts:
    p: {ansible_host: 10.0.0.1, tfcluster_address: 192.168.100.1}
chief:
  hosts:
    c: {ansible_host: 10.0.0.2, tfcluster_address: gpu02-ib.example.com}
worker:
  hosts:
    w0: {ansible_host: 10.0.0.2, tfcluster_address: gpu02-ib.example.com}
    w1: {ansible_host: 10.0.0.3, ansible_port: 2200}
"""


def test_tfcluster_address_is_what_tensorflow_uses_and_ssh_keeps_ansible_host(tmp_path):
    from tfcluster.spec.catalog import load_catalog, task_command
    cluster = build_cluster(load_slots(write(tmp_path, "hosts.yml", DATA_NETWORK)))
    data = {"ps": ["192.168.100.1:2222"], "chief": ["gpu02-ib.example.com:2222"],
            "worker": ["gpu02-ib.example.com:2223", "10.0.0.3:2222"]}
    assert cluster.jobs() == {job: data[job] for job in ("chief", "worker", "ps")}
    assert cluster.cluster_spec_string() == ("chief|gpu02-ib.example.com:2222,worker|"
                                             "gpu02-ib.example.com:2223;10.0.0.3:2222,"
                                             "ps|192.168.100.1:2222")
    worker = cluster.find("worker:0")
    assert cluster.tf_config(worker)["cluster"]["ps"] == data["ps"]
    assert "--worker_hosts=gpu02-ib.example.com:2223,10.0.0.3:2222" in cluster.flags(worker)
    assert worker.address == "gpu02-ib.example.com:2223"
    assert worker.to_dict()["address"] == worker.address
    # SSH still goes to ansible_host, and slots of one SSH machine are one machine.
    assert worker.machine.address == "10.0.0.2" and worker.to_dict()["host"] == "10.0.0.2"
    assert [m.address for m, _ in cluster.machines()] == ["10.0.0.2", "10.0.0.3", "10.0.0.1"]
    command = task_command(load_catalog()["mnist_replica"], cluster, worker, "/r", "/r/c")
    assert "--ps_hosts=192.168.100.1:2222 " in command and "10.0.0.1" not in command


def test_one_data_address_and_port_for_two_slots_is_rejected(tmp_path):
    inventory = write(tmp_path, "hosts.yml", """
worker:
  hosts:
    a: {ansible_host: 10.0.0.1, tfcluster_address: data1, tfcluster_port: 5000}
    b: {ansible_host: 10.0.0.2, tfcluster_address: data1, tfcluster_port: 5000}
""")
    with pytest.raises(UsageError, match="host a and host b both use data1:5000"):
        build_cluster(load_slots(inventory))


def test_ports_are_allocated_per_data_address(tmp_path):
    # Two SSH routes (e.g. port-forwarded containers) to hosts with their own data addresses,
    # and two slots reaching one data address over different SSH routes.
    inventory = write(tmp_path, "hosts.yml", """
worker:
  hosts:
    a: {ansible_host: 127.0.0.1, ansible_port: 2201, tfcluster_address: node1}
    b: {ansible_host: 10.0.0.9, tfcluster_address: node1}
""")
    assert build_cluster(load_slots(inventory)).jobs() == {"worker": ["node1:2222", "node1:2223"]}


def test_ipv6_addresses_are_bracketed(tmp_path):
    inventory = write(tmp_path, "hosts.yml",
                      "worker:\n  hosts:\n    a: {ansible_host: 10.0.0.1, tfcluster_address: 'fd00::1'}\n")
    assert build_cluster(load_slots(inventory)).jobs() == {"worker": ["[fd00::1]:2222"]}


def test_sample_data_network_example_works_uncommented(tmp_path):
    import os
    import shutil
    from support import REPO
    sample = tmp_path / "sample"
    shutil.copytree(os.path.join(REPO, "inventory", "sample"), sample)
    hosts = (sample / "hosts.yml").read_text()
    example = hosts[hosts.index("# worker3:"):].splitlines()[:3]
    assert "tfcluster_address" in example[2]
    for line in example:
        hosts = hosts.replace(line, line.replace("# ", "", 1))
    (sample / "hosts.yml").write_text(hosts)
    cluster = build_cluster(load_slots(str(sample)))
    worker3 = [t for t in cluster.tasks if t.slot == "worker3"][0]
    assert worker3.machine.address == "gpu03.cluster.example.com"
    assert worker3.address == "gpu03-ib.cluster.example.com:2222"
    with open(os.path.join(REPO, "docs", "inventory.md")) as handle:
        assert "| `tfcluster_address` |" in handle.read()


def test_the_inventory_cache_keeps_only_the_newest(tmp_path, monkeypatch):
    import os
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cache = tmp_path / "tfcluster"
    cache.mkdir()
    for i in range(105):  # older than anything written now
        old = cache / ("inventory-old%03d.pickle" % i)
        old.write_bytes(b"")
        os.utime(old, (1000 + i, 1000 + i))
    inventory = write(tmp_path, "hosts.yml", "worker:\n  hosts:\n    w1: {ansible_host: 10.0.0.1}\n")
    assert [s.name for s in load_slots(inventory)] == ["w1"]
    kept = sorted(p.name for p in cache.iterdir())
    assert len(kept) == 100 and "inventory-old000.pickle" not in kept
    assert "inventory-old104.pickle" in kept and any("old" not in name for name in kept)
    assert [s.name for s in load_slots(inventory)] == ["w1"]  # from the cache it kept


def test_spare_group_hosts_are_spares_not_tasks(tmp_path):
    inventory = write(tmp_path, "hosts.ini", """
[worker]
w1 ansible_host=10.0.0.1
w2 ansible_host=10.0.0.2

[spare]
s1 ansible_host=10.0.0.3
""")
    slots = load_slots(inventory)
    assert [(s.name, s.job) for s in slots] == [("w1", "worker"), ("w2", "worker"),
                                                ("s1", "spare")]
    cluster = build_cluster(slots)
    assert cluster.jobs() == {"worker": ["10.0.0.1:2222", "10.0.0.2:2222"]}
    assert [m.address for m in cluster.spares] == ["10.0.0.3"]
