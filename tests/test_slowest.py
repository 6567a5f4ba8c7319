"""The slowest worker of synchronous training, from synthetic metrics points (the fast tier): the
busy figure the trainers report, the Diagnosis that compares it and the summary (the live row:
test_causes.py). A real 3-worker run with one worker under a CPU limit: test_slowest_launch.py."""
import json
import os
import random
import subprocess
import sys

from support import REPO
from support.fakehosts import cluster_of, monitor_of
from tfcluster.diagnosis import SLOWEST
from tfcluster.diagnosis.slowest import HOLD_S, WINDOW_S
from trainers.common.loop import busy_seconds

EXAMPLES_PER_S = 300.0


def feed(diagnosis, tasks, busy, start, seconds, every=1.0, rates=None, jitter=0.0, rng=None,
         key="busy"):
    """Points every EVERY s from START for SECONDS: each task at its BUSY figure (plus or minus
    JITTER of it; KEY "wait": its share of time in the collective) and the same rate unless
    RATES says; returns (now, the Causes named)."""
    now, named = start, []
    while now < start + seconds:
        now += every
        for task in tasks:
            figure = busy[task.label] * (1 + (rng.uniform(-jitter, jitter) if jitter else 0))
            rate = (rates or {}).get(task.label, EXAMPLES_PER_S)
            diagnosis.slowest.metric(task, {"step": 1, "examples_per_s": rate, key: figure},
                                     now)
            diagnosis.stragglers.metric(task, {"step": 1, "examples_per_s": rate}, now)
        named += diagnosis.straggling(now)
    return now, named


def workers(n=3):
    cluster = cluster_of(ps=0, workers=n)
    monitor, _, console = monitor_of(cluster)
    return cluster, monitor.diagnosis, console


def test_the_worker_the_others_wait_for_is_named_once_with_their_wait():
    cluster, diagnosis, console = workers()
    busy = {"worker:0": 1.0, "worker:1": 1.0, "worker:2": 1.0}
    now, named = feed(diagnosis, cluster.tasks, busy, 1000.0, 30)
    assert named == []
    busy.update({"worker:0": 0.55, "worker:1": 0.65})  # worker:2 computes, they wait for it
    now, named = feed(diagnosis, cluster.tasks, busy, now, 60)
    assert [(c.kind, c.task) for c in named] == [(SLOWEST, cluster.find("worker:2"))]
    assert named[0].text == "worker:2 is the slowest: the others wait 40% of each step for it"
    assert "tfcluster: worker:2 is the slowest: the others wait 40% of each step for it" \
        in console.getvalue()
    lines, notes = diagnosis.report()
    assert lines[-1].startswith("slowest: worker:2 held the others back for ")
    assert lines[-1].endswith(": they waited 40% of each step for it")
    assert notes == {"worker:2": "slowest"}


def test_it_is_named_within_the_window_and_the_hold():
    cluster, diagnosis, _ = workers()
    busy = {"worker:0": 1.0, "worker:1": 1.0, "worker:2": 1.0}
    now, _ = feed(diagnosis, cluster.tasks, busy, 1000.0, 20)
    busy.update({"worker:0": 0.5, "worker:1": 0.5})
    named_at = None
    for _ in range(40):
        now, named = feed(diagnosis, cluster.tasks, busy, now, 1)
        if named:
            named_at = now
            break
    assert named_at is not None and named_at - 1020.0 <= WINDOW_S + HOLD_S


def test_a_healthy_run_on_contended_cores_names_nobody():
    """Ten simulated minutes of three workers whose busy figures jitter by 20% each point (the
    scheduler's luck on shared cores), with bursts where one of them lags for a few seconds."""
    cluster, diagnosis, console = workers()
    rng = random.Random(42)
    busy = {"worker:0": 1.2, "worker:1": 1.2, "worker:2": 1.2}
    now, named = 1000.0, []
    for _ in range(60):
        now, found = feed(diagnosis, cluster.tasks, busy, now, 8, jitter=0.2, rng=rng)
        named += found
        lagging = rng.choice(cluster.tasks).label  # a short burst: the others wait 40% for it
        now, found = feed(diagnosis, cluster.tasks,
                          {label: 1.2 if label == lagging else 0.7 for label in busy}, now, 2,
                          jitter=0.2, rng=rng)
        named += found
    assert named == [] and console.getvalue() == ""
    assert diagnosis.report() == ([], {})


def test_a_warm_up_and_one_odd_point_on_a_slow_machine_name_nobody():
    """Points every 3 s (a loaded machine): worker:1's first figure holds its warm-up (4x the
    others'), and later one of worker:2's points caught a burst of other work. Averaged over a
    10 s window either would make the others wait over a fifth of each step for 5 s."""
    cluster, diagnosis, console = workers()
    rng = random.Random(3)
    even = {"worker:0": 1.2, "worker:1": 1.2, "worker:2": 1.2}
    now, named = feed(diagnosis, cluster.tasks, dict(even, **{"worker:1": 4.8}), 1000.0, 3,
                      every=3)
    now, found = feed(diagnosis, cluster.tasks, even, now, 30, every=3, jitter=0.1, rng=rng)
    named += found
    now, found = feed(diagnosis, cluster.tasks, dict(even, **{"worker:2": 4.8}), now, 3,
                      every=3)
    named += found
    now, found = feed(diagnosis, cluster.tasks, even, now, 30, every=3, jitter=0.1, rng=rng)
    assert named + found == [] and console.getvalue() == ""


def test_by_busy_alone_the_others_must_wait_three_tenths_of_each_step():
    """busy is the noisier figure: a 10 s window of a healthy SyncReplicas run's points can leave
    one worker's median 19% over another's. A quarter names nobody, 35% does."""
    cluster, diagnosis, console = workers()
    busy = {"worker:0": 0.75, "worker:1": 0.75, "worker:2": 1.0}
    now, named = feed(diagnosis, cluster.tasks, busy, 1000.0, 60)
    assert named == [] and console.getvalue() == ""
    busy.update({"worker:0": 0.65, "worker:1": 0.65})
    now, named = feed(diagnosis, cluster.tasks, busy, now, 30)
    assert [(c.kind, c.task) for c in named] == [(SLOWEST, cluster.find("worker:2"))]


def test_the_mark_holds_until_the_wait_falls_under_the_lower_mark():
    cluster, diagnosis, console = workers()
    busy = {"worker:0": 0.5, "worker:1": 0.5, "worker:2": 1.0}
    now, named = feed(diagnosis, cluster.tasks, busy, 1000.0, 40)
    assert len(named) == 1
    busy.update({"worker:0": 0.82, "worker:1": 0.82})  # 18%: under the mark, over the clear
    now, named = feed(diagnosis, cluster.tasks, busy, now, 30)
    assert named == [] and "no longer" not in console.getvalue()
    busy.update({"worker:0": 0.97, "worker:1": 0.97})
    now, named = feed(diagnosis, cluster.tasks, busy, now, 30)
    assert console.getvalue().endswith(
        "tfcluster: worker:2 is no longer the one the others wait for\n")
    line, = diagnosis.report()[0]
    assert line.startswith("slowest: worker:2 held the others back for ")


def test_the_time_in_the_collective_names_the_worker_that_waits_least():
    """The trainer's own timing: worker:1 spends 5% of its time in the all-reduce (the
    transfer), the others 45%: they wait 40% for it."""
    cluster, diagnosis, console = workers()
    wait = {"worker:0": 0.45, "worker:1": 0.05, "worker:2": 0.45}
    _, named = feed(diagnosis, cluster.tasks, wait, 1000.0, 40, key="wait")
    assert [(c.kind, c.task) for c in named] == [(SLOWEST, cluster.find("worker:1"))]
    assert named[0].text == "worker:1 is the slowest: the others wait 40% of each step for it"


def test_others_timed_waiting_17_percent_of_each_step_name_the_worker_and_12_percent_nobody():
    """Half a worker's share of two cores left the others waiting 19-39% of each step in their
    collective (tests/measurements.py); healthy runs' waits differed by 0.12 at most (RESULTS)."""
    cluster, diagnosis, console = workers()
    wait = {"worker:0": 0.22, "worker:1": 0.10, "worker:2": 0.22}  # 12% for worker:1
    now, named = feed(diagnosis, cluster.tasks, wait, 1000.0, 60, key="wait")
    assert named == [] and console.getvalue() == ""
    wait.update({"worker:0": 0.27, "worker:2": 0.27})  # 17%
    _, named = feed(diagnosis, cluster.tasks, wait, now, 30, key="wait")
    assert [(c.kind, c.task) for c in named] == [(SLOWEST, cluster.find("worker:1"))]
    assert named[0].text == "worker:1 is the slowest: the others wait 17% of each step for it"


def test_a_healthy_run_timed_in_its_collective_names_nobody():
    cluster, diagnosis, _ = workers()
    rng = random.Random(7)
    _, named = feed(diagnosis, cluster.tasks, {t.label: 0.3 for t in cluster.tasks}, 1000.0,
                    600, jitter=0.9, rng=rng, key="wait")
    assert named == []


def test_workers_whose_rates_differ_are_not_synchronous_and_not_judged_by_waiting():
    cluster, diagnosis, _ = workers()
    busy = {"worker:0": 0.4, "worker:1": 0.4, "worker:2": 1.0}
    rates = {"worker:0": 300.0, "worker:1": 300.0, "worker:2": 200.0}
    _, named = feed(diagnosis, cluster.tasks, busy, 1000.0, 60, rates=rates)
    assert named == []


def test_tasks_that_report_no_busy_figure_are_not_judged():
    cluster, diagnosis, _ = workers(2)
    for now in range(1000, 1060):
        for task in cluster.tasks:
            diagnosis.metric(task, {"step": 1, "examples_per_s": 100.0})
        assert diagnosis.straggling(float(now)) == []


def test_busy_seconds_sum_what_the_threads_ran_and_waited(tmp_path):
    for tid, (ran, waited) in {"10": (2_000_000_000, 500_000_000), "11": (1, 0)}.items():
        (tmp_path / tid).mkdir()
        (tmp_path / tid / "schedstat").write_text("%d %d 7\n" % (ran, waited))
    (tmp_path / "12").mkdir()  # a thread that ended between the listing and the read
    assert busy_seconds(str(tmp_path)) == 2.500000001
    assert busy_seconds(str(tmp_path / "absent")) is None
    assert busy_seconds() > 0  # this process's own threads


def test_the_replay_script_names_the_worker_in_a_runs_points_and_refuses_a_bad_folder(tmp_path):
    """scripts/slowest-replay reads a run folder's metrics.jsonl as the launcher would."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    busy = {"worker:0": 1.0, "worker:1": 1.0, "worker:2": 1.0}
    with open(run_dir / "metrics.jsonl", "w") as handle:
        for second in range(60):
            if second == 30:
                busy.update({"worker:0": 0.5, "worker:1": 0.6})
            for label, figure in busy.items():
                handle.write(json.dumps({"task": label, "time": 1000.0 + second, "step": second,
                                         "examples_per_s": EXAMPLES_PER_S, "busy": figure}) + "\n")
    script = os.path.join(REPO, "scripts", "slowest-replay")
    done = subprocess.run([sys.executable, script, str(run_dir)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert "worker:2 is the slowest: the others wait 45% of each step for it" in done.stdout
    assert "peaked at 0.400 for worker:2" in done.stdout
    bad = subprocess.run([sys.executable, script, str(tmp_path)], capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "has no metrics.jsonl" in bad.stderr
