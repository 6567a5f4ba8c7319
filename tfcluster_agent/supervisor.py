"""One task under its supervisor, and the records that let anyone stop it later. Stdlib only.

A supervisor (forked by the agent: a task costs no second interpreter start) starts its task in
a new session and process group, copies the task's output to NAME.log and to the agent, honours
the controller's lease and writes the exit status. It lives in a session of its own and outlives
the agent, so a run's tasks keep being recorded if the agent dies.

Run folder (0700, files 0600), per task: NAME.log, NAME.pid (the group leader's pid, its start time
and the boot id: a pid is only signalled while all three still match), NAME.status (exit status,
128+N for signal N), NAME.task.json (command, cwd and the NAMES of its environment variables:
values never reach a file). Per run: .lease (touched while a controller is connected) and
.detached (present when no lease applies).
"""
import fcntl
import os
import select
import time

from tfcluster_agent import jsonc as json
from tfcluster_agent.tasktmp import private_tmp, remove_tree

# signal is imported where used, subprocess and threading nowhere: the agent's start and each
# task's pay for none of them.

LEASE_CHECK_SECONDS = 1.0
EXIT_POLL_SECONDS = 0.05  # where the kernel gives no pidfd to wait on


def boot_id():
    try:
        with open("/proc/sys/kernel/random/boot_id") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def proc_stat(pid):
    """The fields of /proc/PID/stat after the command name (state first), or None."""
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _start_of(fields):
    """Start time (clock ticks since boot, /proc/PID/stat field 22) from proc_stat's FIELDS."""
    try:
        return int(fields[19]) if fields else None
    except (ValueError, IndexError):
        return None


def signal_in(pid, mask, signum):
    """True when SIGNUM is in PID's MASK of /proc/PID/status ("SigBlk": blocked, "SigCgt":
    caught); False when the process is gone."""
    try:
        with open("/proc/%d/status" % pid) as handle:
            for line in handle:
                if line.startswith(mask + ":"):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def start_time(pid):
    """The process's start time in clock ticks since boot, or None."""
    return _start_of(proc_stat(pid))


def has_live_member(pgid):
    """True when a process that is not a zombie still belongs to process group PGID."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = proc_stat(int(entry))
            if fields and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
                return True
    return False


def stop_task(run_dir, name, grace):
    """Stop task NAME of RUN_DIR if it runs (TERM, then KILL after GRACE s): "stopped",
    "still running" or "not running"."""
    if not task_state(run_dir, name)["alive"]:
        return "not running"
    return "stopped" if kill_group(run_dir, name, grace) else "still running"


read_json = json.load_file


def read_int(path):
    try:
        with open(path) as handle:
            return int(handle.read().strip())
    except (OSError, ValueError):
        return None


def write_atomic(path, text):
    """Readers see the old file or the new one; private (0600): a task's records and the
    host's report are nobody else's business."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except OSError:  # a full disk, or PATH a folder: no half file left beside it
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise


def group_is_ours(record):
    """True while the process group RECORD names is still the one we started.

    After a reboot (another boot id) or once the leader's pid was reused (another start time) it
    is someone else's. A group whose leader exited but whose children live on cannot have been
    reused: Linux never hands out a pid that is still some group's id.
    """
    if not record or not record.get("pid"):
        return False
    pgid = int(record["pid"])
    if record.get("boot") != boot_id():
        return False
    fields = proc_stat(pgid)
    if fields is not None and _start_of(fields) != record.get("start"):
        return False  # the pid belongs to another process now
    if fields is not None and fields[0] not in ("Z", "X"):
        return True
    # The leader is dead (or a zombie): the group is ours while a live member remains. Zombies
    # count for nothing: a parent that does not reap them would keep a dead group "alive".
    return has_live_member(pgid)


def is_task_name(name):
    """JOB-INDEX, e.g. worker-0: lowercase job (letter first, then letters or digits), a number."""
    job, dash, index = str(name).rpartition("-")
    return bool(dash and job[:1].isalpha() and job.isalnum() and job.isascii() and
                job == job.lower() and index.isdigit() and index.isascii())


def task_names(run_dir):
    try:
        return sorted(n[:-len(".pid")] for n in os.listdir(run_dir) if n.endswith(".pid"))
    except OSError:
        return []


def task_state(run_dir, name):
    record = read_json(os.path.join(run_dir, name + ".pid"))
    code = read_int(os.path.join(run_dir, name + ".status"))
    alive = code is None and group_is_ours(record)
    if code is None and not alive:
        state = "lost"  # supervisor gone without a record: the end is unknown
    else:
        state = "running" if alive else "exited"
    return {"pid": (record or {}).get("pid"), "alive": alive, "exit": code, "state": state}


def end_time(run_dir, name):
    """When the task's end was seen (its status file's time, this host's clock), or None."""
    try:
        return os.stat(os.path.join(run_dir, name + ".status")).st_mtime
    except OSError:
        return None


def kill_group(run_dir, name, grace, reap=None):
    """TERM the task's group, KILL it after GRACE seconds; True when it is gone (or not ours).

    The task's parent calls it with REAP (its poll): a dead leader is a zombie, and so still
    "ours", until its parent reaps it."""
    import _signal
    record = read_json(os.path.join(run_dir, name + ".pid"))
    for sig, wait in ((_signal.SIGTERM, grace), (_signal.SIGKILL, 10)):
        if not group_is_ours(record):
            return True
        try:
            os.killpg(int(record["pid"]), sig)
        except ProcessLookupError:
            return True
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if reap is not None:
                reap()
            if not group_is_ours(record):
                return True
            time.sleep(0.02)
    return not group_is_ours(record)


def lease_expired(run_dir, lease_seconds):
    if not lease_seconds or os.path.exists(os.path.join(run_dir, ".detached")):
        return False
    try:
        return time.time() - os.path.getmtime(os.path.join(run_dir, ".lease")) > lease_seconds
    except OSError:
        return False


class Forked:
    """A forked child as its parent sees it, with Popen's pid, stdout, poll() and wait(): a
    supervisor as the agent sees it, a task as its supervisor does.

    The lock lets the agent's stop threads poll while its main loop waits."""

    def __init__(self, pid, stdout=None):
        import _thread
        self.pid, self.stdout, self.returncode = pid, stdout, None
        self._lock = _thread.allocate_lock()

    def _reap(self, flags):
        with self._lock:
            if self.returncode is None:
                pid, status = os.waitpid(self.pid, flags)
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def poll(self):
        return self._reap(os.WNOHANG)

    def wait(self):
        return self._reap(0)


def fork(run_dir, name, lease, spec, keep_fd=None, keep_fds=()):
    """Start SPEC's task under a supervisor forked from this process; a Forked.

    The child keeps nothing of the agent's: a session of its own, /dev/null for stdin and
    stderr, its stdout the pipe to the agent, KEEP_FD (the port's claim) and KEEP_FDS (its
    GPUs' claims) as descriptors 3 and up, every other descriptor closed, default signals.
    It never returns into the agent's code."""
    import _signal  # not signal: its enums import enum, functools and collections
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setsid()
            null = os.open(os.devnull, os.O_RDWR)
            os.dup2(null, 0)
            os.dup2(write_end, 1)
            os.dup2(null, 2)
            keep = ([keep_fd] if keep_fd is not None else []) + list(keep_fds)
            # Moved above their targets first, so that no dup2 overwrites another claim.
            moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, 3 + len(keep)) for fd in keep]
            for target, fd in enumerate(moved, 3):
                os.dup2(fd, target)
            os.closerange(3 + len(keep), os.sysconf("SC_OPEN_MAX"))
            _signal.signal(_signal.SIGINT, _signal.default_int_handler)
            _signal.signal(_signal.SIGTERM, _signal.SIG_DFL)
            supervise(run_dir, name, lease, spec, out_fd=1)
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    os.set_blocking(read_end, False)
    return Forked(pid, os.fdopen(read_end, "rb", buffering=0))


def spawn_shell(command, cwd, env, out_fd, nice=0):
    """`/bin/sh -c COMMAND` in CWD with ENV, in a session of its own, stdin /dev/null, stdout and
    stderr OUT_FD, no other descriptor and default signals, at niceness NICE (priority.py), as
    subprocess.Popen would start it (its OSError too: a missing CWD); a Forked. By hand:
    subprocess costs every supervisor their imports."""
    import _signal
    report_read, report_write = os.pipe()  # closed by the exec: it reads empty when exec worked
    pid = os.fork()
    if pid == 0:
        try:
            os.setsid()
            if nice:
                from tfcluster_agent.priority import lower_priority
                lower_priority(nice)
            if cwd:
                os.chdir(cwd)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(out_fd, 1)
            os.dup2(out_fd, 2)
            os.closerange(3, report_write)
            os.closerange(report_write + 1, os.sysconf("SC_OPEN_MAX"))
            for sig in (_signal.SIGPIPE, _signal.SIGXFSZ):  # ignored by Python, not by programs
                _signal.signal(sig, _signal.SIG_DFL)
            os.execve("/bin/sh", ["/bin/sh", "-c", command], env)
        except OSError as err:
            os.write(report_write, json.dumps([err.errno, err.strerror, err.filename]).encode())
        finally:
            os._exit(127)
    os.close(report_write)
    with os.fdopen(report_read, "rb") as report:
        failed = report.read()
    if failed:
        os.waitpid(pid, 0)
        raise OSError(*json.loads(failed))
    return Forked(pid)


def supervise(run_dir, name, lease, spec, out_fd):
    """Run the task of SPEC (a TaskSpec); its output goes to NAME.log and to OUT_FD (the agent).
    The task's TMPDIR is a folder of its own, inside the one it would have had, removed when it
    ends however it ends: what a killed program leaves there, and what TensorFlow's autograph
    never removes (its modules' bytecode), does not pile up in the host's /tmp."""
    base = os.path.join(run_dir, name)
    env = dict(os.environ)
    env.update(spec.env)
    for var, value in spec.env_prepend.items():
        env[var] = value + (os.pathsep + env[var] if env.get(var) else "")
    tmp = private_tmp(env.get("TMPDIR") or "/tmp", name)
    if tmp:
        env["TMPDIR"] = tmp
    try:
        status, ended_ns = _supervise(base, run_dir, name, lease, spec, env, out_fd)
    finally:
        if tmp:  # gone before the end is told (and after a supervisor that raised)
            remove_tree(tmp)
    write_atomic(base + ".status", status)
    if ended_ns is not None:
        # Its time is when the end was seen, to the nanosecond (end_time): a file's own times
        # move by the kernel's tick, and the tasks of a cascade end milliseconds apart.
        os.utime(base + ".status", ns=(ended_ns, ended_ns))


def _supervise(base, run_dir, name, lease, spec, env, out_fd):
    """The task of SPEC run to its end: (its exit status, when its end was seen in ns or None
    where it could not start)."""
    write_atomic(base + ".task.json", json.dumps(spec.public_json()))
    log_fd = os.open(base + ".log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    agent = out_fd

    def emit(data):
        nonlocal agent
        os.write(log_fd, data)
        view = memoryview(data)
        while agent is not None and view:
            try:
                view = view[os.write(agent, view):]
            except OSError:  # the agent is gone; the log file still gets everything
                agent = None

    read_end, write_end = os.pipe()
    try:
        proc = spawn_shell(spec.command, spec.cwd, env, write_end, spec.nice)
    except OSError as err:
        emit(("tfcluster agent: cannot start task: %s\n" % err).encode())
        return "127", None
    finally:
        os.close(write_end)
    write_atomic(base + ".pid", json.dumps({"pid": proc.pid, "start": start_time(proc.pid),
                                            "boot": boot_id(), "supervisor": os.getpid()}))
    try:
        exited = os.pidfd_open(proc.pid)
    except OSError:  # no pidfd (Linux before 5.3, valgrind): the task's end is looked for
        exited = None
    open_fds = [read_end] + ([] if exited is None else [exited])
    while True:
        ready, _, _ = select.select(open_fds, [], [], LEASE_CHECK_SECONDS if exited is not None
                                    else EXIT_POLL_SECONDS)
        if read_end in ready:
            data = os.read(read_end, 65536)
            if data:
                emit(data)
            else:
                open_fds.remove(read_end)
        if (exited is None or exited in ready) and proc.poll() is not None:
            ended_ns = time.time_ns()
            break
        if lease_expired(run_dir, lease):
            emit(b"tfcluster agent: controller lease expired, stopping the task\n")
            kill_group(run_dir, name, grace=5, reap=proc.poll)
    # The task ended: pass on what it wrote last (children that keep the pipe open are cut off).
    os.set_blocking(read_end, False)
    try:
        while read_end in open_fds:
            data = os.read(read_end, 65536)
            if not data:
                break
            emit(data)
    except BlockingIOError:
        pass
    code = proc.returncode
    return str(code if code >= 0 else 128 - code), ended_ns

