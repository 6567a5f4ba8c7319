"""tfcluster profile on real runs: a 1 ps + 2 worker mnist_replica run (TF1 sessions) and a
program of the user's own that fits a Keras model under ParameterServerStrategy on this machine;
the mnist_replica run and a ParameterServerStrategy run (ClusterCoordinator loop) on the test
hosts (root). Each is traced: every task's trace holds its step events, in the files and as
TensorBoard's profile plugin shows them; --profile-at takes one trace by itself, and ten
profiles in a row leave the run training (the step rate while traced is a benchmark's figure:
`scripts/bench --only profile`)."""
import collections
import glob
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from support import REPO
from support.cli import assert_run_clean, local_inventory_text, run_record, tfcluster
from support.cli import Launcher
from support.traces import xplane_module
from support.procs import wait_for

pytestmark = pytest.mark.slow

# The events one step leaves in a task's trace: a TF1 session's RunGraph (workers and ps), a
# tf.function step on the coordinator, the functions the coordinator and the ps run remotely.
STEP_EVENTS = ("RunGraph", "SessionRun", "train_step", "FunctionRun",
               "KernelAndDeviceFunc::RunAsync")
PROFILES = 10
DURATION = 1.0
# Now and then a long TF1 run's ps refuses a step as a repeated request ("The same RunGraph
# (Worker) request was received twice"; docs/hangs.md: most likely TensorFlow's request ids,
# drawn by threads seeded with 32 bits, a new thread per step), for which tfcluster's hint is
# --restarts. The TF1 run here restarts such a task, and a trace that the restart cut short is
# taken again; any other restart fails the test.
REPEATED_REQUEST = "request was received twice"
# The runs on the test hosts train until the test has taken its traces: their tasks run at a
# lower priority (launch --nice), so that on a machine the other test sessions fill, the steps
# the test waits on (`tfcluster profile`, its agents, the trace client) are not starved by the
# training, which would burn CPU all the while (benchmarks/RESULTS.md, "Autogroups"). Their
# TensorFlow imports are slower then: the ps get longer to listen.
NICE = ("--nice", "5", "--start-timeout", "300")


def step_events(path, xplane=None):
    """{event name: count} of the step events in the trace file PATH."""
    xplane = xplane or xplane_module()
    space = xplane.XSpace()
    with open(path, "rb") as handle:
        space.ParseFromString(handle.read())
    found = collections.Counter()
    for plane in space.planes:
        for line in plane.lines:
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                if name in STEP_EVENTS:
                    found[name] += 1
    return found


def traces_of(output):
    """{label: its trace file} of the profile a `tfcluster profile` printed (its tasks.json)."""
    folder = re.search(r"profile of \d+ task\(s\) in (\S+) ", output).group(1)
    with open(os.path.join(folder, "tasks.json")) as handle:
        index = json.load(handle)
    files = glob.glob(os.path.join(folder, "plugins", "profile", "*", "*.xplane.pb"))
    traced = {label: os.path.join(folder, entry["trace"]) for label, entry in index.items()
              if entry.get("trace")}
    assert sorted(traced.values()) == sorted(files), (index, files)
    return traced


def local_inventory(tmp_path, **counts):
    """An inventory of COUNTS' tasks (ps=, workers=, chief=) on this machine."""
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(local_inventory_text(str(tmp_path / "work"), **counts))
    return str(inventory)


def launch_and_profile(tmp_path, inventory, example, profile_at, run_id, program=None,
                       extra=()):
    """A launch on INVENTORY of EXAMPLE (training until stopped; or the launch arguments PROGRAM)
    with --profile-at PROFILE_AT and the launch options EXTRA, once that trace came back with
    every task's step events: (launcher, runs dir, run record, the xplane reader)."""
    runs_dir = str(tmp_path / "runs")
    program = program or [example, "--smoke", "--", "--train_steps=10000000", "--log_every=20"]
    launcher = Launcher(runs_dir, "-i", inventory, "--run-id", run_id,
                        "--profile-at", str(profile_at), *extra, *program)
    try:
        launcher.when(r"tfcluster: profile of \d+ task\(s\) in ", 300)
        record = run_record(runs_dir, run_id)
        xplane = xplane_module()
        output = launcher.text()
        traced = traces_of(output)
        if sorted(traced) != sorted(record["tasks"]):
            # A task's restart cut the trace short (the TF1 run's repeated request alone: the
            # test checks each restart's cause at its end). What it traced has its steps, and
            # the whole run is traced once the restarted task trains again.
            assert all(sum(step_events(path, xplane).values()) > 0 for path in traced.values())
            done = profile_after_a_restart(launcher, runs_dir, run_id, 0)
            assert done is not None, "no restart cut the trace short:\n" + output[-3000:]
            assert done.returncode == 0, (done.stderr, launcher.text()[-6000:])
            output = done.stdout + done.stderr
        assert_the_plugin_shows_steps(assert_every_task_traced(record, output, xplane))
    except BaseException:
        launcher.kill()
        raise
    return launcher, runs_dir, record, xplane


def still_trains_then_ends(launcher, label):
    """LABEL reports new steps after what came before; then SIGTERM ends the run."""
    launcher.when(r"\[%s .*\] step \d+" % label, 60, after=time.monotonic())
    launcher.proc.send_signal(signal.SIGTERM)
    launcher.finish(120)


def restarts_of(runs_dir, run_id):
    return len(run_record(runs_dir, run_id)["restart_log"])


def profile(runs_dir, run_id, *options):
    """`tfcluster profile RUN_ID` of every task (or those OPTIONS name), DURATION seconds."""
    return tfcluster("profile", run_id, "--duration", str(DURATION), *options,
                     runs_dir=runs_dir, timeout=120)


def profile_after_a_restart(launcher, runs_dir, run_id, restarts):
    """A profile of the run once it has more than RESTARTS restarts and the task restarted last
    trains again; None when no restart came within 20 s."""
    try:
        wait_for(lambda: restarts_of(runs_dir, run_id) > restarts, 20, "a restart")
    except AssertionError:
        return None
    label = run_record(runs_dir, run_id)["restart_log"][-1]["task"]
    launcher.when(r"\[%s .*\] step \d+" % label, 120, after=time.monotonic())
    return profile(runs_dir, run_id)


def profile_in_a_row(launcher, runs_dir, run_id, record, count, xplane):
    """COUNT profiles of every task of the run in a row: each returns, with every task's step
    events in its trace. One that a task's restart cut short is taken again after it."""
    for attempt in range(count):
        restarts = restarts_of(runs_dir, run_id)
        done = profile(runs_dir, run_id)
        if done.returncode != 0:
            done = profile_after_a_restart(launcher, runs_dir, run_id, restarts) or done
        assert done.returncode == 0, (attempt, done.stderr, launcher.text()[-6000:])
        assert_every_task_traced(record, done.stdout + done.stderr, xplane)


def assert_restarted_only_for_repeated_requests(runs_dir, run_id):
    """Each restart of the run followed TensorFlow's refusal of a repeated request (the task's
    log, which a restart appends to, holds it)."""
    for entry in run_record(runs_dir, run_id)["restart_log"]:
        with open(os.path.join(runs_dir, run_id, entry["task"].replace(":", "-") + ".log")) as log:
            text = log.read()
        assert REPEATED_REQUEST in text, (entry, text[-4000:])


def plugin_step_events(paths):
    """{path: {step event: count}} of the trace files PATHS as TensorBoard's profile plugin
    shows them: the Trace Viewer's events, made by the plugin's own converter (xprof, unpacked by
    `make test`), in a process of its own."""
    found = glob.glob(os.path.join(REPO, ".venv", "xprof-*", "xprof", "convert",
                                   "_pywrap_profiler_plugin.py"))
    assert found, "no xprof converter in .venv: `make xprof` unpacks it (make test does)"
    done = subprocess.run([sys.executable, os.path.join(REPO, "tests", "programs",
                                                        "xprof_events.py"), found[0]] + paths,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
    shown = json.loads(done.stdout)
    return {path: {name: count for name, count in (shown[path] or {}).items()
                   if name in STEP_EVENTS} for path in paths}


def assert_every_task_traced(record, output, xplane):
    """Every task of RECORD has a trace with step events in the profile OUTPUT names."""
    traced = traces_of(output)
    assert sorted(traced) == sorted(record["tasks"]), output
    for label, path in traced.items():
        assert sum(step_events(path, xplane).values()) > 0, (label, path)
    return traced


def assert_the_plugin_shows_steps(traced):
    """TRACED: {label: trace file}; the profile plugin shows step events in each."""
    shown = plugin_step_events(sorted(traced.values()))
    assert all(shown.values()), shown


# The step rate while traced is a benchmark's figure (`scripts/bench --only profile`), not a
# test's: these tests trace, ten times in a row, and the run trains on.

@pytest.mark.timeout(900)
def test_profile_a_tf1_replica_run_ten_times(tmp_path):
    launcher, runs_dir, record, xplane = launch_and_profile(
        tmp_path, local_inventory(tmp_path, ps=1, workers=2, chief=0), "mnist_replica", 200,
        "tf1", extra=("--restarts", "2"))
    try:
        profile_in_a_row(launcher, runs_dir, "tf1", record, PROFILES, xplane)
        still_trains_then_ends(launcher, "worker:0")  # ten traces, and it still trains
    finally:
        launcher.kill()
    assert_restarted_only_for_repeated_requests(runs_dir, "tf1")
    assert_run_clean(run_record(runs_dir, "tf1"))


@pytest.mark.root
@pytest.mark.timeout(900)
def test_profile_a_ps_strategy_run_on_the_test_hosts_ten_times(testhosts, tmp_path):
    """Over SSH, the chief and ps:0 on th1, a worker on th2 and on th3, ps:1 on th3 (a work
    folder they share: each ps saves its variables on its own machine): --profile-at's trace of
    every task with its step events; then chief:0 and ps:1 alone, each trace from its task's
    host; then ten of every task in a row, each with every task's step events; the run still
    trains."""
    from support.procs import processes_of_run
    from support.ssh import hosts_inventory
    inventory = hosts_inventory(testhosts, tmp_path / "hosts.yml",
                                {"chief": [1], "worker": [2, 3], "ps": [1, 3]},
                                str(tmp_path / "work"))
    launcher, runs_dir, record, xplane = launch_and_profile(tmp_path, inventory, "ps_strategy",
                                                            200, "pss", extra=NICE)
    try:
        done = profile(runs_dir, "pss", "--tasks", "chief:0,ps:1")
        assert done.returncode == 0, (done.stderr, launcher.text()[-6000:])
        traced = traces_of(done.stdout + done.stderr)
        assert sorted(traced) == ["chief:0", "ps:1"]
        # TensorFlow names each trace file after its server's host.
        assert {label: os.path.basename(path).rsplit("_", 1)[0]
                for label, path in traced.items()} == {"chief:0": testhosts.addr(1),
                                                        "ps:1": testhosts.addr(3)}
        profile_in_a_row(launcher, runs_dir, "pss", record, PROFILES, xplane)
        still_trains_then_ends(launcher, "chief:0")
    finally:
        launcher.kill()
    assert_run_clean(run_record(runs_dir, "pss"))
    assert processes_of_run("pss") == []


@pytest.mark.timeout(600)
def test_profile_a_parameter_server_strategy_model_fit(tmp_path):
    """Keras's model.fit (tf-keras) under ParameterServerStrategy, a program of the user's own
    (tests/programs/pss_fit.py): --profile-at traces the chief, both workers and the ps, and the
    run then ends by itself."""
    launcher, runs_dir, _, _ = launch_and_profile(
        tmp_path, local_inventory(tmp_path, ps=1, workers=2, chief=1), None, 100, "fit",
        program=["--cmd", "python tests/programs/pss_fit.py 600"])
    try:
        assert launcher.finish(300) == 0, launcher.text()[-6000:]
    finally:
        launcher.kill()
    record = run_record(runs_dir, "fit")
    assert record["results"]["chief:0"]["global_step"] == 600
    assert_run_clean(record)


@pytest.mark.root
@pytest.mark.timeout(600)
def test_profile_a_tf1_replica_run_on_the_test_hosts(testhosts, tmp_path):
    """Over SSH, each task on a host (a network namespace) of its own: the servers start there,
    the ps's host traces them all, every task's trace comes back with its step events."""
    from support.procs import processes_of_run
    from support.ssh import ssh_inventory
    inventory = ssh_inventory(testhosts, tmp_path)
    runs_dir = str(tmp_path / "runs")
    launcher = Launcher(runs_dir, "mnist_replica", "-i", inventory, "--smoke", "--run-id",
                        "hosts", *NICE, "--", "--train_steps=10000000", "--log_every=20")
    try:
        launcher.when(r"\[worker:1 .*\] step [1-9]\d*", 300)
        done = profile(runs_dir, "hosts")
        assert done.returncode == 0, (done.stderr, launcher.text()[-6000:])
        record = run_record(runs_dir, "hosts")
        traced = assert_every_task_traced(record, done.stdout + done.stderr, xplane_module())
        assert_the_plugin_shows_steps(traced)
        assert {os.path.basename(path).rsplit("_", 1)[0] for path in traced.values()} == \
            {address for _, address in testhosts.hosts[:3]}
        launcher.proc.send_signal(signal.SIGTERM)
        launcher.finish(120)
    finally:
        launcher.kill()
    assert_run_clean(run_record(runs_dir, "hosts"))
    assert processes_of_run("hosts") == []
