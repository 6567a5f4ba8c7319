"""The deploy stamp (tfcluster_agent/deploystamp.py), run as deploy.yml runs it (the agent's
command `stamp`, python -B ROOT/tfcluster_agent stamp ...) on a folder of files standing in for a
host: the stamp sees drift, ignores what it must, and the controller's inputs hash follows the
files a deploy is made from. tests/test_dockerhosts.py runs it for real on containers."""
import contextlib
import io
import json
import os
import shutil
import stat
import subprocess
import sys

import pytest

from support import REPO
from tfcluster_agent import deploystamp as deploy_stamp

AGENT = os.path.join(REPO, "tfcluster_agent")


def stamp_tool(*args):
    """In-process, as fast as the tier needs; test_a_fresh_stamp... runs it as deploy.yml does."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert deploy_stamp.main(list(args)) == 0
    return json.loads(out.getvalue())


def stamp_command(*args):
    """As deploy.yml runs it on a host: the agent's command line."""
    proc = subprocess.run([sys.executable, "-B", AGENT, "stamp", *args], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture
def host(tmp_path):
    """A tfcluster root with code, a venv to prune, a work folder, and a file outside it."""
    root = tmp_path / "opt"
    for folder in ("trainers", "venv/lib/python3.11/site-packages/tensorflow", "work", "data/tiny"):
        (root / folder).mkdir(parents=True)
    (root / "trainers" / "loop.py").write_text("x = 1\n")
    (root / "data" / "tiny" / "tiny.txt").write_text("tiny\n")
    (root / "venv" / "tfcluster-installed").write_text("# record\n")
    (tmp_path / "rules.nft").write_text("table inet tfcluster\n")
    (tmp_path / "passwd").write_text("root:x:0:0::/root:/bin/sh\ntfcluster:x:999:999::/opt:/bin/false\n")
    stamp = str(root / ".deploy-stamp.json")
    spec = [["tree", str(root), [str(root / "venv"), str(root / "work")], None],
            ["stat", str(root / "venv" / "tfcluster-installed")],
            ["names", str(root / "venv" / "lib" / "python3*" / "site-packages")],
            ["stat", str(tmp_path / "rules.nft")], ["stat", str(tmp_path / "absent")],
            ["lines", str(tmp_path / "passwd"), "tfcluster:"],
            ["run", ["cat", str(tmp_path / "rules.nft")]], ["env", "TFC_TEST_SOURCE"]]
    written = stamp_tool("write", stamp, "inputs-1", json.dumps(spec))
    assert written["written"] == stamp and written["entries"] > 10
    return tmp_path, root, stamp


def check(stamp, inputs="inputs-1", *more):
    return stamp_tool("check", stamp, inputs, *more)


def test_a_fresh_stamp_is_root_only_and_matches(host):
    _, root, stamp = host
    assert stat.S_IMODE(os.stat(stamp).st_mode) == 0o600
    assert stamp_command("check", stamp, "inputs-1") == {
        "ready": True, "why": "as the last complete deploy left it"}
    assert not os.path.exists(stamp + ".new")


def test_other_inputs_do_not_match(host):
    _, _, stamp = host
    found = check(stamp, "inputs-2")
    assert found["ready"] is False and "inputs changed" in found["why"]


@pytest.mark.parametrize("drift, named", [
    (lambda t, r: os.chmod(r / "trainers" / "loop.py", 0o700), "loop.py"),
    (lambda t, r: (r / "data" / "tiny" / "tiny.txt").unlink(), "tiny.txt"),
    (lambda t, r: shutil.rmtree(r / "data" / "tiny"), "data/tiny"),
    (lambda t, r: (r / "trainers" / "new.py").write_text(""), "new.py"),
    (lambda t, r: os.chmod(r / "work", 0o777), "work"),
    (lambda t, r: (t / "absent").write_text(""), "absent"),
    (lambda t, r: (r / "venv" / "lib" / "python3.11" / "site-packages" / "keras").mkdir(),
     "names "),
    (lambda t, r: (t / "passwd").write_text("tfcluster:x:999:999::/opt:/bin/sh\n"), "lines "),
    (lambda t, r: (r / "venv" / "tfcluster-installed").write_text("# other\n"), "tfcluster-installed"),
])
def test_drift_is_seen_and_named(host, drift, named):
    tmp_path, root, stamp = host
    drift(tmp_path, root)
    found = check(stamp)
    assert found["ready"] is False and named in found["why"], found
    assert os.path.exists(stamp), "a check without --forget-stale removed the stamp"


def test_same_size_same_mtime_edit_is_seen_by_ctime(host):
    tmp_path, _, stamp = host
    rules = tmp_path / "rules.nft"
    before = os.stat(rules)
    rules.write_text("table inet tfcluste2\n")
    os.utime(rules, ns=(before.st_atime_ns, before.st_mtime_ns))
    found = check(stamp)
    assert found["ready"] is False and "rules.nft" in found["why"], found


def test_what_a_run_leaves_is_not_drift(host):
    _, root, stamp = host
    # Run folders, caches, the venv's insides (the install record stands for them).
    (root / "work" / "run-1").mkdir()
    (root / "work" / "run-1" / "log").write_text("x")
    (root / "trainers" / "__pycache__").mkdir()
    (root / "trainers" / "__pycache__" / "loop.cpython-311.pyc").write_text("x")
    (root / "venv" / "lib" / "python3.11" / "site-packages" / "tensorflow" / "x.py").write_text("")
    (root / "venv" / "lib" / "python3.11" / "site-packages" / "__pycache__").mkdir()
    assert (root / "trainers" / "loop.py").read_text() == "x = 1\n"  # reading is no change
    assert check(stamp)["ready"] is True


def test_forget_stale_removes_only_a_stamp_that_does_not_match(host):
    _, root, stamp = host
    assert check(stamp, "inputs-1", "--forget-stale")["ready"] is True
    assert os.path.exists(stamp)
    os.chmod(root / "trainers" / "loop.py", 0o700)
    assert check(stamp, "inputs-1", "--forget-stale")["ready"] is False
    assert not os.path.exists(stamp)
    assert check(stamp) == {"ready": False,
                            "why": "no stamp (never deployed completely, or changed since)"}
    assert stamp_tool("forget", stamp) == {"forgotten": stamp}


def test_a_damaged_stamp_does_not_match(host):
    _, _, stamp = host
    with open(stamp, "w") as handle:
        handle.write("{not json")
    found = check(stamp)
    assert found["ready"] is False and "unreadable stamp" in found["why"]


def test_usage_error_exits_2():
    proc = subprocess.run([sys.executable, "-B", AGENT, "stamp", "check"], capture_output=True,
                          text=True)
    assert proc.returncode == 2 and "stamp check STAMP INPUTS" in proc.stderr


def test_dpkg_status_reads_version_and_status(tmp_path):
    status = tmp_path / "status"
    status.write_text("Package: nftables\nStatus: install ok installed\nArchitecture: amd64\n"
                      "Version: 1.0.6-2\nDescription: x\n more\n\nPackage: other\nVersion: 1\n")
    assert deploy_stamp.dpkg_status(["nftables", "python3"], str(status)) == {
        "nftables": [["amd64", "install ok installed", "1.0.6-2"]], "python3": []}


def test_inputs_follow_roles_code_and_wheels(tmp_path):
    roles = tmp_path / "roles"
    (roles / "common" / "tasks").mkdir(parents=True)
    (roles / "common" / "tasks" / "main.yml").write_text("---\n")
    code = tmp_path / "code"
    shutil.copytree(os.path.join(REPO, "tfcluster_agent"), code / "tfcluster_agent",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (code / "trainers").mkdir()
    (code / "trainers" / "loop.py").write_text("x = 1\n")
    wheels = tmp_path / "wheelhouse"
    wheels.mkdir()
    args = ["inputs", "--content", str(roles), "--roles", str(roles), "--code", str(code),
            "--wheels", str(wheels), "--file", str(tmp_path / "ansible.cfg")]
    first = stamp_tool(*args)
    assert first["roles"] == ["common"] and len(first["hash"]) == 64
    assert stamp_tool(*args) == first
    changes = [lambda: (roles / "common" / "tasks" / "main.yml").write_text("--- # x\n"),
               lambda: (code / "trainers" / "loop.py").write_text("x = 2\n"),
               lambda: (wheels / "tensorflow_cpu-2.21.0-py3-none-any.whl").write_text("w"),
               lambda: (tmp_path / "ansible.cfg").write_text("[defaults]\n")]
    seen = {first["hash"]}
    for change in changes:
        change()
        now = stamp_tool(*args)["hash"]
        assert now not in seen
        seen.add(now)
    # Caches are no input.
    (code / "trainers" / "__pycache__").mkdir()
    (code / "trainers" / "__pycache__" / "loop.pyc").write_text("x")
    assert stamp_tool(*args)["hash"] == now
