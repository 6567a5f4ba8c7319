"""The end of a run: stop every task on every machine in parallel, collect what was not streamed
(TensorBoard events), write the run's records and print the summary."""
import base64
import os
import signal
import stat
import threading

from tfcluster.runs import store as runs
from tfcluster.runs.store import write_private
from tfcluster.errors import RunFailed, RunInterrupted, RunTimedOut
from tfcluster.diagnosis import STALL, wording
from tfcluster.launch.monitor import TAIL_LINES, policy_met, serving_tasks
from tfcluster.runs.record import RunState, TaskState
from tfcluster.view.summary import print_summary
from tfcluster_agent import protocol as P
from tfcluster_agent.supervisor import group_is_ours
from tfcluster_agent.values import value_class

COLLECTED_FOLDERS = ("tensorboard",)
# `tfcluster drain HOST` writes the hosts (a JSON list) into the run folder, then sends the
# launcher this signal: it moves their tasks to spares after the termination notice.
DRAIN_HOSTS_FILE = "drain-hosts.json"
DRAIN_HOST_SIGNAL = signal.SIGUSR1
# What the launcher answers a drain it cannot do: {host: why} (the command waits for it).
DRAIN_REFUSED_FILE = "drain-refused.json"


def stop_tasks(hosts, cluster, grace, skip=(), drain=None, serving=()):
    """Stop every task of the run on every reachable machine; returns the leftovers, if any.
    DRAIN (a Drain): the tasks get the termination notice first, and its seconds to end, but
    for those of SERVING (labels: they serve the others and never end by themselves), which are
    stopped once the others have ended, since those may checkpoint through them."""
    leftovers = ["%s: unreachable, its tasks stop themselves when their lease runs out"
                 % m.label for m, _ in cluster.machines() if m.key in skip]
    tasks = [t for t in cluster.tasks if t.machine.key not in skip]
    if drain is None or not drain.seconds:
        return leftovers + _stop(hosts, tasks, grace, Drain())
    leftovers += _stop(hosts, [t for t in tasks if t.label not in serving], grace, drain)
    return leftovers + _stop(hosts, [t for t in tasks if t.label in serving], grace, Drain())


def _stop(hosts, tasks, grace, drain):
    """Stop TASKS, machine by machine in parallel: what could not be stopped."""
    def stop(link):
        mine = [t for t in tasks if t.machine.key == link.machine.key]
        return link.request(P.Stop(names=[t.name for t in mine],
                                   ports=[t.port for t in mine if t.port], grace=grace,
                                   drain=drain.seconds, reason=drain.reason),
                            timeout=drain.seconds + grace + 20, what="to stop its tasks")

    machines = list({t.machine.key: t.machine for t in tasks}.values())
    outcomes = hosts.each(stop, machines, timeout=drain.seconds + grace + 25)
    leftovers = []
    for machine in machines:
        if machine.key in outcomes.failed:
            leftovers.append("%s: could not stop tasks: %s" % (
                machine.label, outcomes.failed[machine.key].reason))
            continue
        answer = outcomes.succeeded[machine.key]
        if answer.remaining:
            leftovers.append("%s: still running: %s" % (machine.label, ", ".join(answer.remaining)))
        if answer.busy_ports:
            leftovers.append("%s: ports still busy: %s"
                             % (machine.label, ", ".join(map(str, answer.busy_ports))))
    return leftovers


def drain_note(drain, labels, serving, everyone=False):
    """What the drain (a Drain) of the tasks LABELS does, SERVING among them stopped after the
    others; EVERYONE: LABELS are the whole run."""
    servers = [label for label in labels if label in serving]
    noticed = [label for label in labels if label not in serving]
    if not noticed:
        return "stopping %s at once: %s the others, with nothing to checkpoint" % (
            wording.joined_labels(servers), "it serves" if len(servers) == 1 else "they serve")
    who = wording.joined_labels(noticed) if not everyone else \
        "every task but the servers" if servers else "every task"
    return "termination notice to %s (%s): they get %gs to checkpoint and end%s" % (
        who, drain.reason, drain.seconds,
        "; then %s, serving them, %s" % (wording.joined_labels(servers),
                                         "stops" if len(servers) == 1 else "stop")
        if servers else "")


@value_class(frozen=True)
class Drain:
    """A stop that begins with the termination notice (protocol.DRAIN_FILE): the tasks get
    SECONDS to checkpoint and end before they are stopped; REASON is what the notice says."""
    seconds: float = 0.0
    reason: str = ""


def launcher_following(record):
    """True while the launcher that RECORD names still runs, on this machine."""
    return bool(record.active and record.launcher) and group_is_ours(record.launcher)


def collect_files(hosts, cluster, record_dir, skip=()):
    """Copy the host run folders' TensorBoard events into the controller's run folder."""
    def collect(link):
        files = []
        link.request(P.Collect(folders=list(COLLECTED_FOLDERS)), timeout=120,
                     what="to send its files", collect=files)
        for item in files:
            local = safe_join(record_dir, item.path)
            os.makedirs(os.path.dirname(local), exist_ok=True)
            with open(local, "wb") as handle:
                handle.write(base64.b64decode(item.data))
        return len(files)

    machines = [m for m, _ in cluster.machines() if m.key not in skip]
    return hosts.each(collect, machines, timeout=150).reasons(machines)


def safe_join(folder, relative):
    """FOLDER/RELATIVE, refusing names that would leave FOLDER."""
    path = os.path.normpath(os.path.join(folder, relative))
    if os.path.isabs(relative) or not path.startswith(os.path.normpath(folder) + os.sep):
        raise ValueError("the agent sent a file outside the run folder: %r" % relative)
    return path


def finish(hosts, cluster, record, monitor, outcome, grace, reporter, stopped_by_user=False,
           lost=(), drain=None):
    """Stop everything (after the termination notice, with DRAIN), collect, record the end,
    print the summary; returns OUTCOME, or the failure that came before it (earliest_failure)."""
    monitor.diagnosis.teardown_began()  # tasks that end from here on may be ours to stop
    with signals_deferred(reporter):
        serving = [t.label for t in serving_tasks(cluster, record.success_policy)]
        if drain is not None and drain.seconds:
            reporter.note(drain_note(drain, [t.label for t in cluster.tasks], serving,
                                     everyone=True))
        leftovers = stop_tasks(hosts, cluster, grace, skip=lost, drain=drain, serving=serving)
        monitor.pump(0)
        problems = collect_files(hosts, cluster, record.dir, skip=lost)
        hosts.close()
        monitor.pump(0)
        monitor.close()
    outcome = earliest_failure(monitor.diagnosis, outcome)
    for line in leftovers + problems:
        reporter.note("WARNING " + line)
    try:
        record_end(cluster, record, monitor, outcome, stopped_by_user, leftovers, problems)
    except OSError as err:
        reporter.note("WARNING cannot write the run's records in %s: %s" % (
            record.dir, err.strerror or err))
    cause = outcome.cause if outcome is not None else None
    if cause is not None and cause.kind == STALL:
        reporter.note(wording.run_stalled(cause))
    print_summary(reporter, cluster, record, *monitor.diagnosis.report())
    if isinstance(outcome, RunFailed) and outcome.task is not None:
        reporter.note("last %d lines of %s:" % (TAIL_LINES, outcome.task.label))
        for line in monitor.tails[outcome.task.label]:
            reporter.out("    " + line)
    if outcome is not None:
        monitor.diagnosis.print_hints(record.dir, [task.log for task in record.tasks.values()
                                                   if task.state is TaskState.FAILED and task.log])
    reporter.note("logs and run.json in %s" % record.dir)
    return outcome


def earliest_failure(diagnosis, outcome):
    """OUTCOME, or the run's failure named by an earlier end heard after it (DIAGNOSIS:
    earlier_failure)."""
    if isinstance(outcome, RunFailed) and outcome.task is not None:
        earlier = diagnosis.earlier_failure(outcome.task)
        if earlier is not None:
            return RunFailed.of(earlier)
    return outcome


def record_end(cluster, record, monitor, outcome, stopped_by_user, leftovers, problems):
    """The run's end in run.json and every task's .status; an empty log for a silent task."""
    met = policy_met(cluster, monitor.states, record.success_policy)
    monitor.record_end(record)
    for task in cluster.tasks:
        log_path = os.path.join(record.dir, task.name + ".log")
        if not os.path.exists(log_path):
            write_private(log_path, "")  # it printed nothing: its log is there all the same
        code = record.tasks[task.label].exit
        if code is not None:
            write_private(os.path.join(record.dir, task.name + ".status"), "%d\n" % code)
    record.become((RunState.SUCCEEDED if met else RunState.STOPPED) if stopped_by_user
                  else end_state(outcome))
    record.ended, record.leftovers, record.collection_problems = runs.now(), leftovers, problems
    record.exit_code = ((0 if met else None) if stopped_by_user else
                        (0 if outcome is None else outcome.exit_code))
    if outcome is not None:
        record.failure = str(outcome)
    runs.save(record)


def end_state(outcome):
    if outcome is None:
        return RunState.SUCCEEDED
    if isinstance(outcome, RunTimedOut):
        return RunState.TIMED_OUT
    if isinstance(outcome, RunInterrupted):
        return RunState.INTERRUPTED
    return RunState.FAILED


# The signals that end a launch: Ctrl-C, a kill, and the launcher's terminal closing.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def silence_terminal():
    """After SIGHUP the terminal is gone and writing to it fails (EIO): the standard streams
    that were a terminal write to /dev/null from here on, so the teardown runs to its end. (A
    hung-up terminal is no longer a tty to isatty: a character device is what it still is.)"""
    null = None
    for fd in (1, 2):
        try:
            if not stat.S_ISCHR(os.fstat(fd).st_mode):
                continue
        except OSError:
            continue
        if null is None:
            null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, fd)
    if null is not None:
        os.close(null)


class signals_deferred:
    """Teardown is not interrupted by a second Ctrl-C; it is bounded by the stop grace anyway."""

    def __init__(self, reporter):
        self.reporter = reporter
        self.previous = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self.previous = {s: signal.signal(s, self._remind) for s in STOP_SIGNALS}
        return self

    def _remind(self, signum, frame):
        if signum == signal.SIGHUP:
            silence_terminal()
            return
        self.reporter.note("already stopping every task; please wait")

    def __exit__(self, *exc):
        for sig, handler in (self.previous or {}).items():
            signal.signal(sig, handler)
