"""An inventory's SSH files (key, known_hosts) are read from the inventory's own folder, by the
launcher and, through a second inventory source, by `tfcluster deploy`'s ansible-playbook; and
the agent's stream over SSH is read off the channel in lines. In-process, no host needed."""
import json
import os
import subprocess

from tfcluster.cli import main as cli
from tfcluster.cli.arguments import build_parser
from tfcluster.deploy import playbook as deploy
from tfcluster.hosts import sshfiles
from tfcluster.hosts.links import channel_lines
from tfcluster.hosts.inventory import read_slots

INVENTORY = """all:
  vars:
    ansible_ssh_common_args: "-o UserKnownHostsFile=keys/known_hosts -o ConnectTimeout=5"
  children:
    ps:
      hosts:
        ps0: {ansible_host: 10.0.0.11}
    worker:
      hosts:
        worker0: {ansible_host: 10.0.0.12, ansible_ssh_private_key_file: /abs/id}
"""


def cluster(tmp_path):
    """mycluster/: an inventory whose group_vars name a key beside it, and a work folder."""
    folder = tmp_path / "mycluster"
    (folder / "keys").mkdir(parents=True)
    (folder / "group_vars").mkdir()
    (folder / "group_vars" / "all.yml").write_text("ansible_ssh_private_key_file: keys/id\n")
    for name in ("id", "known_hosts"):
        (folder / "keys" / name).write_text(name)
    (folder / "hosts.yml").write_text(INVENTORY)
    (tmp_path / "elsewhere").mkdir()
    return folder


def test_resolve_reads_relative_paths_from_the_inventory_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "inv").mkdir()
    (tmp_path / "inv" / "beside").write_text("")
    (tmp_path / "old").write_text("")
    folder = str(tmp_path / "inv")
    assert sshfiles.resolve("beside", folder) == str(tmp_path / "inv" / "beside")
    assert sshfiles.resolve("/abs/key", folder) == "/abs/key"
    assert sshfiles.resolve("~/key", folder) == os.path.expanduser("~/key")
    assert sshfiles.resolve(None, folder) is None
    # Written for the folder it was run from, before this rule: still found there.
    assert sshfiles.resolve("old", folder) == str(tmp_path / "old")
    # Found nowhere: named beside the inventory, which the error then shows.
    assert sshfiles.resolve("missing", folder) == str(tmp_path / "inv" / "missing")
    assert sshfiles.inventory_folder(folder) == folder
    assert sshfiles.inventory_folder(os.path.join(folder, "hosts.yml")) == folder


def test_launcher_reads_the_inventory_folders_files_from_anywhere(tmp_path, monkeypatch):
    folder = cluster(tmp_path)
    monkeypatch.chdir(tmp_path / "elsewhere")
    slots = {s.name: s.machine for s in read_slots(str(folder / "hosts.yml"))}
    assert slots["ps0"].key_file == str(folder / "keys" / "id")
    assert slots["worker0"].key_file == "/abs/id"
    assert {m.known_hosts for m in slots.values()} == {str(folder / "keys" / "known_hosts")}


def test_deploy_gives_ansible_the_absolute_paths(tmp_path, monkeypatch, capsys):
    folder = cluster(tmp_path)
    monkeypatch.chdir(tmp_path / "elsewhere")
    seen = {}
    real_popen = subprocess.Popen

    class Playbook:
        def __init__(self, cmd, env):
            overlay = cmd[cmd.index("-i", cmd.index("-i") + 1) + 1]
            seen["cmd"] = cmd
            seen["overlay"] = overlay
            seen["host_vars"] = {name[:-4]: json.load(open(os.path.join(overlay, "host_vars", name)))
                                 for name in os.listdir(os.path.join(overlay, "host_vars"))}
            # Ansible itself, with the overlay as the second source, sees the absolute paths.
            with real_popen([cmd[0], "-m", "ansible", "inventory", "-i", cmd[6], "-i", overlay,
                             "--host", "ps0"], stdout=subprocess.PIPE, text=True) as ansible:
                seen["ansible"] = json.loads(ansible.communicate(timeout=120)[0])

        def wait(self):
            return 0

    monkeypatch.setattr(subprocess, "Popen", Playbook)
    assert cli.main(["deploy", "-i", "../mycluster/hosts.yml", "--check"]) == 0
    known = "-o UserKnownHostsFile=%s -o ConnectTimeout=5" % (folder / "keys" / "known_hosts")
    assert seen["host_vars"] == {
        "ps0": {"ansible_ssh_private_key_file": str(folder / "keys" / "id"),
                "ansible_ssh_common_args": known},
        "worker0": {"ansible_ssh_common_args": known}}
    assert seen["ansible"]["ansible_ssh_private_key_file"] == str(folder / "keys" / "id")
    assert not os.path.exists(seen["overlay"]), "the overlay outlived the deploy"
    # The line shown is the user's: the overlay is an implementation detail.
    assert "-i ../mycluster/hosts.yml --check\n" in capsys.readouterr().out
    assert seen["cmd"][5:7] == ["-i", "../mycluster/hosts.yml"]


def test_no_overlay_when_every_path_is_absolute(tmp_path):
    (tmp_path / "hosts.yml").write_text(INVENTORY.replace("keys/known_hosts", "/abs/kh"))
    with sshfiles.overlay(str(tmp_path / "hosts.yml")) as paths:
        assert paths is None
    args = build_parser().parse_args(["deploy", "-i", "h.yml"])
    args.trainer_args = []
    assert "-i" not in deploy.playbook_command(args, None, "/repo")[7:]


def test_channel_lines_splits_on_newlines_across_reads():
    chunks = iter([b'{"a": 1}\n{"b"', b': 2}\n', b"x" * 100000, b"y\nlast", b""])
    assert list(channel_lines(lambda size: next(chunks))) == [
        b'{"a": 1}\n', b'{"b": 2}\n', b"x" * 100000 + b"y\n", b"last"]
