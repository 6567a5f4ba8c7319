"""Measurements behind figures in benchmarks/RESULTS.md that no test asserts (too long, or too
dependent on the machine's load, for `make test`). `make test` does not collect this file (it is
not named test_*); run one by name, as root, on a quiet machine, and read what it prints:

    .venv/bin/python -m pytest -s -p no:randomly tests/measurements.py::test_half_a_workers_share
    .venv/bin/python -m pytest -s -p no:randomly tests/measurements.py::test_remote_trace_options
    .venv/bin/python -m pytest -s -p no:randomly tests/measurements.py::test_profiler_wakeups
    .venv/bin/python -m pytest -s -p no:randomly tests/measurements.py::test_profile_cost_by_task

Each asserts only that it measured something; the figures are the output."""
import collections
import contextlib
import glob
import json
import os
import signal
import statistics
import subprocess
import sys
import time

from support.cli import Launcher, local_inventory_text, tfcluster
from support.cpulimit import cpu_limited, set_cores
from support.procs import wait_for
from support.slowest import SLOWEST, launch_three_workers, matches, stop
from support.traces import xplane_module

WORKERS = ("worker:0", "worker:1", "worker:2")


def test_half_a_workers_share(local_env):
    """Three multi_worker_mirrored workers, each held to SHARE of a core (0.6: what each gets of
    2 cores anyway); after 30 healthy seconds, one at a time to half its share for TRIES tries
    (3). Prints, per try, the seconds until it was named (None: not within 60 s) and the wait
    the line gave. The quotas' CFS period is PERIOD_US (10 ms): with the kernel's default of
    100 ms a halved worker runs at full speed until its quota is spent, then stops, a burstier
    slowness than a core half as fast."""
    share = float(os.environ.get("SHARE", "0.6"))
    tries = int(os.environ.get("TRIES", "3"))
    period = int(os.environ.get("PERIOD_US", "10000"))
    launch, tasks = launch_three_workers(*local_env, "multi_worker_mirrored", "0", [])
    results = []
    try:
        with contextlib.ExitStack() as stack:
            groups = {label: stack.enter_context(cpu_limited(
                tasks[label]["pid"], share, name="tfcluster-share-" + label.replace(":", ""),
                period_us=period))
                for label in WORKERS}
            start = time.monotonic()
            wait_for(lambda: time.monotonic() - start >= 30 or matches(launch, SLOWEST, 0), 35,
                     "the healthy stretch")
            print("healthy 30 s, named:", [m.group(1) for m in matches(launch, SLOWEST, 0)])
            for attempt in range(tries):
                label = WORKERS[attempt % 3]
                seen = len(launch.lines)
                set_cores(groups[label], share / 2, period)
                held = time.monotonic()
                try:
                    found = wait_for(lambda: matches(launch, SLOWEST, seen), 60, "named")
                    results.append((label, round(time.monotonic() - held, 1),
                                    ["%s %s%%" % m.groups() for m in found]))
                except AssertionError:
                    results.append((label, None, []))
                print("try %d: %s" % (attempt + 1, results[-1]), flush=True)
                set_cores(groups[label], share, period)
                with contextlib.suppress(AssertionError):
                    launch.line(r"^tfcluster: %s is no longer the one the others wait for$"
                                % label, 90, label + " let go")
    finally:
        stop(launch)
    assert len(results) == tries


# What a remote trace request may carry (TensorFlow's ProfilerOptions, as client.trace sends it).
TRACE_OPTIONS = [("the defaults", {}), ("host_tracer_level 0", {"host_tracer_level": 0}),
                 ("host_tracer_level 1", {"host_tracer_level": 1}),
                 ("every level 0", {"host_tracer_level": 0, "device_tracer_level": 0,
                                    "python_tracer_level": 0})]


def test_remote_trace_options(tmp_path):
    """A local 1 ps + 2 worker mnist_replica run; `tfcluster profile` starts the tasks' profiler
    servers; then worker:0 is traced for 1 s with each of TRACE_OPTIONS, as
    tfcluster_agent/profiletrace.py calls the tracer. Prints each trace's host events and its
    most frequent ones: with level 0 applied there would be none."""
    from tensorflow.python.profiler.internal import _pywrap_profiler_plugin as client
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(local_inventory_text(str(tmp_path / "work"), ps=1, workers=2, chief=0))
    runs_dir = str(tmp_path / "runs")
    launcher = Launcher(runs_dir, "-i", str(inventory), "--run-id", "options", "mnist_replica",
                        "--smoke", "--", "--train_steps=10000000", "--log_every=50")
    xplane = xplane_module()
    counted = []
    try:
        launcher.when(r"\[worker:0 .*\] step [1-9]\d*", 300)
        done = tfcluster("profile", "options", "--duration", "1", runs_dir=runs_dir,
                         timeout=120)
        assert done.returncode == 0, done.stderr
        index, = glob.glob(os.path.join(runs_dir, "options", "profile", "*", "tasks.json"))
        with open(index) as handle:
            server = json.load(handle)["worker:0"]["server"]
        for name, options in TRACE_OPTIONS:
            folder = str(tmp_path / name.replace(" ", "-"))
            client.trace(server, folder, "", True, 1000, 3, options)
            trace, = glob.glob(os.path.join(folder, "plugins", "profile", "*", "*.xplane.pb"))
            space = xplane.XSpace()
            with open(trace, "rb") as handle:
                space.ParseFromString(handle.read())
            events = collections.Counter(
                plane.event_metadata[event.metadata_id].name.split("#")[0]
                for plane in space.planes for line in plane.lines for event in line.events)
            counted.append(sum(events.values()))
            print("%-20s %6d events; most: %s" % (name, counted[-1], events.most_common(3)),
                  flush=True)
        launcher.proc.send_signal(signal.SIGTERM)  # the run ends as a user's would
        launcher.finish(120)
    finally:
        launcher.kill()
    assert len(counted) == len(TRACE_OPTIONS)


# Three sleepers, one per traced task: while it traces, TensorFlow's Profile handler wakes
# every millisecond to see whether the trace was cancelled.
SLEEPER = "import time\nfor _ in range(4000):\n    time.sleep(0.001)"


def global_step_rate(runs_dir, run_id, start, end):
    """worker:0's global steps per second between START and END, from the run's metrics."""
    with open(os.path.join(runs_dir, run_id, "metrics.jsonl")) as handle:
        points = [json.loads(line) for line in handle if line.strip()]
    inside = [(p["time"], p["step"]) for p in points if p.get("task") == "worker:0"
              and "global_steps_per_s" in p and start <= p["time"] <= end]
    (t0, s0), (t1, s1) = inside[0], inside[-1]
    return (s1 - s0) / (t1 - t0)


def traced_window(runs_dir, run_id, *options):
    """`tfcluster profile RUN_ID --duration 4 OPTIONS`: the trace's window (its tasks.json)."""
    done = tfcluster("profile", run_id, "--duration", "4", *options, runs_dir=runs_dir,
                     timeout=120)
    assert done.returncode == 0, done.stderr
    index = sorted(glob.glob(os.path.join(runs_dir, run_id, "profile", "*", "tasks.json")))[-1]
    with open(index) as handle:
        return next(entry["window"] for entry in json.load(handle).values() if "window" in entry)


def sleepers():
    """Three processes that sleep 1 ms at a time for about 4 s: their (start, end)."""
    start = time.time()
    for proc in [subprocess.Popen([sys.executable, "-c", SLEEPER]) for _ in range(3)]:
        proc.wait()
    return start, time.time()


def step_rate_drop(runs_dir, run_id, kind, measured):
    """After 5 s without anything, MEASURED() (its window: (start, end)); prints worker:0's
    global steps/s in those 5 s against inside the window, and returns the drop."""
    time.sleep(5)
    start = time.time()
    first, last = measured()
    time.sleep(2)  # the points that close the window
    before = global_step_rate(runs_dir, run_id, start - 5, start)
    during = global_step_rate(runs_dir, run_id, first, last)
    print("%-8s %6.1f -> %6.1f global steps/s (%4.1f%% less) in %.1f s"
          % (kind, before, during, 100 * (1 - during / before), last - first), flush=True)
    return 1 - during / before


def print_medians_and_end(launcher, drops):
    """The median of each kind's DROPS; then SIGTERM ends the run as a user's would."""
    for kind, found in drops.items():
        print("%s: median drop %.1f%%" % (kind, 100 * statistics.median(found)))
    launcher.proc.send_signal(signal.SIGTERM)
    launcher.finish(120)


def test_profiler_wakeups(tmp_path):
    """A local 1 ps + 2 worker mnist_replica run, its profiler servers started; ROUNDS (4)
    rounds of three processes that sleep 1 ms at a time for about 4 s, then `tfcluster profile
    --duration 4`, each after 5 s without either. Prints worker:0's global steps/s in those 5 s
    against inside each (the trace: its tasks.json window), and the median drops."""
    rounds = int(os.environ.get("ROUNDS", "4"))
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(local_inventory_text(str(tmp_path / "work"), ps=1, workers=2, chief=0))
    runs_dir = str(tmp_path / "runs")
    launcher = Launcher(runs_dir, "-i", str(inventory), "--run-id", "wakeups", "mnist_replica",
                        "--smoke", "--", "--train_steps=100000000", "--log_every=20")

    drops = collections.defaultdict(list)
    try:
        launcher.when(r"\[worker:0 .*\] step [2-9]\d\d", 300)
        assert tfcluster("profile", "wakeups", "--duration", "1", runs_dir=runs_dir,
                         timeout=120).returncode == 0  # the servers start
        for _ in range(rounds):
            for kind, measured in (("sleepers", sleepers),
                                   ("trace", lambda: traced_window(runs_dir, "wakeups"))):
                drops[kind].append(step_rate_drop(runs_dir, "wakeups", kind, measured))
        print_medians_and_end(launcher, drops)
    finally:
        launcher.kill()
    assert len(drops["trace"]) == rounds


def test_profile_cost_by_task(tmp_path):
    """A local 1 ps + 1 worker mnist_replica run (a core for each task); ROUNDS (4) rounds of
    `tfcluster profile --duration 4` of the ps alone, of the worker alone and of both, each after
    5 s without a trace. Prints worker:0's global steps/s in those 5 s against inside each trace's
    window, and the median drops: which task's trace costs the run its steps."""
    rounds = int(os.environ.get("ROUNDS", "4"))
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(local_inventory_text(str(tmp_path / "work"), ps=1, workers=1, chief=0))
    runs_dir = str(tmp_path / "runs")
    launcher = Launcher(runs_dir, "-i", str(inventory), "--run-id", "bytask", "mnist_replica",
                        "--smoke", "--workers", "1", "--", "--train_steps=100000000",
                        "--log_every=20")
    drops = collections.defaultdict(list)
    try:
        launcher.when(r"\[worker:0 .*\] step [2-9]\d\d", 300)
        traced_window(runs_dir, "bytask")  # the servers start
        for _ in range(rounds):
            for kind, options in (("ps:0", ("--tasks", "ps:0")),
                                  ("worker:0", ("--tasks", "worker:0")), ("both", ())):
                drops[kind].append(step_rate_drop(
                    runs_dir, "bytask", kind, lambda: traced_window(runs_dir, "bytask", *options)))
        print_medians_and_end(launcher, drops)
    finally:
        launcher.kill()
    assert len(drops["both"]) == rounds
