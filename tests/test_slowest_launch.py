"""The slowest worker of a real synchronous run on this machine (root: a cgroup CPU limit): three
MultiWorkerMirroredStrategy workers (or three SyncReplicasOptimizer workers of mnist_replica and
their ps) train, healthy, and nobody is named; then one worker at a time is held to a tenth of
a core, named within 30 s, and let go, TRIES times. Synthetic points: test_slowest.py.

Three workers on this 2-core machine get about two thirds of a core each: a limit of half a core
hardly slows one (its cgroup was throttled in 2 to 73 of 300 periods), a tenth does. Each try
costs a minute of the whole machine, so the suite makes one; 10 of 10 is a measurement."""
import os
import re
import time

import pytest

from support.cli import assert_run_clean, metrics_points, run_record
from support.cpulimit import cpu_hierarchy, cpu_limited, throttled
from support.procs import wait_for
from support.slowest import SLOWEST, launch_three_workers, matches, stop

pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.cgroup]

TRIES = 1
CORES = 0.1
# Each: the example, its ps tasks, its flags. The all-reduce has its own figure (`wait`);
# SyncReplicas workers are judged by `busy` alone.
SYNCHRONOUS = {"multi_worker_mirrored": ("multi_worker_mirrored", "0", []),
               "sync_replicas": ("mnist_replica", "1", ["--sync_replicas"])}
# Healthy training (all three at full speed) before the first limit: the watch judges a task
# once it has reported for its 10 s window, so about 20 s of judgments. The 10-minute healthy
# runs are a measurement (benchmarks/RESULTS.md, scripts/slowest-replay).
HEALTHY_S = 30
NAMED_WITHIN_S = 30


def limit_each_worker(launch, tasks, cores, tries):
    """Hold worker:0, 1, 2, ... in turn to CORES for TRIES tries: each must be named within
    NAMED_WITHIN_S, and let go; the seconds each took to be named."""
    named_after = []
    for attempt in range(tries):
        label = "worker:%d" % (attempt % 3)
        seen = len(launch.lines)
        with cpu_limited(tasks[label]["pid"], cores) as group:
            limited = time.monotonic()
            try:
                found = wait_for(lambda: matches(launch, SLOWEST, seen), NAMED_WITHIN_S,
                                 "%s named as the slowest (try %d)" % (label, attempt + 1))
            except AssertionError as err:
                # Few periods: a machine too loaded to give the worker that much CPU anyway.
                raise AssertionError("%s; the limit throttled it in %s"
                                     % (err, throttled(group))) from None
            named_after.append(round(time.monotonic() - limited, 1))
            print("try %d: %s named after %.1fs" % (attempt + 1, label, named_after[-1]),
                  flush=True)
            assert [m.group(1) for m in found] == [label], found
            assert 20 <= int(found[0].group(2)) < 100
        launch.line(r"^tfcluster: %s is no longer the one the others wait for$" % label, 90,
                    label + " let go")
    return named_after


def busy_figures(runs_dir):
    """A line per worker: the time and busy figure of each of its points, for a false alarm."""
    record = run_record(runs_dir)
    points = metrics_points(runs_dir, record["id"])
    start = min((p["time"] for p in points), default=0)
    return "\n".join("%s: %s" % (label, " ".join("%.1f:%s" % (p["time"] - start, p.get("busy"))
                                                   for p in points if p["task"] == label))
                     for label in sorted({p["task"] for p in points}))


@pytest.mark.timeout(1500)
@pytest.mark.parametrize("training", sorted(SYNCHRONOUS))
def test_a_worker_held_to_a_tenth_of_a_core_is_named_within_30s_and_a_healthy_run_names_nobody(
        local_env, training):
    if os.geteuid() != 0 or cpu_hierarchy() is None:
        pytest.fail("needs root and a cgroup cpu controller (v2 cpu.max or v1 cpu) to limit "
                    "a worker's CPU")
    example, ps, flags = SYNCHRONOUS[training]
    launch, tasks = launch_three_workers(*local_env, example, ps, flags)
    try:
        start = time.monotonic()
        wait_for(lambda: time.monotonic() - start >= HEALTHY_S or matches(launch, SLOWEST, 0),
                 HEALTHY_S + 5, "the healthy stretch")
        assert matches(launch, SLOWEST, 0) == [], \
            "a healthy run named a slowest worker; its workers' busy figures:\n" + \
            busy_figures(local_env[1])
        print("named after (s):", limit_each_worker(launch, tasks, CORES, TRIES))
    finally:
        output = stop(launch)
    rows = {line.split()[0]: line for line in output.splitlines()
            if re.match(r"worker:\d +localhost +", line)}
    limited = {"worker:%d" % (attempt % 3) for attempt in range(TRIES)}
    assert all(rows[w].endswith("(slowest)") == (w in limited)
               for w in ("worker:0", "worker:1", "worker:2")), rows
    assert len(re.findall(r"\nslowest: worker:\d held the others back for \d+s from "
                          r"\d\d:\d\d:\d\d: they waited \d+% of each step for it", output)) == len(limited)
    assert_run_clean(run_record(local_env[1]))
