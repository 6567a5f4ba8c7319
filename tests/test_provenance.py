"""Provenance: what a host's tasks import from and which data they read (the agent's side), the
controller checkout's commit and uncommitted changes, the command line with --env values hidden,
and `tfcluster diff` and `tfcluster rerun` on local launches of a stand-in task, two local
"hosts" whose interpreters differ by one package."""
import json
import os
import shutil
import subprocess
import sys
import sysconfig

import pytest

from support import REPO
from support.cli import run_cli, run_record, tfcluster
from support.ports import free_port_block
from support.procs import stop_leftovers
from tfcluster.cli.rerun import with_values
from tfcluster.errors import UsageError
from tfcluster.runs import provenance
from tfcluster.runs import store as runs
from tfcluster.runs.record import RunRecord
from tfcluster.view import diff
from tfcluster_agent import hostinfo
from tfcluster_agent import provenance as hostfacts

FAKE = "python %s" % os.path.join(REPO, "tests", "programs", "fake_task.py")
QUICK = {"FAKE_WORKER_0": "exit:0:0", "FAKE_WORKER_1": "exit:0:0"}
# Made here: this file's own text may be in a run's code.diff (a checkout with it uncommitted).
SECRET = "secret-%s" % os.urandom(6).hex()


def dist_info(folder, name, version):
    os.makedirs(os.path.join(folder, "%s-%s.dist-info" % (name, version)))


# ------------------------------------------------------------------ the host's facts

def test_distributions_by_their_folders_the_first_of_a_name_winning(tmp_path):
    first, second, added = (str(tmp_path / n) for n in ("site1", "site2", "added"))
    dist_info(first, "Foo_Bar", "1.0")
    dist_info(second, "foo.bar", "2.0")         # shadowed by site1's, as importlib would
    dist_info(added, "nvidia_nccl_cu12", "2.21.5")
    # CUDA 13's wheels name the runtime alone; of cuDNN for two CUDA versions the newest counts.
    dist_info(added, "nvidia_cuda_runtime", "13.0.96")
    dist_info(added, "nvidia_cudnn_cu13", "9.19.0.56")
    dist_info(added, "nvidia_cudnn_cu12", "9.3.0.75")
    os.makedirs(os.path.join(second, "old.egg-info"))
    (tmp_path / "site2" / "old.egg-info" / "PKG-INFO").write_text("Name: old\nVersion: 0.3\n\n")
    os.makedirs(os.path.join(second, "tensorflow", "python", "platform"))
    (tmp_path / "site2" / "tensorflow" / "python" / "platform" / "build_info.py").write_text(
        "build_info = collections.OrderedDict([('cuda_version', '12.5.1'), "
        "('cudnn_version', '9'), ('is_cuda_build', True)])\n")
    # A .pth adds a folder (and an import line adds none).
    (tmp_path / "site1" / "extra.pth").write_text("../added\nimport os\n")
    folders = hostfacts.search_path(sys.executable, lambda: [first, second])
    assert folders == [first, os.path.join(first, "../added"), second]
    packages = hostfacts.distributions(folders)
    assert packages == {"foo-bar": "1.0", "nvidia-nccl-cu12": "2.21.5", "old": "0.3",
                        "nvidia-cuda-runtime": "13.0.96", "nvidia-cudnn-cu13": "9.19.0.56",
                        "nvidia-cudnn-cu12": "9.3.0.75"}
    assert hostfacts.library_versions(packages, folders) == {
        "cuda": "13.0.96", "cudnn": "9.19.0.56", "nccl": "2.21.5", "tf_built_cuda": "12.5.1",
        "tf_built_cudnn": "9"}
    same = dict(reversed(list(packages.items())))
    assert hostfacts.packages_hash(same) == hostfacts.packages_hash(packages)
    assert hostfacts.packages_hash(dict(packages, old="0.4")) != hostfacts.packages_hash(packages)


def test_the_preflight_reports_the_driver_and_the_data_hashes(tmp_path, monkeypatch):
    state = tmp_path / "smi.json"
    state.write_text(json.dumps({"driver": "580.159.04", "gpus": [
        {"uuid": "GPU-0", "name": "Fake", "memory_total": 1000, "memory_used": 0,
         "utilization": 0}]}))
    monkeypatch.setenv("FAKE_NVIDIA_SMI_STATE", str(state))
    monkeypatch.setattr(hostinfo, "python_report", lambda python, cache_dir: {"python_ok": True})
    data = tmp_path / "mnist"
    data.mkdir()
    (data / "train-images-idx3-ubyte.gz").write_bytes(b"images")
    report = hostinfo.preflight_report(sys.executable, [], REPO, None, [["mnist", str(data)]],
                                       os.path.join(REPO, "tests", "programs", "nvidia-smi"))
    assert report["versions"]["driver"] == "580.159.04"
    assert report["packages"]["pytest"] and len(report["packages_hash"]) == 64
    path = str(data / "train-images-idx3-ubyte.gz")
    assert report["data_hashes"] == {path: hostfacts.file_sha256(path)}
    assert "t10k-images-idx3-ubyte.gz" in report["missing_data"][str(data)]


def test_data_files_hashed_once_until_they_change(tmp_path, monkeypatch):
    data = tmp_path / "data"
    data.mkdir()
    paths = [str(data / n) for n in ("a.gz", "b.gz", "absent.gz")]
    for path, text in zip(paths, ("one", "two")):
        open(path, "w").write(text)
    hashed = []
    real = hostfacts.file_sha256
    monkeypatch.setattr(hostfacts, "file_sha256", lambda p: hashed.append(p) or real(p))
    first = hostfacts.data_hashes(paths, str(tmp_path / "cache"), settle_ns=0)
    assert sorted(first) == paths[:2] and first[paths[0]] == hostfacts.file_sha256(paths[0])
    hashed.clear()
    assert hostfacts.data_hashes(paths, str(tmp_path / "cache"), settle_ns=0) == first
    assert hashed == [], "an unchanged file was read again"
    open(paths[1], "w").write("changed")
    again = hostfacts.data_hashes(paths, str(tmp_path / "cache"), settle_ns=0)
    assert hashed == [paths[1]] and again[paths[1]] != first[paths[1]]


# ------------------------------------------------------------------ the controller's checkout

def git(folder, *args):
    return subprocess.run(["git", "-C", str(folder), "-c", "user.name=t", "-c", "user.email=t@t",
                           *args], check=True, capture_output=True).stdout


def test_a_dirty_checkout_is_its_commit_plus_a_diff_that_rebuilds_it(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    git(tree, "init", "-q")
    (tree / "kept.py").write_text("a = 1\nb = 2\n")
    (tree / "gone.py").write_text("x\n")
    git(tree, "add", ".")
    git(tree, "commit", "-q", "-m", "first")
    clean = provenance.Checkout(str(tree)).wait()
    assert clean.commit == git(tree, "rev-parse", "HEAD").decode().strip()
    assert not clean.dirty and clean.diff == b""
    (tree / "kept.py").write_text("a = 1\nb = 3\n")
    (tree / "gone.py").unlink()
    (tree / "new.py").write_text("print('new')")      # untracked, no final newline
    (tree / "empty.txt").write_text("")
    (tree / "blob.bin").write_bytes(b"\0\1\2")
    dirty = provenance.Checkout(str(tree)).wait()
    assert dirty.dirty and dirty.commit == clean.commit
    assert dirty.left_out == ["blob.bin (binary)"]
    # The commit and the diff give back the tree as it was.
    copy = tmp_path / "copy"
    subprocess.run(["git", "clone", "-q", str(tree), str(copy)], check=True)
    patch = tmp_path / "code.diff"
    patch.write_bytes(dirty.diff)
    git(copy, "apply", str(patch))
    for name in ("kept.py", "new.py", "empty.txt"):
        assert (copy / name).read_bytes() == (tree / name).read_bytes()
    assert not (copy / "gone.py").exists()
    assert provenance.Checkout(str(tmp_path)).wait().commit is None  # not a checkout


def test_env_values_hidden_on_the_command_line_and_rerun_asks_for_them():
    argv = ["launch", "--cmd", "x", "--env", "KEY=s3cret", "--env=TOKEN=abc", "--", "--env",
            "A=b"]
    shown = provenance.hidden_argv(argv)
    assert shown == ["launch", "--cmd", "x", "--env", "KEY=<hidden>", "--env=TOKEN=<hidden>",
                     "--", "--env", "A=b"]  # the trainer's own arguments as given
    arguments = provenance.launch_arguments(["tfcluster", "--runs-dir", "r", "--run-id", "x"]
                                            + shown)
    assert arguments == shown
    assert with_values(arguments, {"KEY": "k", "TOKEN": "t"}, "r1")[3:6] == [
        "--env", "KEY=k", "--env=TOKEN=t"]
    with pytest.raises(UsageError, match=r"run r1 got KEY, TOKEN through --env, whose values "
                                         r"no record keeps: give them again"):
        with_values(arguments, {}, "r1")
    with pytest.raises(UsageError, match="run r1 had no --env OTHER"):
        with_values(arguments, {"KEY": "k", "TOKEN": "t", "OTHER": "o"}, "r1")


def test_rerun_of_a_run_recorded_without_a_command_line(tmp_path, capsys):
    record = runs.create(str(tmp_path), "old")
    runs.save(record)
    code, _, err = run_cli(capsys, "--runs-dir", str(tmp_path), "rerun", "old")
    assert code == 2 and "run old has no recorded launch command line" in err
    code, out, _ = run_cli(capsys, "--runs-dir", str(tmp_path), "diff", "old", "old")
    assert code == 0 and "run old has no provenance record" in out


def a_record(run_id, port, data, argv, accuracy, driver="580.159.04"):
    return RunRecord.from_json({
        "id": run_id, "state": "succeeded", "code_hash": "c" * 64,
        "machines": [{"address": "h1", "connection": "ssh", "ssh_port": 22, "user": None,
                      "code_hash": "a" * 64, "packages_hash": "p", "data_hashes": data,
                      "versions": {"driver": driver}, "python_version": "3.11.7"}],
        "tasks": {"worker:0": {"job": "worker", "index": 0, "slot": "w0", "port": port,
                               "machine": ["ssh", "h1", 22, None]}},
        "results": {"worker:0": {"accuracy": accuracy, "devices": ["/device:CPU:0"]}},
        "provenance": {"commit": "f" * 40, "command_line": argv, "cwd": "/w",
                       "env": {"A": "1", "TFCLUSTER_RUN_ID": run_id},
                       "packages": {"p": {"numpy": "2.0.0"}}}})


def test_diff_names_data_arguments_placement_versions_and_puts_metrics_side_by_side():
    first = a_record("r1", 2222, {"/d/x.gz": "1" * 64}, ["tfcluster", "launch", "mnist_replica",
                                                          "--run-id", "r1"], 0.9)
    second = a_record("r2", 2223, {"/d/x.gz": "2" * 64}, ["tfcluster", "--runs-dir", "runs",
                                                          "launch", "mnist_replica",
                                                          "--", "--train_steps=5"], 0.8, "550.54")
    found = dict(diff.compare(first, second))
    assert found["code"] == [] and found["environment"] == []  # each run's own id aside
    assert found["packages"] == [("h1 driver", "580.159.04", "550.54")]
    assert found["data"] == [("h1 /d/x.gz", "1" * 12, "2" * 12)]
    assert found["arguments"] == [("command line", "launch mnist_replica",
                                   "launch mnist_replica -- --train_steps=5")]
    assert found["placement"] == [("worker:0", "h1:2222", "h1:2223")]
    assert diff.metric_rows(first, second) == [("state", "succeeded", "succeeded"),
                                               ("worker:0 accuracy", "0.9", "0.8")]
    assert "no difference in: code, environment" in diff.diff_lines(first, second)[-1]


# ------------------------------------------------------------------ launches, diff, rerun

@pytest.fixture
def two_hosts(tmp_path):
    """An inventory of two local machines, localhost with this interpreter and 127.0.0.1 with
    a venv that imports the same packages plus one more (extra-pkg 1.0)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)})
    with open(os.path.join(site, "ours.pth"), "w") as handle:
        handle.write(sysconfig.get_path("purelib") + "\n")
    dist_info(site, "extra_pkg", "1.0")
    base = free_port_block()
    inventory = tmp_path / "two.yml"
    inventory.write_text("""all:
  vars: {{ansible_connection: local, tfcluster_root: {repo}, tfcluster_workdir: {tmp}/work}}
  children:
    worker:
      hosts:
        w0: {{ansible_host: localhost, tfcluster_python: {python}, tfcluster_port_base: {p0}}}
        w1: {{ansible_host: 127.0.0.1, tfcluster_python: {venv}/bin/python,
              tfcluster_port_base: {p1}}}
""".format(repo=REPO, tmp=tmp_path, python=sys.executable, venv=venv, p0=base, p1=base + 6))
    yield str(inventory), str(tmp_path / "runs"), site
    leftovers = stop_leftovers(str(tmp_path))
    assert not leftovers, "processes of the test were still running: %s" % leftovers


def launch(inventory, runs_dir, *extra):
    return tfcluster("launch", "--cmd", FAKE, "-i", inventory, "--workers", "2", "--plain",
                     "--success", "all_workers", "--env", "API_KEY=" + SECRET, *extra,
                     runs_dir=runs_dir, env=QUICK, check=0)


def the_same_run(first, second):
    """The provenance two records share when one is the rerun of the other."""
    def kept(record):
        found = dict(record["provenance"])
        found.pop("rerun_of")
        found["env"] = {k: v.replace(record["id"], "ID") for k, v in found["env"].items()}
        found["command_line"] = provenance.launch_arguments(found["command_line"])
        return found, record["machines"], record["cluster"]
    assert kept(first) == kept(second)


def test_one_package_named_at_preflight_and_in_diff_the_rerun_recorded_alike(two_hosts):
    inventory, runs_dir, site = two_hosts
    proc = launch(inventory, runs_dir, "--run-id", "first")
    assert "warning: 127.0.0.1: its packages differ from localhost's: extra-pkg 1.0 " \
           "(localhost: none)" in proc.stdout
    first = run_record(runs_dir, "first")
    hashes = {m["address"]: m["packages_hash"] for m in first["machines"]}
    sets = first["provenance"]["packages"]
    assert set(sets) == set(hashes.values()) and len(sets) == 2
    assert sets[hashes["127.0.0.1"]] == dict(sets[hashes["localhost"]], **{"extra-pkg": "1.0"})
    assert first["provenance"]["command_line"][-6:] == [
        "--success", "all_workers", "--env", "API_KEY=<hidden>", "--run-id", "first"]
    assert first["provenance"]["env"]["API_KEY"] == "<hidden>"
    for folder in (os.path.join(runs_dir, "first"), os.path.dirname(inventory)):
        for root, _, files in os.walk(folder):
            for name in files:
                with open(os.path.join(root, name), "rb") as handle:
                    assert SECRET.encode() not in handle.read(), os.path.join(root, name)
    # The checkout this test runs from: clean, or its diff in the run folder.
    status = subprocess.run(["git", "-C", REPO, "status", "--porcelain"], capture_output=True,
                            text=True).stdout
    assert first["provenance"]["commit"] == git(REPO, "rev-parse", "HEAD").decode().strip()
    assert first["provenance"]["dirty"] == bool(status.strip())
    assert os.path.exists(os.path.join(runs_dir, "first", "code.diff")) == bool(status.strip())

    # A rerun: the same arguments, the hidden value given again; its records match.
    proc = tfcluster("rerun", "first", "--run-id", "again", "--env", "API_KEY=" + SECRET,
                     runs_dir=runs_dir, env=QUICK, check=0)
    assert "warning" not in proc.stdout.replace("warning: 127.0.0.1: its packages", ""), \
        proc.stdout
    again = run_record(runs_dir, "again")
    assert again["provenance"]["rerun_of"] == "first" and again["state"] == "succeeded"
    the_same_run(first, again)
    assert tfcluster("rerun", "first", runs_dir=runs_dir).returncode == 2

    # The venv loses its extra package: the rerun warns, the diff names the host and package.
    shutil.rmtree(os.path.join(site, "extra_pkg-1.0.dist-info"))
    proc = tfcluster("rerun", "first", "--run-id", "third", "--env", "API_KEY=x",
                     runs_dir=runs_dir, env=QUICK, check=0)
    assert "warning: 127.0.0.1 extra-pkg: 1.0 in run first, none now" in proc.stdout
    assert "its packages differ" not in proc.stdout
    out = tfcluster("diff", "first", "third", runs_dir=runs_dir, check=0).stdout
    rows = [line.split() for line in out.splitlines()]
    assert ["packages:"] in rows and ["127.0.0.1", "extra-pkg", "1.0", "none"] in rows
    assert "no difference in: code, data, arguments, environment, placement" in out
    assert ["worker:1", "accuracy", "0.5", "0.5"] in rows
    out = tfcluster("diff", "first", "again", runs_dir=runs_dir, check=0).stdout
    assert "no difference in: code, packages, data, arguments, environment, placement" in out


def test_check_names_the_host_whose_packages_differ(two_hosts):
    inventory, _, _ = two_hosts
    proc = tfcluster("check", "-i", inventory, check=0)
    assert "warning: 127.0.0.1: its packages differ from localhost's: extra-pkg 1.0" in proc.stdout
