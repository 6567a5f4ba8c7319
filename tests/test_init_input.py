"""`tfcluster init` and bad input: one line, exit 2, no traceback, no file lost or left empty,
and for every accepted input an inventory that reads back as given (a property test over random
hosts, users and paths)."""
import os
import subprocess
import sys

import pytest
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from support import REPO
from support.files import read_only
from tfcluster.cli import main as cli
from tfcluster.cli.init import HOST, USER
from tfcluster.hosts.inventory import read_slots
from tfcluster_agent.clusterspec import normal_host


def init_proc(*argv, env=None, stdin=None):
    return subprocess.run([sys.executable, "-m", "tfcluster", "init", *map(str, argv)],
                          cwd=REPO, capture_output=True, text=True, timeout=60, input=stdin,
                          env=dict(os.environ, **(env or {})))


def assert_one_line(proc, code, text):
    error = proc.stderr.strip()
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert len(error.splitlines()) == 1 and "Traceback" not in error, error
    assert text in error, error


@pytest.mark.parametrize("argv, text", [
    (["{tmp}/d", "[::1]:22", "--user", "deploy: x"], "user 'deploy: x' is not a login name"),
    (["{tmp}/d", "h1", "--user", ""], "user '' is not a login name"),
    (["{tmp}/d", "h1", "--user=-oProxyCommand=x"], "user '-oProxyCommand=x' is not a login name"),
    (["{tmp}/d", "-oProxyCommand=x@h1"], "unrecognized arguments: -oProxyCommand=x@h1"),
    (["{tmp}/d", "u;rm@h1"], "user 'u;rm' is not a login name"),
    (["{tmp}/d", "h#2"], "host 'h#2' is not a host name or IP address"),
    (["{tmp}/afile", "h1"], "is a file, not a folder"),
    (["/proc/nope", "h1"], "cannot make the folder /proc/nope"),
])
def test_bad_values_are_one_line_and_leave_no_folder(tmp_path, argv, text):
    (tmp_path / "afile").write_text("mine\n")
    proc = init_proc(*[a.replace("{tmp}", str(tmp_path)) for a in argv])
    assert_one_line(proc, 2, text)
    assert sorted(os.listdir(tmp_path)) == ["afile"]
    assert (tmp_path / "afile").read_text() == "mine\n"


def test_a_failed_key_leaves_no_empty_folder(tmp_path):
    proc = init_proc(tmp_path / "new", "h1", "--key", tmp_path / "no-such-key")
    assert_one_line(proc, 2, "no file %s" % (tmp_path / "no-such-key"))
    assert not (tmp_path / "new").exists()


def test_a_failed_forced_write_keeps_the_old_inventory(tmp_path):
    """A host name the locale cannot encode fails the write: the old inventory stays whole."""
    folder = tmp_path / "c"
    assert init_proc(folder, "h1", "h2").returncode == 0
    before = (folder / "hosts.yml").read_bytes()
    proc = init_proc(folder, "--force", "h\u00e9te", "h2",
                     env={"LC_ALL": "C", "PYTHONIOENCODING": "ascii", "PYTHONUTF8": "0"})
    assert proc.returncode in (0, 2), proc.stderr
    after = (folder / "hosts.yml").read_bytes()
    assert after == before or read_slots(str(folder / "hosts.yml"))
    assert sorted(os.listdir(folder)) == ["hosts.yml"]  # nothing written aside is left


@pytest.mark.parametrize("extra", [[], ["--force"], ["--sample"]])
def test_a_read_only_folder_is_one_line(tmp_path, extra):
    folder = tmp_path / "ro"
    folder.mkdir()
    (folder / "hosts.yml").write_text("kept\n") if extra == ["--force"] else None
    before = sorted(os.listdir(folder))
    proc = read_only(folder, [sys.executable, "-m", "tfcluster", "init", str(folder), "h1"]
                     + extra)
    assert_one_line(proc, 2, "cannot write into %s (Read-only file system" % folder
                    if os.geteuid() == 0 else "cannot write into %s" % folder)
    assert sorted(os.listdir(folder)) == before
    if extra == ["--force"]:
        assert (folder / "hosts.yml").read_text() == "kept\n"


def test_ctrl_d_at_a_question_writes_nothing(tmp_path, monkeypatch, capsys):
    def eof(*_):
        raise EOFError
    monkeypatch.setattr("builtins.input", eof)
    monkeypatch.setattr(sys, "stdin", type("Tty", (), {"isatty": lambda self: True})())
    assert cli.main(["init", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "tfcluster: error: no answer: nothing written"
    assert not (tmp_path / "c").exists()


def test_hosts_may_follow_the_options(tmp_path, capsys):
    assert cli.main(["init", str(tmp_path / "c"), "--user", "admin", "h1", "h2"]) == 0
    slots = read_slots(str(tmp_path / "c" / "hosts.yml"))
    assert sorted((s.machine.address, s.machine.user) for s in slots) == [
        ("h1", "admin"), ("h2", "admin")]


def test_paths_with_commas_and_a_user_with_a_colon_are_written_as_yaml(tmp_path):
    key = tmp_path / "keys" / "id, v2"
    key.parent.mkdir()
    key.write_text("key")
    assert cli.main(["init", str(tmp_path / "c"), "[::1]:22", "h2", "--key", str(key)]) == 0
    slots = read_slots(str(tmp_path / "c" / "hosts.yml"))
    assert {s.machine.key_file for s in slots} == {str(key)}
    assert sorted(s.machine.address for s in slots) == ["::1", "h2"]


# ------------------------------------------------------------ the property

# A word starting with '-' is an option to argparse, never a host: refused as unrecognized.
hosts = st.from_regex(HOST, fullmatch=True).filter(lambda h: len(h) < 60 and h[:1] != "-")
users = st.one_of(st.none(), st.text(max_size=12))
names = st.text(st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="/\0"),
                min_size=1, max_size=12).filter(lambda n: n not in (".", ".."))


@settings(max_examples=25, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(host_list=st.lists(hosts, min_size=1, max_size=3), user=users, key_name=names)
def test_every_accepted_input_reads_back_and_every_refused_one_is_one_line(
        tmp_path_factory, host_list, user, key_name):
    folder = tmp_path_factory.mktemp("init")
    key = folder.parent / (folder.name + "-keys") / key_name
    key.parent.mkdir(exist_ok=True)
    key.write_text("key")
    argv = ["init", str(folder / "c"), *host_list, "--key", str(key), "--layout", "mwms"]
    if user is not None:
        argv += ["--user=" + user]
    try:
        code = cli.main(argv)
    except SystemExit as exit:  # argparse's own refusal
        code = exit.code
    valid_user = user is None or bool(USER.match(user))
    parsed = [HOST.match(h) for h in host_list]
    valid_hosts = all(normal_host(m.group("address").strip("[]")) for m in parsed)
    valid_ports = all(not m.group("port") or 1 <= int(m.group("port")) <= 65535 for m in parsed)
    host_users_ok = all(m.group("user") is None or USER.match(m.group("user")) for m in parsed)
    if not (valid_user and valid_ports and host_users_ok and valid_hosts):
        assert code == 2
        assert not (folder / "c").exists()
        return
    assert code == 0
    text = (folder / "c" / "hosts.yml").read_text()
    yaml.safe_load(text)  # parses
    workers = yaml.safe_load(text)["all"]["children"]["worker"]["hosts"]
    assert [(w["ansible_host"], w["ansible_port"], w["ansible_ssh_private_key_file"])
            for w in workers.values()] == [
        (m.group("address").strip("[]"), int(m.group("port") or 22), str(key)) for m in parsed]
    assert all(w["ansible_user"] == (m.group("user") or user or w["ansible_user"])
               for w, m in zip(workers.values(), parsed))


def test_a_sample_of_written_inventories_reads_back_with_the_launchers_reader(tmp_path):
    """The property above reads the YAML; tfcluster's own reader (ansible-core) reads these."""
    key = tmp_path / "my keys" / "id, v2: x"
    key.parent.mkdir()
    key.write_text("key")
    assert cli.main(["init", str(tmp_path / "c"), "u.s-er@[fe80::1]:2200", "h_2", "h3",
                     "--key", str(key), "--user", "deploy.user", "--layout", "mwms"]) == 0
    slots = read_slots(str(tmp_path / "c" / "hosts.yml"))
    assert [(s.machine.address, s.machine.user, s.machine.ssh_port, s.machine.key_file)
            for s in slots] == [("fe80::1", "u.s-er", 2200, str(key)),
                                ("h_2", "deploy.user", 22, str(key)),
                                ("h3", "deploy.user", 22, str(key))]
