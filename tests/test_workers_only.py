"""A cluster of workers only (TensorFlow 2's MultiWorkerMirroredStrategy shape): what `tfcluster
examples -i` and the deploy say it runs, the docs' examples table against the catalog's
declaration, a ps example refused before anything starts, and `init --layout`. The deploy and
the launches of the inventory `init --layout mwms` writes are in tests/test_workers_hosts.py."""
import os
import re
import sys

from support import REPO
from support.cli import tfcluster
from tfcluster.cli import main as cli
from tfcluster.deploy.playbook import check_inventory
from tfcluster.hosts.inventory import read_slots
from tfcluster.spec.catalog import load_catalog

WORKERS = """all:
  vars: {ansible_connection: local, tfcluster_python: %s}
  children:
    worker:
      hosts:
        w0: {ansible_host: localhost}
        w1: {ansible_host: localhost}
        w2: {ansible_host: localhost}
""" % sys.executable


def workers_inventory(tmp_path):
    path = tmp_path / "workers.yml"
    path.write_text(WORKERS)
    return str(path)


def test_examples_marks_what_a_workers_only_inventory_runs(tmp_path, capsys):
    assert cli.main(["examples", "-i", workers_inventory(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("3 workers, no ps: mnist_towers, cifar10_local, multi_worker_mirrored "
                           "and --cmd programs using MultiWorkerMirroredStrategy; the ps "
                           "examples need a ps group")
    rows = {line.split()[0]: line for line in out[1:]}
    assert set(rows) == set(load_catalog())
    assert rows["multi_worker_mirrored"].endswith(" runs")
    assert rows["mnist_replica"].endswith("no: needs 1 ps: the inventory has no ps group")
    assert rows["data_parallel"].endswith("no: needs 1 chief: the inventory has no chief group")


def test_examples_says_when_a_group_has_too_few_tasks(tmp_path, capsys):
    path = tmp_path / "one.yml"
    path.write_text(WORKERS.replace("        w1: {ansible_host: localhost}\n", "")
                    .replace("        w2: {ansible_host: localhost}\n", ""))
    assert cli.main(["examples", "-i", str(path)]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert rows["multi_worker_mirrored"].endswith("no: needs 2 workers: the inventory has 1")
    assert rows["mnist_towers"].endswith(" runs")


def test_a_ps_example_on_workers_alone_is_refused_before_anything_starts(tmp_path):
    runs_dir = tmp_path / "runs"
    proc = tfcluster("launch", "mnist_replica", "--smoke", "-i", workers_inventory(tmp_path),
                     runs_dir=str(runs_dir), timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    error = proc.stderr.strip()
    assert len(error.splitlines()) == 1 and "Traceback" not in error, error
    assert "has no [ps] group but mnist_replica needs 1 ps task(s)" in error
    assert not runs_dir.exists() or not os.listdir(runs_dir)


def test_the_deploy_says_what_a_workers_only_inventory_runs(tmp_path, capsys):
    inventory = workers_inventory(tmp_path)
    text = open(inventory).read().replace("ansible_connection: local,",
                                          "ansible_connection: local, tfcluster_deploy: true,")
    open(inventory, "w").write(text)
    check_inventory(inventory)  # no UsageError: a task group holds hosts
    assert "3 workers, no ps: mnist_towers, cifar10_local, multi_worker_mirrored" in \
        capsys.readouterr().out


def test_the_docs_examples_table_is_the_catalog():
    """docs/examples.md's table lists every example with the topology catalog.yml declares."""
    with open(os.path.join(REPO, "docs", "examples.md")) as handle:
        rows = [line for line in handle if line.startswith("| `")]
    table = {}
    for row in rows:
        cells = [cell.strip() for cell in row.strip().strip("|").split("|")]
        table[cells[0].strip("`")] = cells[2]
    catalog = load_catalog()
    assert set(table) == set(catalog)
    for name, example in catalog.items():
        shown = {}
        for count, job in re.findall(r"(\d+) (ps|chief|workers?|evaluators?)", table[name]):
            shown[job.rstrip("s") if job != "ps" else job] = int(count)
        assert shown == example.needs(), (name, table[name])


def test_init_layout_mwms_makes_every_host_a_worker(tmp_path, capsys):
    assert cli.main(["init", str(tmp_path / "c"), "--layout", "mwms", "a", "b", "c"]) == 0
    inventory = tmp_path / "c" / "hosts.yml"
    slots = read_slots(str(inventory))
    assert [(s.job, s.machine.address) for s in slots] == [("worker", "a"), ("worker", "b"),
                                                           ("worker", "c")]
    header = inventory.read_text().split("all:")[0]
    assert "--layout mwms" in header and "every host is a worker" in header
    assert "The examples that fit it: mnist_towers, cifar10_local, multi_worker_mirrored." in header
    assert "tfcluster launch multi_worker_mirrored -i hosts.yml --smoke" in capsys.readouterr().out


def test_init_layout_ps_keeps_the_first_host_the_ps(tmp_path):
    assert cli.main(["init", str(tmp_path / "c"), "a", "b", "c", "--layout", "ps"]) == 0
    slots = read_slots(str(tmp_path / "c" / "hosts.yml"))
    assert sorted((s.job, s.machine.address) for s in slots) == [
        ("ps", "a"), ("worker", "b"), ("worker", "c")]
