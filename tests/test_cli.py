"""The command line: one-line errors, exit codes, nothing started on bad input."""
import os

import pytest

from support import REPO
from support.cli import run_cli, tfcluster


@pytest.mark.parametrize("args, message", [
    (["launch", "no_such_example"], "unknown example 'no_such_example'"),
    (["launch"], "name an example"),
    (["launch", "mnist_replica", "-i", "missing.yml"], "inventory missing.yml does not exist"),
    (["launch", "mnist_replica", "--cmd", "true"], "not both"),
    (["launch", "mnist_replica", "--workers", "lots"], "expected a number or 'all'"),
    (["launch", "mnist_replica", "--timeout", "-3"], "must be more than 0"),
    (["launch", "mnist_replica", "--ps", "5"], "2 ps task(s) but 5 are needed"),
    (["status", "no-such-run"], "no run no-such-run"),
    (["launch", "mnist_replica", "--resume", "nope"], "no run nope"),
    (["stop"], "no running run"),
    (["data", "fetch", "imagenet", "--dest", "/tmp/x"], "unknown dataset 'imagenet'"),
    (["bogus"], "invalid choice"),
])
def test_usage_errors_are_one_line_exit_2(tmp_path, capsys, monkeypatch, args, message):
    monkeypatch.chdir(REPO)  # the default inventory is relative
    code, _, err = run_cli(capsys, "--runs-dir", str(tmp_path / "runs"), *args)
    assert code == 2, err
    assert message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert not (tmp_path / "runs").exists() or not os.listdir(tmp_path / "runs")


def test_missing_group_is_reported(tmp_path, capsys):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("worker:\n  hosts:\n    w[0:1]: {ansible_host: localhost, "
                         "ansible_connection: local}\n")
    code, _, err = run_cli(capsys, "--runs-dir", str(tmp_path), "launch", "mnist_replica",
                           "-i", str(inventory))
    assert code == 2
    assert "has no [ps] group but mnist_replica needs 1 ps task(s)" in err


def test_examples_lists_names_first():
    proc = tfcluster("examples", check=0)
    names = [line.split()[0] for line in proc.stdout.splitlines()]
    assert "mnist_replica" in names
    from tfcluster.spec.catalog import load_catalog
    assert names == list(load_catalog())


def test_runs_empty(tmp_path, capsys):
    code, out, err = run_cli(capsys, "--runs-dir", str(tmp_path / "none"), "runs")
    assert code == 0 and "no runs yet" in out + err


def test_readme_quick_start_commands():
    with open(os.path.join(REPO, "README.md")) as handle:
        readme = handle.read()
    commands = [line.strip() for line in readme.split("## Quick start", 1)[1].splitlines()
                if line.strip().startswith("make ")]
    assert commands[:2] == ["make demo", "make test"]


def test_a_command_parsed_alone_reads_as_with_every_command_built(capsys):
    """main builds only the named command's arguments (cli/parse.named_command): every command's help
    and the top-level help read the same as from the parser with every command built."""
    from tfcluster.cli.arguments import build_parser
    from tfcluster.cli.commands import COMMANDS
    from tfcluster.cli.parse import named_command

    def named(argv):
        return named_command(argv, COMMANDS)
    assert named(["--runs-dir", "launch", "status"]) == "status"
    assert named(["--runs", "stop", "logs"]) == "logs"  # an abbreviated option
    assert named(["--runs-dir=stop", "launch"]) == "launch"
    assert named(["--help"]) is None and named(["nope"]) is None
    for argv in [["--help"]] + [[name, "--help"] for name in COMMANDS] + [["data", "fetch",
                                                                               "--help"]]:
        helps = []
        for only in (None, named(argv)):
            with pytest.raises(SystemExit):
                build_parser(only).parse_args(argv)
            helps.append(capsys.readouterr().out)
        assert helps[0] == helps[1] and helps[0], argv


def test_fashion_mnists_smoke_launch_is_mnist_replicas():
    """The labs' every-example run launches one of two examples whose --smoke launches are the
    same (tests/support/example_smoke.smoke_twins): their every task's command is."""
    from support.example_smoke import smoke_twins
    from tfcluster.spec.catalog import load_catalog, task_command
    from tfcluster.hosts.inventory import load_slots
    from tfcluster.spec.cluster import build_cluster
    catalog = load_catalog()
    assert smoke_twins(catalog) == {"fashion_mnist": "mnist_replica"}
    twin, original = catalog["fashion_mnist"], catalog["mnist_replica"]
    cluster = build_cluster(load_slots(os.path.join(REPO, "inventory", "local.yml")), twin.topology)
    for task in cluster.tasks:
        assert (task_command(twin, cluster, task, "/r", "/r/c", smoke=True)
                == task_command(original, cluster, task, "/r", "/r/c", smoke=True))
        assert (task_command(twin, cluster, task, "/r", "/r/c")
                != task_command(original, cluster, task, "/r", "/r/c"))
