"""TF1's `CreateSession still waiting for response from worker: /job:ps/replica:0/task:0`,
diagnosed while the run goes on: whether that peer is not running (and how it ended), or runs but
cannot be reached from the waiting task's host (asked of that host's agent: refused or timed
out), or is reached but does not answer (a proxy?). Each finding is named once per task and peer
and is a Cause of kind WAIT.
"""
import re
import time

from tfcluster.diagnosis import WAIT, Cause, wording
from tfcluster.hosts.links import HostError
from tfcluster_agent import protocol as P
from tfcluster_agent.reach import REACH_SECONDS, REACHED

CREATE_SESSION = re.compile(r"CreateSession still waiting for response from worker: "
                            r"/job:(\w+)/replica:\d+/task:(\d+)")
# TensorFlow prints the line every 10 s. For a ps the agent saw listening, the first line is
# enough (CreateSession takes milliseconds then); a peer that may still be starting must keep
# a task waiting this long.
PATIENCE_S = 15.0


class SessionWaits:
    def __init__(self, monitor):
        self.monitor = monitor
        self.findings = []        # the Causes named during the run, for its final report
        self.proxies = {}         # machine key -> proxy variable names on it (preflight)
        self._waiting = {}        # (task, peer) -> when the task's first CreateSession line came
        self._named = set()       # (task, peer) pairs already diagnosed since the task started
        self._probes = {}         # probe id -> (task, peer)
        # label -> (since when it has printed nothing but CreateSession waits, for which peer)
        self.waiting = {}
        self.named_for = {}       # label -> the last finding about it (a stall's cause)
        self.watching = False     # a launch follows its run; status and logs replay old lines

    def watch(self, reports):
        """Diagnose the waits of a launch's run, its preflight REPORTS at hand."""
        self.watching = True
        self.proxies = {key: (report.proxy_env or {}).get("proxies", [])
                        for key, report in reports.items()}

    def started(self, task):
        self._named = {pair for pair in self._named if pair[0] != task.label}
        self._waiting = {pair: at for pair, at in self._waiting.items() if pair[0] != task.label}
        self.waiting.pop(task.label, None)

    def line(self, task, text):
        """A line TASK printed; the Cause it lets us name, if any (else None)."""
        match = CREATE_SESSION.search(text) if self.watching and "CreateSession" in text \
            else None
        if match is None:
            self.waiting.pop(task.label, None)  # any other line: it is doing something else
            return None
        peer_label = "%s:%s" % match.groups()
        self.waiting.setdefault(task.label, (time.monotonic(), peer_label))
        pair = (task.label, peer_label)
        if pair in self._named:
            return None
        first = self._waiting.setdefault(pair, time.monotonic())
        peer = next((t for t in self.monitor.cluster.tasks if t.label == peer_label), None)
        status = self.monitor.states.get(peer_label)
        if peer is None:
            return self._name(task, wording.waits_for_stranger(
                task.label, peer_label, [t.label for t in self.monitor.cluster.tasks]), peer_label)
        if status is None or not status.alive:
            return self._name(task, wording.waits_for_stopped(
                task.label, peer_label, wording.not_running(
                    status, self.monitor.ended_at.get(peer_label),
                    peer_label in self.monitor.ended_at)), peer_label)
        if (peer.job == "ps" and peer_label in self.monitor.listening) or \
                time.monotonic() - first >= PATIENCE_S:
            return self._probe(task, peer)
        return None

    def _probe(self, task, peer):
        """Ask the waiting task's host whether it reaches PEER's port; the answer, a Probed
        event, comes to probed(). A Cause only when the host cannot be asked."""
        pair = (task.label, peer.label)
        self._named.add(pair)
        probe_id = "%s>%s" % pair
        self._probes[probe_id] = (task, peer)
        link = self.monitor.hosts.links.get(task.machine.key)
        try:
            link.send(P.Reach(id=probe_id, targets=[[peer.label, peer.machine.tf_host, peer.port]],
                              timeout=REACH_SECONDS))
        except HostError as err:  # its host is gone, which the launcher reports on its own
            self._probes.pop(probe_id)
            return self._name(task, wording.waits_unasked(task.label, peer.label,
                                                          task.machine.label, err.reason),
                              peer.label)
        return None

    def probed(self, msg):
        """The answer to a probe: the Cause it names (None for an unknown probe)."""
        task, peer = self._probes.pop(msg.id, (None, None))
        if task is None:
            return None
        outcome = msg.results.get(peer.label, "no answer")
        host = wording.task_host(task)
        if outcome == REACHED:
            text = wording.waits_unanswered(task.label, peer.label, host, peer.address,
                                            task.machine.label, self.proxies.get(task.machine.key))
        else:
            text = wording.waits_unreached(task.label, peer.label, host, peer.address, outcome)
        return self._name(task, text, peer.label)

    def _name(self, task, text, peer_label):
        self._named.add((task.label, peer_label))
        self.named_for[task.label] = text
        cause = Cause(WAIT, text, (task,))
        self.findings.append(cause)
        self.monitor.reporter.note(text)
        return cause
