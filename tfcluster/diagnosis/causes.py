"""Why a run hangs or fails, named while it runs and in its final report.

The monitor hands every event to `Causes`, which keeps:
- in which order the tasks ended (rootcause.EndOrder): the report names the earliest failure
  first;
- TF1's `CreateSession still waiting for response from worker: /job:ps/replica:0/task:0`:
  whether that peer is not running (and how it ended), or runs but cannot be reached from the
  waiting task's host (asked of that host's agent: refused or timed out);
- the stragglers (stragglers.StragglerWatch).
"""
import re
import time

from tfcluster.diagnosis import rootcause, wording
from tfcluster.hosts.links import HostError
from tfcluster.diagnosis.stragglers import StragglerWatch
from tfcluster_agent import protocol as P
from tfcluster_agent.reach import REACH_SECONDS, REACHED

CREATE_SESSION = re.compile(r"CreateSession still waiting for response from worker: "
                            r"/job:(\w+)/replica:\d+/task:(\d+)")
# TensorFlow prints the line every 10 s. For a ps the agent saw listening, the first line is
# enough (CreateSession takes milliseconds then); a peer that may still be starting must keep
# a task waiting this long.
PATIENCE_S = 15.0


class Causes:
    def __init__(self, monitor):
        self.monitor = monitor
        self.ends = rootcause.EndOrder()
        self.stragglers = StragglerWatch(monitor.reporter)
        self.findings = []        # what was named during the run, for its final report
        self.proxies = {}         # machine key -> proxy variable names on it (preflight)
        self._waiting = {}        # (task, peer) -> when the task's first CreateSession line came
        self._named = set()       # (task, peer) pairs already diagnosed since the task started
        self._probes = {}         # probe id -> (task, peer)
        # label -> (since when it has printed nothing but CreateSession waits, for which peer)
        self.waiting = {}
        self.named_for = {}       # label -> the last finding about it (a stall's cause)
        self.watching = False     # a launch follows its run; status and logs replay old lines

    def configure(self, reports, straggler_after):
        """Watch a launch's run: its preflight REPORTS and --straggler-after."""
        self.watching = True
        self.proxies = {key: (report.proxy_env or {}).get("proxies", [])
                        for key, report in reports.items()}
        self.stragglers.after = straggler_after

    # ------------------------------------------------------------ the monitor's events
    def started(self, task):
        self.ends.started(task)
        self.stragglers.started(task)
        self._named = {pair for pair in self._named if pair[0] != task.label}
        self._waiting = {pair: at for pair, at in self._waiting.items() if pair[0] != task.label}
        self.waiting.pop(task.label, None)

    def exited(self, task, at=None):
        self.ends.exited(task, at)
        self.stragglers.ended(task)

    def metric(self, task, point):
        self.stragglers.metric(task, point)

    def tick(self):
        self.stragglers.tick()

    def teardown_began(self):
        self.ends.teardown_began()

    def line(self, task, text):
        match = CREATE_SESSION.search(text) if self.watching and "CreateSession" in text \
            else None
        if match is None:
            self.waiting.pop(task.label, None)  # any other line: it is doing something else
            return
        peer_label = "%s:%s" % match.groups()
        self.waiting.setdefault(task.label, (time.monotonic(), peer_label))
        pair = (task.label, peer_label)
        if pair in self._named:
            return
        first = self._waiting.setdefault(pair, time.monotonic())
        peer = next((t for t in self.monitor.cluster.tasks if t.label == peer_label), None)
        status = self.monitor.states.get(peer_label)
        if peer is None:
            self._name(pair, wording.waits_for_stranger(
                task.label, peer_label, [t.label for t in self.monitor.cluster.tasks]))
        elif status is None or not status.alive:
            self._name(pair, wording.waits_for_stopped(task.label, peer_label, wording.not_running(
                status, self.monitor.ended_at.get(peer_label),
                peer_label in self.monitor.ended_at)))
        elif (peer.job == "ps" and peer_label in self.monitor.listening) or \
                time.monotonic() - first >= PATIENCE_S:
            self._probe(pair, task, peer)

    def _probe(self, pair, task, peer):
        """Ask the waiting task's host whether it reaches PEER's port; the answer, a Probed
        event, comes to probed()."""
        self._named.add(pair)
        probe_id = "%s>%s" % pair
        self._probes[probe_id] = (task, peer)
        link = self.monitor.hosts.links.get(task.machine.key)
        try:
            link.send(P.Reach(id=probe_id, targets=[[peer.label, peer.machine.tf_host, peer.port]],
                              timeout=REACH_SECONDS))
        except HostError as err:  # its host is gone, which the launcher reports on its own
            self._probes.pop(probe_id)
            self._name(pair, wording.waits_unasked(task.label, peer.label, task.machine.label,
                                                   err.reason))

    def probed(self, msg):
        task, peer = self._probes.pop(msg.id, (None, None))
        if task is None:
            return
        outcome = msg.results.get(peer.label, "no answer")
        host = wording.task_host(task)
        if outcome == REACHED:
            text = wording.waits_unanswered(task.label, peer.label, host, peer.address,
                                            task.machine.label, self.proxies.get(task.machine.key))
        else:
            text = wording.waits_unreached(task.label, peer.label, host, peer.address, outcome)
        self._name((task.label, peer.label), text)

    def _name(self, pair, text):
        self._named.add(pair)
        self.named_for[pair[0]] = text
        self.findings.append(text)
        self.monitor.reporter.note(text)

    # ------------------------------------------------------------ the final report
    def report(self):
        """(lines for the end of the summary, {label: note for its row})."""
        found = rootcause.failures(self.monitor.cluster, self.monitor.states,
                                   self.monitor.ended_at, self.ends)
        story = rootcause.story(found)
        notes = rootcause.row_notes(found)
        for label in self.stragglers.named:
            notes[label] = ", ".join(filter(None, [notes.get(label), wording.STRAGGLER]))
        return ([story] if story else []) + self.findings + self.stragglers.summary(), notes
