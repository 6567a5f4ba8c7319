"""Launch a cluster: preflight → start every task at once → follow → decide → stop → record.

One shutdown event: the first task failure, a lost machine, SIGINT, SIGTERM and --timeout all lead
to the same teardown, and no process of the run stays on any host.
"""
import json
import os
import shutil
import signal
import threading
import time

from tfcluster.gpus import claims as gpuqueue
from tfcluster.runs import provenance, store as runs
from tfcluster.launch import fencing, proxy, sharing
from tfcluster.errors import (PreflightError, RunFailed, RunInterrupted, RunStalled,
                              RunTimedOut, TfclusterError, UsageError)
from tfcluster.hosts.fanout import Hosts
from tfcluster.runs.metrics import MetricsStore, efficiency_lines
from tfcluster.launch.monitor import Monitor, chief_trains_alone, policy_met, tracked
from tfcluster.launch.recovery import Recovery
from tfcluster.launch.plan import launch_counts, make_cluster
from tfcluster.launch.profiling import ProfileAt, check_profile_at
from tfcluster.view.diff import rerun_warnings
from tfcluster.view.plot import write_run_svg
from tfcluster.launch.preflight import (check_checkpoint_folder, check_spares,
                                        controller_code_hash, preflight, print_preflight)
from tfcluster.runs.record import RECORDED_FACTS, MachineRecord, RunState, TaskRecord
from tfcluster.diagnosis import wording
from tfcluster.spec.catalog import code_root
from tfcluster.view.report import PlainReporter
from tfcluster.launch.taskenv import data_needs, task_specs, thread_plan
from tfcluster.runs.store import host_run_dir, write_task_records
from tfcluster.launch.teardown import (DRAIN_HOST_SIGNAL, DRAIN_HOSTS_FILE, STOP_SIGNALS, Drain,
                                       finish, silence_terminal)
from tfcluster_agent import protocol as P
from tfcluster_agent.supervisor import boot_id, start_time
from tfcluster_agent.values import replace

DEFAULT_FINISH_GRACE = 30.0
WAKE_SECONDS = 0.25  # deadlines are checked at least this often; events wake the loop at once
DRAIN_SIGNALS = ("SIGTERM", "SIGHUP")


class Launch(Recovery):
    def __init__(self, cluster, options, inventory, reporter=None, hosts=None):
        self.cluster = cluster
        self.options = options
        self.inventory = inventory
        self.reporter = reporter or PlainReporter()
        self.run_id = options.run_id or runs.new_run_id(options.example.name)
        check_profile_at(cluster, options, self.run_id)
        self.record = runs.create(options.runs_dir, runs.check_run_id(self.run_id))
        # Spares get no task at the start; the rebuilt clusters of gpus/ and sharing keep theirs.
        self.spares = list(cluster.spares)
        self.hosts = hosts or Hosts([m for m, _ in cluster.machines()] + self.spares)
        self.monitor = None
        self.stop_event = threading.Event()
        self.stop_reason = None
        self.started = False
        self.drain_hosts = []  # labels `tfcluster drain HOST` asked for, not yet moved
        self.failures_seen = {}  # task label: when the launch first saw it fail

    # -- signals: one shutdown event
    def _on_signal(self, signum, frame):
        if signum == signal.SIGHUP:
            silence_terminal()  # closed: nobody reads it any more
        if not self.started:
            raise KeyboardInterrupt
        if self.stop_reason is None:
            self.stop_reason = signal.Signals(signum).name
            self.reporter.note("%s received: %s every task (wait for the teardown)" % (
                self.stop_reason, "draining" if self._drain() else "stopping"))
        self.stop_event.set()
        if self.monitor is not None:
            self.monitor.wake()

    def _on_drain_host(self, signum, frame):
        try:
            with open(os.path.join(self.record.dir, DRAIN_HOSTS_FILE)) as handle:
                self.drain_hosts += [h for h in json.load(handle) if isinstance(h, str)]
            os.remove(os.path.join(self.record.dir, DRAIN_HOSTS_FILE))
        except (OSError, ValueError, TypeError):
            return
        if self.monitor is not None:
            self.monitor.wake()

    def run(self):
        previous = {s: signal.signal(s, self._on_signal) for s in STOP_SIGNALS}
        previous[DRAIN_HOST_SIGNAL] = signal.signal(DRAIN_HOST_SIGNAL, self._on_drain_host)
        try:
            with runs.private_files():
                return self._run()
        except KeyboardInterrupt:
            raise RunInterrupted("interrupted before any task started; nothing to stop") from None
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.hosts.close()

    def _run(self):
        options = self.options
        self.reporter.new_run()
        self.reporter.note("run %s: %s on %d task(s), %d host(s)" % (
            self.run_id, options.example.name, len(self.cluster.tasks),
            len(self.cluster.machines())))
        check_checkpoint_folder(options.runs_dir, options.resume, self.run_id)
        checkout = provenance.Checkout(code_root())  # git answers while the hosts do
        rerun_of = options.rerun_of and runs.load(options.runs_dir, options.rerun_of)
        # Every training task on a GPU machine gets free, healthy GPUs of its own, claimed for
        # this run (with --wait, once they are free); the others see none.
        reports, self.cluster = gpuqueue.secure(
            self, lambda: preflight(self.hosts, self.cluster,
                                    expect_code=options.example.name != "custom",
                                    data_needs=data_needs(self.cluster, options)),
            lambda found: print_preflight(self.reporter, self.cluster, found))
        self.cluster = sharing.place_run_folders(self.cluster, reports)
        for line in fencing.unfenced_warnings(self.cluster, reports) + provenance.package_warnings(
                [m for m, _ in self.cluster.machines()], reports):
            self.reporter.note("warning: " + line)
        self.spares, left_out = check_spares(self.hosts, self.spares)
        for line in left_out:
            self.reporter.note("warning: " + line)
        self.threads = thread_plan(self.cluster, reports, options)
        specs = self.specs = task_specs(self.cluster, options, self.run_id, self.threads)
        gpuqueue.hand_claims(specs, self.cluster, reports)
        proxies = proxy.exempt_cluster(specs, self.cluster, reports, options.env)
        if proxies:
            self.reporter.note(proxies)
        try:
            self._write_record(reports, specs, checkout)
            # Again once this run is on record: of two launches that resume one run at once,
            # at least one sees the other.
            check_checkpoint_folder(options.runs_dir, options.resume, self.run_id)
        except (OSError, PreflightError) as err:
            shutil.rmtree(self.record.dir, ignore_errors=True)
            if isinstance(err, PreflightError):
                raise
            raise UsageError("cannot write the run's records in %s: %s: free some space or pass "
                             "another --runs-dir; nothing was started" % (
                                 self.record.dir, err.strerror or err)) from None
        if rerun_of:
            for line in rerun_warnings(rerun_of, self.record):
                self.reporter.note("warning: " + line)
        self.metrics = MetricsStore(self.record.dir)
        self.profile_at = None
        self.monitor = Monitor(self.hosts, self.cluster, self.record.dir, self.reporter,
                               metrics=self.metrics)
        self.monitor.diagnosis.configure(reports, options.straggler_after)
        outcome = crash = None
        lost = set()
        try:
            self.started = True
            self._start(specs)
            if options.detach:
                self._wait_for_pids()
                self.reporter.note("run %s is running in the background: `tfcluster status %s`, "
                                   "`tfcluster logs %s --follow`, `tfcluster stop %s`"
                                   % ((self.run_id,) * 4))
                self.hosts.close(detach=True)
                self.monitor.close()
                return 0
            self.hosts.start_pinging()
            self.monitor.diagnosis.watch_stalls(self.record, options.stall_after)
            outcome, lost = self._follow()
        except TfclusterError as err:
            outcome = err
        except BaseException as err:
            # A bug of ours still tears the run down; its traceback surfaces afterwards.
            outcome = RunFailed("tfcluster failed while the run was active: %r" % err)
            crash = err
        finally:
            if outcome is not None or not options.detach:
                outcome = finish(self.hosts, self.cluster, self.record, self.monitor, outcome,
                                 options.stop_grace, self.reporter, lost={m.key for m in lost},
                                 drain=self._drain())
            self.metrics.close()
            write_run_svg(self.record.dir, self.metrics, self.reporter)
            if self.profile_at is not None:
                self.profile_at.finish()
        if crash is not None:
            raise crash
        if outcome is not None:
            raise outcome
        return 0

    def _drain(self):
        """The Drain of a launch that SIGTERM or SIGHUP ends (a kill, a closed terminal): the
        tasks checkpoint before they are stopped. Ctrl-C and failures stop at once (None)."""
        if self.stop_reason in DRAIN_SIGNALS:
            return Drain(self.options.drain_grace, self.stop_reason)
        return None

    def _write_record(self, reports, specs, checkout):
        record, options = self.record, self.options
        record.become(RunState.STARTING)
        record.example, record.created = options.example.name, runs.now()
        record.checkpoints_of = options.resume or self.run_id
        if not options.detach:
            record.launcher = {"pid": os.getpid(), "start": start_time(os.getpid()),
                               "boot": boot_id()}
        record.inventory = os.path.abspath(self.inventory)
        record.success_policy, record.smoke = options.example.success, options.smoke
        record.user_args, record.detach = list(options.user_args), options.detach
        record.cluster, record.cluster_spec = self.cluster.jobs(), self.cluster.cluster_spec_string()
        record.code_hash = controller_code_hash()
        record.machines = [MachineRecord(m.to_dict(), {k: getattr(reports[m.key], k)
                                                        for k in RECORDED_FACTS})
                           for m, _ in self.cluster.machines()]
        record.tasks = {t.label: TaskRecord(
            job=t.job, index=t.index, slot=t.slot, machine=t.machine.key, port=t.port,
            address=t.address if t.port else None, cuda_visible_devices=t.cuda_visible_devices,
            name=t.name, command=specs[t.label].command,
            host_run_dir=host_run_dir(t.machine, self.run_id),
            env_names=sorted(specs[t.label].env),
            intra_op_threads=int(specs[t.label].env["TF_NUM_INTRAOP_THREADS"]))
            for t in self.cluster.tasks}
        record.provenance = provenance.make(checkout, options.command_line, specs,
                                            set(options.env), reports.values(), options.rerun_of)
        runs.save(record)
        if checkout.diff:
            runs.write_private(os.path.join(record.dir, provenance.DIFF_FILE), checkout.diff)
        write_task_records(record.dir, self.cluster,
                           {label: spec.public_json() for label, spec in specs.items()})

    def _start(self, specs):
        """Every task of every machine at once: TensorFlow clients wait for their servers."""
        lease = 0 if self.options.detach else self.options.lease
        machines = [m for m, _ in self.cluster.machines()]
        run_dirs = {m.key: host_run_dir(m, self.run_id) for m in machines}
        launch = self.launch_token = sharing.launch_token(self.cluster)

        def start(link):
            mine = [specs[t.label].to_json() for t in self.cluster.tasks
                    if t.machine.key == link.machine.key]
            return link.request(P.Start(run_dir=run_dirs[link.machine.key], tasks=mine,
                                        lease=lease, launch=launch), timeout=60,
                                what="to start its tasks")

        self.started_on = {m.key for m in machines}  # a spare's agent starts its tasks fresh
        failed = self.hosts.each(start, machines, timeout=70).reasons(machines)
        if failed:
            raise RunFailed("could not start the tasks on " + failed[0])

    def _wait_for_pids(self, seconds=15):
        deadline = time.monotonic() + seconds
        while len(self.monitor.started_at) < len(self.cluster.tasks) and \
                time.monotonic() < deadline:
            self.monitor.pump(WAKE_SECONDS)
        self.monitor.record_started(self.record)

    def _finish_grace(self):
        """How long other workers may go on once the policy is met. When a real chief
        succeeded, the workers only served it (ParameterServerStrategy): stop them at once."""
        if self.options.finish_grace is not None:
            return self.options.finish_grace
        if chief_trains_alone(self.cluster, self.options.example.success):
            return 0.0
        return DEFAULT_FINISH_GRACE

    def _follow(self):
        """Wait on the agents' events until the run is decided; returns (outcome, lost machines)."""
        options, monitor, cluster = self.options, self.monitor, self.cluster
        now = time.monotonic()
        deadline = now + options.timeout if options.timeout else None
        self.ps_deadline = now + options.start_timeout
        ps_tasks = cluster.job_tasks("ps")
        policy_met_at = None
        pids_recorded = False
        profile_at = self.profile_at = ProfileAt(options.profile_at, cluster, self.run_id,
                                                 self.record.dir, self.reporter)
        while True:
            monitor.pump(WAKE_SECONDS)
            profile_at.poll(self.metrics.latest())
            if not pids_recorded and len(monitor.started_at) == len(cluster.tasks):
                pids_recorded = True
                self.monitor.record_started(self.record)
            if monitor.write_error is not None:
                return RunFailed("cannot write the logs in %s: %s" % (
                    self.record.dir, monitor.write_error)), []
            stalled = monitor.diagnosis.stalled()
            if stalled is not None and options.on_stall == "stop":
                return RunStalled(str(stalled), cause=stalled), []
            monitor.diagnosis.straggling()
            if self.drain_hosts:
                self._drain_hosts()
                cluster, ps_tasks = self.cluster, self.cluster.job_tasks("ps")
            # The tasks of a lost machine end with it: the machine's loss is decided first.
            lost = monitor.lost_machines(options.lost_contact, [m.key for m in self.spares])
            for spare in [m for m in self.spares if m in lost]:
                self.spares.remove(spare)
                self.reporter.note("warning: spare %s left out: %s" % (spare.label, (
                    wording.machine_silent([spare.label], options.lost_contact))))
            lost = [m for m in lost if m.key in {k.key for k, _ in cluster.machines()}]
            if lost:
                why = wording.machine_silent([m.label for m in lost], options.lost_contact)
                if self._move(lost, why):
                    cluster = self.cluster
                    ps_tasks = cluster.job_tasks("ps")
                    continue
                return RunFailed(wording.no_spare_left(
                    wording.joined_labels([m.label for m in lost]), why)), lost
            failed = monitor.diagnosis.failure()
            if failed and not self._heard_since_failure(failed.task):
                continue  # the ends its machine sent with it (a ps's) are heard first
            if failed and self.spares and self._machine_silent():
                continue  # a task fails first when its machine goes: the loss may decide yet
            if failed and self._restart(failed.task, str(failed)):
                continue
            if failed and options.restarts and self._move([failed.task.machine], (
                    wording.failed_on_machine(failed.task.label, failed.task.machine.label,
                                              self.record.tasks[failed.task.label].restarts + 1))):
                continue
            if failed:
                return RunFailed.of(monitor.diagnosis.failed(failed.task)), []
            waiting = [t for t in ps_tasks if t.label not in monitor.listening]
            if waiting and time.monotonic() > self.ps_deadline:
                return RunFailed(wording.never_listened([t.label for t in waiting],
                                                        options.start_timeout),
                                 task=waiting[0]), []
            if policy_met_at is None and policy_met(cluster, monitor.states,
                                                    options.example.success):
                policy_met_at = time.monotonic()
                self.reporter.note("success policy %s met" % options.example.success)
            if policy_met_at is not None:
                running = [t for t in tracked(cluster) if monitor.unfinished(t)]
                if not running:
                    return None, []
                if time.monotonic() - policy_met_at > self._finish_grace():
                    self.reporter.note("stopping %s: still running %gs after the run succeeded"
                                       % (", ".join(t.label for t in running),
                                          self._finish_grace()))
                    return None, []
            if deadline and time.monotonic() > deadline:
                return RunTimedOut(wording.timed_out(options.timeout),
                                   cause=monitor.diagnosis.still_stalled()), []
            if self.stop_event.is_set():
                return RunInterrupted(wording.interrupted(self.stop_reason),
                                      cause=monitor.diagnosis.still_stalled()), []


def launch(inventory_path, options, load_slots, reporter=None, planned=None):
    """Build the cluster for OPTIONS.example from the inventory and run it. PLANNED: (cluster,
    Hosts whose local agents are starting) made for it already, before this module's imports."""
    if planned is not None:
        cluster, hosts = planned
        return Launch(cluster, options, inventory_path, reporter, hosts=hosts).run()
    slots = load_slots(inventory_path)
    example = options.example
    counts = launch_counts(example, options.counts)
    cluster = make_cluster(inventory_path, slots, counts, example, options.spares)
    if not options.baseline:
        return Launch(cluster, options, inventory_path, reporter).run()
    # --baseline: the same example with a single training task first, then the cluster.
    reporter = reporter or PlainReporter()
    run_id = options.run_id or runs.new_run_id(example.name)
    check_profile_at(cluster, options, run_id)  # refused before the baseline runs
    single = dict(counts, worker=1 if counts.get("worker", 1) else 0, evaluator=0)
    if single["worker"]:
        single["chief"] = 0 if example.success != "chief" else counts.get("chief", 0)
    reporter.note("--baseline: first %s as a single training task" % example.name)
    Launch(make_cluster(inventory_path, slots, single, example),
           replace(options, run_id=run_id + "-baseline", baseline=False),
           inventory_path, reporter).run()
    base = runs.load(options.runs_dir, run_id + "-baseline")
    code = Launch(cluster, replace(options, run_id=run_id, baseline=False), inventory_path,
                  reporter).run()
    main = runs.load(options.runs_dir, run_id)
    for line in efficiency_lines(base, main):
        reporter.out(line)
    return code
