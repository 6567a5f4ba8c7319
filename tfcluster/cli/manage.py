"""Runs after launch: status, logs, stop, history. They work from run.json and the agents, so they
also work after the launcher was killed or when it ran with --detach; when a host's agent is gone
its run folder's records still tell."""
import json
import os
import signal
import time

from tfcluster.gpus import claims as gpuqueue
from tfcluster.runs import metrics
from tfcluster.runs import store as runs
from tfcluster.runs.store import host_run_dir
from tfcluster.diagnosis.stall import print_stacks, take_stacks
from tfcluster.errors import RunFailed, UsageError
from tfcluster.hosts.fanout import Hosts
from tfcluster.hosts.inventory import Machine
from tfcluster.runs.metrics import MetricsStore
from tfcluster.launch import profiling
from tfcluster.launch.monitor import Monitor, policy_met, tracked
from tfcluster.view.plot import write_run_svg
from tfcluster.view.report import PlainReporter
from tfcluster.spec.cluster import Cluster, Task
from tfcluster.launch.teardown import (DRAIN_HOST_SIGNAL, DRAIN_HOSTS_FILE, DRAIN_REFUSED_FILE,
                                       Drain, finish, launcher_following, stop_tasks)
from tfcluster_agent import protocol as P

WAKE_SECONDS = 0.25


def cluster_from_record(record):
    """The run's cluster; each task on its machine by Machine.key (the SSH port included)."""
    machines = {}
    for entry in record.machines:
        machine = Machine(**{k: v for k, v in entry.settings.items()
                             if k in Machine.field_names})
        machines[machine.key] = machine
    return Cluster(Task(entry.job, entry.index, entry.slot, machines[entry.machine], entry.port,
                        entry.cuda_visible_devices) for entry in record.tasks.values())


def pick(runs_dir, run_id, active_only=False):
    # None (no argument) is the newest; an empty id is refused by runs.load.
    return runs.latest(runs_dir, active_only) if run_id is None else runs.load(runs_dir, run_id)


def attach(hosts, cluster, run_id, from_start):
    """Open every machine's agent on the run folder; {label: its Attached entry} of the tasks it
    knows (hand them to Monitor.attached)."""
    def call(link):
        return link.request(P.Attach(run_dir=host_run_dir(link.machine, run_id),
                                     from_start=from_start), timeout=30).tasks

    machines = [m for m, _ in cluster.machines()]
    outcomes = hosts.each(call, machines,
                          timeout=max([m.connect_timeout for m in machines] or [0]) + 40)
    states, unreachable = {}, []
    for machine, tasks in cluster.machines():
        if machine.key in outcomes.failed:
            unreachable.append((machine, outcomes.failed[machine.key]))
            continue
        answer = outcomes.succeeded[machine.key]
        for task in tasks:
            if task.name in answer:
                states[task.label] = answer[task.name]
    return states, unreachable


def warn_unreachable(reporter, unreachable):
    for machine, err in unreachable:
        reporter.note("WARNING %s: %s" % (machine.label, err.reason))


def status(runs_dir, run_id=None, reporter=None):
    reporter = reporter or PlainReporter()
    record = pick(runs_dir, run_id)
    cluster = cluster_from_record(record)
    states = {}
    latest = latest_metrics(record.dir)
    if record.active:
        # The hosts' logs from the start: their metric lines give each task's last step, also
        # for a detached run, whose controller keeps no metrics.
        store = MetricsStore()
        with Hosts([m for m, _ in cluster.machines()]) as hosts:
            monitor = Monitor(hosts, cluster, None, PlainReporter(echo=False), metrics=store)
            answers, unreachable = attach(hosts, cluster, record.id, from_start=True)
            monitor.attached(answers)
            states = dict(monitor.states)  # as the agents answered, before their replayed events
            monitor.pump(0)
        warn_unreachable(reporter, unreachable)
        latest = dict(latest, **store.latest())
    reporter.out("run %s (%s) %s, created %s" % (record.id, record.example, record.state,
                                                 record.created))
    reporter.out("%-12s %-18s %-8s %-12s %-5s %10s %10s %12s" % (
        "TASK", "HOST", "PID", "STATE", "EXIT", "STEP", "LOSS", "EXAMPLES/S"))
    for task in cluster.tasks:
        entry = record.tasks[task.label]
        live = states.get(task.label)
        state = live.state if live else entry.state
        code = live.exit if live else entry.exit
        point = latest.get(task.label, {})
        reporter.out("%-12s %-18s %-8s %-12s %-5s %10s %10s %12s" % (
            task.label, task.machine.label, "-" if entry.pid is None else entry.pid, state,
            "-" if code is None else code, point.get("step", "-"), _short(point.get("loss")),
            _short(point.get("examples_per_s"))))
    if record.active and states:
        if policy_met(cluster, states, record.success_policy):
            reporter.note("training finished; stop the parameter servers with `tfcluster stop %s`"
                          % record.id)
        elif not any(states[t.label].alive for t in tracked(cluster) if t.label in states):
            reporter.note("no worker is running any more; `tfcluster stop %s` collects the logs"
                          % record.id)
    return 0


def latest_metrics(record_dir):
    try:
        return metrics.load(record_dir).latest()
    except (OSError, ValueError):
        return {}


def _short(value):
    if value is None:
        return "-"
    return "%.4g" % value if isinstance(value, float) else str(value)


def logs(runs_dir, run_id, task_label=None, follow=False, reporter=None):
    record = pick(runs_dir, run_id)
    cluster = cluster_from_record(record)
    chosen = [cluster.find(task_label)] if task_label else cluster.tasks
    # Every line as the task wrote it: a log is read to see everything.
    reporter = reporter or PlainReporter(prefix=len(chosen) > 1, verbose=True)
    if not record.active:
        for task in chosen:
            path = os.path.join(record.dir, task.name + ".log")
            if not os.path.exists(path):
                reporter.note("no log for %s in %s" % (task.label, record.dir))
                continue
            with open(path, errors="replace") as handle:
                for line in handle.read().splitlines():
                    reporter.task_line(task, line)
        say_if_silent(reporter, record, task_label, "")
        return 0
    shown = Cluster(chosen)
    machines = [m for m, _ in shown.machines()]
    try:
        with Hosts(machines) as hosts:
            # Following a run writes nothing: the records are the launcher's (or stop's).
            monitor = Monitor(hosts, shown, None, reporter)
            answers, unreachable = attach(hosts, shown, record.id, from_start=True)
            warn_unreachable(reporter, unreachable)
            monitor.attached(answers)
            monitor.pump(0)
            while follow and any(monitor.alive(t) for t in chosen) \
                    and len(monitor.closed_links) < len(machines):
                monitor.pump(WAKE_SECONDS)
            monitor.close()
    except KeyboardInterrupt:
        pass
    say_if_silent(reporter, record, task_label, " yet" if not follow else "")
    return 0


def say_if_silent(reporter, record, task_label, yet):
    """A note when the logs shown had no line: an empty answer would look like a failure."""
    if getattr(reporter, "task_lines", None) == 0:
        reporter.note("run %s: %s printed nothing%s" % (record.id, task_label or "its tasks", yet))


def stop(runs_dir, run_id=None, grace=10.0, reporter=None, drain=None):
    """Stop every task of a run (idempotent), collect its logs and close its record; with
    DRAIN (a teardown.Drain), after the termination notice."""
    with runs.private_files():
        return _stop(runs_dir, run_id, grace, reporter, drain)


def drain(runs_dir, run_id=None, grace=10.0, drain_grace=30.0, reporter=None, timeout=600):
    """`tfcluster drain`: every task of a run gets the termination notice and DRAIN_GRACE s to
    checkpoint and end, then the run is stopped as by `tfcluster stop`. A run whose launcher
    still follows it drains through that launcher (SIGTERM: its own --drain-grace), which
    records the end; this waits up to TIMEOUT s for it. RUN_ID may name a host of a running
    run instead: drain_host."""
    reporter = reporter or PlainReporter()
    if run_id is not None and not os.path.exists(os.path.join(runs_dir, run_id)):
        host_run = next((r for r in reversed(runs.all_runs(runs_dir)) if r.active and any(
            run_id in (m.settings.get("address"), _label(m.settings)) for m in r.machines)), None)
        if host_run is not None:
            return drain_host(host_run, run_id, reporter, timeout)
    record = pick(runs_dir, run_id, active_only=run_id is None)
    if not launcher_following(record):
        return stop(runs_dir, record.id, grace, reporter,
                    drain=Drain(drain_grace, "tfcluster drain"))
    pid = record.launcher["pid"]
    reporter.note("run %s: its launcher (pid %d) drains it" % (record.id, pid))
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while launcher_following(record):
        if time.monotonic() > deadline:
            raise RunFailed("run %s: its launcher (pid %d) still runs %gs after SIGTERM"
                            % (record.id, pid, timeout))
        time.sleep(0.1)
    record = runs.load(runs_dir, record.id)
    reporter.note("run %s: %s" % (record.id, record.state))
    return 0


def _label(settings):
    return Machine(**settings).label


def drain_host(record, host, reporter, timeout=600):
    """`tfcluster drain HOST`: the launcher of RECORD's run gives HOST's tasks the termination
    notice, then moves them to a spare; this waits up to TIMEOUT s for the move."""
    if not launcher_following(record):
        raise UsageError("drain %s: run %s has no launcher following it (--detach), and only "
                         "a launcher moves tasks to a spare: `tfcluster drain %s` drains the "
                         "whole run" % (host, record.id, record.id))
    moves = len(record.moves)
    answer = os.path.join(record.dir, DRAIN_REFUSED_FILE)
    if os.path.exists(answer):
        os.remove(answer)  # an earlier drain's
    runs.write_private(os.path.join(record.dir, DRAIN_HOSTS_FILE), json.dumps([host]))
    os.kill(record.launcher["pid"], DRAIN_HOST_SIGNAL)
    reporter.note("run %s: its launcher (pid %d) drains %s and moves its tasks to a spare"
                  % (record.id, record.launcher["pid"], host))
    deadline = time.monotonic() + timeout
    while True:
        record = runs.load(record.runs_dir, record.id)
        if len(record.moves) > moves:
            move = record.moves[-1]
            reporter.note("run %s: moved %s from %s to %s" % (
                record.id, ", ".join(move.tasks), move.lost, move.spare))
            return 0
        if os.path.exists(answer):
            with open(answer) as handle:
                why = json.load(handle)
            raise RunFailed("run %s: %s not drained: %s" % (
                record.id, host, "; ".join(why.values()) or "refused"))
        if not record.active:
            raise RunFailed("run %s ended (%s) before %s was drained" % (record.id, record.state,
                                                                       host))
        if time.monotonic() > deadline:
            raise RunFailed("run %s: %s not moved %gs after the drain was asked (no spare "
                            "left? the launcher's console says)" % (record.id, host, timeout))
        time.sleep(0.2)


def _stop(runs_dir, run_id, grace, reporter, drain=None):
    reporter = reporter or PlainReporter()
    record = pick(runs_dir, run_id, active_only=run_id is None)
    if gpuqueue.stop_waiting(record, reporter):  # still waiting for GPUs: nothing started
        return 0
    cluster = cluster_from_record(record)
    was_active = record.active
    with Hosts([m for m, _ in cluster.machines()]) as hosts:
        if was_active:
            for name in [t.name + ".log" for t in cluster.tasks] + [metrics.FILE]:
                path = os.path.join(record.dir, name)  # the agents send it all again
                if os.path.exists(path):
                    os.truncate(path, 0)
            store = MetricsStore(record.dir)
            monitor = Monitor(hosts, cluster, record.dir, PlainReporter(echo=False),
                              metrics=store)
            answers, unreachable = attach(hosts, cluster, record.id, from_start=True)
            monitor.attached(answers)
            finish(hosts, cluster, record, monitor, None, grace, reporter, stopped_by_user=True,
                   lost={m.key for m, _ in unreachable}, drain=drain)
            store.close()
            write_run_svg(record.dir, store, reporter)
        else:
            _, unreachable = attach(hosts, cluster, record.id, from_start=False)
            leftovers = stop_tasks(hosts, cluster, grace, skip={m.key for m, _ in unreachable})
            if leftovers:
                raise RunFailed("run %s: %s" % (record.id, "; ".join(leftovers)))
    if record.leftovers:
        raise RunFailed("run %s: tasks could not be stopped: %s"
                        % (record.id, "; ".join(record.leftovers)))
    reporter.note("run %s: %s; no task left running, ports free" % (
        record.id, record.state if was_active else "already ended (%s)" % record.state))
    return 0


def history(runs_dir, reporter=None):
    reporter = reporter or PlainReporter()
    records = runs.all_runs(runs_dir)
    if not records:
        reporter.note("no runs yet in %s" % runs_dir)
        return 0
    reporter.out("%-40s %-22s %-12s %-26s %s" % ("RUN", "EXAMPLE", "STATE", "CREATED", "TASKS"))
    for record in records:
        reporter.out("%-40s %-22s %-12s %-26s %d" % (
            record.id, record.example, record.state, record.created, len(record.tasks)))
    return 0


def stacks(runs_dir, run_id=None, reporter=None):
    """`tfcluster stacks`: every task's stacks of a running run, saved in its folder."""
    reporter = reporter or PlainReporter()
    record = pick(runs_dir, run_id, active_only=run_id is None)
    if not record.active:
        raise UsageError("run %s has ended (%s): its tasks have no stacks any more; "
                         "`tfcluster runs` lists the runs" % (record.id, record.state))
    cluster = cluster_from_record(record)
    with Hosts([m for m, _ in cluster.machines()]) as hosts:
        found, problems = take_stacks(hosts, cluster, record.id, record.dir)
    print_stacks(reporter, cluster, record.dir, found, problems)
    if not found:
        raise RunFailed("no stacks from any host of run %s" % record.id)
    return 0


def profile(runs_dir, run_id=None, duration=profiling.DEFAULT_DURATION, only=None,
            reporter=None, unsafe=False):
    """`tfcluster profile`: one trace of every task of a running run, in its profile/ folder."""
    reporter = reporter or PlainReporter()
    profiling.check_duration(duration)
    record = pick(runs_dir, run_id, active_only=run_id is None)
    cluster = cluster_from_record(record)
    tasks = profiling.parse_tasks(only, cluster)
    if not record.active:
        raise UsageError("run %s has ended (%s): only a running run can be profiled; "
                         "`tfcluster runs` lists the runs" % (record.id, record.state))
    if not unsafe:
        profiling.refuse_collectives(cluster, record.id, "--unsafe")
    with Hosts(list({t.machine.key: t.machine for t in tasks}.values())) as hosts:
        taken = profiling.take_profile(hosts, tasks, record.id, record.dir, duration)
    profiling.report_profile(reporter, taken, tasks)
    if not taken.traced:
        raise RunFailed("no task of run %s was traced" % record.id)
    return 0
