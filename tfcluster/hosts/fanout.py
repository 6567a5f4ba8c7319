"""The fan-out: every machine's agent link (hosts/links.py) called in parallel, each call with
its own deadline and thread, the outcomes kept per machine; the links closed together."""
import queue
import threading
import time

from tfcluster.hosts.links import AgentLink, HostError
from tfcluster_agent import protocol as P


class Outcomes:
    """What a call to every machine got, as fabric's GroupResult keeps it: SUCCEEDED maps each
    machine key to the call's value, FAILED to the HostError why it has none."""

    def __init__(self):
        self.succeeded = {}
        self.failed = {}

    def call(self, call, link):
        """CALL(LINK), its value or its error kept under the link's machine."""
        key = link.machine.key
        try:
            self.succeeded[key] = call(link)
        except HostError as err:
            self.failed[key] = err
        except Exception as err:  # kept per machine; the caller decides
            self.failed[key] = HostError(link.machine, str(err) or type(err).__name__)

    def reasons(self, machines):
        """"LABEL: reason" of each of MACHINES that failed, in order."""
        return ["%s: %s" % (m.label, self.failed[m.key].reason) for m in machines
                if m.key in self.failed]


class Hosts:
    """The agent links of a cluster's machines, with parallel calls collecting per-machine
    outcomes; closes them all when used as a context manager."""

    PING_SECONDS = 1.0

    def __init__(self, machines):
        self.events = queue.Queue()
        self.links = {m.key: AgentLink(m, self.events) for m in machines}
        self._stop = threading.Event()
        self._pinger = None

    def link(self, machine):
        return self.links[machine.key]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def each(self, call, machines=None, timeout=None):
        """Outcomes of CALL(link) on each machine of MACHINES (None: every machine; an empty
        list: none), in parallel.

        Each call runs in its own thread: one host that hangs costs only its own deadline, and
        fails with "no answer"."""
        links = list(self.links.values()) if machines is None else \
            [self.links[m.key] for m in machines]
        running = Outcomes()
        threads = [threading.Thread(target=running.call, args=(call, link), daemon=True)
                   for link in links]
        for thread in threads:
            thread.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        # A copy: a call still running after its deadline changes nothing the caller holds.
        outcomes = Outcomes()
        outcomes.succeeded, outcomes.failed = dict(running.succeeded), dict(running.failed)
        for link in links:
            key = link.machine.key
            if key not in outcomes.succeeded and key not in outcomes.failed:
                outcomes.failed[key] = HostError(link.machine, "no answer within %gs" % timeout)
        return outcomes

    def spawn_local(self):
        """Start the local machines' agents now (a process each, no waiting); one that cannot
        start says why when its link is opened."""
        for link in self.links.values():
            if link.machine.is_local:
                try:
                    link.spawn()
                except HostError:
                    pass

    def start_pinging(self):
        """A ping a second to every agent: the lease of an attached run."""
        def ping():
            while not self._stop.wait(self.PING_SECONDS):
                for link in list(self.links.values()):
                    if link.hello is not None and not link.closed and not link.detaching:
                        try:
                            link.send(P.Ping())
                        except HostError:
                            pass
        self._pinger = threading.Thread(target=ping, daemon=True)
        self._pinger.start()

    def close(self, detach=False):
        self._stop.set()
        for link in self.links.values():
            link.detaching = detach
        self.each(lambda link: link.close(detach=detach), timeout=10)
