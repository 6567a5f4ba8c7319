"""A fake host layer for the launcher in-process: each agent link answers from a script, so its
stages and policies run in milliseconds, without processes."""
import io
import json
import queue
import time

from support.task_output import IN_COLLECTIVE, WAITING
from tfcluster.spec import catalog
from tfcluster.hosts.fanout import Outcomes
from tfcluster.hosts.inventory import Machine, Slot
from tfcluster.launch.launcher import Launch
from tfcluster.launch.options import LaunchOptions
from tfcluster.launch.monitor import Monitor
from tfcluster.view.report import PlainReporter
from tfcluster.spec.cluster import build_cluster
from tfcluster_agent import protocol as P
from tfcluster_agent import stall


class FakeLink:
    """One machine's agent: tasks exit as EXITS says ({name: [code of each start...]}; None, or
    a name that is not there, runs until stopped)."""

    def __init__(self, machine, events, exits, report):
        self.machine, self.events, self.exits, self.report = machine, events, exits, report
        self.hello, self.closed, self.detaching = None, False, False
        self._last_heard = None  # None: heard this very moment, as an agent that pings
        self.alive, self.starts, self.specs, self.stops = set(), {}, [], []
        self.clusters = []  # what NewCluster told this machine

    @property
    def last_heard(self):
        return time.monotonic() if self._last_heard is None else self._last_heard

    @last_heard.setter
    def last_heard(self, value):  # a test that sets it speaks for the agent from then on
        self._last_heard = value

    def open(self, first=None):
        self.hello = P.Hello(pid=1, hostname=self.machine.address, boot_id="b")
        return self

    def send(self, msg):
        pass  # answered by reply_to

    def reply_to(self, msg, timeout, what="", collect=None):
        return self.request(msg, timeout, what, collect)

    def emit(self, msg):
        self.events.put((self.machine.key, msg))

    def request(self, msg, timeout, what="", collect=None):
        if self.hello is None:  # as AgentLink, the first request opens the link
            self.open(first=msg)
        if isinstance(msg, P.Preflight):
            return P.Report(report=dict(self.report, ports={str(p): True for p in msg.ports}))
        if isinstance(msg, P.Start):
            for spec in msg.tasks:
                self.specs.append(spec)
                name = spec["name"]
                count = self.starts[name] = self.starts.get(name, 0) + 1
                self.emit(P.Started(name=name, pid=1000 + len(self.specs), time=time.time()))
                if spec.get("port") and spec["await_listening"]:
                    self.emit(P.Listening(name=name, port=spec["port"]))
                self.emit(P.Output(name=name, text="hello from %s\n" % name))
                codes = self.exits.get(name) or [None]
                code = codes[min(count, len(codes)) - 1]  # None: runs until stopped
                if code is not None:
                    self.emit(P.Output(name=name, text=P.metric_line(10, loss=1.0) + "\n"))
                    self.emit(P.Exited(name=name, code=code, state="exited"))
                else:
                    self.alive.add(name)
            return P.Accepted()
        if isinstance(msg, P.Stop):
            self.stops.append(msg)
            for name in sorted(self.alive & set(msg.names)):
                self.emit(P.Exited(name=name, code=143, state="exited"))
            stopped = {n: "stopped" if n in self.alive else "not running" for n in msg.names}
            self.alive -= set(msg.names)
            return P.Stopped(tasks=stopped, busy_ports=[], remaining=[])
        if isinstance(msg, P.NewCluster):
            self.clusters.append(msg.cluster)
            return P.Accepted()
        if isinstance(msg, P.Collect):
            return P.Collected(count=0)
        if isinstance(msg, P.Listen):
            return P.Report(report={"failed": {}})
        if isinstance(msg, P.Reach):  # every peer is reached but those the report names
            unreachable = self.report.get("unreachable", {})
            return P.Report(report={"results": {key: unreachable.get(key, "reached")
                                                for key, _, _ in msg.targets}})
        raise AssertionError("unexpected %r" % msg)

    def close(self, detach=False):
        self.closed = True


class FakeHosts:
    def __init__(self, machines, exits=None, report=None):
        self.events = queue.Queue()
        report = report or {"python_ok": True, "tf_version": "2.21.0", "cpus": 4, "gpus": [],
                            "code_hash": None, "hostname": "h"}
        self.links = {m.key: FakeLink(m, self.events, exits or {}, report) for m in machines}

    def link(self, machine):
        return self.links[machine.key]

    def each(self, call, machines=None, timeout=None):
        outcomes = Outcomes()
        for link in (self.links.values() if machines is None else
                     [self.links[m.key] for m in machines]):
            outcomes.call(call, link)
        return outcomes

    def start_pinging(self):
        pass

    def close(self, detach=False):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def cluster_of(ps=1, workers=2, chief=0, gpus_per_machine=None):
    machine = Machine(address="10.0.0.1", connection="ssh", root="/opt/t",
                      python="/opt/t/venv/bin/python", workdir="/opt/t/work")
    slots = [Slot(name="%s%d" % (job, i), job=job, machine=machine, port=None, port_base=2222,
                  gpus=None)
             for job, n in (("chief", chief), ("worker", workers), ("ps", ps)) for i in range(n)]
    return build_cluster(slots, {"ps": ps, "worker": workers, "chief": chief, "evaluator": 0})


def run(tmp_path, cluster, exits, policy="all_workers", report=None, **options):
    example = catalog.custom_example("python train.py", policy)
    hosts = FakeHosts([m for m, _ in cluster.machines()], exits, report)
    console = io.StringIO()
    launch = Launch(cluster, LaunchOptions(example=example, runs_dir=str(tmp_path / "runs"),
                                           run_id="r", **options),
                    "inventory.yml", PlainReporter(stream=console), hosts=hosts)
    outcome = None
    try:
        launch.run()
    except Exception as err:  # the outcome is what the test looks at
        outcome = err
    record = json.loads((tmp_path / "runs" / "r" / "run.json").read_text()) \
        if (tmp_path / "runs" / "r" / "run.json").exists() else None
    return outcome, record, console.getvalue(), hosts


class StallingLink(FakeLink):
    """worker-1 stalls as soon as it is watched; the stacks say where."""

    def send(self, msg):
        if isinstance(msg, stall.WatchStalls):
            self.watched = msg
            self.emit(stall.Stalled(name="worker-1", seconds=3.2, cpu=0.01))

    def request(self, msg, timeout, what="", collect=None):
        if isinstance(msg, stall.TakeStacks):
            return P.Report(report={"stacks": {"worker-0": IN_COLLECTIVE, "worker-1": WAITING}})
        return super().request(msg, timeout, what, collect)


class SendingHosts:
    """Hosts whose links keep what the monitor sends them."""

    def __init__(self, cluster):
        self.events = queue.Queue()
        self.sent = []
        link = type("Link", (), {"send": lambda _, msg: self.sent.append(msg)})()
        self.links = {m.key: link for m, _ in cluster.machines()}


def monitor_of(cluster):
    """A monitor of CLUSTER whose tasks all started; (monitor, a machine key, its console)."""
    console = io.StringIO()
    monitor = Monitor(SendingHosts(cluster), cluster, None, PlainReporter(console, echo=False))
    monitor.diagnosis.configure({}, straggler_after=30)
    key = cluster.tasks[0].machine.key
    for task in cluster.tasks:
        monitor.handle(key, P.Started(name=task.name, pid=1, time=time.time()))
    return monitor, key, console
