"""Bad input around a launch: what a task prints, the trainer's flags, the watch's flags, a home
that cannot hold a cache. Launches of shell commands (--cmd) on two local workers: seconds."""
import os
import pty
import select
import subprocess
import sys
import time

import pytest

from conftest import REPO, local_inventory_text, run_record, stop_leftovers, tfcluster

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
    assert logs.stdout.count("] ? 50%") == 2

    # The live view, on a terminal that cannot show it either.
    code, shown = on_terminal([sys.executable, "-m", "tfcluster", "--runs-dir", runs_dir,
                               "launch", "-i", inventory, "--cmd", PRINT_BAR + "; sleep 1",
                               "--run-id", "live"], latin1)
    assert code == 0 and "Traceback" not in shown, shown
    assert run_record(runs_dir, "live")["state"] == "succeeded"
