"""Stalled tasks and their stacks, on the host (standard library only).

A watched task is stalled when its log has not grown and its process group has used less than
a small share of one core for STALL_AFTER seconds. The watch costs next to nothing: the size of
each log (one stat), and one pass over /proc/*/stat for the CPU of the silent tasks' groups,
every poll_interval(STALL_AFTER) seconds; no process is started.

Stacks: every Python process of a task loaded stacks/sitecustomize.py, which registered
faulthandler on a signal and wrote RUN_DIR/.stacks/PID.txt's header. take_stacks signals the
processes of the tasks' groups that did (and still catch that signal), waits for their dumps
and writes RUN_DIR/stacks/NAME.txt per task: what each process of the task is doing.
"""
import os
import time
from _collections import deque  # collections.deque itself: the package imports more modules

from tfcluster_agent import protocol as P
from tfcluster_agent import supervisor as S

CPU_SHARE = 0.01       # of one core over the window: less is "no CPU"
MIN_CPU_SECONDS = 0.05
DUMP_SECONDS = 3.0     # how long a process gets to write its stacks
_TICKS = os.sysconf("SC_CLK_TCK")


# The messages (protocol.DEFINED_IN names them: they are decoded after this module is loaded).

@P.message
class WatchStalls:
    """Send Stalled when a task of NAMES printed nothing and used almost no CPU for STALL_AFTER
    seconds, and Resumed when it goes on."""
    kind = "watch_stalls"
    names: list
    stall_after: float


@P.message
class TakeStacks:
    """Save the stacks of the tasks NAMES in RUN_DIR/stacks/; a Report {"stacks": {name: text}}."""
    kind = "take_stacks"
    run_dir: str
    names: list


@P.message
class Stalled:
    kind = "stalled"
    name: str
    seconds: float  # quiet for so long, having used CPU seconds:
    cpu: float


@P.message
class Resumed:
    kind = "resumed"
    name: str
    seconds: float  # after being quiet for so long
    why: str        # output | CPU


def poll_interval(stall_after):
    """Seconds between two looks: a stall is seen at most this late."""
    return min(5.0, max(P.MIN_STALL_AFTER, stall_after / 10.0))


def cpu_threshold(stall_after):
    return max(MIN_CPU_SECONDS, CPU_SHARE * stall_after)


def scan_groups(pgids):
    """{pgid: (CPU seconds of its live members and the children they reaped, [member pids])}."""
    found = {pgid: [0, []] for pgid in pgids}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = S.proc_stat(int(entry))
        # After the command: state, ppid, pgrp (index 2); utime, stime, cutime, cstime (11-14).
        if not fields or fields[0] in ("Z", "X"):
            continue
        group = found.get(int(fields[2]))
        if group is not None:
            group[0] += sum(int(f) for f in fields[11:15])
            group[1].append(int(entry))
    return {pgid: (ticks / _TICKS, pids) for pgid, (ticks, pids) in found.items()}


class _Watched:
    def __init__(self, task, now):
        self.task = task          # the agent's Task: a restart makes a new one
        self.pgid = None
        self.log_size = -1
        self.quiet_since = now    # its last output, or its start
        self.samples = deque()  # (time, its group's CPU) while quiet
        self.stalled = False
        self.last_scan = None     # the group's CPU as last scanned
        self.cpu_gone = 0.0       # what members that exited took out of the scanned sum

    def cpu(self, scanned):
        """The group's CPU seconds as a sum that never falls: a member that exits takes its
        seconds out of the live members' sum (unless a member reaped it), which is no idleness."""
        if self.last_scan is not None and scanned < self.last_scan:
            self.cpu_gone += self.last_scan - scanned
        self.last_scan = scanned
        return scanned + self.cpu_gone


class StallWatch:
    """Watches the agent's tasks named NAMES; sends Stalled and Resumed through SEND."""

    def __init__(self, run_dir, tasks, names, stall_after, send):
        if not run_dir:
            raise ValueError("this agent started no run: there is nothing to watch")
        self.run_dir, self.tasks, self.names = run_dir, tasks, set(names)
        self.stall_after, self.send = float(stall_after), send
        self.interval = poll_interval(self.stall_after)
        self.threshold = cpu_threshold(self.stall_after)
        self.watched = {}
        self.next_poll = 0.0

    def poll(self):
        now = time.monotonic()
        if now < self.next_poll:
            return
        self.next_poll = now + self.interval
        quiet = []
        for name in self.names:
            task = self.tasks.get(name)
            if task is None or task.exit_sent:
                continue
            watched = self.watched.get(name)
            if watched is None or watched.task is not task:
                watched = self.watched[name] = _Watched(task, now)
            if watched.pgid is None:
                record = S.read_json(os.path.join(self.run_dir, name + ".pid")) or {}
                if not isinstance(record.get("pid"), int):
                    continue  # not started yet
                watched.pgid = record["pid"]
            try:
                size = os.stat(os.path.join(self.run_dir, name + ".log")).st_size
            except OSError:
                size = -1
            if size == watched.log_size:
                quiet.append(watched)
                continue
            watched.log_size = size
            self._resume(watched, now, "output")
            watched.quiet_since = now
            watched.samples.clear()
        if quiet:
            groups = scan_groups([w.pgid for w in quiet])
            for watched in quiet:
                scanned, members = groups[watched.pgid]
                if members:  # none: the task has ended (being stopped), its exit on its way
                    self._judge(watched, now, watched.cpu(scanned))

    def _judge(self, watched, now, cpu):
        """Stalled: quiet for STALL_AFTER, and the CPU of the last STALL_AFTER seconds (a
        sliding window: an idle process's few ticks never add up to a stall's end) is small."""
        samples = watched.samples
        samples.append((now, cpu))
        while len(samples) > 1 and samples[1][0] <= now - self.stall_after:
            samples.popleft()  # the oldest left is the window's start
        used = cpu - samples[0][1]
        if used >= self.threshold:
            self._resume(watched, now, "CPU")
        elif not watched.stalled and now - watched.quiet_since >= self.stall_after:
            watched.stalled = True
            self.send(Stalled(name=watched.task.name, seconds=round(now - watched.quiet_since, 1),
                              cpu=round(used, 2)))

    def _resume(self, watched, now, why):
        if watched.stalled:
            watched.stalled = False
            self.send(Resumed(name=watched.task.name, seconds=round(now - watched.quiet_since, 1),
                              why=why))


# ---------------------------------------------------------------- stacks

def _describe(pid):
    """pid 123 (python3) S in do_epoll_wait: what the kernel says a process does."""
    fields = S.proc_stat(pid)
    try:
        with open("/proc/%d/comm" % pid) as handle:
            comm = handle.read().strip()
        with open("/proc/%d/wchan" % pid) as handle:
            wchan = handle.read().strip()
    except OSError:
        comm, wchan = "?", ""
    return "pid %d (%s) state %s%s" % (pid, comm, fields[0] if fields else "?",
                                       " in %s" % wchan if wchan not in ("", "0") else "")


def _header(path):
    """(signal, main thread id) from a stacks file's first line, or None."""
    try:
        with open(path) as handle:
            words = handle.readline().split()
        return int(words[4]), words[6]
    except (OSError, ValueError, IndexError):
        return None


def take_stacks(run_dir, names, hostname):
    """{name: text}: every process of each running task, with every Python thread's stack."""
    groups, texts = {}, {}
    for name in names:
        record = S.read_json(os.path.join(run_dir, name + ".pid"))
        if S.group_is_ours(record):
            groups[name] = int(record["pid"])
        else:
            texts[name] = "%s is not running\n" % name
    members = scan_groups(groups.values())
    folder = os.path.join(run_dir, ".stacks")
    pending = {}  # pid -> (path, size before, main thread)
    lines = {name: [] for name in groups}
    for name, pgid in groups.items():
        for pid in sorted(members[pgid][1]):
            path = os.path.join(folder, "%d.txt" % pid)
            header = _header(path)
            lines[name].append(pid)
            if header and S.signal_in(pid, "SigCgt", header[0]):
                pending[pid] = (path, os.path.getsize(path), header[1])
                try:
                    os.kill(pid, header[0])
                except ProcessLookupError:
                    del pending[pid]
    dumps = _wait_for_dumps(pending)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    for name, pids in lines.items():
        parts = ["# %s on %s at %s: every process of its group\n" % (name, hostname, stamp)]
        for pid in pids:
            parts.append("# %s" % _describe(pid))
            if pid in dumps:
                parts.append(", main thread %s\n%s" % (pending[pid][2], dumps[pid]))
            elif pid in pending:
                parts.append(": its Python stacks did not come within %gs\n" % DUMP_SECONDS)
            else:
                parts.append(": no Python stacks (not Python, or it did not load tfcluster's "
                             "sitecustomize)\n")
        texts[name] = "".join(parts)
    out = os.path.join(run_dir, "stacks")
    os.makedirs(out, mode=0o700, exist_ok=True)
    for name, text in texts.items():
        S.write_atomic(os.path.join(out, name + ".txt"), text)
    return texts


def _wait_for_dumps(pending):
    """{pid: the text it appended}, once each file grew and then kept its size for a moment
    (faulthandler writes a dump in one go, thread by thread)."""
    deadline = time.monotonic() + DUMP_SECONDS
    sizes = {pid: size for pid, (_, size, _) in pending.items()}
    done, steady = {}, {}
    while len(done) < len(pending) and time.monotonic() < deadline:
        time.sleep(0.02)
        for pid, (path, before, _) in pending.items():
            if pid in done:
                continue
            try:
                size = os.path.getsize(path)
            except OSError:
                continue
            steady[pid] = steady.get(pid, 0) + 1 if size == sizes[pid] and size > before else 0
            sizes[pid] = size
            if steady[pid] >= 2:
                with open(path, "rb") as handle:
                    handle.seek(before)
                    done[pid] = handle.read().decode(errors="replace")
    return done


def answer_take_stacks(msg, send):
    """Answer a TakeStacks from a thread: the agent's loop keeps passing output meanwhile."""
    import threading

    def take():
        try:
            send(P.Report(report={"stacks": take_stacks(msg.run_dir, msg.names,
                                                        os.uname().nodename)}))
        except (OSError, ValueError, TypeError) as err:
            send(P.Error(message="take_stacks: %s" % err))
    threading.Thread(target=take, daemon=True).start()

