"""Why a run hangs or fails, in-process (the fast tier): the reachability check's two ends,
proxy exemptions, the first failure first, TF1's CreateSession wait diagnosed, stragglers.
Real launches of the same: test_causes_launch.py (local) and test_causes_hosts.py (test hosts)."""
import io
import time
from types import SimpleNamespace

from rich.console import Console

from support.fakehosts import FakeHosts, FakeLink, cluster_of, monitor_of, run
from support.ports import free_port_block
from support.task_output import CREATE_SESSION
from tfcluster.launch import proxy
from tfcluster.launch import reach
from tfcluster.diagnosis import END, STRAGGLER, WAIT, Cause, rootcause
from tfcluster.errors import PreflightError, RunFailed
from tfcluster.view.live import LiveReporter
from tfcluster.runs.record import PreflightReport, TaskState, TaskStatus
from tfcluster.view.report import PlainReporter, is_noise
from tfcluster.diagnosis.stragglers import StragglerWatch
from tfcluster_agent import protocol as P
from tfcluster_agent import reach as agent_reach
from tfcluster_agent.hostinfo import proxy_facts


# ------------------------------------------------------------------ reachability, agent side

def test_listeners_are_reached_and_a_closed_port_is_refused():
    port = free_port_block(2)
    listeners = agent_reach.Listeners()
    try:
        assert listeners.listen([port]) == {}
        assert "in use" in listeners.listen([port])[str(port)]  # one listener per port
        found = agent_reach.probe([["open", "127.0.0.1", port], ["closed", "localhost", port + 1],
                                   ["nowhere", "no-such-host.invalid", port]], timeout=2)
    finally:
        listeners.close()
    assert found == {"open": "reached", "closed": "refused",
                     "nowhere": "cannot resolve no-such-host.invalid"}
    assert agent_reach.probe([["again", "127.0.0.1", port]], 2) == {"again": "refused"}


def test_the_agent_listens_until_its_tasks_start_and_probes_in_the_background(agent, tmp_path):
    port = free_port_block(2)
    agent.send(P.Listen(ports=[port]))
    assert agent.next(P.Report).report == {"failed": {}}
    agent.send(P.Reach(targets=[["ps:0", "127.0.0.1", port], ["worker:1", "127.0.0.1", port + 1]],
                       timeout=2))
    assert agent.next(P.Report).report == {"results": {"ps:0": "reached", "worker:1": "refused"}}
    agent.send(P.Reach(id="w>p", targets=[["ps:0", "127.0.0.1", port]], timeout=2))
    assert agent.next(P.Probed) == P.Probed(id="w>p", results={"ps:0": "reached"})
    # A start closes the listeners first: the task binds the port itself (the fixture stops it).
    agent.send(P.Start(run_dir=str(tmp_path / "run"), tasks=[{
        "name": "ps-0", "command": "python3 -c 'import socket,time; s=socket.create_server("
        "(\"\", %d)); print(\"bound\", flush=True); time.sleep(60)'" % port, "port": port}]))
    assert isinstance(agent.next((P.Accepted, P.Error)), P.Accepted)
    assert isinstance(agent.next(P.Listening), P.Listening)
    assert agent.next(P.Output, timeout=30).text == "bound\n"


# ------------------------------------------------------------------ reachability, controller

REPORT = {"python_ok": True, "tf_version": "2.21.0", "cpus": 2, "gpus": [], "code_hash": None}


def test_unreachable_ports_refuse_the_launch_naming_both_ends():
    cluster = cluster_of(ps=1, workers=2)
    hosts = FakeHosts([m for m, _ in cluster.machines()], report=dict(
        REPORT, unreachable={"ps:0": "timed out", "worker:1": "refused"}))
    link = next(iter(hosts.links.values()))
    calls, original = [], link.request
    link.request = lambda msg, *a, **k: calls.append(msg.kind) or original(msg, *a, **k)
    assert reach.check(hosts, cluster) == [
        "worker host 10.0.0.1 cannot reach worker:1 at 10.0.0.1:2223: refused",
        "worker host 10.0.0.1 cannot reach ps:0 at 10.0.0.1:2224: timed out"]
    assert calls == ["listen", "reach"]


def test_what_each_task_dials():
    cluster = cluster_of(ps=2, workers=2, chief=1)
    machine = cluster.tasks[0].machine
    dialled = [(task.label, peer.label) for task, peer in reach.targets(cluster, machine)]
    # Every peer once (by the first task of the machine that dials it); a ps dials nobody.
    assert dialled == [("chief:0", "worker:0"), ("chief:0", "worker:1"), ("chief:0", "ps:0"),
                       ("chief:0", "ps:1"), ("worker:0", "chief:0")]


def test_the_launcher_refuses_before_anything_starts(tmp_path):
    outcome, record, _, hosts = run(tmp_path, cluster_of(), {}, report=dict(
        REPORT, unreachable={"ps:0": "timed out"}))
    assert isinstance(outcome, PreflightError) and outcome.exit_code == 3
    assert "worker host 10.0.0.1 cannot reach ps:0 at 10.0.0.1:2224: timed out" in str(outcome)
    assert record is None and all(not link.specs for link in hosts.links.values())


def test_an_older_agent_is_named_with_the_fix():
    cluster = cluster_of(ps=1, workers=1)
    hosts = FakeHosts([m for m, _ in cluster.machines()])
    link = next(iter(hosts.links.values()))

    def old(msg, *args, **kwargs):
        from tfcluster.hosts.links import HostError
        raise HostError(link.machine, "listen: not a tfcluster message: '{\"type\":\"listen\"}'")
    link.request = old
    assert reach.check(hosts, cluster) == [
        "10.0.0.1: its tfcluster agent is older than this controller: run `tfcluster sync -i "
        "INVENTORY` (or launch with --sync)"]


# ------------------------------------------------------------------ proxies

def reports_with(cluster, **facts):
    return {m.key: PreflightReport(proxy_env=facts) for m, _ in cluster.machines()}


def test_proxy_facts_keep_names_not_values():
    facts = proxy_facts({"HTTPS_PROXY": "http://user:secret@proxy:3128", "all_proxy": "x",
                         "no_proxy": "example.com", "PATH": "/bin"})
    assert facts == {"proxies": ["HTTPS_PROXY", "all_proxy"], "no_proxy": "example.com"}


def test_tasks_get_no_grpc_proxy_for_every_cluster_address():
    cluster = cluster_of(ps=1, workers=2)
    quiet = reports_with(cluster, proxies=[])
    assert proxy.task_exemptions(cluster, quiet, {}) == ({}, "")
    noisy = reports_with(cluster, proxies=["http_proxy"], no_proxy="example.com,10.0.0.1")
    exemptions, note = proxy.task_exemptions(cluster, noisy, {"HTTPS_PROXY": "http://p:1"})
    # gRPC read no_proxy before: its entries stay, the cluster's address comes first, once.
    assert exemptions == {label: "10.0.0.1,example.com" for label in ("worker:0", "worker:1",
                                                                      "ps:0")}
    assert note == ("proxy variables set (http_proxy on 10.0.0.1; --env HTTPS_PROXY): tasks get "
                    "no_grpc_proxy=10.0.0.1, so gRPC reaches the cluster directly; other traffic "
                    "still uses the proxy")
    # A no_grpc_proxy of the user's is what gRPC reads instead of no_proxy: it is kept.
    exemptions, _ = proxy.task_exemptions(cluster, noisy, {"no_grpc_proxy": "svc.local"})
    assert exemptions["ps:0"] == "10.0.0.1,svc.local"


def test_a_launch_says_once_what_it_did_about_proxies(tmp_path):
    report = dict(REPORT, proxy_env={"proxies": ["https_proxy"]})
    outcome, record, console, hosts = run(tmp_path, cluster_of(), {"worker-0": [0],
                                                                   "worker-1": [0]},
                                          report=report)
    assert outcome is None, console
    assert console.count("proxy variables set (https_proxy on 10.0.0.1)") == 1
    specs = {s["name"]: s["env"] for s in next(iter(hosts.links.values())).specs}
    assert {env["no_grpc_proxy"] for env in specs.values()} == {"10.0.0.1"}
    assert "no_grpc_proxy" in record["tasks"]["ps:0"]["env_names"]


# ------------------------------------------------------------------ the first failure first

def test_the_earliest_failure_is_named_first_and_the_others_follow_it(tmp_path, monkeypatch):
    """The ps is killed, both workers fail a moment later, and the launcher sees all three in
    one batch of events: the report blames the ps, not the first task in the list."""
    held, real_emit = [], FakeLink.emit

    def emit(link, msg):  # the workers' exits wait for the ps's
        if isinstance(msg, P.Exited) and msg.name != "ps-0" and held[-1:] != [None]:
            held.append(msg)
            return
        real_emit(link, msg)
        if isinstance(msg, P.Exited) and msg.name == "ps-0":
            for waiting in held:
                real_emit(link, waiting)
            held.append(None)
    monkeypatch.setattr(FakeLink, "emit", emit)
    _, _, console = run_blaming_the_ps(tmp_path)
    rows = {line.split()[0]: line for line in console.splitlines() if line.startswith(
        ("ps:0 ", "worker:0 ", "worker:1 "))}
    assert rows["ps:0"].endswith("(first failure)") and rows["worker:1"].endswith("(after ps:0)")


def test_ends_that_arrive_out_of_order_are_ordered_by_their_hosts_times(tmp_path, monkeypatch):
    """The workers' ends reach the launcher first and fail the run; the ps's, which happened
    before them on the same host, comes during the teardown: the run is blamed on the ps all
    the same, its headline included."""
    held, real_emit, real_request = [], FakeLink.emit, FakeLink.request
    ended = time.time()

    def emit(link, msg):
        if isinstance(msg, P.Exited):
            msg = P.Exited(name=msg.name, code=msg.code, state=msg.state,
                           ended=ended + (0 if msg.name == "ps-0" else 0.1))
            if msg.name == "ps-0":
                held.append(msg)
                return
        real_emit(link, msg)

    def request(link, msg, *args, **kwargs):
        if isinstance(msg, P.Stop):
            for waiting in held:
                real_emit(link, waiting)
            held.clear()
        return real_request(link, msg, *args, **kwargs)
    monkeypatch.setattr(FakeLink, "emit", emit)
    monkeypatch.setattr(FakeLink, "request", request)
    outcome, record, _ = run_blaming_the_ps(tmp_path)
    assert outcome.task.label == "ps:0" and record["failure"] == str(outcome)


def run_blaming_the_ps(tmp_path):
    """A run whose ps is killed and whose workers then fail: (outcome, record, console), once
    checked that the ps is named first."""
    outcome, record, console, _ = run(
        tmp_path, cluster_of(), {"ps-0": [137], "worker-0": [1], "worker-1": [1]})
    assert isinstance(outcome, RunFailed)
    assert str(outcome).startswith("ps:0 on 10.0.0.1 ended while the run was active (was killed "
                                   "by SIGKILL)"), outcome
    story = [line for line in console.splitlines() if "failed after" in line]
    assert len(story) == 1 and story[0].startswith(
        "worker:0 and worker:1 failed after ps:0 was killed by SIGKILL at "), console
    return outcome, record, console


def test_end_order_keeps_each_hosts_times_and_the_controllers_order_across_hosts():
    def task(label, host):
        return SimpleNamespace(label=label, job=label.split(":")[0],
                               machine=SimpleNamespace(key=host))
    ps, worker, other = task("ps:0", "a"), task("worker:0", "a"), task("worker:1", "b")
    # Before the teardown, a ps recorded up to PS_SLACK s after a worker of its host ended first:
    # its supervisor may have run late, and a ps never ends because of a worker.
    early = rootcause.EndOrder()
    early.exited(worker, 100.0)
    early.exited(ps, 100.0 + rootcause.PS_SLACK - 0.5)
    assert sorted(["worker:0", "ps:0"], key=early.order) == ["ps:0", "worker:0"]
    late = rootcause.EndOrder()
    late.exited(worker, 100.0)
    late.exited(ps, 100.0 + rootcause.PS_SLACK + 0.5)
    assert sorted(["worker:0", "ps:0"], key=late.order) == ["worker:0", "ps:0"]
    ends = rootcause.EndOrder()
    ends.exited(other, 50.0)     # another host, its clock far behind: heard first, stays first
    ends.exited(worker, 100.1)
    ends.teardown_began()
    ends.exited(ps, 100.0)       # heard last, happened before worker:0 on the same host
    assert sorted(["worker:0", "ps:0", "worker:1"], key=ends.order) == [
        "worker:1", "ps:0", "worker:0"]
    assert ends.before_teardown("ps:0") and ends.before_teardown("worker:0")
    ends.exited(task("worker:2", "a"), 100.2)
    assert not ends.before_teardown("worker:2")
    ends.started(ps)
    assert not ends.ended("ps:0") and ends.order("ps:0") == float("inf")


def test_tasks_the_teardown_stopped_are_not_failures():
    cluster = cluster_of(ps=1, workers=2)
    ends, states, ended_at = rootcause.EndOrder(), {}, {}
    worker0, worker1, ps = cluster.tasks

    def ended(task, code):
        states[task.label] = TaskStatus(state=TaskState.EXITED, exit=code)
        ended_at[task.label] = time.time()
        ends.exited(task)
    ended(worker1, 3)
    ends.teardown_began()
    ended(ps, 143)
    ended(worker0, 143)
    found = rootcause.failures(cluster, states, ended_at, ends)
    assert [task.label for task, _, _ in found] == ["worker:1"]
    assert rootcause.story(found) is None
    assert rootcause.first_failure(cluster, states, ends.order).task is worker1


# ------------------------------------------------------------------ CreateSession waits

def test_the_diagnosis_names_each_cause_with_its_kind_and_task():
    """The monitor hands the events on; what the Diagnosis names comes back as a Cause: a
    CreateSession wait, the end that fails the run, and that same end said in full."""
    cluster = cluster_of(ps=1, workers=2)
    monitor, key, _ = monitor_of(cluster)
    worker0, ps = cluster.find("worker:0"), cluster.find("ps:0")
    assert monitor.diagnosis.failure() is None
    monitor.handle(key, P.Exited(name="ps-0", code=137, state="exited"))
    wait = monitor.diagnosis.line(worker0, CREATE_SESSION)
    assert wait.kind == WAIT and wait.task is worker0
    assert wait.text.startswith("worker:0 waits in CreateSession for ps:0, which is not running: "
                                "it was killed by SIGKILL at ")
    assert monitor.diagnosis.line(worker0, CREATE_SESSION) is None  # named once
    end = monitor.diagnosis.failure()
    assert (end.kind, end.task) == (END, ps)
    assert str(end) == "ps:0 on 10.0.0.1 ended while the run was active (was killed by SIGKILL)"
    assert monitor.diagnosis.failed(ps) == Cause(
        END, "ps:0 on 10.0.0.1 was killed by SIGKILL before it listened on 10.0.0.1:2224", (ps,))


def test_a_createsession_wait_for_a_dead_ps_names_how_it_ended():
    cluster = cluster_of(ps=1, workers=1)
    monitor, key, console = monitor_of(cluster)
    monitor.handle(key, P.Exited(name="ps-0", code=1, state="exited"))
    monitor.handle(key, P.Output(name="worker-0", text=CREATE_SESSION + "\n" + CREATE_SESSION
                                 + "\n"))
    line, = [l for l in console.getvalue().splitlines() if "CreateSession" in l]
    assert line.startswith("tfcluster: worker:0 waits in CreateSession for ps:0, which is not "
                           "running: it exited 1 at "), line
    assert monitor.hosts.sent == []


def test_a_createsession_wait_for_a_listening_ps_is_probed_from_the_waiting_host():
    cluster = cluster_of(ps=1, workers=2)
    monitor, key, console = monitor_of(cluster)
    monitor.diagnosis.waits.proxies = {key: ["http_proxy"]}
    monitor.handle(key, P.Listening(name="ps-0", port=2224))
    for name in ("worker-0", "worker-1"):
        monitor.handle(key, P.Output(name=name, text=CREATE_SESSION + "\n"))
    first, second = monitor.hosts.sent
    assert first == P.Reach(id="worker:0>ps:0", targets=[["ps:0", "10.0.0.1", 2224]], timeout=5.0)
    monitor.handle(key, P.Output(name="worker-0", text=CREATE_SESSION + "\n"))
    assert len(monitor.hosts.sent) == 2  # once per waiting task and peer
    monitor.handle(key, P.Probed(id=first.id, results={"ps:0": "timed out"}))
    monitor.handle(key, P.Probed(id=second.id, results={"ps:0": "reached"}))
    notes = [l for l in console.getvalue().splitlines() if l.startswith("tfcluster:")]
    assert notes == [
        "tfcluster: worker:0 waits in CreateSession for ps:0: ps:0 is running, but worker host "
        "10.0.0.1 cannot reach ps:0 at 10.0.0.1:2224: timed out",
        "tfcluster: worker:1 waits in CreateSession for ps:0: ps:0 is running and worker host "
        "10.0.0.1 reaches it at 10.0.0.1:2224, but it does not answer TensorFlow; 10.0.0.1 has "
        "proxy variables (http_proxy): does the program send gRPC through a proxy?"]
    lines, _ = monitor.diagnosis.report()
    assert lines == [n[len("tfcluster: "):] for n in notes]


def test_a_peer_that_may_still_start_gets_patience():
    cluster = cluster_of(ps=0, workers=2, chief=1)
    monitor, key, _ = monitor_of(cluster)
    waiting = CREATE_SESSION.replace("/job:ps/", "/job:worker/")
    monitor.handle(key, P.Output(name="chief-0", text=waiting + "\n"))
    assert monitor.hosts.sent == []  # worker:0 may still be importing TensorFlow
    monitor.diagnosis.waits._waiting[("chief:0", "worker:0")] -= 20
    monitor.handle(key, P.Output(name="chief-0", text=waiting + "\n"))
    assert [m.targets for m in monitor.hosts.sent] == [[["worker:0", "10.0.0.1", 2223]]]


def test_the_console_hides_tensorflows_info_lines_but_the_createsession_wait():
    assert is_noise("I0000 00:00:1795692373.650872   20300 master.cc:243] Scanning workers for "
                    "devices: 2 total workers")
    assert is_noise("I0000 00:00:1795692374.602722   20376 profiler_session.cc:117] Profiler "
                    "session initializing.")
    assert not is_noise(CREATE_SESSION)
    assert not is_noise("W0000 00:00:1795692285.474252   15716 master.cc:278] a warning")


def test_a_hidden_message_of_several_lines_is_hidden_whole():
    """At TF_CPP_MIN_LOG_LEVEL=0 some INFO messages print a protobuf over the next lines."""
    stream = io.StringIO()
    reporter = PlainReporter(stream)
    task = cluster_of(ps=0, workers=1).tasks[0]
    for line in ("I0000 00:00:1795697251.449152   27045 eager_service_impl.cc:355] "
                 "SessionOptions: goo.gle/debugproto", "device_count {", '  key: "CPU"',
                 "  value: 1", "}", "allow_soft_placement: true", "",
                 "I0000 00:00:1795697322.902049   29952 coordination_service.cc:505] Example "
                 "stragglers:", "/job:worker/replica:0/task:1", "worker:0 serving", "loss: 0.5",
                 # A program's own line right after a hidden one is shown.
                 "I0000 00:00:1795891321.928861   29758 kernel_and_device.cc:101] Ignoring "
                 "error status", "chief: the cluster changed; workers now at a:1, b:2"):
        reporter.task_line(task, line)
    assert stream.getvalue().splitlines() == [
        "[worker:0 10.0.0.1] worker:0 serving", "[worker:0 10.0.0.1] loss: 0.5",
        "[worker:0 10.0.0.1] chief: the cluster changed; workers now at a:1, b:2"]


# ------------------------------------------------------------------ stragglers

def feed(watch, tasks, rates, start, seconds, step=0.5, named=None):
    """Points every STEP s from START for SECONDS, each task at its rate (None: silent); the
    Causes the ticks name go to NAMED."""
    now = start
    while now < start + seconds:
        now += step
        for task in tasks:
            if rates[task.label] is not None:
                watch.metric(task, {"step": 1, "examples_per_s": rates[task.label]}, now)
        (named if named is not None else []).extend(watch.tick(now))
    return now


def test_a_straggler_is_named_as_a_cause_once():
    cluster = cluster_of(ps=0, workers=3)
    watch = StragglerWatch(PlainReporter(io.StringIO()), after=5.0)
    for task in cluster.tasks:
        watch.started(task)
    named = []
    feed(watch, cluster.tasks, {"worker:0": 100.0, "worker:1": 10.0, "worker:2": 100.0}, 1000.0,
         30, named=named)
    assert [(c.kind, c.task) for c in named] == [(STRAGGLER, cluster.find("worker:1"))]
    assert named[0].text.startswith("worker:1 is a straggler: 10 examples/s over the last 10s")


def test_a_worker_under_half_its_peers_median_for_long_enough_is_a_straggler():
    cluster = cluster_of(ps=0, workers=3)
    console = io.StringIO()
    watch = StragglerWatch(PlainReporter(console), after=30.0)
    for task in cluster.tasks:
        watch.started(task)
    rates = {"worker:0": 100.0, "worker:1": 90.0, "worker:2": 100.0}
    now = feed(watch, cluster.tasks, rates, 1000.0, 20)
    assert console.getvalue() == ""
    rates["worker:1"] = 40.0  # under half of 100 from here on: marked 30 s later, not before
    now = feed(watch, cluster.tasks, rates, now, 35)
    assert console.getvalue() == ""
    now = feed(watch, cluster.tasks, rates, now, 10)
    assert console.getvalue().startswith(
        "tfcluster: worker:1 is a straggler: 40 examples/s over the last 10s, under half its "
        "peers' median (100) for 30s")
    rates["worker:1"] = None  # stopped: it does nothing at all
    now = feed(watch, cluster.tasks, rates, now, 10)
    rates["worker:1"] = 100.0
    now = feed(watch, cluster.tasks, rates, now, 15)
    assert console.getvalue().endswith("tfcluster: worker:1 caught up with its peers\n")
    line, = watch.summary(now)
    assert line.startswith("straggler: worker:1 ran under half its peers' median rate for ")
    assert line.endswith("(at worst 0% of it)")


def test_the_live_view_marks_the_straggler_row_and_the_slowest_worker_row():
    cluster = cluster_of(ps=0, workers=3)
    console = Console(file=io.StringIO(), width=140, color_system=None)
    reporter = LiveReporter(console=console, live=False)
    for task in cluster.tasks:
        reporter.task_started(task, 1)
    reporter.task_straggling(cluster.tasks[1], "worker:1 is a straggler: ...")
    reporter.task_slowest(cluster.tasks[2], True)
    frame = Console(file=io.StringIO(), width=140, color_system=None)
    frame.print(reporter.render())
    rows = {line.split()[0]: line for line in frame.file.getvalue().splitlines() if line}
    assert "running, straggler" in rows["worker:1"] and "straggler" not in rows["worker:0"]
    assert "running, slowest" in rows["worker:2"] and "slowest" not in rows["worker:1"]
