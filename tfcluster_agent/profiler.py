"""TensorFlow's profiler for a run's tasks, on the host (standard library only).

Starting: every Python process of a task loaded stacks/sitecustomize.py, which blocks
PROFILE_SIGNAL and waits for it in a thread of its own. start_profilers claims a port in the
task's fenced range (its TensorFlow port + PORT_OFFSET and up) like a task port, writes it to
RUN_DIR/.profiler/PID.request and signals the task's processes, leader first, until one answers
that its profiler server listens (RUN_DIR/.profiler/PID.answer). The claim covers the moment
between choosing the port and the server binding it; from then on the bound port keeps other
launches off it (their preflight finds it busy). A second profile finds the server running.

Tracing: trace runs profiletrace.py with the host's TensorFlow interpreter, which traces every
listed server at once (tf.profiler.experimental.client.trace) into a folder of the run, and
answers with the files written there. Each profiler server writes its own trace file on its own
host, under the folder the client named (TensorFlow's design): the agent of every other host
sends its files from that folder (ProfileFiles).
"""
import os
import subprocess
import time

from tfcluster_agent import protocol as P
from tfcluster_agent import supervisor as S

# sitecustomize.py computes the same: SIGRTMAX - 3 is the stacks' signal.
PROFILE_SIGNAL = getattr(__import__("signal"), "SIGRTMAX", 64) - 4
# The fence covers 100 ports from each machine's port base (roles/firewall): the task ports
# from the base up, their profiler servers PORT_OFFSET above them.
PORT_OFFSET = 50
PORT_TRIES = 10
ANSWER_SECONDS = 5.0
FOLDER = ".profiler"


@P.message
class StartProfilers:
    """Start a profiler server in each task of PORTS ({name: its TensorFlow port}); a Report
    {"profilers": {name: {"port": N} or {"error": why}}}."""
    kind = "start_profilers"
    run_dir: str
    ports: dict


@P.message
class TraceProfile:
    """Trace the profiler servers at ADDRESSES (host:port) for DURATION_MS at once, with the
    interpreter PYTHON, into RUN_DIR/profile/STAMP; a Report {"files": {path: base64},
    "error": why or "", "window": [asked, written] (wall-clock seconds) or None}."""
    kind = "trace_profile"
    run_dir: str
    python: str
    addresses: list
    duration_ms: int
    stamp: str


@P.message
class ProfileFiles:
    """The trace files this host's profiler servers wrote under FOLDER, a trace's folder inside
    RUN_DIR/profile/; a Report {"files": {path in the run folder: base64}}."""
    kind = "profile_files"
    run_dir: str
    folder: str


def _read_answer(path, deadline):
    while time.monotonic() < deadline:
        try:
            with open(path) as handle:
                text = handle.read().strip()
            if text:
                return text
        except FileNotFoundError:
            pass
        time.sleep(0.02)
    return None


def _ask(folder, pid, port):
    """The answer of process PID asked to serve its profiler on PORT, or None."""
    answer = os.path.join(folder, "%d.answer" % pid)
    try:
        os.unlink(answer)
    except FileNotFoundError:
        pass
    S.write_atomic(os.path.join(folder, "%d.request" % pid), "%d\n" % port)
    try:
        os.kill(pid, PROFILE_SIGNAL)
    except ProcessLookupError:
        return "error the process has exited"
    return _read_answer(answer, time.monotonic() + ANSWER_SECONDS)


def _free_port(task_port, claims, holder):
    """(a port above TASK_PORT claimed for this profiler, its claim descriptor or None); (None,
    why) when none of PORT_TRIES is free."""
    from tfcluster_agent.hostinfo import claim_port, label_claim, port_is_free
    for port in range(task_port + PORT_OFFSET, task_port + PORT_OFFSET + PORT_TRIES):
        fd, other = claim_port(port)
        if other is not None:
            continue
        if not port_is_free(port):
            if fd is not None:
                os.close(fd)
            continue
        if fd is not None:
            label_claim(fd, holder)
            claims.append(fd)
        return port, None
    return None, "no free port in %d-%d for its profiler server" % (
        task_port + PORT_OFFSET, task_port + PORT_OFFSET + PORT_TRIES - 1)


def start_one(run_dir, name, task_port, claims):
    """{"port": N} once a process of task NAME serves its profiler, else {"error": why}."""
    from tfcluster_agent.stall import scan_groups
    record = S.read_json(os.path.join(run_dir, name + ".pid"))
    if not S.group_is_ours(record):
        return {"error": "it is not running"}
    pgid = int(record["pid"])
    members = sorted(scan_groups([pgid])[pgid][1], key=lambda pid: (pid != pgid, pid))
    # Its sitecustomize waits for the signal in a thread: the signal is blocked.
    candidates = [pid for pid in members if S.signal_in(pid, "SigBlk", PROFILE_SIGNAL)]
    if not candidates:
        return {"error": "no process of it loaded tfcluster's sitecustomize (not Python, or "
                         "PYTHONPATH replaced)"}
    folder = os.path.join(run_dir, FOLDER)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    port, why = None, None
    reasons = []
    for pid in candidates:
        answer = _served(folder, pid)
        if answer is None:
            if port is None:
                port, why = _free_port(int(task_port), claims, "the profiler of %s in %s"
                                       % (name, os.path.basename(run_dir)))
                if port is None:
                    return {"error": why}
            answer = _ask(folder, pid, port)
        if answer is None:
            reasons.append("pid %d did not answer within %gs" % (pid, ANSWER_SECONDS))
            continue
        word, _, rest = answer.partition(" ")
        if word == "listening":
            S.write_atomic(os.path.join(folder, "%d.port" % pid), rest + "\n")
            return {"port": int(rest), "pid": pid}
        reasons.append(rest if word == "no-tensorflow" else "pid %d: %s" % (pid, rest))
    return {"error": "; ".join(dict.fromkeys(reasons))}


def _served(folder, pid):
    """`listening PORT` when PID's server was started by an earlier profile."""
    try:
        with open(os.path.join(folder, "%d.port" % pid)) as handle:
            return "listening %d" % int(handle.read())
    except (OSError, ValueError):
        return None


def start_profilers(run_dir, ports):
    claims = []
    try:
        return {name: start_one(run_dir, name, port, claims) for name, port in ports.items()}
    finally:
        for fd in claims:  # each server binds its port now (or never will)
            os.close(fd)


def trace(msg, code_root):
    """{"files": {path in the run folder: base64}, "error": ""} of one trace of every server."""
    out = os.path.join(msg.run_dir, "profile", msg.stamp)
    os.makedirs(out, mode=0o700, exist_ok=True)
    script = os.path.join(code_root, "tfcluster_agent", "profiletrace.py")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    # Nice: the client must not take the cores the traced tasks train on.
    proc = subprocess.run(
        ["nice", "-n", "10", msg.python, script, ",".join(msg.addresses), out,
         str(int(msg.duration_ms))], env=env, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        timeout=msg.duration_ms / 1000.0 + 180)
    error, window = "", None
    lines = [line for line in proc.stdout.decode(errors="replace").splitlines() if line.strip()]
    if proc.returncode:
        error = lines[-1] if lines else "the trace client exited with %d" % proc.returncode
    elif lines and lines[-1].startswith("window "):
        window = [float(word) for word in lines[-1].split()[1:3]]
    return {"files": read_files(msg.run_dir, out), "error": error, "window": window}


def read_files(run_dir, folder):
    """{path relative to RUN_DIR: base64} of the files under FOLDER, a trace's folder of the
    run; ValueError for any other folder."""
    import base64
    top = os.path.join(os.path.realpath(run_dir), "profile") + os.sep
    if not os.path.realpath(folder).startswith(top):
        raise ValueError("%s is not a trace folder of the run %s" % (folder, run_dir))
    files = {}
    for root, _, names in os.walk(folder):
        for name in sorted(names):
            path = os.path.join(root, name)
            with open(path, "rb") as handle:
                files[os.path.relpath(path, run_dir)] = base64.b64encode(handle.read()).decode()
    return files


def answer(msg, send, code_root):
    """Answer StartProfilers or TraceProfile from a thread: the agent's loop goes on."""
    import threading

    def work():
        try:
            if msg.kind == StartProfilers.kind:
                report = {"profilers": start_profilers(msg.run_dir, msg.ports)}
            elif msg.kind == ProfileFiles.kind:
                report = {"files": read_files(msg.run_dir, msg.folder)}
            else:
                report = trace(msg, code_root)
            send(P.Report(report=report))
        except (OSError, ValueError, TypeError, subprocess.SubprocessError) as err:
            send(P.Error(message="%s: %s" % (msg.kind, err)))
    threading.Thread(target=work, daemon=True).start()
