"""The host layer's fan-out: per-machine values and errors kept apart, a hanging host costing
only its deadline, links that open themselves, and Hosts closing its links as a context manager
(local agents: no TensorFlow, no test hosts)."""
import sys
import threading

from conftest import REPO
from tfcluster.hosts.links import Hosts
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
        assert link.hello is not None and link._proc.poll() is None
    assert link._proc.wait(timeout=10) is not None  # its agent ended with the block
