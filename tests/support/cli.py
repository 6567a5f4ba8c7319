"""The CLI as a user runs it, the local inventories it runs on, and what a run must leave."""
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

from support import REPO
from support.ports import free_port_block, port_free
from support.procs import pid_alive, wait_for


def local_vars_text(workdir):
    """The start of a local inventory: its vars, the checkout's code, WORKDIR its work folder."""
    return """all:
  vars:
    ansible_connection: local
    tfcluster_deploy: false
    tfcluster_root: {repo}
    tfcluster_python: {python}
    tfcluster_workdir: {workdir}
    tfcluster_data_dir: {workdir}/data
""".format(repo=REPO, python=sys.executable, workdir=workdir)


def local_inventory_text(workdir, port_base=None, ps=2, workers=3, chief=1, extra=""):
    """An inventory like inventory/local.yml, with its own work folder and ports."""
    return local_vars_text(workdir) + """    tfcluster_port_base: {port_base}
{extra}  children:
    chief:
      hosts:
{chief_hosts}    worker:
      hosts:
{worker_hosts}    ps:
      hosts:
{ps_hosts}""".format(
        extra=extra,
        port_base=port_base if port_base is not None else free_port_block(),
        chief_hosts="".join("        chief%d: {ansible_host: localhost}\n" % i for i in range(chief)),
        worker_hosts="".join("        worker%d: {ansible_host: localhost}\n" % i
                             for i in range(workers)),
        ps_hosts="".join("        ps%d: {ansible_host: localhost}\n" % i for i in range(ps)))


def tfcluster(*args, runs_dir=None, timeout=600, check=None, env=None):
    """Run the CLI as a user would; returns CompletedProcess with text output."""
    argv = [sys.executable, "-m", "tfcluster"]
    if runs_dir:
        argv += ["--runs-dir", runs_dir]
    argv += list(args)
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, **(env or {})))
    if check is not None and proc.returncode != check:
        raise AssertionError("tfcluster %s exited %d, expected %d\nstdout:\n%s\nstderr:\n%s" % (
            " ".join(args), proc.returncode, check, proc.stdout[-6000:], proc.stderr[-3000:]))
    return proc


def metrics_points(runs_dir, run_id):
    """The metrics points of run RUN_ID (metrics.jsonl), [] before the first."""
    path = os.path.join(runs_dir, run_id, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as handle:
        return [json.loads(line) for line in handle if line.strip()]


def run_record(runs_dir, run_id=None):
    if run_id is None:
        names = sorted(os.listdir(runs_dir))
        assert names, "no run folder in %s" % runs_dir
        run_id = names[-1]
    with open(os.path.join(runs_dir, run_id, "run.json")) as handle:
        return json.load(handle)


def written_record(runs_dir, run_id=None):
    """run_record(RUNS_DIR, RUN_ID), or None while there is none yet: the launcher makes the
    runs folder, then the run's folder, then its run.json."""
    try:
        return run_record(runs_dir, run_id)
    except (AssertionError, FileNotFoundError):
        return None


def wait_running(runs_dir, run_id=None, timeout=90):
    """The record of run RUN_ID (the newest by default) once its state is "running"."""
    def running():
        record = written_record(runs_dir, run_id)
        return record if record and record.get("state") == "running" else None
    return wait_for(running, timeout, "the run to be running")


def assert_pictures_drawn(runs_dir):
    """Every ended run in RUNS_DIR with metrics points has its metrics.svg: the launcher (or
    `tfcluster stop`) writes it before it returns."""
    runs = [os.path.join(runs_dir, name) for name in os.listdir(runs_dir)] \
        if os.path.isdir(runs_dir) else []
    missing = [run for run in runs if picture_due(run)
               and not os.path.exists(os.path.join(run, "metrics.svg"))]
    assert not missing, "runs ended with metrics points but no metrics.svg: %s" % missing


def picture_due(run_dir):
    """Whether RUN_DIR's run ended with metrics points (its end recorded: a run whose controller
    was killed draws nothing)."""
    try:
        with open(os.path.join(run_dir, "run.json")) as handle:
            ended = json.load(handle).get("ended")
        return bool(ended) and os.path.getsize(os.path.join(run_dir, "metrics.jsonl")) > 0
    except (OSError, ValueError):
        return False


def stopped_by_lease(record):
    """True once every task of RECORD (a local run whose controller is gone) has stopped, its
    .lease aged an hour at each look: the lease runs out at once, whatever the lease length,
    and a ping the agent reads late cannot renew it for long."""
    long_ago = time.time() - 3600
    for folder in {task["host_run_dir"] for task in record["tasks"].values()}:
        try:
            os.utime(os.path.join(folder, ".lease"), (long_ago, long_ago))
        except FileNotFoundError:
            pass  # its agent never started a task there
    return not any(pid_alive(task["pid"]) for task in record["tasks"].values() if task["pid"])


def assert_run_clean(record):
    """Every task process of the run gone, every port free."""
    for label, task in record["tasks"].items():
        if task.get("pid"):
            assert not pid_alive(task["pid"]), "%s (pid %s) still running" % (label, task["pid"])
        if task.get("port"):
            assert port_free(task["port"]), "%s port %s still busy" % (label, task["port"])


def run_cli(capsys, *argv):
    """tfcluster in this process (fast): (exit code, stdout, stderr)."""
    from tfcluster.cli import main as cli
    try:
        code = cli.main(list(argv))
    except SystemExit as exit_:  # argparse's errors
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


def assert_usage_error(code, err, message):
    assert code == 2, err
    assert message in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


class Launch:
    """`tfcluster launch` in the background, its output lines collected as they come."""

    def __init__(self, runs_dir, *args, env=None):
        argv = [sys.executable, "-m", "tfcluster", "--runs-dir", runs_dir, "launch", *args]
        self.proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True,
                                     env=dict(os.environ, **(env or {})))
        self.lines = []
        self.reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stdout))
        self.reader.start()

    def line(self, pattern, timeout, what):
        """The first output line matching PATTERN, waited for."""
        def found():
            return next((line for line in list(self.lines) if re.search(pattern, line)), None)
        return wait_for(found, timeout, what, interval=0.2)

    def end(self, timeout=90):
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError("the launch still runs after %gs; its last lines:\n%s"
                                 % (timeout, "".join(self.lines[-40:]))) from None
        self.reader.join(10)
        return "".join(self.lines)

    def kill(self):
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
        self.end()


class Launcher:
    """`tfcluster launch ...` in the background; every line it prints, with when it came."""

    def __init__(self, runs_dir, *args):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tfcluster", "--runs-dir", runs_dir, "launch", "--plain",
             *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def when(self, pattern, timeout, after=0.0):
        """When the first line matching PATTERN (a regex) came, waiting up to TIMEOUT s."""
        def seen():
            return next((t for t, line in list(self.lines)
                         if t >= after and re.search(pattern, line)), None)
        return wait_for(seen, timeout,
                        lambda: "a line matching %r; got:\n%s" % (pattern, self.text()))

    def text(self):
        return "\n".join(line for _, line in self.lines)

    def finish(self, timeout):
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError("the launch still runs after %gs; its output, with when each "
                                 "line came:\n%s" % (timeout, self.timed_text()[-8000:])) from None
        self.reader.join(5)
        return code

    def timed_text(self):
        start = self.lines[0][0] if self.lines else 0.0
        return "\n".join("%7.1f %s" % (t - start, line) for t, line in list(self.lines))

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
