"""Stalled runs on the controller: the agents' Stalled events on the console, the stacks of
every task of the run (`tfcluster stacks RUN`, and at once when a task stalls), the cause in one
line (tfcluster/diagnosis/stacks.py), a Cause of kind STALL that the launcher stops the run on
with --on-stall stop.

The agents watch (tfcluster_agent/stall.py); the controller only asks them to, per machine, for
the training tasks: a ps idles by design and is never stalled by itself.
"""
import os
import time

from tfcluster.diagnosis import STALL, Cause, wording
from tfcluster.runs.store import host_run_dir, write_private
from tfcluster.spec.cluster import TRAINING_JOBS

# The agent's stall watch and stacks.py are imported by the functions that use them: `tfcluster
# status` and `runs` import this module and need neither.

DEFAULT_STALL_AFTER = 120.0
WAITING = "CreateSession"  # in StallFollower.stalled: stalled by its repeated wait lines


def take_stacks(hosts, cluster, run_id, record_dir):
    """({label: text}, [problems]): every task's stacks, saved in RECORD_DIR/stacks/NAME.txt."""
    from tfcluster_agent.stall import DUMP_SECONDS, TakeStacks

    def take(link):
        mine = [t.name for t in cluster.tasks if t.machine.key == link.machine.key]
        return link.request(TakeStacks(run_dir=host_run_dir(link.machine, run_id), names=mine),
                            timeout=DUMP_SECONDS + 20, what="to send the stacks").report

    machines = [m for m, _ in cluster.machines()]
    outcomes = hosts.each(take, machines, timeout=DUMP_SECONDS + 60)
    stacks = {}
    os.makedirs(os.path.join(record_dir, "stacks"), exist_ok=True)
    for machine, tasks in cluster.machines():
        answer = outcomes.succeeded.get(machine.key, {})
        for task in tasks:
            text = answer.get("stacks", {}).get(task.name)
            if text is not None:
                stacks[task.label] = text
                write_private(os.path.join(record_dir, "stacks", task.name + ".txt"), text)
    return stacks, outcomes.reasons(machines)


def print_stacks(reporter, cluster, record_dir, stacks, problems):
    from tfcluster.diagnosis.stacks import blocked_for_tensorflow, innermost, main_thread
    for problem in problems:
        reporter.note(wording.no_stacks_from(problem))
    if not stacks:
        return
    reporter.note(wording.stacks_in(os.path.join(record_dir, "stacks")))
    width = max(len(t.label) for t in cluster.tasks)
    for task in cluster.tasks:
        if task.label in stacks:
            reporter.out("  %-*s  %s" % (width, task.label, innermost(main_thread(
                stacks[task.label]))))
            blocked = blocked_for_tensorflow(stacks[task.label])
            if blocked:
                reporter.out("  %-*s  %s" % (width, "", wording.blocked_thread_line(
                    blocked.what, innermost(list(blocked.frames)))))


class StallFollower:
    """A launch's stalls: the agents' events on the console, the stacks and the cause once the
    stalls of one moment have all come in. WAITS: the run's SessionWaits (causes.py), whose
    CreateSession waits stall a task too."""

    def __init__(self, hosts, cluster, record, monitor, reporter, stall_after, waits):
        self.hosts, self.cluster, self.record = hosts, cluster, record
        self.monitor, self.reporter, self.waits = monitor, reporter, waits
        self.stall_after = {t.label: stall_after if stall_after is not None
                            else t.machine.stall_after for t in cluster.tasks}
        self.stalled = {}         # label -> its Stalled event
        self.diagnosed = set()    # the stalled labels the last cause covered
        self.due = None           # when to take the stacks: stalls seen together settle first
        self.cause = None         # the last Cause named, while the tasks are still stalled

    def watch(self):
        """Ask every machine's agent to watch its training tasks; a machine whose
        stall_after is 0 is not watched."""
        from tfcluster_agent.stall import WatchStalls
        for machine, tasks in self.cluster.machines():
            mine = [t for t in tasks if t.job in TRAINING_JOBS and self.stall_after[t.label]]
            if mine:
                self.hosts.link(machine).send(WatchStalls(
                    names=[t.name for t in mine], stall_after=self.stall_after[mine[0].label]))

    def settle_seconds(self):
        """Another agent may see its own tasks stall up to one look later."""
        from tfcluster_agent.stall import poll_interval
        return max(poll_interval(s) for s in self.stall_after.values() if s) + 1.0

    def event(self, task, msg):
        """An agent's Stalled or Resumed event about TASK."""
        if msg.kind == "stalled" and task.label in self.monitor.results:
            return  # it reported its result: quiet while TensorFlow shuts down, not a hang
        if msg.kind == "stalled":
            self.stalled[task.label] = msg
            self.reporter.note(wording.stalled_quietly(task.label, msg.seconds, msg.cpu))
            self.reporter.task_stalled(task, True)
            if self.due is None:
                self.due = time.monotonic() + self.settle_seconds()
        elif self.stalled.pop(task.label, None) is not None:
            self.reporter.note(wording.resumed(task.label, msg.why, msg.seconds))
            self.reporter.task_stalled(task, False)
            self.diagnosed.discard(task.label)
            if not self.stalled:
                self.cause = None

    def _waits(self):
        """A TF1 task that prints nothing but `CreateSession still waiting` for stall_after is
        stalled too: those lines keep its log growing, so its agent never calls it quiet."""
        now = time.monotonic()
        waiting = self.waits.waiting
        for label, (since, peer) in waiting.items():
            task = self.cluster.find(label)
            if task.job in TRAINING_JOBS and self.stall_after[label] and \
                    label not in self.stalled and now - since >= self.stall_after[label]:
                self.stalled[label] = WAITING
                self.reporter.note(wording.stalled_waiting(label, now - since, peer))
                self.reporter.task_stalled(task, True)
                if self.due is None:
                    self.due = now + self.settle_seconds()
        for label in [l for l, why in self.stalled.items() if why is WAITING and l not in waiting]:
            self.stalled.pop(label)
            self.reporter.note(wording.resumed(label, "output"))
            self.reporter.task_stalled(self.cluster.find(label), False)
            self.diagnosed.discard(label)
            if not self.stalled:
                self.cause = None

    def check(self):
        """Take the stacks and name the cause once the stalls settled: a Cause of kind STALL
        for the tasks stalled now, once; else None."""
        self._waits()
        if self.due is None or time.monotonic() < self.due:
            return None
        self.due = None
        stalled = {label for label in self.stalled
                   if self.monitor.alive(self.cluster.find(label))}
        if stalled <= self.diagnosed:
            return None
        self.diagnosed = stalled
        stacks, problems = take_stacks(self.hosts, self.cluster, self.record.id, self.record.dir)
        print_stacks(self.reporter, self.cluster, self.record.dir, stacks, problems)
        # Tasks that ended while their stacks were taken (a success among them) stalled no run.
        self.monitor.pump(0)
        ended = {label for label in stalled if not self.monitor.alive(self.cluster.find(label))}
        if ended:
            self.reporter.note("%s ended while its stacks were taken" % ", ".join(sorted(ended)))
            stalled -= ended
            self.diagnosed = stalled
            if not stalled:
                return None
        from tfcluster.diagnosis.stacks import stall_cause
        waits = self._wait_causes(stalled)
        cause = waits or stall_cause(self.cluster, self.monitor.states, self.monitor.ended_at,
                                     stacks, stalled) or wording.stalled_plainly(stalled)
        self.reporter.note(cause)
        self.cause = Cause(STALL, cause, tuple(self.cluster.find(label)
                                               for label in sorted(stalled)))
        return self.cause

    def _wait_causes(self, stalled):
        """The CreateSession findings (tfcluster/diagnosis/causes.py) of the STALLED tasks that only wait
        for a peer, when every stalled task is one of them."""
        waits = self.waits
        if not stalled or any(self.stalled.get(label) is not WAITING for label in stalled):
            return None
        return "; ".join(waits.named_for.get(label) or wording.waits_for(
            label, waits.waiting[label][1]) for label in sorted(stalled))

    def current(self):
        """The last stall's Cause while some of its tasks are still stalled and alive, else
        None: a run stopped now (--timeout, Ctrl-C) stopped in that stall."""
        still = [label for label in self.stalled if self.monitor.alive(self.cluster.find(label))]
        return self.cause if still else None
