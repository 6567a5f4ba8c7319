"""The one entry to diagnosis. A run's monitor owns a Diagnosis and hands it every event of the
run's tasks; the launcher asks it, through the monitor, what stalled, which end failed the run and
who lags, and the teardown asks it for the report. Each answer is a Cause (diagnosis/__init__.py),
worded by wording.py."""
import time

from tfcluster.diagnosis import END, Cause, rootcause, wording
from tfcluster.diagnosis.causes import SessionWaits
from tfcluster.diagnosis.hints import print_hints
from tfcluster.diagnosis.slowest import SlowestWatch
from tfcluster.diagnosis.stall import StallFollower
from tfcluster.diagnosis.stragglers import StragglerWatch


class Diagnosis:
    """MONITOR: the run's monitor (launch/monitor.py), read for the tasks' states, end times,
    listening ps tasks and last lines, its hosts and its reporter."""

    def __init__(self, monitor):
        self.monitor = monitor
        self.ends = rootcause.EndOrder()
        self.waits = SessionWaits(monitor)
        self.stragglers = StragglerWatch(monitor.reporter)
        self.slowest = SlowestWatch(monitor.reporter)
        self.stalls = None  # a StallFollower, once a launch watches its run for stalls

    # ------------------------------------------------------------ a launch follows its run
    def configure(self, reports, straggler_after):
        """Diagnose as a launch: its preflight REPORTS, --straggler-after."""
        self.waits.watch(reports)
        self.stragglers.after = straggler_after

    def watch_stalls(self, record, stall_after):
        """Ask the agents to watch the run's training tasks for stalls, once they started;
        STALL_AFTER: --stall-after, None for each machine's tfcluster_stall_after, 0: off."""
        monitor = self.monitor
        self.stalls = StallFollower(monitor.hosts, monitor.cluster, record, monitor,
                                    monitor.reporter, stall_after, self.waits)
        self.stalls.watch()

    # ------------------------------------------------------------ the monitor's events
    def started(self, task):
        self.ends.started(task)
        self.stragglers.started(task)
        self.slowest.started(task)
        self.waits.started(task)

    def exited(self, task, at=None):
        """TASK ended, at AT on its host's clock when known."""
        self.ends.exited(task, at)
        self.stragglers.ended(task)
        self.slowest.ended(task)

    def line(self, task, text):
        """A line TASK printed: the Cause of kind WAIT it names, or None."""
        return self.waits.line(task, text)

    def probed(self, msg):
        """An agent's answer to a CreateSession probe: the Cause of kind WAIT it names, or None."""
        return self.waits.probed(msg)

    def metric(self, task, point):
        self.stragglers.metric(task, point)
        self.slowest.metric(task, point)

    def stall_event(self, task, msg):
        """An agent's Stalled or Resumed event about TASK."""
        if self.stalls is not None:
            self.stalls.event(task, msg)

    def teardown_began(self):
        """Tasks that end from here on may be ours to stop."""
        self.ends.teardown_began()

    # ------------------------------------------------------------ causes, asked by the launcher
    def stalled(self):
        """The Cause (kind STALL) of the tasks stalled now, once their stalls settled and their
        stacks were taken; each stall is named once. None otherwise."""
        return self.stalls.check() if self.stalls is not None else None

    def still_stalled(self):
        """The last stall's Cause while its tasks are still stalled, else None."""
        return self.stalls.current() if self.stalls is not None else None

    def straggling(self, now=None):
        """The Causes of the tasks that lag from now on: of kind STRAGGLER (a rate under half
        its peers'), or SLOWEST (the worker a synchronous run waits for)."""
        now = now or time.time()
        return self.stragglers.tick(now) + self.slowest.tick(self.stragglers.rates(now)[0], now)

    def failure(self):
        """The Cause (kind END) of the earliest end that fails the run, or None: its task is the
        one to restart, or the one the run fails on (failed())."""
        return rootcause.first_failure(self.monitor.cluster, self.monitor.states, self.ends.order)

    def failed(self, task):
        """The Cause (kind END) of the run failing on TASK's end, said with what is known of it:
        a ps that never listened, a collective that lost its peers."""
        monitor = self.monitor
        status = monitor.states[task.label]
        from tfcluster.diagnosis.stacks import collective_abort_cause  # a failure's: its regexes
        text = collective_abort_cause(monitor.cluster, monitor.states, monitor.ended_at, task,
                                      monitor.tails[task.label])
        if text is None and task.job == "ps" and task.label not in monitor.listening:
            text = wording.ps_never_listened(task, status)
        return Cause(END, text or wording.task_failed(task, status), (task,))

    def earlier_failure(self, task):
        """The Cause of a failure that ended before TASK's, heard after it (ends from one host
        can arrive out of order; the teardown hears the last of them), or None."""
        if not self.ends.ended(task.label):
            return None
        found = rootcause.failures(self.monitor.cluster, self.monitor.states,
                                   self.monitor.ended_at, self.ends)
        if not found or found[0][0] is task or \
                self.ends.order(found[0][0].label) > self.ends.order(task.label):
            return None
        return self.failed(found[0][0])

    # ------------------------------------------------------------ the final report
    def report(self):
        """(lines for the end of the summary, {label: note for its row})."""
        found = rootcause.failures(self.monitor.cluster, self.monitor.states,
                                   self.monitor.ended_at, self.ends)
        story = rootcause.story(found)
        notes = rootcause.row_notes(found)
        for word, named in ((wording.STRAGGLER, self.stragglers.named),
                            (wording.SLOWEST, self.slowest.named)):
            for label in named:
                notes[label] = ", ".join(filter(None, [notes.get(label), word]))
        return ([story] if story else []) + [str(c) for c in self.waits.findings] + \
            self.stragglers.summary() + self.slowest.summary(), notes

    def print_hints(self, record_dir, log_names):
        """The hints (hints.py) for the failed tasks' logs LOG_NAMES in RECORD_DIR."""
        print_hints(self.monitor.reporter, record_dir, log_names)
