"""Shared test helpers: a private local inventory, the CLI as a subprocess, leftover checks."""
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(REPO, "tests")
sys.path.insert(0, TESTS)
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "scripts"))  # hostlib, the test hosts' library
# Their failed asserts explain themselves as a test's do.
pytest.register_assert_rewrite("example_checks", "example_smoke")

from tfcluster_agent.hostinfo import port_is_free as port_free  # noqa: E402,F401  (tests import it from here)

pytest_plugins = ["fixtures_testhosts"] if os.path.exists(
    os.path.join(TESTS, "fixtures_testhosts.py")) else []
if os.environ.get("CPU_OF_CGROUP"):  # under scripts/cpu-of: each test's CPU seconds
    pytest_plugins.append("cpu_per_test")

# Tests use their own port range so a user's runs on 2222+ never collide with them; each test
# takes a block of free ports. Sessions side by side (scripts/testsuite) get ranges of their own
# (TFCLUSTER_TEST_PORTS=LOW-HIGH): a free block may be taken by another session before it binds.
LOW, HIGH = map(int, os.environ.get("TFCLUSTER_TEST_PORTS", "24100-29000").split("-"))
TEST_PORT_RANGE = range(LOW, HIGH, 20)


def free_port_block(size=12):
    span = len(TEST_PORT_RANGE)
    start = (os.getpid() * 20) % span
    for offset in range(span):
        base = TEST_PORT_RANGE[(start + offset) % span]
        if base + size <= HIGH and all(port_free(p) for p in range(base, base + size)):
            return base
    raise AssertionError("no block of %d free ports in %s" % (size, TEST_PORT_RANGE))


# scripts/testsuite runs the main session as two shards side by side (TFCLUSTER_TEST_SHARD):
# "local" the TensorFlow launches on this machine, "rest" everything else but the containers
# (the test hosts are one set per machine: every test that uses them is in "rest"). A file of
# local launches goes to "rest" so that the shards take about as long.
SHARDS = ("local", "rest")
LOCAL_TO_REST = {"test_cifar10.py"}


def shard_of(item):
    local = (item.get_closest_marker("slow") and not item.get_closest_marker("root")
             and not item.get_closest_marker("docker") and "testhosts" not in item.fixturenames
             and item.path.name not in LOCAL_TO_REST)
    return "local" if local else "rest"


def pytest_collection_modifyitems(config, items):
    shard = os.environ.get("TFCLUSTER_TEST_SHARD")
    if not shard:
        return
    assert shard in SHARDS, "TFCLUSTER_TEST_SHARD is one of %s, not %r" % (SHARDS, shard)
    kept = [item for item in items if shard_of(item) == shard]
    config.hook.pytest_deselected(items=[item for item in items if shard_of(item) != shard])
    items[:] = kept


@pytest.fixture(autouse=True)
def umask_left_as_found():
    """A test (or the code it calls in-process) that leaves the umask changed fails: whatever
    the session runs afterwards (a wheelhouse's pack, files handed to another user) would
    inherit it."""
    before = os.umask(0o022)
    os.umask(before)
    yield
    after = os.umask(before)
    assert after == before, "the umask was left at %04o (was %04o)" % (after, before)


def local_inventory_text(workdir, port_base=None, ps=2, workers=3, chief=1, extra=""):
    """An inventory like inventory/local.yml, with its own work folder and ports."""
    return """all:
  vars:
    ansible_connection: local
    tfcluster_deploy: false
    tfcluster_root: {repo}
    tfcluster_python: {python}
    tfcluster_workdir: {workdir}
    tfcluster_data_dir: {workdir}/data
    tfcluster_port_base: {port_base}
{extra}  children:
    chief:
      hosts:
{chief_hosts}    worker:
      hosts:
{worker_hosts}    ps:
      hosts:
{ps_hosts}""".format(
        repo=REPO, python=sys.executable, workdir=workdir, extra=extra,
        port_base=port_base if port_base is not None else free_port_block(),
        chief_hosts="".join("        chief%d: {ansible_host: localhost}\n" % i for i in range(chief)),
        worker_hosts="".join("        worker%d: {ansible_host: localhost}\n" % i
                             for i in range(workers)),
        ps_hosts="".join("        ps%d: {ansible_host: localhost}\n" % i for i in range(ps)))


@pytest.fixture
def local_env(tmp_path):
    """(inventory path, runs dir) on this machine, in a temporary folder."""
    inventory = tmp_path / "local.yml"
    inventory.write_text(local_inventory_text(str(tmp_path / "work")))
    runs_dir = tmp_path / "runs"
    yield str(inventory), str(runs_dir)
    assert_pictures_drawn(str(runs_dir))
    leftovers = stop_leftovers(str(tmp_path))
    assert not leftovers, "processes of the test were still running: %s" % leftovers


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


def run_record(runs_dir, run_id=None):
    if run_id is None:
        names = sorted(os.listdir(runs_dir))
        assert names, "no run folder in %s" % runs_dir
        run_id = names[-1]
    with open(os.path.join(runs_dir, run_id, "run.json")) as handle:
        return json.load(handle)


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


# Machine-wide resources of the suite, one pytest session (or scripts/bench) at a time.
TESTHOSTS_LOCK = "/run/lock/tfc-testhosts.session.lock"
DOCKERHOSTS_LOCK = "/run/lock/tfc-dockerhosts.session.lock"
WHEELHOUSE_LOCK = "/run/lock/tfc-wheelhouse.lock"


def ready_wheelhouse(timeout=1800, copy_to=None):
    """`tfcluster wheelhouse` (the wheels and the packed venv in REPO/wheelhouse), one caller at
    a time: the container session and the lab tests deploy from it side by side, and the second
    finds it made (a rerun with the same inputs downloads nothing and keeps the pack). COPY_TO:
    a folder that gets its files as made (hard links), for deploys that must see one wheelhouse
    while the other session replaces the checkout's (share_wheelhouse)."""
    fd = hold_lock(WHEELHOUSE_LOCK, timeout)
    try:
        proc = subprocess.run([sys.executable, "-m", "tfcluster", "wheelhouse"],
                              cwd=REPO, capture_output=True, text=True, timeout=timeout)
        if proc.returncode == 0 and copy_to:
            link_files(os.path.join(REPO, "wheelhouse"), copy_to)
        return proc
    finally:
        os.close(fd)


def share_wheelhouse(source):
    """The checkout's wheelhouse gets SOURCE's files (a wheelhouse made elsewhere): a later
    wheelhouse there finds the wheels and the pack already made."""
    fd = hold_lock(WHEELHOUSE_LOCK, timeout=1800)
    try:
        link_files(source, os.path.join(REPO, "wheelhouse"))
    finally:
        os.close(fd)


def link_files(source, dest):
    """DEST/ gets SOURCE/'s files as hard links (replacing those of the same name)."""
    os.makedirs(dest, exist_ok=True)
    for name in os.listdir(source):
        path = os.path.join(source, name)
        target = os.path.join(dest, name)
        if not os.path.isfile(path) or (os.path.exists(target) and os.path.samefile(path, target)):
            continue
        try:
            os.link(path, target + ".link")
        except OSError:  # another file system (a --basetemp elsewhere): a copy
            shutil.copy2(path, target + ".link")
        os.replace(target + ".link", target)


def hold_lock(path, timeout):
    """A descriptor holding PATH's exclusive lock (closing it lets go); fails the test when
    another session keeps it past TIMEOUT seconds."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)

    def taken():
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False
    try:
        wait_for(taken, timeout, "the lock %s, held by another test session or bench" % path,
                 interval=0.5)
    except BaseException:
        os.close(fd)
        raise
    return fd


def wait_for(condition, timeout, what, interval=0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError("timed out after %ss waiting for %s" % (timeout, what))


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
