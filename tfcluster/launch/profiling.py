"""TensorFlow's profiler across a run: `tfcluster profile RUN` and `launch --profile-at STEP`.

Each machine's agent starts a profiler server in its tasks (tfcluster_agent/profiler.py, through
the hook every task's Python loads); then the agent of one machine, the first task's, traces
them all at once and sends the files back into runs/ID/profile/, the folder `tfcluster
tensorboard RUN` serves to the profile plugin. A task that cannot be traced is named, with why.
"""
import base64
import json
import os
import threading
import time

from tfcluster.errors import UsageError
from tfcluster.hosts.fanout import Hosts
from tfcluster.runs.store import host_run_dir, write_private
from tfcluster_agent.profiler import ProfileFiles, StartProfilers, TraceProfile

DEFAULT_DURATION = 2.0
MIN_DURATION = 0.1
MAX_DURATION = 600.0
START_TIMEOUT = 60.0


def parse_tasks(text, cluster):
    """The cluster's tasks named by `job:i,job:i` (None or "": all); UsageError for others."""
    if not text:
        return list(cluster.tasks)
    by_label = {t.label: t for t in cluster.tasks}
    chosen = []
    for label in (part.strip() for part in text.split(",")):
        if label not in by_label:
            raise UsageError("--tasks: this run has no task %r; its tasks are %s" % (
                label, ", ".join(by_label)))
        if by_label[label] not in chosen:
            chosen.append(by_label[label])
    return chosen


def check_duration(seconds):
    if not MIN_DURATION <= seconds <= MAX_DURATION:
        raise UsageError("--duration %g is out of range: give %g to %g seconds"
                         % (seconds, MIN_DURATION, MAX_DURATION))
    return seconds


def trains_with_collectives(cluster):
    """True for several tasks and no ps: the shape of MultiWorkerMirroredStrategy, whose
    all-reduces TensorFlow's profiler can crash (refuse_collectives)."""
    jobs = [t.job for t in cluster.tasks]
    return len(jobs) > 1 and "ps" not in jobs


def refuse_collectives(cluster, run_id, flag):
    """UsageError for a trace of a run that trains with collectives, unless FLAG was given.
    When a trace ends, TensorFlow's host tracer merges each collective's start and end events,
    recorded on two threads, through pointers into buffers it has copied and freed meanwhile
    (tsl TraceMeRecorder::Consume): the traced task aborts ('free(): invalid pointer') in some
    of its traces. The tracer cannot be turned off for a remote trace (its options are ignored)."""
    if trains_with_collectives(cluster):
        raise UsageError(
            "run %s trains with collective ops (%d tasks, no ps): TensorFlow's profiler can "
            "crash such a task when its trace ends (docs/profile.md); add %s to trace it anyway"
            % (run_id, len(cluster.tasks), flag))


def check_profile_at(cluster, options, run_id):
    """launch --profile-at: refused, before anything starts, for a run of CLUSTER that trains
    with collectives unless --profile-unsafe was given."""
    if options.profile_at is not None and not options.profile_unsafe:
        refuse_collectives(cluster, run_id, "--profile-unsafe")


class Profile:
    """One trace's outcome: FOLDER (in the run record), TRACED {label: file}, and PROBLEMS
    {label: why it has no trace}."""

    def __init__(self, folder):
        self.folder = folder
        self.traced = {}
        self.problems = {}
        self.window = None  # [asked, written]: the trace's wall-clock seconds on the tracer


def start_servers(hosts, tasks, run_id):
    """({label: "host:port" of its profiler server}, {label: why none})."""
    machines = {}
    for task in tasks:
        if task.port:
            machines.setdefault(task.machine.key, (task.machine, []))[1].append(task)

    def start(link):
        mine = machines[link.machine.key][1]
        return link.request(StartProfilers(run_dir=host_run_dir(link.machine, run_id),
                                           ports={t.name: t.port for t in mine}),
                            timeout=START_TIMEOUT, what="to start the profilers").report

    outcomes = hosts.each(start, [m for m, _ in machines.values()], timeout=START_TIMEOUT + 10)
    servers, problems = {}, {}
    for task in tasks:
        if not task.port:
            problems[task.label] = "it runs no TensorFlow server"
            continue
        if task.machine.key in outcomes.failed:
            problems[task.label] = outcomes.failed[task.machine.key].reason
            continue
        answer = outcomes.succeeded[task.machine.key]["profilers"].get(task.name) or {}
        if "port" in answer:
            servers[task.label] = "%s:%d" % (task.machine.tf_host, answer["port"])
        else:
            problems[task.label] = answer.get("error") or "its agent did not answer for it"
    return servers, problems


def trace_file_task(path, servers):
    """The label whose server wrote the trace file PATH (TensorFlow names it HOST_PORT.*)."""
    base = os.path.basename(path)
    for label, address in servers.items():
        host, _, port = address.rpartition(":")
        if base.startswith("%s_%s." % (host, port)):
            return label
    return None


def take_profile(hosts, tasks, run_id, record_dir, duration):
    """Start the servers, trace them all for DURATION seconds, keep the files: a Profile."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    profile = Profile(os.path.join(record_dir, "profile", stamp))
    servers, profile.problems = start_servers(hosts, tasks, run_id)
    if not servers:
        write_index(profile, servers)
        return profile
    by_label = {t.label: t for t in tasks}
    tracer = by_label[next(iter(servers))].machine
    link = hosts.link(tracer)
    timeout = duration + 240  # the client's TensorFlow import, and the files' way back
    try:
        answer = link.request(TraceProfile(
            run_dir=host_run_dir(tracer, run_id), python=tracer.python,
            addresses=list(servers.values()), duration_ms=int(duration * 1000), stamp=stamp),
            timeout=timeout, what="to send the trace").report
    except Exception as err:  # the one trace is lost: every task says why
        for label in servers:
            profile.problems[label] = "the trace from %s failed: %s" % (tracer.label, err)
        write_index(profile, servers)
        return profile
    files = dict(answer.get("files", {}))
    where = {}  # label -> why its host's files could not be brought
    if not answer.get("error"):
        files.update(other_hosts_files(hosts, tasks, servers, tracer, run_id, stamp, where))
    for relpath, data in files.items():
        parts = relpath.split("/")
        if ".." in parts or parts[:2] != ["profile", stamp]:
            continue  # only the files of this trace, inside its folder
        path = os.path.join(record_dir, *parts)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as out:
            out.write(base64.b64decode(data))
        label = trace_file_task(path, servers)
        if label is not None and path.endswith(".xplane.pb"):
            profile.traced[label] = path
    for label, why in where.items():
        if label not in profile.traced:
            profile.problems[label] = why
    for label in servers:
        if label not in profile.traced:
            profile.problems[label] = answer.get("error") or "its server sent no trace"
    profile.window = answer.get("window")
    write_index(profile, servers)
    return profile


def other_hosts_files(hosts, tasks, servers, tracer, run_id, stamp, where):
    """The files each traced host other than TRACER wrote: a profiler server writes its trace
    on its own host, under the folder the client named (the tracer's). A host whose run folder
    is elsewhere kept them outside its run folder: WHERE says so for its tasks."""
    folder = "%s/profile/%s" % (host_run_dir(tracer, run_id), stamp)
    machines, problems = {}, {}
    for task in tasks:
        machine = task.machine
        if task.label not in servers or machine.key == tracer.key:
            continue
        if host_run_dir(machine, run_id) != host_run_dir(tracer, run_id):
            problems[task.label] = ("its profiler server wrote its trace on %s in %s, outside "
                                    "the run folder there" % (machine.label, folder))
            continue
        machines.setdefault(machine.key, (machine, []))[1].append(task.label)

    def collect(link):
        return link.request(ProfileFiles(run_dir=host_run_dir(link.machine, run_id),
                                         folder=folder),
                            timeout=120, what="to send its trace files").report["files"]

    outcomes = hosts.each(collect, [m for m, _ in machines.values()], timeout=130)
    files = {}
    for key, (machine, labels) in machines.items():
        if key in outcomes.failed:
            for label in labels:
                problems[label] = "its trace files did not come from %s: %s" % (
                    machine.label, outcomes.failed[key].reason)
        else:
            files.update(outcomes.succeeded[key])
    where.update(problems)
    return files


INDEX = "tasks.json"


def write_index(profile, servers):
    """PROFILE's folder/tasks.json: each task's profiler server and trace file (with the
    trace's window: when it was asked for and when the files were written, wall-clock seconds
    on the tracing host), or why it has none."""
    index = {}
    for label in sorted(set(servers) | set(profile.traced) | set(profile.problems)):
        entry = {"server": servers.get(label)}
        if label in profile.traced:
            entry["trace"] = os.path.relpath(profile.traced[label], profile.folder)
            entry["window"] = profile.window
        else:
            entry["problem"] = profile.problems.get(label)
        index[label] = entry
    os.makedirs(profile.folder, exist_ok=True)
    write_private(os.path.join(profile.folder, INDEX), json.dumps(index, indent=1) + "\n")


def report_profile(reporter, profile, tasks):
    """One line for the traces' folder, one per task that has none, with why."""
    if profile.traced:
        reporter.note("profile of %d task(s) in %s (`tfcluster tensorboard` shows it)"
                      % (len(profile.traced), profile.folder))
    for task in tasks:
        if task.label in profile.problems:
            reporter.note("%s: not traced: %s" % (task.label, profile.problems[task.label]))


class ProfileAt:
    """`launch --profile-at STEP`: one trace of every task, once a task reported STEP. It is
    taken in a thread, over agent links of its own (the launch's links carry the run's events
    and their requests' replies), so the launch goes on following the run meanwhile."""

    def __init__(self, step, cluster, run_id, record_dir, reporter,
                 duration=DEFAULT_DURATION):
        self.step, self.cluster, self.run_id = step, cluster, run_id
        self.record_dir, self.reporter, self.duration = record_dir, reporter, duration
        self.thread = None

    def poll(self, latest):
        """LATEST: {label: its newest metrics point}; starts the trace at the step."""
        if self.thread is not None or self.step is None:
            return
        steps = [p.get("step") for p in latest.values() if isinstance(p.get("step"), int)]
        if not steps or max(steps) < self.step:
            return
        self.reporter.note("step %d reached: tracing every task for %gs (--profile-at)"
                           % (max(steps), self.duration))
        self.thread = threading.Thread(target=self._take, daemon=True)
        self.thread.start()

    def _take(self):
        tasks = list(self.cluster.tasks)
        try:
            with Hosts([m for m, _ in self.cluster.machines()]) as hosts:
                taken = take_profile(hosts, tasks, self.run_id, self.record_dir, self.duration)
        except Exception as err:  # the run goes on without its profile
            self.reporter.note("--profile-at: no profile: %s" % err)
            return
        report_profile(self.reporter, taken, tasks)

    def wait(self, seconds):
        if self.thread is not None:
            self.thread.join(seconds)

    def finish(self):
        """At the run's end: say when the step never came or the trace was still under way."""
        if self.step is None:
            return
        if self.thread is None:
            self.reporter.note("--profile-at %d: no task reported that step; no profile taken"
                               % self.step)
        elif self.thread.is_alive():
            self.reporter.note("--profile-at %d: the run ended before its trace was taken"
                               % self.step)
