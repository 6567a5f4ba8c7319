"""The host-side agent on its own: process groups, exit records, logs, lease, ports."""
import base64
import json
import os
import socket
import subprocess
import sys

import pytest

from conftest import REPO, pid_alive, port_free, wait_for

AGENT = os.path.join(REPO, "trainers", "agent.py")


def agent(*args):
    proc = subprocess.run([sys.executable, AGENT] + list(args), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def start(run_dir, tasks, lease=0):
    spec = base64.b64encode(json.dumps({"tasks": tasks, "lease": lease}).encode()).decode()
    return agent("start", "--dir", str(run_dir), "--spec", spec)["started"]


@pytest.fixture
def run_dir(tmp_path):
    path = tmp_path / "run"
    yield path
    # Whatever a test started, stop it even when the test failed.
    subprocess.run([sys.executable, AGENT, "stop", "--dir", str(path), "--grace", "1"],
                   capture_output=True, timeout=60)


def test_start_poll_exit_status_and_logs(run_dir):
    started = start(run_dir, [
        {"name": "ok", "command": "echo hello; echo $GREETING", "env": {"GREETING": "hi there"}},
        {"name": "bad", "command": "echo failing >&2; exit 3"}])
    assert all(started.values())
    wait_for(lambda: all(not t["alive"] for t in agent("poll", "--dir", str(run_dir))["tasks"].values()),
             10, "both tasks to end")
    tasks = agent("poll", "--dir", str(run_dir))["tasks"]
    assert tasks["ok"]["exit"] == 0 and tasks["ok"]["log"] == "hello\nhi there\n"
    assert tasks["bad"]["exit"] == 3 and "failing" in tasks["bad"]["log"]
    offsets = base64.b64encode(json.dumps({"ok": 6}).encode()).decode()
    assert agent("poll", "--dir", str(run_dir), "--offsets", offsets)["tasks"]["ok"]["log"] == "hi there\n"


def test_stop_kills_the_whole_process_group(run_dir):
    # The task forks a grandchild; stopping must take both.
    started = start(run_dir, [{"name": "tree", "command": "sleep 300 & echo $! > child.pid; wait",
                               "cwd": str(run_dir)}])
    pgid = started["tree"]
    child = int(wait_for(lambda: (run_dir / "child.pid").exists() and (run_dir / "child.pid").read_text().strip(),
                         10, "the grandchild's pid"))
    assert pid_alive(pgid) and pid_alive(child)
    answer = agent("stop", "--dir", str(run_dir), "--grace", "2")
    assert answer["tasks"] == {"tree": "stopped"} and answer["remaining"] == []
    assert not pid_alive(child) and not pid_alive(pgid)
    state = agent("poll", "--dir", str(run_dir))["tasks"]["tree"]
    assert state["exit"] == 128 + 15 and not state["alive"]
    # Stopping again is harmless.
    assert agent("stop", "--dir", str(run_dir))["tasks"] == {"tree": "not running"}


def test_lease_stops_tasks_when_the_controller_goes_quiet(run_dir):
    started = start(run_dir, [{"name": "long", "command": "exec sleep 300"}], lease=2)
    pid = started["long"]
    wait_for(lambda: not pid_alive(pid), 20, "the task to stop after its lease expired")
    log = agent("poll", "--dir", str(run_dir))["tasks"]["long"]["log"]
    assert "lease expired" in log


def test_port_checks_and_preflight(run_dir):
    server = socket.socket()
    server.bind(("", 0))
    server.listen()
    port = server.getsockname()[1]
    try:
        report = agent("preflight", "--ports", str(port), "--python", sys.executable)
        assert report["ports"] == {str(port): False}
        assert report["python_ok"] and report["tf_version"].startswith("2.21")
        listening = agent("poll", "--dir", str(run_dir), "--listening", str(port))["listening"]
        assert listening == {str(port): True}
    finally:
        server.close()
    assert port_free(port)
    report = agent("preflight", "--ports", str(port), "--python", "/nonexistent/python")
    assert report["ports"] == {str(port): True}
    assert not report["python_ok"] and "no interpreter" in report["error"]


def test_code_hash_changes_with_content(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n")
    first = subprocess.run([sys.executable, AGENT, "hash", "--dir", str(tmp_path)],
                           capture_output=True, text=True).stdout
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "a.pyc").write_text("junk")
    assert subprocess.run([sys.executable, AGENT, "hash", "--dir", str(tmp_path)],
                          capture_output=True, text=True).stdout == first
    (tmp_path / "a.py").write_text("x = 2\n")
    assert subprocess.run([sys.executable, AGENT, "hash", "--dir", str(tmp_path)],
                          capture_output=True, text=True).stdout != first
