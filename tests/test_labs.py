"""Labs as they are (docs/labs.md), the fast tier: folders machines share, run folders inside a
shared workdir, the unfenced-host warning, the administrator's half a user's deploy checks,
tfcluster_root's default, `deploy --system`, and sync writing a shared root once. The runs on
the test hosts as an ordinary user, with a shared home, are tests/test_labs_hosts.py."""
import json
import os
import subprocess
import sys

import pytest

from support import REPO
from support.cli import tfcluster
from tfcluster.launch import fencing, sharing
from tfcluster.cli.main import build_parser
from tfcluster.deploy.playbook import playbook_command
from tfcluster.errors import UsageError
from tfcluster.hosts.inventory import Machine, default_root, load_slots
from tfcluster.runs.record import PreflightReport
from tfcluster.spec.cluster import Cluster, Task
from tfcluster.runs.store import host_run_dir
from tfcluster_agent import shares

READY = os.path.join(REPO, "plugins", "modules", "system_ready.py")
FAKE_SMI = os.path.join(REPO, "tests", "programs", "nvidia-smi")


def test_machines_reading_one_folder_read_one_token(tmp_path):
    shared, apart = tmp_path / "home" / "work", tmp_path / "other"
    assert shares.folder_id(str(shared), create=False) is None  # a dry run makes nothing
    assert not shared.exists()
    first = shares.folder_id(str(shared))
    assert first and shares.folder_id(str(shared)) == first  # another machine reads it back
    assert shares.folder_id(str(apart)) not in (None, first)
    assert sorted(os.listdir(shared)) == [shares.MARKER]  # no temporary file left
    assert oct(os.stat(shared / shares.MARKER).st_mode & 0o777) == "0o644"
    (tmp_path / "file").write_text("")
    assert shares.folder_id(str(tmp_path / "file" / "work")) is None  # cannot hold a marker
    out = subprocess.run([sys.executable, shares.__file__, "ensure", "--read-only",
                          str(shared), str(apart / "new")], capture_output=True, text=True)
    assert json.loads(out.stdout) == {str(shared): first, str(apart / "new"): None}


def test_a_shared_run_folder_names_its_launch(tmp_path):
    run = tmp_path / "work" / "run1"
    shares.make_run_folder(str(run / "th1"), launch="launch-a")
    shares.make_run_folder(str(run / "th2"), launch="launch-a")  # the same launch, another host
    assert sorted(os.listdir(run)) == [".launch", "th1", "th2"]
    assert oct(os.stat(run).st_mode & 0o777) == oct(os.stat(run / "th1").st_mode & 0o777) == "0o700"
    with pytest.raises(ValueError, match="run folder .*/run1 exists already: another run has "
                                         "this id; choose another --run-id"):
        shares.make_run_folder(str(run / "th3"), launch="launch-b")  # another launch, same id
    assert not (run / "th3").exists()
    with pytest.raises(ValueError, match="/run1/th1 exists already"):
        shares.make_run_folder(str(run / "th1"), launch="launch-a")
    assert shares.run_id(str(run / "th1"), "launch-a") == shares.run_id(str(run), "") == "run1"
    shares.make_run_folder(str(tmp_path / "work" / "run2"))  # a workdir of its own: as before
    with pytest.raises(ValueError, match="/run2 exists already"):
        shares.make_run_folder(str(tmp_path / "work" / "run2"))


def machine(address, workdir="/home/u/tfcluster/work"):
    return Machine(address=address, workdir=workdir)


def cluster_of(*machines):
    return Cluster(Task("worker", i, "w%d" % i, m, 2222 + i) for i, m in enumerate(machines))


def reports(found):
    return {key: PreflightReport(**facts) for key, facts in found.items()}


def test_machines_sharing_a_workdir_get_a_run_folder_each():
    a, b, c = machine("10.0.0.1"), machine("10.0.0.2"), machine("10.0.0.3", "/opt/work")
    cluster = cluster_of(a, b, c)
    found = {a.key: dict(hostname="gpu1", workdir_id="t1"),
             b.key: dict(hostname="gpu2", workdir_id="t1"),
             c.key: dict(hostname="gpu3", workdir_id="t2")}
    placed = sharing.place_run_folders(cluster, reports(found))
    dirs = [host_run_dir(t.machine, "RUN") for t in placed.tasks]
    assert dirs == ["/home/u/tfcluster/work/RUN/gpu1", "/home/u/tfcluster/work/RUN/gpu2",
                    "/opt/work/RUN"]
    assert sharing.launch_token(placed) and sharing.launch_token(cluster) == ""
    # Two machines answering with one host name: their addresses name their folders.
    found[b.key]["hostname"] = "gpu1"
    placed = sharing.place_run_folders(cluster, reports(found))
    assert [t.machine.run_subdir for t in placed.tasks] == ["10.0.0.1", "10.0.0.2", None]
    # Nothing shared: the cluster as it was.
    found[b.key]["workdir_id"] = "t3"
    assert sharing.place_run_folders(cluster, reports(found)) is cluster


def test_an_unfenced_ssh_host_is_named_once():
    fenced, bare = machine("10.0.0.1"), machine("10.0.0.2")
    local = Machine(address="localhost", connection="local")
    cluster = Cluster([Task("ps", 0, "p", bare, 2222), Task("worker", 0, "w0", bare, 2223),
                       Task("worker", 1, "w1", fenced, 2222), Task("worker", 2, "w2", local, 2222)])
    found = {bare.key: PreflightReport(fenced=False), fenced.key: PreflightReport(fenced=True),
             local.key: PreflightReport(fenced=False)}
    assert fencing.unfenced_warnings(cluster, found) == [
        "10.0.0.2: no firewall fences TensorFlow's port(s) 2222, 2223 here: anyone on its "
        "network can connect, and TensorFlow runs any graph it is sent; an administrator "
        "fences them with `tfcluster deploy --system` (docs/labs.md)"]
    assert fencing.port_span([2224, 2222, 2223, 4000, 2230, 2231]) == "2222-2224, 2230, 2231, 4000"
    found[bare.key] = PreflightReport(fenced=None)  # tfcluster_fenced: fenced by other means
    assert fencing.unfenced_warnings(cluster, found) == []


def test_tfcluster_root_defaults_to_the_users_home(tmp_path, monkeypatch):
    monkeypatch.setenv("USER", "carol")
    assert default_root("root") == default_root("alice", become=True) == "/opt/tfcluster"
    assert default_root("alice") == "/home/alice/tfcluster"
    assert default_root(None) == "/home/carol/tfcluster"  # SSH's default: the controller's user
    inventory = tmp_path / "lab.yml"
    inventory.write_text("worker:\n  hosts:\n"
                         "    a: {ansible_host: 10.0.0.1, ansible_user: alice}\n"
                         "    b: {ansible_host: 10.0.0.2, ansible_user: bob, ansible_become: true}\n"
                         "    c: {ansible_host: 10.0.0.3, ansible_user: dan, tfcluster_fenced: true}\n")
    a, b, c = [s.machine for s in load_slots(str(inventory))]
    assert (a.root, a.python, a.workdir) == ("/home/alice/tfcluster",
                                             "/home/alice/tfcluster/venv/bin/python",
                                             "/home/alice/tfcluster/work")
    assert b.root == "/opt/tfcluster" and c.root == "/home/dan/tfcluster"
    assert (a.fence_file, c.fence_file) == ("/etc/tfcluster-firewall.nft", "")


def deploy_args(*argv):
    args = build_parser().parse_args(["deploy", "-i", "hosts.yml", *argv])
    args.trainer_args = []
    return args


def test_deploy_system_runs_only_the_administrators_half(tmp_path):
    cmd = playbook_command(deploy_args("--system", "--limit", "gpu1"), None, REPO)
    assert cmd[cmd.index("-i") + 2:cmd.index("-i") + 4] == ["-e", "tfcluster_deploy_scope=system"]
    assert "tfcluster_deploy_scope=system" not in playbook_command(deploy_args(), None, REPO)
    with pytest.raises(UsageError, match="--system is a part of the deploy playbook"):
        playbook_command(deploy_args("--system", "--playbook", "stop"), None, REPO)
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("worker:\n  hosts:\n    a: {}\n")
    proc = tfcluster("deploy", "-i", str(inventory), "--system", "--playbook", "teardown")
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr


def ready(tmp_path, **wanted):
    """The module system_ready as Ansible runs it on a host (its arguments in a file, JSON out)."""
    base = {"packages": ["python3"], "python": sys.executable, "python_range": ["3.10", "3.13"],
            "gpu": False, "nvidia_smi": "nvidia-smi", "min_driver": "555.42.06",
            "root": str(tmp_path / "home" / "tfcluster")}
    arguments = tmp_path / "arguments.json"
    arguments.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": dict(base, **wanted)}))
    out = subprocess.run([sys.executable, READY, str(arguments)],
                         capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, FAKE_NVIDIA_SMI_STATE=str(tmp_path / "gpus.json")))
    assert out.returncode == 0, out.stdout + out.stderr
    found = json.loads(out.stdout)
    assert found["changed"] is False
    return found


def test_a_users_deploy_names_what_the_administrators_half_left_out(tmp_path):
    assert ready(tmp_path)["missing"] == [] and ready(tmp_path)["user"] == []
    found = ready(tmp_path, packages=["python3", "tfc-no-such-package"], gpu=True,
                  nvidia_smi=str(tmp_path / "nvidia-smi"))
    assert found["missing"] == [
        "Debian package(s) tfc-no-such-package not installed",
        "no NVIDIA driver (%s does not answer)" % (tmp_path / "nvidia-smi")]
    (tmp_path / "gpus.json").write_text(json.dumps({"driver": "550.54.15", "gpus": [
        {"uuid": "GPU-1"}]}))
    assert ready(tmp_path, gpu=True, nvidia_smi=FAKE_SMI)["missing"] == [
        "NVIDIA driver 550.54.15, older than the 555.42.06 TensorFlow needs"]
    (tmp_path / "gpus.json").write_text(json.dumps({"driver": "580.65.06", "gpus": [
        {"uuid": "GPU-1"}]}))
    assert ready(tmp_path, gpu=True, nvidia_smi=FAKE_SMI)["missing"] == []
    assert ready(tmp_path, python_range=["3.14", "3.15"])["missing"] == [
        "Python %d.%d at %s; TensorFlow needs 3.14 to 3.15" % (sys.version_info[:2] + (sys.executable,))]
    assert ready(tmp_path, python=str(tmp_path / "python3"))["missing"] == [
        "no Python at %s (No such file or directory)" % (tmp_path / "python3")]
    if os.geteuid() != 0:  # root may write anywhere
        assert ready(tmp_path, root="/opt/tfc-not-mine/tfcluster")["user"] == [
            "tfcluster_root /opt/tfc-not-mine/tfcluster cannot be made here: /opt is not writable"]


def test_sync_writes_a_shared_root_once(tmp_path):
    """Two machines (local slots here) whose tfcluster_root is one folder: one writes it, the
    other is named as sharing it, and the folder ends up with this checkout's code."""
    root = tmp_path / "home" / "tfcluster"
    token = shares.folder_id(str(root))
    inventory = tmp_path / "lab.yml"
    inventory.write_text("all:\n  vars:\n    ansible_connection: local\n    tfcluster_root: %s\n"
                         "    tfcluster_python: %s\n"
                         "worker:\n  hosts:\n    a: {ansible_host: lab1}\n    b: {ansible_host: lab2}\n"
                         % (root, sys.executable))
    proc = tfcluster("sync", "-i", str(inventory), check=0)
    lines = proc.stdout.splitlines()
    assert [line for line in lines if "shares tfcluster_root" in line] == [
        "sync: lab2                   shares tfcluster_root %s with lab1, which writes it" % root]
    assert sum(line.startswith("sync: lab") and "file(s) sent" in line for line in lines) == 1
    assert lines[-1].startswith("sync: 1 host(s) up to date")
    assert shares.folder_id(str(root)) == token
    assert os.path.exists(root / "tfcluster_agent" / "agent.py")
    assert os.path.exists(root / "trainers.sha256")
