"""Per-task GPU assignment from fake preflight reports (no GPU, no TensorFlow needed)."""
import os
import re

import pytest

from support import REPO
from tfcluster.gpus import placement as gpus
from tfcluster.spec.catalog import load_catalog, task_command
from tfcluster.hosts.inventory import load_slots
from tfcluster.runs.record import PreflightReport
from tfcluster.spec.cluster import build_cluster

SAMPLE = os.path.join(REPO, "inventory", "sample")
JOBS = ("chief", "worker", "ps", "evaluator")


def smi_lines(count):
    return ["GPU %d: NVIDIA A100-SXM4-80GB (UUID: GPU-%08d-0000-0000-0000-000000000000)" % (i, i)
            for i in range(count)]


def fake_reports(cluster, per_gpu_host=2):
    """What preflight would report: GPUs on machines named gpu*, none elsewhere."""
    return {machine.key: PreflightReport(
        gpus=smi_lines(per_gpu_host if machine.address.startswith("gpu") else 0))
        for machine, _ in cluster.machines()}


def assigned(slots, counts=None, task_per_gpu=True, per_gpu_host=2):
    cluster = build_cluster(slots, counts, task_per_gpu)
    reports = fake_reports(cluster, per_gpu_host)
    return gpus.assign(cluster, reports), reports


def write(tmp_path, text):
    path = tmp_path / "hosts.yml"
    path.write_text(text)
    return str(path)


def check_own_gpus(cluster):
    """No two tasks of a machine share a GPU; every training task on a GPU machine has one."""
    for machine, tasks in cluster.machines():
        seen = {}
        for task in tasks:
            for gpu in gpus.devices(task):
                assert gpu not in seen, "%s and %s share GPU %d" % (seen[gpu], task.label, gpu)
                seen[gpu] = task.label
            env = gpus.task_env(task, cluster)
            assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
            assert env["CUDA_VISIBLE_DEVICES"] == task.cuda_visible_devices
            assert "TF_FORCE_GPU_ALLOW_GROWTH" not in env


def test_parse_gpu_list():
    lines = smi_lines(2) + ["  MIG 1g.10gb Device 0: (UUID: MIG-1)", "No devices were found", ""]
    assert gpus.parse_gpu_list(lines) == [0, 1]
    assert gpus.parse_gpu_list(["GPU 3: X", "GPU 1: Y"]) == [1, 3]
    assert gpus.parse_gpu_list(None) == []


def test_sample_inventory_every_training_task_has_its_own_gpus():
    cluster, reports = assigned(load_slots(SAMPLE))
    assert gpus.problems(cluster, reports) == []
    check_own_gpus(cluster)
    for task in cluster.tasks:
        if task.job in ("chief", "worker"):
            assert len(gpus.devices(task)) >= 1, task
        else:
            assert task.cuda_visible_devices == "", task
    # chief0 + worker0 split gpu01; worker2 lists GPU 1 of gpu02, so worker1 gets GPU 0.
    by_slot = {t.slot: t.cuda_visible_devices for t in cluster.tasks}
    assert by_slot["chief0"] != by_slot["worker0"]
    assert by_slot["worker1"] == "0" and by_slot["worker2"] == "1"


@pytest.mark.parametrize("name", ["mnist_replica", "cifar10", "cifar10_local"])
def test_rendered_num_gpus_is_what_the_task_sees(name):
    example = load_catalog()[name]
    counts = {job: example.topology.get(job, 0) for job in JOBS}
    cluster, _ = assigned(load_slots(SAMPLE), counts, example.task_per_gpu)
    check_own_gpus(cluster)
    for task in cluster.tasks:
        command = task_command(example, cluster, task, "/w/run", "/w/run/ck")
        shown = int(re.search(r"--num_gpus=(\d+)", command).group(1))
        assert shown == len(gpus.devices(task))
        assert shown >= 1 if task.job == "worker" else shown == 0


def test_one_task_per_machine_sees_all_its_gpus(tmp_path):
    inventory = write(tmp_path, "worker:\n  hosts:\n    w: {ansible_host: gpu1}\n"
                                "ps:\n  hosts:\n    p: {ansible_host: gpu1}\n")
    cluster, _ = assigned(load_slots(inventory), per_gpu_host=4)
    assert [t.cuda_visible_devices for t in cluster.tasks] == ["0,1,2,3", ""]


def test_more_tasks_than_gpus_share_with_memory_growth(tmp_path):
    inventory = write(tmp_path, "worker:\n  hosts:\n    w[0:2]: {ansible_host: gpu1}\n"
                                "    c: {ansible_host: cpu1}\n")
    cluster, reports = assigned(load_slots(inventory))
    assert [t.cuda_visible_devices for t in cluster.tasks] == ["0", "1", "0", ""]
    assert gpus.problems(cluster, reports) == []
    growth = [gpus.task_env(t, cluster).get("TF_FORCE_GPU_ALLOW_GROWTH") for t in cluster.tasks]
    assert growth == ["true", None, "true", None]


def test_listed_gpus_are_kept_and_excluded_from_the_split(tmp_path):
    inventory = write(tmp_path, """
chief:
  hosts:
    c: {ansible_host: gpu1}
worker:
  hosts:
    w0: {ansible_host: gpu1, tfcluster_gpus: [2, 3]}
    w1: {ansible_host: gpu1}
evaluator:
  hosts:
    e: {ansible_host: gpu1, tfcluster_gpus: [1]}
ps:
  hosts:
    p: {ansible_host: gpu1, tfcluster_gpus: [0]}
""")
    cluster, reports = assigned(load_slots(inventory), per_gpu_host=6)
    assert {t.label: t.cuda_visible_devices for t in cluster.tasks} == {
        "chief:0": "4", "worker:0": "2", "worker:1": "3", "worker:2": "5",
        "evaluator:0": "1", "ps:0": "0"}
    assert gpus.problems(cluster, reports) == []
    check_own_gpus(cluster)


def test_gpu_less_machine_gives_no_gpu(tmp_path):
    inventory = write(tmp_path, "chief:\n  hosts:\n    c: {ansible_host: cpu1}\n"
                                "worker:\n  hosts:\n    w: {ansible_host: cpu1}\n")
    cluster, _ = assigned(load_slots(inventory))
    assert [t.cuda_visible_devices for t in cluster.tasks] == ["", ""]
    assert gpus.task_env(cluster.tasks[0], cluster)["CUDA_VISIBLE_DEVICES"] == ""


def test_an_id_preflight_did_not_report_is_a_problem_naming_the_host(tmp_path):
    inventory = write(tmp_path, "worker:\n  hosts:\n    w0: {ansible_host: gpu01, tfcluster_gpus: [3]}\n"
                                "    w1: {ansible_host: cpu01, tfcluster_gpus: [0]}\n")
    cluster, reports = assigned(load_slots(inventory))
    assert gpus.problems(cluster, reports) == [
        "gpu01: tfcluster_gpus of w0 lists GPU 3 but nvidia-smi -L shows 0, 1: fix tfcluster_gpus",
        "cpu01: tfcluster_gpus of w1 lists GPU 0 but nvidia-smi -L shows no GPU: fix tfcluster_gpus"]


def test_two_slots_listing_one_gpu_is_a_problem(tmp_path):
    inventory = write(tmp_path, "worker:\n  hosts:\n    w0: {ansible_host: gpu01, tfcluster_gpus: [1]}\n"
                                "    w1: {ansible_host: gpu01, tfcluster_gpus: [0, 1]}\n")
    cluster, reports = assigned(load_slots(inventory), task_per_gpu=False)
    assert gpus.problems(cluster, reports) == [
        "gpu01: w0 and w1 both list GPU 1 in tfcluster_gpus: give each slot its own GPUs"]


def test_task_env_before_assign_sets_no_devices():
    cluster = build_cluster(load_slots(SAMPLE))
    worker = cluster.find("worker:0")
    assert worker.cuda_visible_devices is None
    assert gpus.task_env(worker, cluster) == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
