"""The host layer's fan-out: per-machine values and errors kept apart, a hanging host costing
only its deadline, links that open themselves, and Hosts closing its links as a context manager
(local agents: no TensorFlow, no test hosts)."""
import sys
import threading

from support import REPO
from support.procs import pid_alive
from tfcluster.hosts.fanout import Hosts
from tfcluster.hosts.inventory import Machine
from tfcluster_agent import protocol as P


def local(name):
    return Machine(address=name, connection="local", python=sys.executable, root=REPO)


def test_each_keeps_values_and_errors_apart():
    good, bad, slow = local("good"), local("bad"), local("slow")
    released = threading.Event()

    def call(link):
        if link.machine is bad:
            raise ValueError("it broke")
        if link.machine is slow:
            released.wait(5)
            return "too late"
        return link.machine.address

    hosts = Hosts([good, bad, slow])
    outcomes = hosts.each(call, timeout=0.3)
    released.set()
    assert outcomes.succeeded == {good.key: "good"}
    assert set(outcomes.failed) == {bad.key, slow.key}
    assert outcomes.failed[bad.key].reason == "it broke"
    assert outcomes.failed[slow.key].reason == "no answer within 0.3s"
    assert outcomes.reasons([good, bad, slow]) == ["bad: it broke", "slow: no answer within 0.3s"]
    # The slow call ends after the deadline: what the caller holds does not change.
    hosts.close()
    assert outcomes.succeeded == {good.key: "good"} and slow.key in outcomes.failed


def test_links_open_themselves_and_close_with_their_hosts(tmp_path):
    machine = local("localhost")
    with Hosts([machine]) as hosts:
        link = hosts.link(machine)
        assert link.hello is None
        outcomes = hosts.each(lambda link: link.request(
            P.Attach(run_dir=str(tmp_path), from_start=False), timeout=30))
        assert not outcomes.failed, outcomes.failed
        assert isinstance(outcomes.succeeded[machine.key], P.Attached)
        agent = link._proc
        assert link.hello is not None and agent.poll() is None
    # Its agent ended with the block: the process is reaped, not only told to go.
    assert agent.poll() is not None and not pid_alive(agent.pid)
