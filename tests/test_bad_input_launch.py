"""Bad input around a launch: what a task prints, the trainer's flags, the watch's flags, a home
that cannot hold a cache. Launches of shell commands (--cmd) on two local workers: seconds."""
import os
import pty
import select
import subprocess
import sys
import time

import pytest

from support import REPO
from support.cli import local_inventory_text, run_cli, run_record, tfcluster
from support.files import read_only
from support.procs import stop_leftovers

# A progress bar's character, which latin-1 cannot encode.
BAR = "\u2501"
PRINT_BAR = "printf '\\342\\224\\201 50%%\\n'"


def assert_one_line(code, err, wanted_code, message):
    assert code == wanted_code, err
    assert message in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


@pytest.fixture
def two_workers(tmp_path):
    """(inventory of two local workers, runs dir); no process of the test is left running."""
    inventory = tmp_path / "w.yml"
    inventory.write_text(local_inventory_text(str(tmp_path / "work"), ps=0, workers=2, chief=0))
    yield str(inventory), str(tmp_path / "runs")
    leftovers = stop_leftovers(str(tmp_path))
    assert not leftovers, "processes of the test were still running: %s" % leftovers


def run_files(runs_dir, run_id, launch_output):
    """What a failed check needs to tell where a task's output was lost: the launch's output,
    the run's task entries and each file of its folder."""
    folder = os.path.join(runs_dir, run_id)
    files = {}
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), "rb") as handle:
            files[name] = handle.read()[-300:]
    return "launch:\n%s\ntasks: %s\nfiles: %s" % (
        launch_output, run_record(runs_dir, run_id)["tasks"], files)


def on_terminal(argv, env, timeout=120):
    """ARGV run on a pseudo-terminal (its live view): (exit code, everything it showed)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, cwd=REPO,
                            env=dict(os.environ, TERM="xterm", COLUMNS="120", **env))
    os.close(slave)
    shown = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if select.select([master], [], [], 0.5)[0]:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: the program ended and closed the terminal
                    break
                if not data:
                    break
                shown += data
        return proc.wait(timeout=max(1, deadline - time.monotonic())), shown.decode("latin-1")
    finally:
        proc.kill()
        proc.wait()
        os.close(master)


def test_a_character_the_terminal_cannot_encode_is_replaced_not_fatal(two_workers):
    inventory, runs_dir = two_workers
    latin1 = {"PYTHONIOENCODING": "latin-1"}
    proc = tfcluster("launch", "-i", inventory, "--plain", "--cmd", PRINT_BAR, "--run-id", "plain",
                     runs_dir=runs_dir, env=latin1)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    assert "] ? 50%" in proc.stdout
    assert run_record(runs_dir, "plain")["state"] == "succeeded"
    with open(os.path.join(runs_dir, "plain", "worker-0.log"), "rb") as handle:
        assert handle.read() == (BAR + " 50%\n").encode()  # the log keeps the bytes
    logs = tfcluster("logs", "plain", runs_dir=runs_dir, env=latin1)
    assert logs.returncode == 0 and not logs.stderr, logs.stderr
    assert logs.stdout.count("] ? 50%") == 2, run_files(runs_dir, "plain", proc.stdout)

    # The live view, on a terminal that cannot show it either.
    code, shown = on_terminal([sys.executable, "-m", "tfcluster", "--runs-dir", runs_dir,
                               "launch", "-i", inventory, "--cmd", PRINT_BAR + "; sleep 1",
                               "--run-id", "live"], latin1)
    assert code == 0 and "Traceback" not in shown, shown
    assert run_record(runs_dir, "live")["state"] == "succeeded"


def test_a_wrong_trainer_flag_is_refused_before_anything_starts(tmp_path):
    """Every built-in example's trainer, in a fresh controller process: one line naming the flag
    and the closest valid one, exit 2, no run folder, and no TensorFlow imported to find out."""
    from tfcluster.spec.catalog import load_catalog
    program = ("import sys; from tfcluster.cli import main as cli\n"
               "for name in sys.argv[2:]:\n"
               "    code = cli.main(['--runs-dir', sys.argv[1], 'launch', name, '--smoke', '--',"
               " '--no_such_flag'])\n"
               "    print(name, code, flush=True)\n"
               "assert 'tensorflow' not in sys.modules\n")
    names = sorted(load_catalog())
    runs_dir = tmp_path / "runs"
    proc = subprocess.run([sys.executable, "-c", program, str(runs_dir)] + names, cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [word for name in names for word in (name, "2")], proc.stdout
    lines = proc.stderr.splitlines()
    assert len(lines) == len(names) and "Traceback" not in proc.stderr, proc.stderr
    for name, line in zip(names, lines):
        assert line.startswith("tfcluster: error: %s's trainer has no flag --no_such_flag: the "
                               "closest is --" % name), line
    assert not runs_dir.exists()


@pytest.mark.parametrize("args, message", [
    (["--no_such_flag"], "mnist_replica's trainer has no flag --no_such_flag: the closest is "
                         "--num_gpus (see `python -m trainers.mnist_replica --help`)"),
    (["--train_steps=ten"], "mnist_replica's trainer: argument --train_steps: invalid int "
                            "value: 'ten'"),
    (["steps"], "mnist_replica's trainer takes flags only, not 'steps'"),
])
def test_trainer_flags_and_values(tmp_path, capsys, args, message):
    code, out, err = run_cli(capsys, "--runs-dir", str(tmp_path / "runs"), "launch",
                             "mnist_replica", "-i", "/nonexistent.yml", "--", *args)
    assert_one_line(code, err, 2, message)  # before the inventory is even read
    assert not (tmp_path / "runs").exists()


def test_the_catalogs_own_trainer_flags_pass_the_check():
    """The flags each example gives its trainer (args, smoke) are the trainer's: the check
    refuses none of them."""
    import re
    import shlex
    from tfcluster.spec.catalog import check_trainer_args, load_catalog
    for example in load_catalog().values():
        for template in (example.args, example.smoke):
            check_trainer_args(example, shlex.split(re.sub(r"\{\{[^}]*\}\}", "x", template)))


def test_an_empty_run_id_stops_nothing(two_workers):
    """`tfcluster stop "$UNSET"`: refused; the running run goes on until named or left out."""
    inventory, runs_dir = two_workers
    tfcluster("launch", "-i", inventory, "--cmd", "sleep 60", "--detach", "--run-id", "busy",
              runs_dir=runs_dir, check=0)
    stop = tfcluster("stop", "", runs_dir=runs_dir)
    assert_one_line(stop.returncode, stop.stderr, 2, "the run id is empty")
    assert run_record(runs_dir, "busy")["state"] == "running"
    status = tfcluster("status", runs_dir=runs_dir, check=0)
    assert status.stdout.count(" running ") == 2, status.stdout
    tfcluster("stop", runs_dir=runs_dir, check=0)  # left out: the newest running run
    assert run_record(runs_dir, "busy")["state"] == "stopped"


@pytest.mark.parametrize("argv, message", [
    (["--stall-after", "0.001"], "argument --stall-after: must be 0 (off) or at least 1 s (how "
                                 "often the watch looks), not '0.001'"),
    (["--stall-after", "5", "--detach"], "--stall-after and --on-stall need the launcher to "
                                         "watch the run: drop them, or drop --detach"),
    (["--on-stall", "report", "--detach"], "--stall-after and --on-stall need the launcher"),
])
def test_stall_flags_the_watch_cannot_honour(two_workers, capsys, argv, message):
    inventory, runs_dir = two_workers
    code, out, err = run_cli(capsys, "--runs-dir", runs_dir, "launch", "-i", inventory, "--cmd",
                             "sleep 4", *argv)
    assert_one_line(code, err, 2, message)
    assert not os.path.exists(runs_dir) and "preflight" not in out


class EndingWhileStacksAreTaken:
    """worker-1 stalls at once (support.fakehosts.StallingLink); every worker then ends with exit 0
    while the stacks are taken."""

    def request(self, msg, timeout, what="", collect=None):
        from tfcluster_agent import protocol as P
        from tfcluster_agent.stall import TakeStacks
        if isinstance(msg, TakeStacks):
            for name in sorted(n for n in self.alive if n.startswith("worker")):
                self.alive.discard(name)
                self.emit(P.Exited(name=name, code=0, state="exited"))
        return super().request(msg, timeout, what, collect)


def test_tasks_that_succeed_while_a_stall_is_acted_on_fail_no_run(tmp_path, monkeypatch):
    from support.fakehosts import StallingLink, cluster_of, run
    from tfcluster.diagnosis.stall import StallFollower
    link = type("Link", (EndingWhileStacksAreTaken, StallingLink), {})
    monkeypatch.setattr("support.fakehosts.FakeLink", link)
    monkeypatch.setattr(StallFollower, "settle_seconds", lambda self: 0.1)
    outcome, record, console, _ = run(tmp_path, cluster_of(ps=1, workers=2), {}, stall_after=3,
                                      on_stall="stop")
    assert outcome is None, console
    assert record["state"] == "succeeded" and "worker:1 ended while its stacks were taken" in console
    assert [record["tasks"]["worker:%d" % i]["exit"] for i in (0, 1)] == [0, 0]


def test_logs_of_tasks_that_printed_nothing_say_so(two_workers):
    inventory, runs_dir = two_workers
    tfcluster("launch", "-i", inventory, "--cmd", "true", "--run-id", "quiet", runs_dir=runs_dir,
              check=0)
    for argv, said in ((["quiet"], "tfcluster: run quiet: its tasks printed nothing\n"),
                       (["quiet", "--task", "worker:1"],
                        "tfcluster: run quiet: worker:1 printed nothing\n")):
        logs = tfcluster("logs", *argv, runs_dir=runs_dir, check=0)
        assert logs.stdout == said and not logs.stderr, logs.stdout + logs.stderr


def test_the_default_runs_folder_is_not_called_runs_dir(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").write_text("not a folder")
    code, out, err = run_cli(capsys, "launch", "--cmd", "true", "-i", "/nonexistent.yml")
    assert_one_line(code, err, 2, "tfcluster: error: the runs folder runs cannot hold files (it is "
                                  "a file): run from a folder you can write to, or pass "
                                  "--runs-dir DIR")
    code, out, err = run_cli(capsys, "--runs-dir", "runs", "launch", "--cmd", "true")
    assert_one_line(code, err, 2, "tfcluster: error: --runs-dir runs cannot hold files")
    assert (tmp_path / "runs").read_text() == "not a folder"


@pytest.mark.parametrize("home_is, command", [("missing", ["launch", "--plain", "--cmd", "true"]),
                                              ("read-only", ["spec"])],
                         ids=["missing-launch", "read-only-spec"])
def test_a_home_that_cannot_hold_the_cache(two_workers, tmp_path, home_is, command):
    """Warned once; the cache goes to a private folder under the runs folder, where the next
    command finds the inventory read and a launch TensorFlow's version (no import); the home is
    never created nor written (as root, a makedirs would: ours, Ansible's, Keras')."""
    inventory, runs_dir = two_workers
    home = tmp_path / "home"
    argv = ["env", "HOME=%s" % home, "XDG_CACHE_HOME=", sys.executable, "-m", "tfcluster",
            "--runs-dir", runs_dir, command[0], "-i", inventory, *command[1:]]
    cache = os.path.join(runs_dir, ".cache", "tfcluster")
    if home_is == "missing":
        proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)
    else:
        home.mkdir()
        proc = read_only(home, argv)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr == "tfcluster: warning: HOME %s %s: tfcluster caches in %s (set " \
        "XDG_CACHE_HOME for another place)\n" % (
            home, "does not exist" if home_is == "missing" else "cannot be written",
            os.path.abspath(cache)), proc.stderr
    assert "warning" not in proc.stdout, proc.stdout  # a local agent found the same cache
    assert not home.exists() if home_is == "missing" else not os.listdir(home)
    cached = os.listdir(cache)
    assert any(n.startswith("inventory-") for n in cached), cached
    if command[0] == "launch":
        assert any(n.startswith(".preflight-") for n in cached), cached  # TensorFlow's version
    assert os.stat(cache).st_mode & 0o077 == 0  # private


def test_more_spares_than_unused_machines_is_refused_before_anything_starts(two_workers):
    inventory, runs_dir = two_workers
    proc = tfcluster("launch", "-i", inventory, "--spares", "1", "--cmd", "true",
                     runs_dir=runs_dir)
    assert_one_line(proc.returncode, proc.stderr, 2, "--spares 1: only 0 machine(s) of the inventory are left "
                                  "without a task")
    assert not os.path.exists(runs_dir) or not os.listdir(runs_dir)
