"""Runs after launch: status, logs, stop, history. They work from run.json alone, so they also work
after the launcher was killed or when it ran with --detach."""
import os
import time

from tfcluster import runs
from tfcluster.errors import RunFailed
from tfcluster.hosts import Hosts
from tfcluster.inventory import Machine
from tfcluster.launcher import (POLL_SECONDS, Poller, finish, note, out, policy_met, tracked)
from tfcluster.spec import Cluster, Task


def cluster_from_record(record):
    machines = {m["address"] + ":%s:%s" % (m["ssh_port"], m["user"]): Machine(**{
        k: v for k, v in m.items() if k in Machine.__dataclass_fields__})
        for m in record.get("machines", [])}
    tasks = []
    for label, entry in record.get("tasks", {}).items():
        machine = next(m for m in machines.values() if m.address == entry["host"])
        tasks.append(Task(entry["job"], entry["index"], entry["slot"], machine, entry["port"],
                          entry.get("cuda_visible_devices")))
    return Cluster(tasks)


def pick(runs_dir, run_id, active_only=False):
    return runs.load(runs_dir, run_id) if run_id else runs.latest(runs_dir, active_only)


def status(runs_dir, run_id=None):
    record = pick(runs_dir, run_id)
    cluster = cluster_from_record(record)
    states = {}
    if record.active:
        hosts = Hosts([m for m, _ in cluster.machines()])
        try:
            poller = Poller(hosts, cluster, record.id, echo=False)
            poller.offsets = {t.name: 1 << 62 for t in cluster.tasks}  # states only, no log text
            poller.poll()
            states = poller.states
        finally:
            hosts.close()
    out("run %s (%s) %s, created %s" % (record.id, record.get("example"), record.get("state"),
                                        record.get("created")))
    out("%-12s %-18s %-8s %-12s %s" % ("TASK", "HOST", "PID", "STATE", "EXIT"))
    for task in cluster.tasks:
        entry = record["tasks"][task.label]
        live = states.get(task.label)
        state = live["state"] if live else entry.get("state")
        code = live["exit"] if live else entry.get("exit")
        out("%-12s %-18s %-8s %-12s %s" % (task.label, task.machine.address, entry.get("pid", "-"),
                                           state, "-" if code is None else code))
    if record.active and states:
        if policy_met(cluster, states, record.get("success_policy", "all_workers")):
            note("training finished; stop the parameter servers with `tfcluster stop %s`"
                 % record.id)
        elif not any(states.get(t.label, {}).get("alive") for t in tracked(cluster)):
            note("no worker is running any more; `tfcluster stop %s` collects the logs" % record.id)
    return 0


def logs(runs_dir, run_id, task_label=None, follow=False):
    record = pick(runs_dir, run_id)
    cluster = cluster_from_record(record)
    chosen = [cluster.find(task_label)] if task_label else cluster.tasks
    if not record.active:
        for task in chosen:
            path = os.path.join(record.dir, task.name + ".log")
            if not os.path.exists(path):
                note("no log for %s in %s" % (task.label, record.dir))
                continue
            with open(path, errors="replace") as handle:
                for line in handle.read().splitlines():
                    out(("[%s %s] " % (task.label, task.machine.address) if len(chosen) > 1 else "")
                        + line)
        return 0
    hosts = Hosts([m for m, _ in cluster.machines()])
    try:
        poller = Poller(hosts, cluster, record.id, prefix=len(chosen) > 1)
        while True:
            poller.poll(only=chosen)
            if not follow or not any(poller.states.get(t.label, {}).get("alive") for t in chosen):
                return 0
            time.sleep(POLL_SECONDS)
    except KeyboardInterrupt:
        return 0
    finally:
        hosts.close()


def stop(runs_dir, run_id=None, grace=10.0):
    """Stop every task of a run (idempotent), collect its logs and close its record."""
    record = pick(runs_dir, run_id, active_only=run_id is None)
    cluster = cluster_from_record(record)
    was_active = record.active
    hosts = Hosts([m for m, _ in cluster.machines()])
    try:
        poller = Poller(hosts, cluster, record.id, echo=False)
        finish_state = None
        if was_active:
            poller.poll()
            finish(hosts, cluster, record, poller, None, grace, stopped_by_user=True)
            finish_state = record.get("state")
        else:
            from tfcluster.launcher import stop_tasks
            leftovers = stop_tasks(hosts, cluster, record.id, grace)
            if leftovers:
                raise RunFailed("run %s: %s" % (record.id, "; ".join(leftovers)))
    finally:
        hosts.close()
    if record.get("leftovers"):
        raise RunFailed("run %s: tasks could not be stopped: %s"
                         % (record.id, "; ".join(record["leftovers"])))
    note("run %s: %s; no task left running, ports free" % (
        record.id, finish_state or "already ended (%s)" % record.get("state")))
    return 0


def history(runs_dir):
    records = runs.all_runs(runs_dir)
    if not records:
        note("no runs yet in %s" % runs_dir)
        return 0
    out("%-40s %-22s %-12s %-26s %s" % ("RUN", "EXAMPLE", "STATE", "CREATED", "TASKS"))
    for record in records:
        out("%-40s %-22s %-12s %-26s %d" % (record.id, record.get("example"), record.get("state"),
                                            record.get("created"), len(record.get("tasks", {}))))
    return 0
