"""TensorFlow 2's own shape on the test hosts, as a new user makes it: `tfcluster init --layout
mwms` of three hosts (every host a worker, nothing else), deployed by `tfcluster deploy`, then
by `ansible-playbook playbooks/deploy.yml`; the inventory runs multi_worker_mirrored and the
Keras tutorial (a --cmd program that knows nothing of tfcluster), and refuses mnist_replica in
one line naming the ps group it lacks.

The deploy is root's: the fence, the service group and the GPU fact land in this machine's
/etc, which the hosts share, and /opt/tfcluster in each host's own /opt; the fixture removes
them again."""
import os

import pytest

from support import REPO
from support.ansible_run import Ansible, explain
from support.cli import assert_run_clean, run_record, tfcluster
from support.locks import ready_wheelhouse
from support.rootstep import remove_root_step, root_step_state
from support.procs import processes_of_run
from tfcluster.hosts.inventory import read_slots

pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.timeout(1800)]  # a first deploy

KERAS = "python %s" % os.path.join(REPO, "examples", "keras_multi_worker.py")
SHAPE = ("3 workers, no ps: mnist_towers, cifar10_local, multi_worker_mirrored and --cmd "
         "programs using MultiWorkerMirroredStrategy; the ps examples need a ps group")


class Cluster:
    def __init__(self, testhosts, work, inventory, ansible):
        self.testhosts, self.work, self.inventory = testhosts, work, str(inventory)
        self.ansible, self.deploy = ansible, None
        self.runs = str(work / "runs")
        # Run ids of this session alone: the test hosts share this machine's process table.
        self.run_id = "workers-%d-{}" % os.getpid()

    def cli(self, *args, check=None, timeout=900):
        env = {"ANSIBLE_SSH_CONTROL_PATH_DIR": self.ansible.control_dir, "ANSIBLE_NOCOLOR": "1"}
        return tfcluster(*args, runs_dir=self.runs, check=check, timeout=timeout, env=env)



@pytest.fixture(scope="module")
def cluster(testhosts, tmp_path_factory):
    work = tmp_path_factory.mktemp("workers")
    folder = work / "cluster"
    # The folder init writes into, with the wheelhouse/ its inventory's deploy reads.
    wheelhouse = ready_wheelhouse(copy_to=str(folder / "wheelhouse"))
    assert wheelhouse.returncode == 0, wheelhouse.stdout[-3000:] + wheelhouse.stderr[-3000:]
    addresses = [address for _, address in testhosts.hosts[:3]]
    tfcluster("init", str(folder), "--layout", "mwms", "--user", "root", "--key",
              str(testhosts.key), "--known-hosts", str(testhosts.known_hosts), *addresses, check=0)
    (work / "extra.json").write_text("{}")
    ansible = Ansible(folder / "hosts.yml", str(work / "extra.json"), str(work / "ansible"))
    made, before = root_step_state()
    cluster = Cluster(testhosts, work, folder / "hosts.yml", ansible)
    try:
        cluster.deploy = cluster.cli("deploy", "-i", cluster.inventory, timeout=1800)
        yield cluster
    finally:
        try:
            for name, _ in testhosts.hosts[:3]:
                testhosts.ssh(name, "rm -rf /opt/tfcluster", timeout=120)
            ansible.close()
        finally:
            remove_root_step(testhosts, made, before)


def test_init_writes_three_workers_and_tfcluster_deploy_deploys_them(cluster):
    slots = read_slots(cluster.inventory)
    assert [(s.job, s.machine.address) for s in slots] == [
        ("worker", address) for _, address in cluster.testhosts.hosts[:3]]
    proc = cluster.deploy
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-2000:]
    # Before Ansible starts, what three workers run.
    assert proc.stdout.splitlines()[0] == "tfcluster: %s: %s" % (cluster.inventory, SHAPE), \
        proc.stdout[:2000]
    assert "failed=0" in proc.stdout and "failed=1" not in proc.stdout


def test_ansible_playbook_deploys_them_too(cluster):
    proc = cluster.ansible.run("deploy.yml")
    assert proc.returncode == 0, explain(proc)
    assert all(proc.recap[name]["failed"] == 0 for name in ("worker0", "worker1", "worker2")), \
        explain(proc)


def test_multi_worker_mirrored_runs(cluster):
    cluster.cli("launch", "multi_worker_mirrored", "-i", cluster.inventory, "--smoke", "--plain",
                "--run-id", cluster.run_id.format("mwms"), check=0)
    record = run_record(cluster.runs, cluster.run_id.format("mwms"))
    assert record["state"] == "succeeded" and sorted(record["tasks"]) == ["worker:0", "worker:1"]
    assert_run_clean(record)
    assert not processes_of_run(cluster.run_id.format("mwms"))


def test_the_keras_tutorial_runs_on_every_worker(cluster):
    """examples/keras_multi_worker.py, which knows nothing of tfcluster (TF_CONFIG is all it
    reads), on the three workers: each one trains in step and ends well."""
    run_id = cluster.run_id.format("keras")
    cluster.cli("launch", "--cmd", KERAS, "-i", cluster.inventory, "--plain", "--run-id", run_id,
                "--env", "TF_USE_LEGACY_KERAS=1", "--success", "all_workers", check=0)
    record = run_record(cluster.runs, run_id)
    assert record["state"] == "succeeded"
    assert sorted(record["tasks"]) == ["worker:0", "worker:1", "worker:2"]
    for name in ("worker-0", "worker-1", "worker-2"):
        with open(os.path.join(cluster.runs, run_id, name + ".log")) as handle:
            assert "loss by epoch:" in handle.read(), name
    assert_run_clean(record)
    assert not processes_of_run(run_id)


def test_mnist_replica_is_refused_naming_the_ps_group(cluster):
    proc = cluster.cli("launch", "mnist_replica", "-i", cluster.inventory, "--smoke",
                       "--run-id", "replica")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    error = proc.stderr.strip()
    assert len(error.splitlines()) == 1 and "Traceback" not in error, error
    assert "has no [ps] group but mnist_replica needs 1 ps task(s)" in error
    assert not os.path.exists(os.path.join(cluster.runs, "replica"))


def test_examples_marks_what_the_inventory_runs(cluster):
    out = cluster.cli("examples", "-i", cluster.inventory, check=0).stdout
    rows = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert rows["multi_worker_mirrored"].endswith(" runs")
    assert rows["mnist_replica"].endswith("no: needs 1 ps: the inventory has no ps group")
