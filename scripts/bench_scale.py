"""The control plane at 1 to 128 test hosts against a plain parallel SSH fan-out (issue 29).

For each host count, alternating, medians of N: a whole `tfcluster launch --cmd true` with one
worker per host, and the fan-out it is measured against: one `ssh host python3 -c pass` per host,
all started at once, with the same key and known_hosts. Then `tfcluster check` (the preflight
alone), a detached `sleep` run's `tfcluster status` and `tfcluster stop`, and the launch's
teardown (its "success policy met" line to its exit), each against the same fan-out; and the
fan-out again with the key exchange paramiko (tfcluster's SSH) negotiates, curve25519.

The controller's figures: its CPU (the launch process and what it waited for, from wait4), and,
sampled every SAMPLE_SECONDS over the process and its descendants on this machine, peak resident
memory, threads and open descriptors. The fan-out's are those of its ssh processes together.
The test hosts share this machine's cores: a host's sshd, agent and task cost CPU here too.
"""
import os
import statistics
import subprocess
import threading
import time

SAMPLE_SECONDS = 0.05
# OpenSSH 9's default key exchange (sntrup761 or mlkem768 with x25519) costs its client several
# times paramiko's curve25519: the fan-out is also timed with that one (the launch's ratio to it).
CURVE25519 = ["-o", "KexAlgorithms=curve25519-sha256"]


def testhost_address(number):
    return "10.231.0.%d" % (10 + number)


def process_table():
    """{pid: (ppid, rss kB, threads, open descriptors)} of every process now."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/status" % entry) as handle:
                fields = dict(line.split(":", 1) for line in handle if ":" in line)
            fds = len(os.listdir("/proc/%s/fd" % entry))
        except (OSError, ValueError):
            continue  # gone meanwhile
        table[int(entry)] = (int(fields["PPid"]), int(fields.get("VmRSS", "0 kB").split()[0]),
                             int(fields["Threads"]), fds)
    return table


class Peaks:
    """Peak resident memory (MB), threads and descriptors of ROOTS() and their descendants."""

    def __init__(self, roots):
        self.roots, self.memory, self.threads, self.fds = roots, 0.0, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self):
        while not self._stop.is_set():
            table = process_table()
            children = {}
            for pid, (ppid, _, _, _) in table.items():
                children.setdefault(ppid, []).append(pid)
            tree, todo = set(), [p for p in self.roots() if p in table]
            while todo:
                pid = todo.pop()
                if pid not in tree:
                    tree.add(pid)
                    todo += children.get(pid, [])
            self.memory = max(self.memory, sum(table[p][1] for p in tree) / 1024)
            self.threads = max(self.threads, sum(table[p][2] for p in tree))
            self.fds = max(self.fds, sum(table[p][3] for p in tree))
            self._stop.wait(SAMPLE_SECONDS)

    def close(self):
        self._stop.set()
        self._thread.join()


def waited(proc):
    """(exit status, CPU seconds of PROC and what it waited for) once PROC has ended."""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_utime + usage.ru_stime


class Sample:
    """One measured run: wall seconds, controller CPU seconds, and the peaks."""

    def __init__(self, seconds, cpu, peaks, output=""):
        self.seconds, self.cpu, self.output = seconds, cpu, output
        self.memory, self.threads, self.fds = peaks.memory, peaks.threads, peaks.fds


def measured(argv, what, env=None):
    """Run ARGV (a tfcluster command) to its end: a Sample; exits the bench when it fails."""
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    peaks = Peaks(lambda: [proc.pid])
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(
        (time.monotonic(), raw.decode(errors="replace")) for raw in proc.stdout), daemon=True)
    reader.start()
    code, cpu = waited(proc)
    seconds = time.monotonic() - start
    reader.join(10)
    peaks.close()
    if code != 0:
        raise SystemExit("bench: %s exited %d:\n%s" % (what, code, "".join(
            line for _, line in lines[-30:])))
    sample = Sample(seconds, cpu, peaks, "".join(line for _, line in lines))
    sample.lines, sample.end = lines, start + seconds
    return sample


def fan_out(ssh, addresses):
    """One `ssh host python3 -c pass` per address, all at once: a Sample of them together."""
    before = os.times()
    start = time.monotonic()
    procs = [subprocess.Popen(ssh + ["root@" + address, "python3", "-c", "pass"],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE) for address in addresses]
    peaks = Peaks(lambda: [p.pid for p in procs])
    failed = [p for p in procs if p.wait() != 0]
    seconds = time.monotonic() - start
    peaks.close()
    if failed:
        raise SystemExit("bench: the fan-out failed: %s" % failed[0].stderr.read().decode()[-500:])
    for proc in procs:
        proc.stderr.close()
    after = os.times()
    return Sample(seconds, after.children_user + after.children_system
                  - before.children_user - before.children_system, peaks)


def medians(samples):
    """A Sample of each figure's median."""
    sample = Sample(0, 0, type("P", (), {"memory": 0, "threads": 0, "fds": 0})())
    for name in ("seconds", "cpu", "memory", "threads", "fds"):
        setattr(sample, name, statistics.median(getattr(s, name) for s in samples))
    return sample


FIGURES = (("launch", "`launch --cmd true`, one worker per host"),
           ("check", "`check` (the preflight alone)"),
           ("teardown", "teardown: success policy met → exit"),
           ("status", "`status` of a detached run"),
           ("stop", "`stop` of a detached run"))


def scale_table(tfcluster, inventory_for, ssh, counts, n, runs_dir):
    """Markdown lines for COUNTS hosts: TFCLUSTER(*args) is a tfcluster command line,
    INVENTORY_FOR(count) an inventory of the first COUNT test hosts, SSH the fan-out's ssh."""
    lines = ["| hosts | figure | tfcluster | fan-out | ratio | controller CPU | CPU per host "
             "| peak memory | threads | descriptors |", "|---" * 10 + "|"]
    for count in counts:
        inventory = inventory_for(count)
        addresses = [testhost_address(i) for i in range(1, count + 1)]

        def command(*args):
            return tfcluster("--runs-dir", runs_dir, *args)
        launch = command("launch", "--plain", "--cmd", "true", "-i", inventory,
                         "--workers", "all", "--success", "all_workers")
        measured(launch, "a first launch on %d hosts" % count)  # caches, compiled code
        runs = {what: [] for what, _ in FIGURES}
        runs["fan-out"], runs["fan-out x25519"] = [], []
        for i in range(n):  # alternating: a busy moment weighs on every kind alike
            run = measured(launch, "launch on %d hosts" % count)
            runs["launch"].append(run)
            met = next(t for t, line in run.lines if "success policy" in line)
            runs["teardown"].append(Sample(run.end - met, 0, run))
            runs["fan-out"].append(fan_out(ssh, addresses))
            runs["fan-out x25519"].append(fan_out(ssh + CURVE25519, addresses))
            runs["check"].append(measured(command("check", "-i", inventory),
                                          "check on %d hosts" % count))
            run_id = "scale-%d-%d" % (count, i)
            measured(command("launch", "--plain", "--cmd", "sleep 600", "-i", inventory,
                             "--workers", "all", "--detach", "--run-id", run_id),
                     "detached launch on %d hosts" % count)
            runs["status"].append(measured(command("status", run_id), "status, %d hosts" % count))
            runs["stop"].append(measured(command("stop", run_id), "stop, %d hosts" % count))
        got = {what: medians(samples) for what, samples in runs.items()}
        fan = got["fan-out"]
        for what, label in FIGURES:
            sample = got[what]
            controller = "| - | - | - | - | - |" if what == "teardown" else \
                "| %.3f s | %.4f s | %.0f MB | %d | %d |" % (
                    sample.cpu, sample.cpu / count, sample.memory, sample.threads, sample.fds)
            lines.append("| %d | %s | %.3f s | %.3f s | %.2f %s" % (
                count, label, sample.seconds, fan.seconds, sample.seconds / fan.seconds,
                controller))
        for what, label in (("fan-out", "the fan-out itself: %d ssh processes" % count),
                            ("fan-out x25519", "the same fan-out with paramiko's key exchange "
                             "(`%s`)" % " ".join(CURVE25519))):
            sample = got[what]
            lines.append("| %d | %s | - | %.3f s | %.2f | %.3f s | %.4f s | %.0f MB | %d | %d |" % (
                count, label, sample.seconds, got["launch"].seconds / sample.seconds, sample.cpu,
                sample.cpu / count, sample.memory, sample.threads, sample.fds))
    return lines
