"""Processes the tests look for, wait on and stop."""
import os
import signal
import time


def processes_matching(text):
    """(pid, command line) of processes whose command line or environment contains TEXT."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as handle:
                cmdline = handle.read().replace(b"\0", b" ").decode(errors="replace")
            with open("/proc/%s/environ" % pid, "rb") as handle:
                environ = handle.read().decode(errors="replace")
        except OSError:
            continue
        if text in cmdline or text in environ:
            found.append((int(pid), cmdline.strip()))
    return found


def stop_leftovers(marker):
    """Kill processes whose command line or environment names MARKER; returns what was found."""
    found = processes_matching(marker)
    for pid, _ in found:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return found


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return handle.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def parent_of(pid):
    """The parent pid of PID, or None when it is gone."""
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return int(handle.read().split(")")[-1].split()[1])
    except (OSError, ValueError):
        return None


def wait_for(condition, timeout, what, interval=0.1):
    """CONDITION's first true value within TIMEOUT s. WHAT says what was awaited: a string, or a
    function that says it when the wait failed (with what came in the meantime)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError("timed out after %ss waiting for %s"
                         % (timeout, what() if callable(what) else what))


def processes_of_run(run_id):
    """Pids whose environment names RUN_ID: a run's tasks and every child they started."""
    marker = ("TFCLUSTER_RUN_ID=%s" % run_id).encode()
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/environ" % pid, "rb") as handle:
                if marker in handle.read().split(b"\0"):
                    found.append(int(pid))
        except OSError:
            pass
    return found
