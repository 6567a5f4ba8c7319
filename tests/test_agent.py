"""The host-side agent on its own, spoken to over its stdin/stdout as the controller does:
process groups, exit records, streamed output, lease, ownership, identities, ports."""
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time

import pytest

from support import REPO
from support.agents import AGENT, AgentProcess
from support.ports import free_port_block, port_free
from support.procs import pid_alive, wait_for
from tfcluster_agent import gpuclaims, hostcode, hostinfo
from tfcluster_agent import protocol as P
from tfcluster_agent import supervisor


def start(agent, run_dir, tasks, lease=0.0):
    agent.send(P.Start(run_dir=str(run_dir), tasks=tasks, lease=lease))
    reply = agent.next((P.Accepted, P.Error))
    assert isinstance(reply, P.Accepted), reply


def exit_codes(agent, count):
    """{task name: exit code} of the next COUNT tasks to exit."""
    exits = {}
    while len(exits) < count:
        msg = agent.next(P.Exited)
        exits[msg.name] = msg.code
    return exits


def outputs(agent, name):
    return "".join(m.text for m in agent.seen if isinstance(m, P.Output) and m.name == name)


def test_tasks_stream_output_and_exit_status_and_keep_secrets(agent, tmp_path):
    run_dir = tmp_path / "run"
    start(agent, run_dir, [
        {"name": "worker-0", "command": "echo hello; echo $GREETING", "env": {"GREETING": "s3cr3t"}},
        {"name": "worker-1", "command": "echo failing >&2; exit 3"}])
    exits = exit_codes(agent, 2)
    assert exits == {"worker-0": 0, "worker-1": 3}
    assert outputs(agent, "worker-0") == "hello\ns3cr3t\n"
    assert "failing" in outputs(agent, "worker-1")
    assert {m.name for m in agent.seen if isinstance(m, P.Started)} == {"worker-0", "worker-1"}
    # The log has the output; no file names the secret's value; the folder is private.
    assert (run_dir / "worker-0.log").read_text() == "hello\ns3cr3t\n"
    for path in run_dir.iterdir():
        assert b"s3cr3t" not in path.read_bytes() or path.name == "worker-0.log", path
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    assert json.loads((run_dir / "worker-0.task.json").read_text())["env_names"] == ["GREETING"]


def test_ends_found_together_are_reported_in_the_order_they_happened(agent, tmp_path):
    """Both tasks end while the agent is stopped, the second of its list first: their exits
    come in the order their supervisors recorded them, each with that time."""
    run_dir, go = tmp_path / "run", tmp_path / "go"
    wait = "while [ ! -e %s ]; do sleep 0.02; done; " % go
    start(agent, run_dir, [{"name": "worker-0", "command": wait + "sleep 0.3"},
                           {"name": "worker-1", "command": wait + "exit 1"}])
    wait_for(lambda: all((run_dir / (n + ".pid")).exists() for n in ("worker-0", "worker-1")),
             20, "both tasks to start")
    os.kill(agent.proc.pid, signal.SIGSTOP)
    try:
        go.touch()
        wait_for(lambda: all((run_dir / (n + ".status")).exists()
                             for n in ("worker-0", "worker-1")), 20, "both tasks to end")
    finally:
        os.kill(agent.proc.pid, signal.SIGCONT)
    first, second = agent.next(P.Exited), agent.next(P.Exited)
    assert [first.name, second.name] == ["worker-1", "worker-0"]
    assert first.ended == os.stat(run_dir / "worker-1.status").st_mtime < second.ended


def test_a_forked_supervisor_keeps_nothing_of_the_agent_and_outlives_it(agent, tmp_path):
    run_dir = tmp_path / "run"
    go = tmp_path / "go"  # the task runs until the test has looked at its supervisor
    start(agent, run_dir, [{"name": "worker-0",
                            "command": "while [ ! -e %s ]; do sleep 0.05; done; echo done" % go}])
    agent.next(P.Started)
    record = json.loads((run_dir / "worker-0.pid").read_text())
    sup = record["supervisor"]
    assert sup != agent.proc.pid and os.getsid(sup) == sup  # a session of its own

    def open_files(pid):
        return {os.readlink("/proc/%d/fd/%s" % (pid, fd)) for fd in os.listdir("/proc/%d/fd" % pid)}
    agent_channel = {os.readlink("/proc/%d/fd/%d" % (agent.proc.pid, fd)) for fd in (0, 1)}
    assert not open_files(sup) & agent_channel  # the controller's channel stays the agent's
    # The agent dies: the supervisor records the task's end all the same, then is gone.
    agent.proc.kill()
    agent.proc.wait()
    assert pid_alive(sup)
    go.touch()
    wait_for(lambda: (run_dir / "worker-0.status").exists(), 20, "the exit status")
    assert (run_dir / "worker-0.status").read_text() == "0"
    assert (run_dir / "worker-0.log").read_text() == "done\n"
    wait_for(lambda: not pid_alive(sup), 10, "the supervisor to end")


def test_a_task_starts_as_popen_started_it(agent, tmp_path):
    """The supervisor forks and execs the task's shell itself (no subprocess): the task gets
    SIGPIPE back at its default, none of the supervisor's descriptors (its port claim), and a
    missing cwd fails its start with the error Popen gave, exit 127."""
    run_dir, port = tmp_path / "run", free_port_block(1)
    start(agent, run_dir, [
        {"name": "worker-0", "port": port, "await_listening": False,
         "command": "yes | head -n 1; ls -l /proc/$$/fd | grep -c tfcluster || true"},
        {"name": "worker-1", "command": "echo never", "cwd": str(tmp_path / "missing")}])
    exits = exit_codes(agent, 2)
    assert exits == {"worker-0": 0, "worker-1": 127}
    # With SIGPIPE ignored, `yes` would go on and complain of a broken pipe.
    assert outputs(agent, "worker-0") == "y\n0\n"
    assert outputs(agent, "worker-1") == "tfcluster agent: cannot start task: [Errno 2] No " \
        "such file or directory: '%s'\n" % (tmp_path / "missing")
    assert (run_dir / "worker-1.status").read_text() == "127"


def test_a_task_gets_a_private_tmpdir_removed_when_it_ends(agent, tmp_path):
    """Each task's TMPDIR is a new 0700 folder inside the one it was given, and it is gone by
    the time its exit is reported, whether the task ended by itself or was killed; a symbolic
    link in it is removed, not followed, and so is a link the task put in its folder's place."""
    run_dir, parent, kept = tmp_path / "run", tmp_path / "tmp", tmp_path / "kept"
    parent.mkdir()
    kept.mkdir()
    (kept / "file").write_text("x")
    fill = 'echo "$TMPDIR"; stat -c %%a "$TMPDIR"; mkdir "$TMPDIR/sub"; touch "$TMPDIR/sub/f"; ' \
           'ln -s %s "$TMPDIR/link"' % kept
    start(agent, run_dir, [
        {"name": "worker-0", "env": {"TMPDIR": str(parent)}, "command": fill},
        {"name": "worker-1", "env": {"TMPDIR": str(parent)}, "command": fill + "; kill -KILL $$"},
        {"name": "worker-2", "env": {"TMPDIR": str(parent)},
         "command": 'rmdir "$TMPDIR" && ln -s %s "$TMPDIR"' % kept}])
    assert exit_codes(agent, 3) == {"worker-0": 0, "worker-1": 128 + 9, "worker-2": 0}
    for name in ("worker-0", "worker-1"):
        folder, mode = outputs(agent, name).split()
        assert os.path.dirname(folder) == str(parent), folder
        assert os.path.basename(folder).startswith("tfcluster-%s-" % name) and mode == "700"
    assert list(parent.iterdir()) == []
    assert (kept / "file").read_text() == "x"


def test_a_task_started_nice_has_its_niceness_and_its_sessions_autogroups(agent, tmp_path):
    """launch --nice: the task and what it starts at that niceness, and its session's autogroup
    too where the kernel has autogroups (without it the niceness would only order the task's
    own processes); a task started without it at the agent's."""
    show = "nice; sh -c nice; cat /proc/self/autogroup 2>/dev/null || echo none"
    start(agent, tmp_path / "run", [{"name": "worker-0", "command": show, "nice": 10},
                                    {"name": "worker-1", "command": show}])
    assert exit_codes(agent, 2) == {"worker-0": 0, "worker-1": 0}
    base = os.getpriority(os.PRIO_PROCESS, 0)
    niced, plain = outputs(agent, "worker-0").split("\n"), outputs(agent, "worker-1").split("\n")
    assert niced[:2] == [str(max(base, 10))] * 2 and plain[:2] == [str(base)] * 2
    if niced[2] != "none":
        assert niced[2].endswith(" nice 10") and plain[2].endswith(" nice 0"), (niced, plain)


def test_stop_kills_the_whole_process_group(agent, tmp_path):
    run_dir = tmp_path / "run"
    # The task forks a grandchild; stopping must take both.
    start(agent, run_dir, [{"name": "worker-0", "cwd": str(tmp_path),
                            "command": "sleep 300 & echo $! > child.pid; wait"}])
    pid = agent.next(P.Started).pid
    child = int(wait_for(lambda: (tmp_path / "child.pid").exists() and
                         (tmp_path / "child.pid").read_text().strip(), 10, "the grandchild's pid"))
    assert pid_alive(pid) and pid_alive(child)
    agent.send(P.Stop(names=["worker-0"], ports=[], grace=2))
    answer = agent.next(P.Stopped)
    assert answer.tasks == {"worker-0": "stopped"} and answer.remaining == []
    assert not pid_alive(child) and not pid_alive(pid)
    exited = [m for m in agent.seen if isinstance(m, P.Exited)]
    assert [(m.name, m.code) for m in exited] == [("worker-0", 128 + 15)]


def test_a_closed_channel_ends_the_lease_and_a_detach_does_not(tmp_path):
    """The lease is long, so neither run can lose it while the test sets up; once both
    controllers are gone, each .lease is aged past it, as if the lease had run out."""
    leased, detached = AgentProcess(), AgentProcess()
    try:
        start(leased, tmp_path / "run", [{"name": "worker-0", "command": "exec sleep 300"}],
              lease=60)
        start(detached, tmp_path / "other", [{"name": "worker-0", "command": "exec sleep 300"}],
              lease=60)
        leased_pid, detached_pid = leased.next(P.Started).pid, detached.next(P.Started).pid
        leased.proc.stdin.close()          # the controller vanished without a word
        detached.send(P.Detach())
        detached.proc.stdin.close()
        # The agent touches .lease as it reads the detach, so age it only once that is done.
        wait_for(lambda: (tmp_path / "other" / ".detached").exists(), 20, "the detach")
        long_ago = time.time() - 120
        for run in ("run", "other"):
            os.utime(tmp_path / run / ".lease", (long_ago, long_ago))
        wait_for(lambda: not pid_alive(leased_pid), 20, "the task to stop after its lease")
        assert "lease expired" in (tmp_path / "run" / "worker-0.log").read_text()
        assert pid_alive(detached_pid), "a detached run has no lease"
    finally:
        subprocess.run([sys.executable, AGENT, "stop", "--dir", str(tmp_path / "other")],
                       capture_output=True, timeout=60)
        for agent in (leased, detached):
            agent.proc.wait(timeout=30)


def test_a_new_cluster_reaches_the_task_that_goes_on(agent, tmp_path):
    run_dir = tmp_path / "run"
    agent.send(P.NewCluster(cluster={"worker": ["a:1"]}))  # no run here yet: refused
    assert isinstance(agent.next((P.Accepted, P.Error)), P.Error)
    start(agent, run_dir, [{"name": "chief-0", "env": {
        P.CLUSTER_FILE_ENV: str(run_dir / P.CLUSTER_FILE)},
        "command": "while [ ! -e $%s ]; do sleep 0.05; done; cat $%s" % (
            P.CLUSTER_FILE_ENV, P.CLUSTER_FILE_ENV)}])
    cluster = {"chief": ["10.0.0.1:2222"], "worker": ["10.0.0.2:2222", "10.0.9.1:2222"]}
    agent.send(P.NewCluster(cluster=cluster))
    assert isinstance(agent.next((P.Accepted, P.Error)), P.Accepted)
    assert exit_codes(agent, 1) == {"chief-0": 0}
    assert json.loads(outputs(agent, "chief-0")) == cluster
    assert stat.S_IMODE((run_dir / P.CLUSTER_FILE).stat().st_mode) & 0o077 == 0


def test_a_run_never_adopts_another_runs_folder(agent, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    agent.send(P.Start(run_dir=str(run_dir), tasks=[{"name": "worker-0", "command": "true"}]))
    reply = agent.next((P.Accepted, P.Error))
    assert isinstance(reply, P.Error) and "exists already" in reply.message
    agent.send(P.Start(run_dir=str(tmp_path / "x"), tasks=[{"name": "../x", "command": "true"}]))
    assert isinstance(agent.next((P.Accepted, P.Error)), P.Error)


def test_stop_spares_a_process_whose_pid_was_reused(agent, tmp_path):
    """A record whose pid now belongs to someone else (a reboot, a reused pid) is not signalled."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    foreign = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        planted = {"pid": foreign.pid, "start": supervisor.start_time(foreign.pid) + 1,
                   "boot": supervisor.boot_id()}
        (run_dir / "worker-0.pid").write_text(json.dumps(planted))
        rebooted = dict(planted, start=supervisor.start_time(foreign.pid), boot="another-boot")
        (run_dir / "worker-1.pid").write_text(json.dumps(rebooted))
        agent.send(P.Attach(run_dir=str(run_dir), from_start=True))
        states = agent.next(P.Attached).tasks
        assert not states["worker-0"]["alive"] and not states["worker-1"]["alive"]
        agent.send(P.Stop(names=["worker-0", "worker-1"], ports=[], grace=1))
        assert agent.next(P.Stopped).tasks == {"worker-0": "not running", "worker-1": "not running"}
        assert pid_alive(foreign.pid)
    finally:
        foreign.kill()
        foreign.wait()


def preflight_ports(link, port, tmp_path):
    """A preflight of PORT that imports nothing (no interpreter there): its report."""
    absent = tmp_path / "absent"  # inside a fresh temporary folder: no such path can exist
    link.send(P.Preflight(python=str(absent / "python"), ports=[port], code_dir=str(absent)))
    return link.next(P.Report).report


def test_a_port_is_claimed_from_preflight_until_its_task_has_exited(agent, tmp_path):
    """Two launches that pick the same port: the second is refused, naming the first, before
    anything of it is made, even though nothing listens on the port yet."""
    port = free_port_block(1)
    task = {"name": "ps-0", "command": "exec sleep 300", "port": port}

    def refused(link, run_dir):
        link.send(P.Start(run_dir=str(run_dir), tasks=[task], lease=0.0))
        reply = link.next((P.Accepted, P.Error))
        assert isinstance(reply, P.Error), reply
        assert not run_dir.exists()
        return reply.message

    first = AgentProcess()  # a launch in its preflight holds the port until its agent ends
    try:
        report = preflight_ports(first, port, tmp_path)
        assert report["ports"] == {str(port): True} and report["port_holders"] == {}
        assert "port(s) %d claimed by a launch in its preflight, agent pid %d (user %s): " \
            "nothing started" % (port, first.proc.pid, gpuclaims.user_name()) \
            in refused(agent, tmp_path / "run")
    finally:
        first.close()
    start(agent, tmp_path / "run", [task])
    assert agent.next(P.Started).name == "ps-0"
    second = AgentProcess()  # the task's supervisor holds it while the task runs
    try:
        report = preflight_ports(second, port, tmp_path)
        assert report["ports"] == {str(port): False}
        # The claims are system-wide, so each label names its user (docs/labs.md).
        user = gpuclaims.user_name()
        assert report["port_holders"] == {str(port): "run run (user %s)" % user}
        assert "claimed by run run (user %s)" % user in refused(second, tmp_path / "second")
        agent.send(P.Stop(names=["ps-0"], ports=[], grace=1))
        assert agent.next(P.Stopped).tasks == {"ps-0": "stopped"}
        assert preflight_ports(second, port, tmp_path)["port_holders"] == {}
    finally:
        second.close()


def test_a_failed_start_keeps_no_claim_and_no_claims_folder_claims_nothing(agent, tmp_path,
                                                                           monkeypatch):
    port = free_port_block(1)
    (tmp_path / "taken").mkdir()
    agent.send(P.Start(run_dir=str(tmp_path / "taken"), lease=0.0, tasks=[
        {"name": "ps-0", "command": "exec sleep 300", "port": port}]))
    reply = agent.next((P.Accepted, P.Error))
    assert isinstance(reply, P.Error) and "exists already" in reply.message, reply
    other = AgentProcess()
    try:
        report = preflight_ports(other, port, tmp_path)
        assert report["ports"] == {str(port): True} and report["port_holders"] == {}
    finally:
        other.close()
    (tmp_path / "file").write_text("")  # where the claims folder cannot be made
    monkeypatch.setattr(gpuclaims, "CLAIMS_DIR", str(tmp_path / "file" / "claims"))
    assert hostinfo.claim_port(port) == (None, None)


@pytest.mark.slow  # a real TensorFlow import
def test_listening_event_and_preflight(agent, tmp_path):
    server = socket.socket()
    server.bind(("", 0))
    server.listen()
    port = server.getsockname()[1]
    try:
        agent.send(P.Preflight(python=sys.executable, ports=[port], code_dir=REPO + "/trainers"))
        report = agent.next(P.Report, timeout=150).report  # a real TensorFlow import
        assert report["ports"] == {str(port): False}
        assert report["python_ok"] and report["tf_version"].startswith("2.21")
        assert report["code_hash"] == hostcode.code_hash(REPO + "/trainers")
        start(agent, tmp_path / "run", [{"name": "ps-0", "command": "exec sleep 300",
                                         "port": port}])
        assert agent.next(P.Listening).port == port
    finally:
        server.close()
    assert port_free(port)
    agent.send(P.Stop(names=["ps-0"], ports=[], grace=1))  # its claim ends with it
    assert agent.next(P.Stopped).tasks == {"ps-0": "stopped"}
    absent = tmp_path / "absent"  # inside a fresh temporary folder: no such path can exist
    agent.send(P.Preflight(python=str(absent / "python"), ports=[port], code_dir=str(absent)))
    report = agent.next(P.Report).report
    assert report["ports"] == {str(port): True} and report["code_hash"] is None
    assert not report["python_ok"] and "no interpreter" in report["error"]


def test_code_hash_changes_with_content(tmp_path):
    for package in hostcode.packages():
        (tmp_path / package).mkdir()
    (tmp_path / "trainers" / "a.py").write_text("x = 1\n")
    (tmp_path / "unrelated.py").write_text("not host code\n")
    first = hostcode.code_hash(str(tmp_path))
    (tmp_path / "trainers" / "__pycache__").mkdir()
    (tmp_path / "trainers" / "__pycache__" / "a.pyc").write_text("junk")
    (tmp_path / "unrelated.py").write_text("changed, still not host code\n")
    assert hostcode.code_hash(str(tmp_path)) == first
    (tmp_path / "trainers" / "a.py").write_text("x = 2\n")
    second = hostcode.code_hash(str(tmp_path))
    assert second != first
    (tmp_path / "tfcluster_agent" / "agent.py").write_text("# the agent is host code too\n")
    assert hostcode.code_hash(str(tmp_path)) != second


def test_cached_code_hash_follows_every_change(tmp_path, monkeypatch):
    code, cache = tmp_path / "code", tmp_path / "cache"
    for package in hostcode.packages():
        (code / package).mkdir(parents=True)
    source = code / "trainers" / "a.py"
    source.write_text("x = 1\n")
    # Just written: not remembered (a change within the clock's tick could keep the times).
    assert hostinfo.cached_code_hash(str(code), str(cache), settle_ns=10**12) == hostcode.code_hash(str(code))
    assert not cache.exists()
    first = hostinfo.cached_code_hash(str(code), str(cache), settle_ns=0)
    assert first == hostcode.code_hash(str(code)) and len(list(cache.iterdir())) == 1
    # A remembered hash is what the files hash to, and it is used: a forged entry is believed.
    entry = next(cache.iterdir())
    entry.write_text(json.dumps(dict(json.loads(entry.read_text()), digest="f" * 64)))
    assert hostinfo.cached_code_hash(str(code), str(cache)) == "f" * 64
    # Same size, new bytes: the change time moves, the hash is computed again.
    source.write_text("x = 2\n")
    second = hostinfo.cached_code_hash(str(code), str(cache), settle_ns=0)
    assert second == hostcode.code_hash(str(code)) != first
    (code / "trainers" / "b.py").write_text("")
    assert hostinfo.cached_code_hash(str(code), str(cache), settle_ns=0) == hostcode.code_hash(str(code)) != second
    os.remove(code / "trainers" / "b.py")
    assert hostinfo.cached_code_hash(str(code), str(cache), settle_ns=0) == second
    # Files in a new folder, and in a folder that a listing remembered.
    (code / "trainers" / "sub").mkdir()
    (code / "trainers" / "sub" / "c.py").write_text("")
    third = hostinfo.cached_code_hash(str(code), str(cache), settle_ns=0)
    assert third == hostcode.code_hash(str(code)) != second
    (code / "trainers" / "sub" / "d.py").write_text("")
    assert hostinfo.cached_code_hash(str(code), str(cache), settle_ns=0) == hostcode.code_hash(str(code)) != third
    # A skipped name stays skipped on the remembered listing too.
    (code / "trainers" / ".hidden.py").write_text("")
    assert hostinfo.cached_code_hash(str(code), str(cache), settle_ns=0) == hostcode.code_hash(str(code))
    # A folder that changed while its files did not (a __pycache__ made in it): listed once
    # more, then remembered again, not listed at every preflight after it.
    (code / "trainers" / "__pycache__").mkdir()
    listings = []
    monkeypatch.setattr(hostinfo, "code_files",
                        lambda *args: listings.append(args) or hostcode.code_files(*args))
    for _ in range(2):
        assert hostinfo.cached_code_hash(str(code), str(cache), settle_ns=0) == hostcode.code_hash(str(code))
    assert len(listings) == 1


def test_a_preflight_of_unchanged_code_needs_no_regular_expression(tmp_path):
    """The agent's start does without re (and enum, which it imports): the remembered listing
    stands while no folder changed, and its JSON goes through _json."""
    code = """import sys; sys.path.insert(0, %r)
from tfcluster_agent import hostinfo, protocol
hostinfo.cached_code_hash(%r, %r, settle_ns=0)
protocol.decode(protocol.encode(protocol.Hello(pid=1, hostname="h", boot_id="b")))
print(sorted(m for m in ("re", "enum", "json") if m in sys.modules))""" % (
        REPO, REPO, str(tmp_path))
    argv = [sys.executable, "-S", "-c", code]
    assert subprocess.run(argv, capture_output=True, text=True, check=True).stdout  # listed
    assert subprocess.run(argv, capture_output=True, text=True, check=True).stdout == "[]\n"


def test_the_agent_without_site_finds_tensorflow_where_a_plain_start_would():
    """The agent starts with -S (no site): its preflight still looks TensorFlow up in-process,
    in the folders site would add, and finds what the interpreter's plain start imports."""
    from tfcluster_agent.hostinfo import TF_PROBE
    plain = subprocess.run([sys.executable, TF_PROBE, "locate"],
                           capture_output=True, text=True, check=True).stdout.strip()
    without_site = subprocess.run(
        [sys.executable, "-S", "-c", "import sys; sys.path.insert(0, %r); from tfcluster_agent "
         "import hostinfo; print(hostinfo.locate_tensorflow())" % REPO],
        capture_output=True, text=True, check=True).stdout.strip()
    assert plain and without_site == plain
