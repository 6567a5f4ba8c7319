"""Launch a cluster: preflight → ps → workers → stream → decide → stop → collect → record.

One shutdown event: the first task failure, SIGINT, SIGTERM and --timeout all lead to the same
teardown, and no process of the run stays on any host.
"""
import collections
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field

from tfcluster import runs
from tfcluster.catalog import task_command, trainers_dir
from tfcluster.errors import (PreflightError, RunFailed, RunInterrupted, RunTimedOut,
                              TfclusterError, UsageError)
from tfcluster.hosts import HostError, Hosts, encode
from tfcluster.inventory import JOBS
from tfcluster.spec import build_cluster

TRACKED_JOBS = ("chief", "worker")
POLL_SECONDS = 0.5
TAIL_LINES = 20
LOST_CONTACT_SECONDS = 30
DEFAULT_FINISH_GRACE = 30.0


@dataclass(frozen=True)
class LaunchOptions:
    example: object
    runs_dir: str = "runs"
    run_id: str | None = None
    detach: bool = False
    timeout: float | None = None
    user_args: tuple = ()
    smoke: bool = False
    counts: dict = field(default_factory=dict)
    intra_op_threads: int | None = None
    inter_op_threads: int | None = None
    start_timeout: float = 60.0
    finish_grace: float | None = None
    stop_grace: float = 10.0
    resume: str | None = None
    lease: float = 60.0
    cwd: str | None = None
    env: dict = field(default_factory=dict)


def out(message=""):
    print(message, flush=True)


def note(message):
    print("tfcluster: " + message, flush=True)


def host_run_dir(machine, run_id):
    return machine.workdir.rstrip("/") + "/" + run_id


# ---------------------------------------------------------------- preflight

def preflight(hosts, cluster, expect_code=True):
    """Check every machine in parallel; returns {machine key: report}; raises PreflightError."""
    controller_hash = _controller_code_hash()

    def check(session):
        ports = ",".join(str(t.port) for t in cluster.tasks
                         if t.machine.key == session.machine.key and t.port)
        return session.agent("preflight", "--python", session.machine.python, "--ports", ports,
                             "--code-dir", session.machine.root.rstrip("/") + "/trainers",
                             timeout=session.machine.connect_timeout + 150)

    machines = [m for m, _ in cluster.machines()]
    outcomes = hosts.each(check, machines, timeout=max(m.connect_timeout for m in machines) + 170)
    problems, reports = [], {}
    for machine in machines:
        report = outcomes[machine.key]
        if isinstance(report, Exception):
            reason = report.reason if isinstance(report, HostError) else str(report)
            reports[machine.key] = {"error": reason}
            problems.append("%s: %s" % (machine.label, reason))
            continue
        reports[machine.key] = report
        if not report.get("python_ok"):
            problems.append("%s: %s" % (machine.label, report.get("error")))
        busy = [p for p, free in report.get("ports", {}).items() if not free]
        if busy:
            problems.append("%s: port(s) %s already in use: stop what uses them (`tfcluster stop`) "
                            "or set tfcluster_port_base" % (machine.label, ", ".join(busy)))
        if expect_code and report.get("code_hash") != controller_hash and not _runs_this_checkout(machine):
            problems.append("%s: its trainer code differs from this checkout's: rerun "
                            "ansible-playbook playbooks/deploy.yml" % machine.label)
    versions = {r.get("tf_version") for r in reports.values() if r.get("tf_version")}
    if len(versions) > 1:
        listing = ", ".join("%s=%s" % (m.label, reports[m.key].get("tf_version"))
                            for m in machines if reports[m.key].get("tf_version"))
        problems.append("TensorFlow versions differ (%s): deploy the same version everywhere"
                        % listing)
    return reports, problems


def print_preflight(cluster, reports, controller_hash=None):
    controller_hash = controller_hash or _controller_code_hash()
    out("%-22s %-9s %-10s %-5s %-5s %-12s %s" % ("HOST", "REACHED", "TF", "CPUS", "GPUS", "PORTS",
                                                  "CODE"))
    for machine, tasks in cluster.machines():
        report = reports.get(machine.key, {})
        if "error" in report and "python_ok" not in report:
            out("%-22s %-9s %s" % (machine.label, "no", report["error"]))
            continue
        ports = report.get("ports", {})
        busy = [p for p, free in ports.items() if not free]
        code = report.get("code_hash")
        out("%-22s %-9s %-10s %-5s %-5s %-12s %s" % (
            machine.label, "yes", report.get("tf_version") or "MISSING", report.get("cpus", "?"),
            len(report.get("gpus", [])),
            ("busy " + ",".join(busy)) if busy else "%d free" % len(ports),
            "same" if code == controller_hash or _runs_this_checkout(machine)
            else ("stale" if code else "missing")))


def _runs_this_checkout(machine):
    """A local slot whose code is this very checkout cannot be stale."""
    return machine.is_local and os.path.realpath(os.path.join(machine.root, "trainers")) == \
        os.path.realpath(trainers_dir())


def _controller_code_hash():
    sys.path.insert(0, os.path.dirname(trainers_dir()))
    from trainers import agent
    return agent.code_hash(trainers_dir())


def check_hosts(cluster):
    """`tfcluster check`: the preflight alone, with a per-host table."""
    hosts = Hosts([m for m, _ in cluster.machines()])
    try:
        reports, problems = preflight(hosts, cluster)
    finally:
        hosts.close()
    print_preflight(cluster, reports)
    if problems:
        raise PreflightError("preflight failed: " + "; ".join(problems))
    note("all %d host(s) ready" % len(reports))


# ---------------------------------------------------------------- task specs

def thread_plan(cluster, reports, options):
    """Intra/inter-op threads per task: a fair share of the machine's cores."""
    plan = {}
    for machine, tasks in cluster.machines():
        cpus = int(reports.get(machine.key, {}).get("cpus") or os.cpu_count() or 1)
        share = max(1, cpus // len(tasks))
        for task in tasks:
            # Two inter-op threads at least: ParameterServerStrategy deadlocks with one.
            plan[task.label] = (options.intra_op_threads or share, options.inter_op_threads or 2)
    return plan


def task_specs(cluster, options, run_id, threads):
    specs = {}
    example = options.example
    for task in cluster.tasks:
        machine = task.machine
        run_dir = host_run_dir(machine, run_id)
        checkpoint_dir = host_run_dir(machine, options.resume or run_id) + "/checkpoints"
        command = task_command(example, cluster, task, run_dir, checkpoint_dir,
                               options.user_args, options.smoke)
        intra, inter = threads[task.label]
        env = {"TF_CONFIG": _json(cluster.tf_config(task)),
               "TF_NUM_INTRAOP_THREADS": str(intra), "TF_NUM_INTEROP_THREADS": str(inter),
               "OMP_NUM_THREADS": str(intra), "PYTHONUNBUFFERED": "1",
               "TFCLUSTER_RUN_ID": run_id, "TFCLUSTER_TASK": task.label,
               "TFCLUSTER_RUN_DIR": run_dir}
        env.update(options.env)
        if task.cuda_visible_devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = task.cuda_visible_devices
        if example.name == "custom":
            cwd = options.cwd or (os.getcwd() if machine.is_local else machine.root)
        else:
            cwd = run_dir
        specs[task.label] = {
            "name": task.name, "label": task.label, "command": command, "env": env, "cwd": cwd,
            "env_prepend": {"PATH": os.path.dirname(machine.python), "PYTHONPATH": machine.root},
        }
    return specs


def _json(obj):
    import json
    return json.dumps(obj, separators=(",", ":"))


# ---------------------------------------------------------------- streaming

class Poller:
    """Polls every machine's agent; prints new log lines prefixed with task and host."""

    def __init__(self, hosts, cluster, run_id, echo=True, prefix=True):
        self.hosts = hosts
        self.cluster = cluster
        self.run_id = run_id
        self.echo = echo
        self.prefix = prefix
        self.offsets = {t.name: 0 for t in cluster.tasks}
        self.states = {}
        self.tails = {t.label: collections.deque(maxlen=TAIL_LINES) for t in cluster.tasks}
        self.listening = {}
        self.last_contact = {m.key: time.monotonic() for m, _ in cluster.machines()}
        self._partial = {}

    def poll(self, listening_ports=None, only=None):
        machines = [m for m, tasks in self.cluster.machines()
                    if only is None or any(t in only for t in tasks)]

        def call(session):
            names = {t.name: self.offsets[t.name] for t in self.cluster.tasks
                     if t.machine.key == session.machine.key}
            ports = ",".join(str(p) for p in (listening_ports or {}).get(session.machine.key, []))
            return session.agent("poll", "--dir", host_run_dir(session.machine, self.run_id),
                                 "--offsets", encode(names), "--listening", ports, timeout=30)

        outcomes = self.hosts.each(call, machines, timeout=40)
        for machine in machines:
            answer = outcomes[machine.key]
            if isinstance(answer, Exception):
                continue
            self.last_contact[machine.key] = time.monotonic()
            self.listening.update({(machine.key, int(p)): v
                                   for p, v in answer.get("listening", {}).items()})
            for task in self.cluster.tasks:
                if task.machine.key != machine.key or task.name not in answer["tasks"]:
                    continue
                if only is not None and task not in only:
                    continue
                state = answer["tasks"][task.name]
                self.offsets[task.name] = state.pop("offset")
                self._emit(task, state.pop("log"))
                self.states[task.label] = state
        return outcomes

    def _emit(self, task, text):
        if not text:
            return
        prefix = "[%s %s] " % (task.label, task.machine.address) if self.prefix else ""
        for line in text.splitlines():
            self.tails[task.label].append(line)
            if self.echo:
                out(prefix + line)

    def out_of_contact(self):
        limit = time.monotonic() - LOST_CONTACT_SECONDS
        return [m for m, _ in self.cluster.machines() if self.last_contact[m.key] < limit]


# ---------------------------------------------------------------- the run

class Launch:
    def __init__(self, cluster, options, inventory):
        self.cluster = cluster
        self.options = options
        self.inventory = inventory
        self.run_id = options.run_id or runs.new_run_id(options.example.name)
        self.record = runs.create(options.runs_dir, runs.check_run_id(self.run_id))
        self.hosts = Hosts([m for m, _ in cluster.machines()])
        self.poller = Poller(self.hosts, cluster, self.run_id)
        self.stop_event = threading.Event()
        self.stop_reason = None
        self.started = False

    # -- signals: one shutdown event
    def _on_signal(self, signum, frame):
        if not self.started:
            raise KeyboardInterrupt
        if self.stop_reason is None:
            self.stop_reason = signal.Signals(signum).name
            note("%s received: stopping every task (wait for the teardown)" % self.stop_reason)
        self.stop_event.set()

    def run(self):
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            return self._run()
        except KeyboardInterrupt:
            raise RunInterrupted("interrupted before any task started; nothing to stop") from None
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.hosts.close()

    def _run(self):
        options = self.options
        note("run %s: %s on %d task(s), %d host(s)" % (
            self.run_id, options.example.name, len(self.cluster.tasks), len(self.cluster.machines())))
        reports, problems = preflight(self.hosts, self.cluster,
                                      expect_code=options.example.name != "custom")
        print_preflight(self.cluster, reports)
        if problems:
            raise PreflightError("preflight failed, nothing started: " + "; ".join(problems))
        specs = task_specs(self.cluster, options, self.run_id,
                           thread_plan(self.cluster, reports, options))
        self._write_record(reports, specs)
        outcome = crash = None
        try:
            self.started = True
            self._start([t for t in self.cluster.tasks if t.job == "ps"], specs)
            self._wait_for_ps()
            self._start([t for t in self.cluster.tasks if t.job != "ps"], specs)
            self.record.data.update(state="running", started=runs.now())
            self.record.save()
            if options.detach:
                note("run %s is running in the background: `tfcluster status %s`, "
                     "`tfcluster logs %s --follow`, `tfcluster stop %s`"
                     % ((self.run_id,) * 4))
                return 0
            outcome = self._monitor()
        except TfclusterError as err:
            outcome = err
        except BaseException as err:
            # A bug of ours still tears the run down; its traceback surfaces afterwards.
            outcome = RunFailed("tfcluster failed while the run was active: %r" % err)
            crash = err
        finally:
            if outcome is not None or not options.detach:
                finish(self.hosts, self.cluster, self.record, self.poller, outcome,
                       options.stop_grace)
        if crash is not None:
            raise crash
        if outcome is not None:
            raise outcome
        return 0

    def _write_record(self, reports, specs):
        machines = {m.key: m for m, _ in self.cluster.machines()}
        self.record.data.update(
            id=self.run_id, example=self.options.example.name, state="starting",
            created=runs.now(), inventory=os.path.abspath(self.inventory),
            success_policy=self.options.example.success, smoke=self.options.smoke,
            user_args=list(self.options.user_args), detach=self.options.detach,
            cluster=self.cluster.jobs(), cluster_spec=self.cluster.cluster_spec_string(),
            code_hash=_controller_code_hash(),
            machines=[dict(m.to_dict(), tf_version=reports[k].get("tf_version"),
                           hostname=reports[k].get("hostname"), cpus=reports[k].get("cpus"),
                           gpus=reports[k].get("gpus"))
                      for k, m in machines.items()],
            tasks={t.label: dict(t.to_dict(), name=t.name, command=specs[t.label]["command"],
                                 host_run_dir=host_run_dir(t.machine, self.run_id),
                                 env={k: v for k, v in specs[t.label]["env"].items()},
                                 state="pending", exit=None)
                   for t in self.cluster.tasks})
        self.record.save()

    def _start(self, tasks, specs):
        if not tasks:
            return
        by_machine = {}
        for task in tasks:
            by_machine.setdefault(task.machine.key, []).append(specs[task.label])
        lease = 0 if self.options.detach else self.options.lease

        def start(session):
            payload = encode({"tasks": by_machine[session.machine.key], "lease": lease})
            return session.agent("start", "--dir", host_run_dir(session.machine, self.run_id),
                                 "--spec", payload, timeout=60)

        machines = [m for m, _ in self.cluster.machines() if m.key in by_machine]
        outcomes = self.hosts.each(start, machines, timeout=90)
        for task in tasks:
            answer = outcomes[task.machine.key]
            if isinstance(answer, Exception):
                raise RunFailed("could not start %s: %s" % (task.label, answer))
            self.record.data["tasks"][task.label].update(pid=answer["started"].get(task.name),
                                                         state="running")
            note("started %s on %s (pid %s)" % (task.label, task.machine.address,
                                                answer["started"].get(task.name)))
        self.record.save()

    def _wait_for_ps(self):
        ps = [t for t in self.cluster.tasks if t.job == "ps"]
        if not ps:
            return
        ports = {}
        for task in ps:
            ports.setdefault(task.machine.key, []).append(task.port)
        deadline = time.monotonic() + self.options.start_timeout
        while True:
            self.poller.poll(ports)
            for task in ps:
                if not self.poller.states.get(task.label, {}).get("alive", True):
                    raise RunFailed("%s exited before it listened on %s"
                                    % (task.label, task.address), task=task)
            if all(self.poller.listening.get((t.machine.key, t.port)) for t in ps):
                note("ps task(s) listening: %s" % ", ".join(t.address for t in ps))
                return
            if time.monotonic() > deadline:
                raise RunFailed("ps task(s) not listening after %gs (raise --start-timeout)"
                                % self.options.start_timeout)
            if self.stop_event.wait(POLL_SECONDS):
                raise RunInterrupted("interrupted by %s" % self.stop_reason)

    def _finish_grace(self):
        """How long other workers may go on once the policy is met. When a real chief
        succeeded, the workers only served it (ParameterServerStrategy): stop them at once."""
        if self.options.finish_grace is not None:
            return self.options.finish_grace
        if self.options.example.success == "chief" and self.cluster.job_tasks("chief"):
            return 0.0
        return DEFAULT_FINISH_GRACE

    def _monitor(self):
        options = self.options
        deadline = time.monotonic() + options.timeout if options.timeout else None
        policy_met_at = None
        while True:
            self.poller.poll()
            failed = first_failure(self.cluster, self.poller.states)
            if failed:
                task, message = failed
                return RunFailed(message, task=task)
            lost = self.poller.out_of_contact()
            if lost:
                return RunFailed("lost contact with %s for %ds" % (
                    ", ".join(m.label for m in lost), LOST_CONTACT_SECONDS))
            if policy_met_at is None and policy_met(self.cluster, self.poller.states,
                                                    options.example.success):
                policy_met_at = time.monotonic()
                note("success policy %s met" % options.example.success)
            if policy_met_at is not None:
                running = [t for t in tracked(self.cluster)
                           if self.poller.states.get(t.label, {}).get("alive")]
                if not running:
                    return None
                if time.monotonic() - policy_met_at > self._finish_grace():
                    note("stopping %s: still running %gs after the run succeeded"
                         % (", ".join(t.label for t in running), self._finish_grace()))
                    return None
            if deadline and time.monotonic() > deadline:
                return RunTimedOut("the run exceeded --timeout %gs" % options.timeout)
            if self.stop_event.wait(POLL_SECONDS):
                return RunInterrupted("interrupted by %s" % self.stop_reason)


def tracked(cluster):
    return [t for t in cluster.tasks if t.job in TRACKED_JOBS]


def policy_tasks(cluster, policy):
    chief = cluster.job_tasks("chief")
    workers = cluster.job_tasks("worker")
    if policy == "chief":
        return chief[:1] or workers[:1]
    if policy == "worker0":
        return workers[:1] or chief[:1]
    return chief + workers


def policy_met(cluster, states, policy):
    return all(states.get(t.label, {}).get("exit") == 0 for t in policy_tasks(cluster, policy))


def first_failure(cluster, states):
    """A tracked task that failed, or a ps that ended (workers would hang without it)."""
    for task in cluster.tasks:
        state = states.get(task.label)
        if not state or state.get("alive"):
            continue
        code = state.get("exit")
        if task.job in TRACKED_JOBS and code != 0:
            return task, "%s on %s %s" % (task.label, task.machine.address, describe_exit(state))
        if task.job == "ps":
            return task, "%s on %s ended while the run was active (%s)" % (
                task.label, task.machine.address, describe_exit(state))
    return None


def describe_exit(state):
    if state.get("state") == "lost":
        return "disappeared without an exit status"
    code = state.get("exit")
    if code is not None and code > 128:
        try:
            return "was killed by %s" % signal.Signals(code - 128).name
        except ValueError:
            pass
    return "exited with status %s" % code


# ---------------------------------------------------------------- teardown, collection, summary

def stop_tasks(hosts, cluster, run_id, grace):
    """Stop every task of the run on every machine; returns the leftovers, if any."""
    def stop(session):
        mine = [t for t in cluster.tasks if t.machine.key == session.machine.key]
        return session.agent("stop", "--dir", host_run_dir(session.machine, run_id),
                             "--names", ",".join(t.name for t in mine),
                             "--ports", ",".join(str(t.port) for t in mine if t.port),
                             "--grace", str(grace), timeout=grace + 60)

    outcomes = hosts.each(stop, [m for m, _ in cluster.machines()], timeout=grace + 90)
    leftovers = []
    for machine, _ in cluster.machines():
        answer = outcomes[machine.key]
        if isinstance(answer, Exception):
            leftovers.append("%s: could not stop tasks: %s" % (machine.label, answer))
            continue
        if answer["remaining"]:
            leftovers.append("%s: still running: %s" % (machine.label, ", ".join(answer["remaining"])))
        if answer["busy_ports"]:
            leftovers.append("%s: ports still busy: %s"
                             % (machine.label, ", ".join(map(str, answer["busy_ports"]))))
    return leftovers


def collect_logs(hosts, cluster, record):
    """Copy every task's log and exit record into the controller's run folder."""
    os.makedirs(record.dir, exist_ok=True)

    def fetch(session):
        remote_dir = host_run_dir(session.machine, record.id)
        names = session.agent("files", "--dir", remote_dir)["files"]
        for name in names:
            session.get(remote_dir + "/" + name, os.path.join(record.dir, name))
        return names

    outcomes = hosts.each(fetch, [m for m, _ in cluster.machines()], timeout=300)
    problems = []
    for machine, _ in cluster.machines():
        if isinstance(outcomes[machine.key], Exception):
            problems.append("%s: %s" % (machine.label, outcomes[machine.key]))
    return problems


def finish(hosts, cluster, record, poller, outcome, grace, stopped_by_user=False):
    """Stop everything, collect logs, record the end, print the summary."""
    with _signals_deferred():
        poller.poll()
        leftovers = stop_tasks(hosts, cluster, record.id, grace)
        poller.poll()
        problems = collect_logs(hosts, cluster, record)
    for line in leftovers + problems:
        note("WARNING " + line)
    met = policy_met(cluster, poller.states, record.get("success_policy", "all_workers"))
    state = ("succeeded" if met else "stopped") if stopped_by_user else _end_state(outcome)
    tasks = record.data.setdefault("tasks", {})
    for task in cluster.tasks:
        entry = tasks.setdefault(task.label, {})
        st = poller.states.get(task.label, {})
        log_path = os.path.join(record.dir, task.name + ".log")
        entry.update(exit=st.get("exit"), state=_task_state(task, st), log=task.name + ".log")
        if os.path.exists(log_path):
            with open(log_path, errors="replace") as handle:
                result = runs.results_from_log(handle.read())
            if result is not None:
                record.data.setdefault("results", {})[task.label] = result
    record.data.update(state=state, ended=runs.now(), leftovers=leftovers,
                       collection_problems=problems,
                       exit_code=(0 if met else None) if stopped_by_user else
                       (0 if outcome is None else outcome.exit_code))
    if outcome is not None:
        record.data["failure"] = str(outcome)
    record.save()
    print_summary(cluster, record)
    if isinstance(outcome, RunFailed):
        failed = outcome.task
        if failed is not None:
            note("last %d lines of %s:" % (TAIL_LINES, failed.label))
            for line in _tail(record, failed, poller):
                out("    " + line)
    note("logs and run.json in %s" % record.dir)


def _end_state(outcome):
    if outcome is None:
        return "succeeded"
    if isinstance(outcome, RunTimedOut):
        return "timed_out"
    if isinstance(outcome, RunInterrupted):
        return "interrupted"
    return "failed"


def _task_state(task, state):
    if not state:
        return "not started"
    if state.get("state") == "lost":
        return "lost"
    code = state.get("exit")
    if code == 0:
        return "succeeded"
    if task.job == "ps" and code is not None and code >= 128:
        return "stopped"
    if code is not None and code in (128 + signal.SIGTERM, 128 + signal.SIGKILL):
        return "stopped"
    return "failed"


def _tail(record, task, poller):
    path = os.path.join(record.dir, task.name + ".log")
    if os.path.exists(path):
        with open(path, errors="replace") as handle:
            return handle.read().splitlines()[-TAIL_LINES:]
    return list(poller.tails[task.label])


class _signals_deferred:
    """Teardown is not interrupted by a second Ctrl-C; it is bounded by the stop grace anyway."""

    def __enter__(self):
        if threading.current_thread() is not threading.main_thread():
            self.previous = None
            return self
        self.previous = {s: signal.signal(s, self._remind) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    @staticmethod
    def _remind(signum, frame):
        note("already stopping every task; please wait")

    def __exit__(self, *exc):
        for sig, handler in (self.previous or {}).items():
            signal.signal(sig, handler)


SUMMARY_KEYS = ("accuracy", "test_accuracy", "final_xent", "final_cost", "loss", "global_step",
                "train_time_s", "examples_per_s")


def print_summary(cluster, record):
    results = record.get("results", {})
    keys = [k for k in SUMMARY_KEYS if any(k in r for r in results.values())]
    header = "%-12s %-18s %-11s %-5s" % ("TASK", "HOST", "STATE", "EXIT")
    out()
    out(header + "".join(" %14s" % k for k in keys))
    for task in cluster.tasks:
        entry = record["tasks"].get(task.label, {})
        row = "%-12s %-18s %-11s %-5s" % (task.label, task.machine.address, entry.get("state"),
                                          "-" if entry.get("exit") is None else entry.get("exit"))
        result = results.get(task.label, {})
        row += "".join(" %14s" % _fmt(result.get(k)) for k in keys)
        out(row)
    out("run %s %s" % (record.id, record.get("state")))


def _fmt(value):
    if value is None:
        return "-"
    if isinstance(value, float):
        return "%.0f" % value if abs(value) >= 1000 else "%.4g" % value
    return str(value)


def launch(inventory_path, options, load_slots):
    """Build the cluster for OPTIONS.example from the inventory and run it."""
    slots = load_slots(inventory_path)
    example = options.example
    if example.name == "custom":
        counts = dict(options.counts)
    else:
        counts = {job: example.topology.get(job, 0) for job in JOBS}
        counts.update(options.counts)
    have = {s.job for s in slots}
    for job, wanted in counts.items():
        if wanted and job not in have:
            raise UsageError("inventory %s has no [%s] group but %s needs %s %s task(s): add one"
                             % (inventory_path, job, example.name, wanted, job))
    cluster = build_cluster(slots, counts, example.task_per_gpu)
    if not cluster.job_tasks("worker") and not cluster.job_tasks("chief"):
        raise UsageError("inventory %s has no [worker] or [chief] hosts: nothing would train"
                         % inventory_path)
    return Launch(cluster, options, inventory_path).run()
