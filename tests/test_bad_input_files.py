"""Bad input about files and folders (`tfcluster wheelhouse`, `tfcluster deploy`) and a Ctrl-C
while the program loads: one line, exit 2 (or the failed program's status), no traceback,
nothing left behind: no empty folder, no file changed."""
import os
import subprocess
import sys

import pytest

from support import REPO
from support.cli import assert_usage_error, run_cli
from support.fake_pip import FAKE_PIP
from support.files import read_only

# The fake pip's `install --dry-run --report FILE` (what --lock runs): one package resolved.
FAKE_LOCKING_PIP = r'''
import json, os, sys
if sys.argv[1] == "install":
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "calls"), "a") as handle:
        handle.write(" ".join(sys.argv[1:]) + "\n")
    with open(sys.argv[sys.argv.index("--report") + 1], "w") as handle:
        json.dump({"install": [{"metadata": {"name": "six", "version": "1.17.0"}}]}, handle)
    sys.exit(0)
''' + FAKE_PIP


def tfcluster_argv(*args):
    return [sys.executable, "-m", "tfcluster", *args]


class House:
    """A wheelhouse's inputs in tmp_path: a copy of the constraints and a fake pip."""

    def __init__(self, tmp_path):
        self.tmp = tmp_path
        self.constraints = tmp_path / "constraints.txt"
        self.constraints.write_text(
            open(os.path.join(REPO, "roles", "tensorflow", "files", "constraints.txt")).read())
        self.pip_program = tmp_path / "fake_pip.py"
        self.pip_program.write_text(FAKE_LOCKING_PIP)
        self.pip = "%s %s" % (sys.executable, self.pip_program)

    def args(self, dest, *extra):
        return ["wheelhouse", "--dest", str(dest), "--constraints", str(self.constraints),
                "--no-pack", "--pip", self.pip, *extra]

    def calls(self):
        calls = self.tmp / "calls"
        return calls.read_text().splitlines() if calls.exists() else []


@pytest.fixture
def house(tmp_path):
    return House(tmp_path)


def test_wheelhouse_dest_that_is_a_file(house, capsys):
    a_file = house.tmp / "afile"
    a_file.write_text("mine")
    code, _, err = run_cli(capsys, *house.args(a_file))
    assert_usage_error(code, err, "tfcluster: error: --dest %s cannot hold files (it is a file): "
                                  "pass a folder you can write to" % a_file)
    assert a_file.read_text() == "mine" and not house.calls()


def test_wheelhouse_dest_in_a_read_only_folder_is_not_made(house):
    folder = house.tmp / "shelf"
    folder.mkdir()
    proc = read_only(folder, tfcluster_argv(*house.args(folder / "wheels")))
    assert_usage_error(proc.returncode, proc.stderr, "tfcluster: error: --dest %s cannot hold "
                                                     "files (" % (folder / "wheels"))
    assert not os.listdir(folder) and not house.calls()


def test_wheelhouse_record_that_cannot_be_replaced(house):
    dest = house.tmp / "wheels"
    dest.mkdir()
    record = dest / "wheelhouse.json"
    record.write_text("{}")  # not this download's: pip must run and the record go first
    proc = read_only(record, tfcluster_argv(*house.args(dest)))
    assert_usage_error(proc.returncode, proc.stderr, str(dest))
    assert proc.stderr.startswith("tfcluster: error: "), proc.stderr
    assert record.read_text() == "{}" and not house.calls()


def test_wheelhouse_pip_that_does_not_exist(house, capsys):
    dest = house.tmp / "wheels"
    argv = house.args(dest)
    argv[argv.index("--pip") + 1] = "/nonexistent/pip"
    code, _, err = run_cli(capsys, *argv)
    assert_usage_error(code, err, "tfcluster: error: --pip '/nonexistent/pip': no such program: "
                                  "pass a pip command that runs here")
    assert not dest.exists()


def test_a_failed_wheelhouse_leaves_no_empty_folder(house, capsys):
    (house.tmp / "fail").write_text("")  # the fake pip fails
    dest = house.tmp / "new" / "wheels"
    code, out, err = run_cli(capsys, *house.args(dest))
    assert code == 1 and err == "tfcluster: error: pip download failed (exit code 1)\n", err
    assert len(house.calls()) == 1 and not (house.tmp / "new").exists()


def test_a_missing_constraints_file_is_no_lock(house, capsys):
    """A mistyped --constraints: an error, not a lock of every package into a new file."""
    typo = house.tmp / "typo" / "c.txt"
    argv = house.args(house.tmp / "wheels")
    argv[argv.index("--constraints") + 1] = str(typo)
    code, _, err = run_cli(capsys, *argv)
    assert_usage_error(code, err, "tfcluster: error: no constraints file %s: check the path, or "
                                  "pass --lock to write a new one" % typo)
    assert not house.calls() and not (house.tmp / "typo").exists()
    assert not (house.tmp / "wheels").exists()
    # Asked for, the new file is written.
    code, out, err = run_cli(capsys, *argv, "--lock")
    assert code == 0, err
    assert typo.read_text().splitlines()[-1] == "six==1.17.0"
    assert [call.split()[0] for call in house.calls()] == ["install"]


def test_scripts_wheelhouse_names_itself(house):
    argv = house.args(house.tmp / "afile")[1:]
    (house.tmp / "afile").write_text("")
    proc = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "wheelhouse"), *argv],
                          capture_output=True, text=True, timeout=60)
    assert_usage_error(proc.returncode, proc.stderr, "wheelhouse: error: --dest %s cannot hold "
                                                     "files" % (house.tmp / "afile"))


def test_lock_into_a_read_only_folder(house):
    folder = house.tmp / "pins"
    folder.mkdir()
    argv = house.args(house.tmp / "wheels", "--lock")
    argv[argv.index("--constraints") + 1] = str(folder / "new" / "c.txt")
    proc = read_only(folder, tfcluster_argv(*argv))
    assert_usage_error(proc.returncode, proc.stderr, "tfcluster: error: --constraints' folder "
                                                     "%s cannot hold files" % (folder / "new"))
    assert not os.listdir(folder) and not house.calls()


# Ctrl-C as the program loads MODULE: a finder raises KeyboardInterrupt at its import (once),
# then the program starts as the console script or `python -m tfcluster` does.
INTERRUPTED_START = r'''
import sys
MODULE, HOW = sys.argv[1], sys.argv[2]
class Interrupt:
    def find_spec(self, name, path=None, target=None):
        if name == MODULE:
            sys.meta_path.remove(self)
            raise KeyboardInterrupt
sys.meta_path.insert(0, Interrupt())
sys.argv = ["tfcluster"] + sys.argv[3:]
if HOW == "console script":  # what pip's tfcluster script (tfcluster.cli.main:run) does
    from tfcluster.cli.main import run
    sys.exit(run())
import runpy
runpy.run_module("tfcluster", run_name="__main__", alter_sys=True)
'''


@pytest.mark.parametrize("how", ["console script", "python -m"])
@pytest.mark.parametrize("module, argv", [
    ("argparse", ["runs"]),                                # the command line's own modules
    ("tfcluster.cli.parse", ["runs"]),
    ("tfcluster.deploy.wheelhouse", ["wheelhouse", "--dest", "DEST"]),  # a command's parser
    ("tfcluster.spec.catalog", ["launch", "--cmd", "true", "-i", "INVENTORY"]),  # a command
    ("tfcluster.launch.launcher", ["launch", "--cmd", "true", "-i", "INVENTORY"]),  # agents started
])
def test_ctrl_c_while_the_program_loads(tmp_path, how, module, argv):
    from support.cli import local_inventory_text
    from support.procs import stop_leftovers
    inventory = tmp_path / "w.yml"
    inventory.write_text(local_inventory_text(str(tmp_path / "work"), ps=0, workers=2, chief=0))
    argv = [{"INVENTORY": str(inventory), "DEST": str(tmp_path / "wheels")}.get(a, a)
            for a in argv]
    proc = subprocess.run([sys.executable, "-c", INTERRUPTED_START, module, how, "--runs-dir",
                           str(tmp_path / "runs"), *argv], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 130 and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.splitlines()) <= 1, proc.stderr
    assert not os.path.exists(tmp_path / "wheels")
    runs = tmp_path / "runs"  # made before the launch's modules load; no run in it
    assert not runs.exists() or not os.listdir(runs)
    assert not stop_leftovers(str(tmp_path))  # the agents that had started were ended


@pytest.mark.parametrize("text, argv, message", [
    ("worker:\n  hosts:\n    w0: {ansible_host: localhost\n", [],
     "cannot parse inventory %s: YAML parsing failed: "),
    ("worker:\n  hosts:\n    w0: {tfcluster_port: soon}\n", ["--system"],
     "host w0: tfcluster_port must be a whole number, not 'soon'"),
    ("all:\n  vars: {tfcluster_deploy: false}\nworker:\n  hosts:\n    w0: {}\n", ["--system"],
     "inventory %s: every slot has tfcluster_deploy: false, so there is nothing to deploy: set "
     "tfcluster_deploy: true for the machines to provision"),
    ("all:\n  vars: {tfcluster_deploy: false}\nworker:\n  hosts:\n    w0: {}\n",
     ["--playbook", "teardown"], "so there is nothing to tear down"),
    ("ungrouped:\n  hosts:\n    h0: {}\n", [], "inventory %s has no hosts in ps, worker, chief or "
                                                "evaluator groups: nothing to deploy"),
])
def test_deploy_checks_the_inventory_before_ansible_starts(tmp_path, capsys, text, argv, message):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(text)
    code, out, err = run_cli(capsys, "deploy", "-i", str(inventory), *argv)
    assert_usage_error(code, err, message.replace("%s", str(inventory)))
    assert "ansible-playbook" not in out, out  # never started
