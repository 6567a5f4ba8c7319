"""Bad input: a one-line error naming the problem and the fix, exit 2, nothing started.

The CLI runs in-process (tfcluster.cli.main.main) so these stay fast."""
import json
import os
import subprocess

import pytest

from support import REPO
from support.cli import assert_usage_error, run_cli as run
from tfcluster.runs import store as runs
from tfcluster.spec.catalog import check_templates, custom_example, load_catalog, task_command
from tfcluster.errors import UsageError
from tfcluster.hosts.inventory import Machine, Slot, load_slots
from tfcluster.spec.cluster import build_cluster


def inventory(tmp_path, host_vars):
    path = tmp_path / "hosts.yml"
    path.write_text("worker:\n  hosts:\n    w0: {ansible_connection: local, ansible_host: localhost, "
                    "%s}\nps:\n  hosts:\n    p0: {ansible_host: localhost}\n" % host_vars)
    return str(path)


@pytest.mark.parametrize("host_vars, message", [
    ("tfcluster_connect_timeout: abc",
     "host w0: tfcluster_connect_timeout must be a number of seconds above 0, not 'abc'"),
    ("tfcluster_connect_timeout: .nan", "tfcluster_connect_timeout must be a number of seconds"),
    ("tfcluster_port: true", "host w0: tfcluster_port must be a whole number, not 'true'"),
    ("tfcluster_gpus: [-1]", "host w0: tfcluster_gpus lists GPU -1, but ids start at 0"),
    ("tfcluster_stall_after: 0.5", "host w0: tfcluster_stall_after must be 0 (off) or at least "
                                   "1 s (how often the watch looks), not 0.5"),
    ("tfcluster_gpus: [0, 0]", "host w0: tfcluster_gpus lists a GPU twice"),
    ("tfcluster_data_dir: data", "host w0: tfcluster_data_dir must be an absolute path, not 'data'"),
    ('tfcluster_workdir: "/srv/a\\nb"', "host w0: tfcluster_workdir '/srv/a\\nb' contains a control"),
    ("tfcluster_root: '/srv/a:b'", "tfcluster_root '/srv/a:b' contains ':', which separates PYTHONPATH"),
    ("tfcluster_address: 'x;reboot'", "host w0: tfcluster_address 'x;reboot' is not a host name"),
    ("ansible_host: '$(reboot)'", "host w0: ansible_host '$(reboot)' is not a host name"),
])
def test_inventory_values(tmp_path, capsys, host_vars, message):
    path = inventory(tmp_path, host_vars)
    assert_usage_error(*run(capsys, "spec", "-i", path)[::2], message)
    runs_dir = tmp_path / "runs"
    code, _, err = run(capsys, "--runs-dir", str(runs_dir), "launch", "mnist_replica", "-i", path)
    assert_usage_error(code, err, message)
    assert not os.listdir(runs_dir)  # nothing started, no run recorded


def test_paths_with_spaces_are_accepted(tmp_path, capsys):
    path = inventory(tmp_path, "tfcluster_data_dir: '/srv/my data', tfcluster_root: '/opt/tf cluster'")
    code, out, err = run(capsys, "spec", "-i", path, "--format", "flags")
    assert code == 0, err
    slot = [s for s in load_slots(path) if s.name == "w0"][0]
    assert slot.machine.data_dir == "/srv/my data"
    assert slot.machine.python == "/opt/tf cluster/venv/bin/python"


@pytest.mark.parametrize("text, message", [
    ("worker|a:1;a:1", "a:1 is in the cluster spec twice (worker and worker)"),
    ("worker|a:1,ps|a:01", "a:1 is in the cluster spec twice (worker and ps)"),
    ("worker|$(reboot):1", "task '$(reboot):1' of job 'worker': '$(reboot)' is not a host name"),
    ("worker|a b:1", "'a b' is not a host name"),
    ("worker|a;b:1", "task 'a' of job 'worker' is not host:port"),
])
def test_cluster_spec_hosts(capsys, text, message):
    assert_usage_error(*run(capsys, "spec", "--cluster-spec", text, "--format", "json")[::2],
                       message)


@pytest.mark.parametrize("argv, message", [
    (["launch", "mnist_replica", "--timeout", "nan"], "argument --timeout: expected a finite number"),
    (["launch", "mnist_replica", "--lease", "inf"], "argument --lease: expected a finite number"),
    (["launch", "mnist_replica", "--intra-op-threads", "-3"],
     "argument --intra-op-threads: must be 1 or more, not -3"),
    (["launch", "mnist_replica", "--inter-op-threads", "two"],
     "argument --inter-op-threads: expected a whole number"),
    (["launch", "mnist_replica", "--nice", "20"],
     "argument --nice: must be from 0 (the default) to 19, not 20"),
    (["launch", "mnist_replica", "--nice", "-5"],
     "argument --nice: must be from 0 (the default) to 19, not -5"),
    (["launch", "mnist_replica", "--run-id", "abc\n"], "argument --run-id: run id 'abc\\n' may only"),
    (["launch", "mnist_replica", "--run-id", "../x"], "argument --run-id: run id '../x' may only"),
    (["status", "abc\n"], "run id 'abc\\n' may only use"),
    # An empty id (a script's unset variable) is no "newest run": leaving it out is.
    (["stop", ""], "argument run: the run id is empty: give one, or leave the argument out"),
    (["status", ""], "argument run: the run id is empty"),
    (["logs", ""], "argument run: the run id is empty"),
    (["stacks", ""], "argument run: the run id is empty"),
    (["plot", "a", ""], "argument RUN: the run id is empty"),
    (["tensorboard", ""], "argument RUN: the run id is empty"),
    (["launch", "--cmd", "true", "--resume", ""], "argument --resume: the run id is empty"),
    (["launch", "--cmd", "true", "--run-id", ""], "argument --run-id: the run id is empty"),
    # A long one is shortened in the message.
    (["logs", "x" * 5000], "run id '%s... (5000 characters)' may only use" % ("x" * 40)),
])
def test_argument_types(tmp_path, capsys, argv, message):
    runs_dir = tmp_path / "runs"
    code, _, err = run(capsys, "--runs-dir", str(runs_dir), *argv)
    assert_usage_error(code, err, message)
    assert len(err) < 400, err
    assert not runs_dir.exists()


def test_data_fetch_dest(tmp_path, capsys):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert_usage_error(*run(capsys, "data", "fetch", "mnist", "--dest", str(a_file))[::2],
                       "--dest %s cannot hold files (it is a file): pass a folder" % a_file)
    assert_usage_error(*run(capsys, "data", "fetch", "mnist", "--dest", str(a_file / "sub"))[::2],
                       "cannot hold files (not a directory)")
    # /proc takes no new folders, even for root.
    assert_usage_error(*run(capsys, "data", "fetch", "mnist", "--dest", "/proc/tfcluster-x")[::2],
                       "--dest /proc/tfcluster-x cannot hold files")


def test_runs_dir_not_writable_fails_before_anything(tmp_path, capsys):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    for runs_dir in (str(a_file), "/proc/tfcluster-runs"):
        code, out, err = run(capsys, "--runs-dir", runs_dir, "launch", "mnist_replica")
        assert_usage_error(code, err, "--runs-dir %s cannot hold files" % runs_dir)
        assert "preflight" not in out + err


def write_record(runs_dir, name, data):
    os.makedirs(runs_dir / name)
    (runs_dir / name / "run.json").write_text(data if isinstance(data, str) else json.dumps(data))


GOOD_RUN = {"id": "good", "state": "succeeded", "created": "2026-01-02", "example": "mnist_replica",
            "tasks": {}, "machines": []}


def test_bad_run_folders_are_skipped_with_a_warning(tmp_path, capsys):
    runs_dir = tmp_path / "runs"
    write_record(runs_dir, "good", GOOD_RUN)
    write_record(runs_dir, "corrupt", '{"id": "corrupt", "sta')
    write_record(runs_dir, "a list", "[]")
    write_record(runs_dir, "wrong-shape", {"id": "wrong-shape", "created": "2026-01-03",
                                           "tasks": {"worker:0": {"job": "worker"}}})
    records = runs.all_runs(str(runs_dir))
    assert [r.id for r in records] == ["good"]
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 3 and "Traceback" not in err
    assert "warning: skipping %s: run corrupt: cannot read" % (runs_dir / "corrupt") in err
    assert "'a list' is not a run id: rename or remove that folder" in err
    assert "wrong-shape: run wrong-shape: " in err and "task worker:0 incomplete" in err
    assert runs.latest(str(runs_dir)).id == "good"
    with pytest.raises(UsageError, match="no running run"):
        runs.latest(str(runs_dir), active_only=True)
    with pytest.raises(UsageError, match="cannot read .*: repair or remove that folder"):
        runs.load(str(runs_dir), "corrupt")


def test_bad_run_folders_do_not_break_the_commands(tmp_path, capsys):
    runs_dir = tmp_path / "runs"
    write_record(runs_dir, "good", GOOD_RUN)
    write_record(runs_dir, "corrupt", "{")
    write_record(runs_dir, "with space", "{}")
    for argv, code_wanted in ((["runs"], 0), (["status"], 0), (["logs"], 0), (["stop"], 2)):
        code, out, err = run(capsys, "--runs-dir", str(runs_dir), *argv)
        assert code == code_wanted, (argv, out, err)
        assert "Traceback" not in err and err.count("warning: skipping") == 2, err
        if argv == ["stop"]:  # the one finished run is not stopped again; nothing crashed
            assert "no running run" in err
    code, out, err = run(capsys, "--runs-dir", str(runs_dir), "runs")
    assert "good" in out and "corrupt" not in out


def test_run_ids_are_unique_and_folders_exclusive(tmp_path):
    ids = [runs.new_run_id("mnist_replica") for _ in range(200)]
    # Made within a second or two, they differ by their 24 random bits alone: two of 200 share
    # them once in about 800 tries (measured: 3 in 3000); two such pairs almost never.
    assert len(set(ids)) >= 199 and all(runs.RUN_ID.fullmatch(i) for i in ids), ids
    first = runs.create(str(tmp_path), "same")
    second = runs.create(str(tmp_path), "same")  # both checked before either wrote
    runs.save(first)
    with pytest.raises(UsageError, match="run same already exists"):
        runs.save(second)
    assert json.loads((tmp_path / "same" / "run.json").read_text())["id"] == "same"
    loaded = runs.load(str(tmp_path), "same")
    loaded.become("running")
    runs.save(loaded)  # the owner of a folder keeps saving into it
    with pytest.raises(UsageError, match="already exists"):
        runs.create(str(tmp_path), "same")


ARGV_PRINTER = "#!/bin/sh\nprintf '%s\\n' \"$@\"\n"  # one argument a line


def test_template_values_reach_the_shell_quoted(tmp_path):
    """Every example's command through /bin/sh, with spaces and shell characters in every path."""
    odd = tmp_path / "my dir $HOME;x"
    python = odd / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(ARGV_PRINTER)
    python.chmod(0o755)
    machine = Machine(address="localhost", connection="local", python=str(python), root=str(odd),
                      data_dir=str(odd / "data"), workdir=str(odd / "work"))
    plain = Machine(address="localhost", connection="local", python=str(python), root="/r",
                    data_dir="/r/data", workdir="/r/work")
    for name, example in load_catalog().items():
        for chosen, run_dir in ((machine, str(odd / "work" / "run")), (plain, "/r/work/run")):
            slots = [Slot("w%d" % i, "worker", chosen) for i in range(2)] + \
                    [Slot("p0", "ps", chosen), Slot("c0", "chief", chosen)]
            cluster = build_cluster(slots)
            task = cluster.find("worker:0")
            command = task_command(example, cluster, task, run_dir, run_dir + "/ck")
            argv = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True,
                                  check=True).stdout.splitlines()
            # The paths arrive whole; with plain paths the command is what the template says.
            data = [a for a in argv if a.startswith("--data_dir=")]
            assert data and data[0].startswith("--data_dir=" + chosen.data_dir + "/"), (name, argv)
            assert any(a.endswith("=" + run_dir + "/ck") for a in argv), (name, argv)
            if chosen is plain:  # plain paths stay as the template wrote them, unquoted
                assert "=/r/data/" in command and "=/r/work/run/ck" in command, (name, command)


def test_template_errors_are_usage_errors_before_preflight():
    cluster = build_cluster(load_slots(os.path.join(REPO, "inventory", "sample")))
    for text, message in (("python {{ nope }}", "cannot render --cmd: 'nope' is undefined"),
                          ("python {{ x", "cannot render --cmd: unexpected end of template")):
        with pytest.raises(UsageError, match=message):
            check_templates(custom_example(text, "chief"), cluster)
    for example in load_catalog().values():
        check_templates(example, cluster)


def test_code_deployed_before_the_agent_had_a_main_asks_for_a_deploy(tmp_path, monkeypatch):
    """A host whose tfcluster code predates `python -B ROOT/tfcluster_agent serve`. Its error
    lines are read after its stdout has ended, as on a loaded machine: they still name it."""
    import queue
    import shutil
    import sys
    import time
    from tfcluster.hosts.links import AgentLink, HostError
    drain = AgentLink._drain_stderr

    def late_drain(link, stream):
        time.sleep(0.5)
        drain(link, stream)
    monkeypatch.setattr(AgentLink, "_drain_stderr", late_drain)
    (tmp_path / "tfcluster_agent").mkdir()
    shutil.copy(os.path.join(REPO, "tfcluster_agent", "agent.py"), tmp_path / "tfcluster_agent")
    machine = Machine(address="localhost", connection="local", python=sys.executable,
                      root=str(tmp_path))
    with pytest.raises(HostError, match="older than this controller's: run ansible-playbook "
                                        "playbooks/deploy.yml"):
        AgentLink(machine, queue.Queue()).open(timeout=30)


def test_a_launch_refused_after_its_local_agents_started_ends_them(tmp_path, capsys,
                                                                   monkeypatch):
    """The local agents start before the launcher's modules are imported (cli/commands.planned_launch):
    a launch refused after that (its run id taken) ends them before it returns."""
    from support.cli import local_inventory_text
    from tfcluster.hosts.fanout import Hosts
    inventory = tmp_path / "local.yml"
    inventory.write_text(local_inventory_text(str(tmp_path / "work"), workers=2, ps=0))
    (tmp_path / "runs" / "taken").mkdir(parents=True)
    started = []
    spawn_local = Hosts.spawn_local

    def spawned(hosts):
        spawn_local(hosts)
        started.extend(link._proc for link in hosts.links.values())
    monkeypatch.setattr(Hosts, "spawn_local", spawned)
    code, out, err = run(capsys, "--runs-dir", str(tmp_path / "runs"), "launch", "--cmd", "true",
                         "-i", str(inventory), "--ps", "0", "--run-id", "taken")
    assert code == 2 and "run taken already exists" in err, (out, err)
    assert started and all(proc is not None and proc.poll() is not None for proc in started)
