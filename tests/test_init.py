"""`tfcluster init`: the starting inventory it writes, read back by the launcher's own reader
and by Ansible; its refusals; and the sample it copies. In-process, no host needed."""
import io
import os
import subprocess
import sys

import pytest

from support.ansible_run import ansible_tool
from support import REPO
from tfcluster.cli import main as cli
from tfcluster.hosts.inventory import read_slots


def init(*argv):
    return cli.main(["init", *map(str, argv)])


def test_hosts_given_ask_nothing_first_is_ps(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("builtins.input", lambda *_: pytest.fail("init asked with hosts given"))
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "id_ed25519").write_text("key")
    (tmp_path / "known_hosts").write_text("hosts")
    monkeypatch.chdir(tmp_path)
    assert init("mycluster", "root@10.0.0.11", "ubuntu@gpu1.example.com:2222", "10.0.0.13",
                "--user", "admin", "--key", "keys/id_ed25519",
                "--known-hosts", "known_hosts") == 0
    out = capsys.readouterr().out
    inventory = tmp_path / "mycluster" / "hosts.yml"
    assert "wrote %s" % inventory in out and "tfcluster deploy -i hosts.yml" in out
    text = inventory.read_text()
    # The header tells the next three commands, in order.
    header = [line for line in text.splitlines() if line.startswith("#   tfcluster ")]
    assert [line.split()[2] for line in header] == ["wheelhouse", "deploy", "launch"]
    # One line per host with what a user changes; files outside the folder by absolute path.
    key, known = tmp_path / "keys" / "id_ed25519", tmp_path / "known_hosts"
    assert ("worker0: {ansible_host: gpu1.example.com, ansible_user: ubuntu, ansible_port: 2222, "
            "ansible_ssh_private_key_file: %s, tfcluster_gpus: ~}" % key) in text
    slots = read_slots(str(inventory))
    assert [(s.name, s.job, s.machine.address, s.machine.user, s.machine.ssh_port) for s in slots] == [
        ("worker0", "worker", "gpu1.example.com", "ubuntu", 2222),
        ("worker1", "worker", "10.0.0.13", "admin", 22),
        ("ps0", "ps", "10.0.0.11", "root", 22)]
    assert {(s.machine.key_file, s.machine.known_hosts) for s in slots} == {(str(key), str(known))}


@pytest.mark.slow
def test_ansible_reads_the_folders_beside_the_inventory(tmp_path):
    """The controller folders deploy reads are beside the inventory, and sudo is used only for
    users other than root (tests/test_dockerhosts.py deploys with such an inventory)."""
    assert init(tmp_path / "mycluster", "root@10.0.0.11", "ubuntu@10.0.0.12") == 0
    inventory = tmp_path / "mycluster" / "hosts.yml"
    folder = tmp_path / "mycluster"
    proc = subprocess.run(
        [ansible_tool("ansible"), "ps0,worker0", "-i", str(inventory), "-m", "debug", "-a",
         "msg={{ inventory_hostname }},{{ tensorflow_wheelhouse_src }},{{ datasets_cache_dir }},"
         "{{ ansible_become }},{{ tensorflow_install_mode }}"],
        capture_output=True, text=True, timeout=120, cwd=str(tmp_path),
        env=dict(os.environ, ANSIBLE_NOCOLOR="1"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for host, become in (("ps0", "False"), ("worker0", "True")):
        assert "%s,%s/wheelhouse,%s/data,%s,offline" % (host, folder, folder, become) in proc.stdout


def test_files_inside_the_folder_are_written_relative(tmp_path):
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "id").write_text("key")
    assert init(tmp_path, "10.0.0.11", "--key", tmp_path / "keys" / "id") == 0
    text = (tmp_path / "hosts.yml").read_text()
    assert "ansible_ssh_private_key_file: keys/id" in text
    # One host alone is the ps and the worker: two slots on one machine.
    slots = read_slots(str(tmp_path / "hosts.yml"))
    assert sorted((s.job, s.machine.address) for s in slots) == [("ps", "10.0.0.11"),
                                                                 ("worker", "10.0.0.11")]
    assert {s.machine.key_file for s in slots} == {str(tmp_path / "keys" / "id")}


def test_without_hosts_it_asks_on_a_terminal(tmp_path, monkeypatch, capsys):
    answers = iter(["ps.example.com w1.example.com w2.example.com", "", "", ""])
    monkeypatch.setattr("builtins.input", lambda *_: next(answers))
    monkeypatch.setattr(sys, "stdin", type("Tty", (io.StringIO,), {"isatty": lambda self: True})())
    assert init(tmp_path) == 0
    slots = read_slots(str(tmp_path / "hosts.yml"))
    assert [s.machine.address for s in slots if s.job == "worker"] == ["w1.example.com",
                                                                       "w2.example.com"]
    assert "UserKnownHostsFile" not in "".join(
        line for line in (tmp_path / "hosts.yml").read_text().splitlines()
        if not line.lstrip().startswith("#"))


@pytest.mark.parametrize("argv, message", [
    (["."], "name the hosts, e.g. tfcluster init . ubuntu@gpu01"),
    ([".", "user@host:99999"], "host 'user@host:99999' is not [USER@]ADDRESS[:PORT]"),
    ([".", "a@b@c"], "host 'a@b@c' is not [USER@]ADDRESS[:PORT]"),
    ([".", "h1", "--key", "/nonexistent/id"], "no file /nonexistent/id: give an existing"),
    (["root@h1", "root@h2"], "the first argument is the folder: tfcluster init DIR HOST ..., "
                             "e.g. tfcluster init . root@h1 root@h2"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, monkeypatch, capsys, argv,
                                                          message):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # no terminal: nothing to ask on
    assert init(*argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert os.listdir(tmp_path) == []


def test_an_existing_inventory_is_kept_unless_forced(tmp_path, capsys):
    (tmp_path / "hosts.yml").write_text("mine\n")
    assert init(tmp_path, "h1", "h2") == 2
    assert "hosts.yml exists: edit it, or pass --force" in capsys.readouterr().err
    assert (tmp_path / "hosts.yml").read_text() == "mine\n"
    assert init(tmp_path, "h1", "h2", "--force") == 0
    assert "ps0: {ansible_host: h1" in (tmp_path / "hosts.yml").read_text()


def test_sample_is_copied_whole(tmp_path):
    assert init(tmp_path / "sample", "--sample") == 0
    sample = os.path.join(REPO, "inventory", "sample")
    for folder, _, names in os.walk(sample):
        for name in names:
            path = os.path.join(folder, name)
            copy = tmp_path / "sample" / os.path.relpath(path, sample)
            assert copy.read_bytes() == open(path, "rb").read(), copy
    assert {s.job for s in read_slots(str(tmp_path / "sample"))} == {"ps", "worker", "chief",
                                                                     "evaluator"}
