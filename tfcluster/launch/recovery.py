"""How a launch recovers: a failed task restarted (--restarts), a lost machine's tasks moved to
a spare (docs/spares.md), the cluster rebuilt and the run record keeping both placements. A
mixin of launcher.Launch, whose state (cluster, spares, hosts, monitor, record, specs, options)
it works on."""
import json
import os
import time

from tfcluster.diagnosis import wording
from tfcluster.errors import RunFailed
from tfcluster.launch import sharing
from tfcluster.launch.monitor import serving_tasks
from tfcluster.launch.taskenv import task_specs
from tfcluster.launch.teardown import DRAIN_REFUSED_FILE, Drain, drain_note, stop_tasks
from tfcluster.runs import store as runs
from tfcluster.runs.record import MachineRecord, MoveEntry
from tfcluster.runs.store import host_run_dir
from tfcluster.spec.catalog import moves_whole
from tfcluster.spec.cluster import Cluster
from tfcluster_agent import protocol as P

SILENT_SECONDS = 3.0  # a machine this long silent may be lost: its peers' failures wait


class Recovery:
    def _restart(self, task, why):
        """Restart TASK (or the whole job) if --restarts allows; False when it does not."""
        if self.record.tasks[task.label].restarts >= self.options.restarts:
            return False
        whole = task.job in ("chief", "ps") or self.options.example.restart == "job"
        count = self.monitor.record_restart(self.record, task, why, whole)
        self.reporter.note("%s; restarting %s (restart %d of %d)" % (
            why, "every task from the last checkpoint" if whole else task.label,
            count, self.options.restarts))
        tasks = self.cluster.tasks if whole else [task]
        if whole:
            leftovers = stop_tasks(self.hosts, self.cluster, self.options.stop_grace)
            if leftovers:
                raise RunFailed("cannot restart the job: " + "; ".join(leftovers))
            self.monitor.pump(0)
        self._start_again(tasks, count)
        runs.save(self.record)
        return True

    def _start_again(self, tasks, count):
        """Start TASKS (of self.cluster) again, the COUNTth time."""
        labels = {t.label for t in tasks}
        for machine, mine in self.cluster.machines():
            # Programs may tell a restart from a first start (e.g. to skip a start barrier).
            specs = [self.specs[t.label].replace(env=dict(self.specs[t.label].env,
                                                          TFCLUSTER_RESTARTS=str(count))).to_json()
                     for t in mine if t.label in labels]
            if not specs:
                continue
            again = machine.key in self.started_on
            self.started_on.add(machine.key)
            self.hosts.link(machine).request(
                P.Start(run_dir=host_run_dir(machine, self.run_id), tasks=specs,
                        lease=self.options.lease, restart=again,
                        launch="" if again else self.launch_token),
                timeout=60, what="to %s %s" % ("restart" if again else "start",
                                               ", ".join(s["name"] for s in specs)))
        self.ps_deadline = time.monotonic() + self.options.start_timeout
        for restarted in tasks:
            self.failures_seen.pop(restarted.label, None)
            self.monitor.restarting(restarted)
            self.reporter.task_restarted(restarted, count)

    def _drain_hosts(self):
        """Move the tasks of the hosts `tfcluster drain HOST` named to spares, after the
        termination notice; a host that runs no task of the run, or no spare left, is said."""
        asked, self.drain_hosts = self.drain_hosts, []
        refused = {}
        for label in asked:
            machine = next((m for m, _ in self.cluster.machines()
                            if label in (m.label, m.address)), None)
            if machine is None:
                refused[label] = "no task of this run runs there"
            elif not self._move([machine], "drained by tfcluster drain %s" % label,
                                drain=Drain(self.options.drain_grace, "tfcluster drain %s"
                                            % label)):
                refused[label] = "no spare left to take its tasks; they go on there"
        for label, why in refused.items():
            self.reporter.note("drain %s: %s" % (label, why))
        if refused:  # `tfcluster drain HOST` waits for the move or this answer
            runs.replace_private(os.path.join(self.record.dir, DRAIN_REFUSED_FILE),
                                 json.dumps(refused))  # read while written: whole or none

    def _move(self, machines, why, drain=None):
        """Move the tasks of lost MACHINES to spares and start them there (every task again,
        from the last checkpoint, when the example's `move` or a moved chief or ps asks it);
        False when too few spares are left. DRAIN: the tasks stopped get the termination
        notice first (a drained host: they checkpoint before they move)."""
        if len(self.spares) < len(machines):
            return False
        before, cluster, moves = self.cluster, self.cluster, []
        for machine in machines:
            spare = sharing.place_spare(cluster, self.spares.pop(0))
            labels = [t.label for t in cluster.tasks if t.machine.key == machine.key]
            cluster = cluster.moved(machine.key, spare)
            moves.append((machine, spare, labels))
            link = self.hosts.links.get(machine.key)
            if link is not None:
                link.detaching = True  # no more pings: its lease ends what still runs there
        moved = [t for t in cluster.tasks if any(t.label in labels for _, _, labels in moves)]
        whole = moves_whole(self.options.example, self.options.user_args, self.options.smoke) \
            or any(t.job in ("chief", "ps") for t in moved)
        # A machine lost by its failures still answers: what runs there stops first.
        silent = self._silent(machines)
        reachable = Cluster([t for t in before.tasks if t.label in {m.label for m in moved}
                             and t.machine.key not in silent])
        stopping = before if whole else reachable
        serving = {t.label for t in serving_tasks(before, self.options.example.success)}
        if drain is not None:
            self.reporter.note(drain_note(drain, [t.label for t in stopping.tasks], serving))
        leftovers = [line for line in stop_tasks(self.hosts, stopping, self.options.stop_grace,
                                                 skip=silent, drain=drain, serving=serving)
                     if "unreachable" not in line] if stopping.tasks else []
        if leftovers:
            raise RunFailed("cannot move the tasks to a spare: " + "; ".join(leftovers))
        self.monitor.pump(0)
        self.cluster = cluster
        self.monitor.placed(cluster)
        self.specs = task_specs(cluster, self.options, self.run_id, self.threads)
        self._record_moves(before, cluster, moves, why, whole)
        count = len(self.record.restart_log) + len(self.record.moves)  # TFCLUSTER_RESTARTS
        for machine, spare, labels in moves:
            self.reporter.note(wording.moved(machine.label, spare.label, labels, whole,
                                             time.time(), drained=drain is not None))
        self._start_again(cluster.tasks if whole else moved, count)
        if not whole:
            self._tell_new_cluster(cluster, moved)
        runs.save(self.record)
        return True

    def _tell_new_cluster(self, cluster, moved):
        """The tasks that go on learn where the moved ones are (their CLUSTER_FILE): a
        ParameterServerStrategy chief hands the new addresses to its coordinator. A machine that
        cannot be told is said: its tasks keep the old addresses."""
        labels = {t.label for t in moved}
        staying = [m for m, mine in cluster.machines() if any(t.label not in labels for t in mine)]
        told = self.hosts.each(lambda link: link.request(
            P.NewCluster(cluster=cluster.jobs()), timeout=30, what="to tell of the new cluster"),
            staying, timeout=40)
        for line in told.reasons(staying):
            self.reporter.note("not told of the new cluster: " + line)

    def _machine_silent(self):
        """True while a machine of the run has said nothing for SILENT_SECONDS (its agent pings
        every second) but is not lost yet."""
        limit = time.monotonic() - SILENT_SECONDS
        keys = {m.key for m, _ in self.cluster.machines()}
        return any(link.hello is not None and link.last_heard < limit
                   for key, link in self.hosts.links.items() if key in keys)

    def _heard_since_failure(self, task):
        """True once TASK's machine has said something after the launch first saw TASK fail:
        the ends that machine found in the same look are heard by then (its ps's, which may
        be the cause), and a machine whose link ends a moment after its task was killed (a
        reboot, a power cut) is a lost machine, whose tasks move, and not a task failure."""
        seen = self.failures_seen.setdefault(task.label, time.monotonic())
        return self.hosts.link(task.machine).last_heard > seen

    def _silent(self, machines):
        """The keys of MACHINES whose agents do not answer."""
        lost = {m.key for m in self.monitor.lost_machines(self.options.lost_contact)}
        return {m.key for m in machines if m.key in lost}

    def _record_moves(self, before, after, moves, why, whole):
        record = self.record
        known = {m.key for m in record.machines}
        for machine, spare, labels in moves:
            if spare.key not in known:
                record.machines.append(MachineRecord(spare.to_dict(), {}))
            record.moves.append(MoveEntry(
                lost=machine.label, spare=spare.label, tasks=labels, why=why,
                scope="job" if whole else "task", time=runs.now(),
                cluster_before=before.jobs(), cluster_after=after.jobs()))
        for task in after.tasks:
            entry = record.tasks[task.label]
            entry.machine, entry.port = task.machine.key, task.port
            entry.address = task.address if task.port else None
            entry.host_run_dir = host_run_dir(task.machine, self.run_id)
            entry.command = self.specs[task.label].command
        record.cluster, record.cluster_spec = after.jobs(), after.cluster_spec_string()
