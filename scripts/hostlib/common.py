"""What both test-host tools need: one-line errors, the command line, tools, polling, locks,
processes, mounts and the state file. Nothing here reads or writes a path at import time."""

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SBIN_DIRS = "/usr/local/sbin:/usr/sbin:/sbin:/usr/local/bin:/usr/bin:/bin"


class Fail(Exception):
    """A user-facing error: one line on stderr, exit code `code`."""

    def __init__(self, msg, code=1):
        super().__init__(msg)
        self.code = code


# --------------------------------------------------------------------------
# the command line


def require_root(prog, why):
    """The first check of every command, before any path is touched: an ordinary user may not
    be able to enter the checkout (root's home is 0700), and still gets this one line."""
    if os.geteuid() != 0:
        raise Fail(f"{prog} needs root ({why}): run as root", 2)


def host_count(low, high, why=""):
    """An argparse type: an integer LOW..HIGH."""
    def parse(text):
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}")
        if not low <= n <= high:
            raise argparse.ArgumentTypeError(f"must be {low}..{high}{why}")
        return n
    return parse


def host_tool_parser(prog, description, up_help, low, high, timeout, more=(), why=""):
    """The command line both tools share: `up N [--timeout S]`, `down`, `status`; the caller adds
    the subcommands named in MORE to the returned subparsers."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    names = ",".join(["up", "down", "status", *more])
    sub = p.add_subparsers(dest="cmd", metavar="{" + names + "}")
    up = sub.add_parser("up", help=up_help)
    up.add_argument("n", type=host_count(low, high, why), metavar="N",
                    help=f"number of hosts, {low}..{high}")
    up.add_argument("--timeout", type=float, default=timeout,
                    help=f"seconds for every sshd to accept logins (default {timeout:g})")
    sub.add_parser("down", help="remove everything up made (safe to repeat)")
    sub.add_parser("status", help="one line per host")
    return p, sub


def _terminate(signum, frame):
    raise KeyboardInterrupt  # so a killed `up` still cleans up after itself


def run_command(prog, parser, argv, preflight, lock, commands):
    """Parse ARGV, run PREFLIGHT, then COMMANDS[args.cmd](args) holding LOCK; a Fail becomes one
    line on stderr and its exit code. Returns the exit code."""
    signal.signal(signal.SIGTERM, _terminate)
    args = parser.parse_args(argv)
    if not args.cmd:
        parser.print_usage(sys.stderr)
        print(f"{prog}: error: a command is required", file=sys.stderr)
        return 2
    try:
        preflight()
        with lock:
            return commands[args.cmd](args) or 0
    except Fail as e:
        print(str(e) if str(e).startswith(prog) else f"{prog}: {e}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


# --------------------------------------------------------------------------
# tools


def search_path():
    return os.environ.get("PATH", "") + ":" + SBIN_DIRS


def find_tools(tools, path=None):
    """TOOLS maps a tool to its Debian package. Returns ({tool: absolute path}, [missing])."""
    found, missing = {}, []
    for name in tools:
        where = shutil.which(name, path=search_path() if path is None else path)
        if where:
            found[name] = where
        else:
            missing.append(name)
    return found, missing


def missing_tools_message(prog, missing, tools):
    pkgs = sorted({tools[t] for t in missing})
    return (f"{prog} needs {', '.join(missing)}: install the Debian package"
            f"{'s' if len(pkgs) > 1 else ''} {' '.join(pkgs)} (apt-get install {' '.join(pkgs)})")


def require_tools(prog, tools):
    _, missing = find_tools(tools)
    if missing:
        raise Fail(missing_tools_message(prog, missing, tools), 2)


def tool(name):
    """NAME's absolute path on PATH or in the sbin folders (root's tools), else NAME."""
    return shutil.which(name, path=search_path()) or name


# --------------------------------------------------------------------------
# commands, polling


def run(args, check=True, capture=True, timeout=30, env=None):
    """Run a command; on failure raise Fail with the last line of its stderr."""
    try:
        p = subprocess.run(args, stdin=subprocess.DEVNULL, capture_output=capture,
                           text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise Fail(f"timed out after {timeout}s: {' '.join(map(str, args))}")
    if check and p.returncode != 0:
        err = (p.stderr or p.stdout or "").strip().splitlines()
        raise Fail(f"command failed ({p.returncode}): {' '.join(map(str, args))}"
                   + (f": {err[-1]}" if err else ""))
    return p


def wait_until(cond, timeout, interval=0.05):
    """Poll cond() until it returns a true value or timeout; return last value."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v or time.monotonic() >= deadline:
            return v
        time.sleep(interval)


def tcp_open(addr, port=22, timeout=0.5):
    try:
        with socket.create_connection((addr, port), timeout=timeout):
            return True
    except OSError:
        return False


def log_tail(path, n=3, missing=""):
    """The last N lines of the log at PATH on one line."""
    try:
        return " | ".join(Path(path).read_text(errors="replace").strip().splitlines()[-n:])
    except OSError:
        return missing


class Lock:
    """Serialise the commands of one tool on this machine (an flock on PATH)."""

    def __init__(self, path, prog, timeout=120):
        self.path, self.prog, self.timeout = Path(path), prog, timeout
        self.fd = None

    def __enter__(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)

        def try_lock():
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                return False

        if not wait_until(try_lock, self.timeout, 0.1):
            os.close(self.fd)
            raise Fail(f"another {self.prog} command holds {self.path} "
                       f"(waited {self.timeout}s)")
        return self

    def __exit__(self, *exc):
        os.close(self.fd)


# --------------------------------------------------------------------------
# processes


def proc_cmdline(pid):
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
            "utf-8", "replace")
    except OSError:
        return ""


def is_zombie(pid):
    """True for a process that has ended but is not reaped yet, or is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def processes_naming(folder, also=""):
    """Pids of processes (not this one) whose command line names FOLDER/ (and ALSO)."""
    marker = str(folder) + "/"
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            cmd = proc_cmdline(d.name)
            if marker in cmd and also in cmd:
                pids.append(int(d.name))
    return sorted(pids)


def started_from(pid, folder):
    """True while PID runs a command line that names FOLDER/ (a pid we recorded is still ours)."""
    return bool(pid) and str(folder) + "/" in proc_cmdline(pid) and not is_zombie(pid)


def kill_and_wait(pids, timeout):
    """TERM, then KILL after TIMEOUT seconds; returns the pids still alive after both."""
    pids = set(pids)
    for sig, t in ((signal.SIGTERM, timeout), (signal.SIGKILL, 3.0)):
        for p in list(pids):
            try:
                os.kill(p, sig)
            except (ProcessLookupError, PermissionError):
                pids.discard(p)

        def gone():
            for p in list(pids):
                try:
                    os.waitpid(p, os.WNOHANG)  # reaps it if it is our child
                except ChildProcessError:
                    pass
                if not Path(f"/proc/{p}").exists() or is_zombie(p):
                    pids.discard(p)
            return not pids

        if wait_until(gone, t):
            return []
    return sorted(pids)


def start_logged(argv, log):
    """Start ARGV in a session of its own, its output appended to the file LOG."""
    with open(log, "ab") as out:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
                                cwd="/")


# --------------------------------------------------------------------------
# mounts, files


def mounts():
    """(root, mount point) of every mount visible here."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    return [(f[3], f[4].replace("\\040", " ")) for f in map(str.split, lines) if len(f) >= 5]


def mounts_under(folder):
    """Mount points below FOLDER, deepest first."""
    inside = [mnt for _, mnt in mounts() if mnt.startswith(str(folder) + "/")]
    return sorted(inside, key=len, reverse=True)


def remove_tree(folder):
    """rm -rf FOLDER, after unmounting what is mounted below it (never delete through a mount)."""
    for mnt in mounts_under(folder):
        run([tool("umount"), "-l", mnt], check=False)
    left = mounts_under(folder)
    if left:
        raise Fail(f"cannot remove {folder}: {left[0]} is still mounted")
    shutil.rmtree(folder, ignore_errors=True)


def write_atomically(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class StateFile:
    """A tool's record of what it made (JSON), rewritten after every step so `down` finds it."""

    def __init__(self, path):
        self.path = Path(path)

    def load(self):
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None

    def save(self, state):
        write_atomically(self.path, json.dumps(state, indent=2) + "\n")


# --------------------------------------------------------------------------
# up and down, status


def refuse_leftovers(prog, left, state):
    """`up` on hosts that are up, or on what a crash left: exit 2, asking for `down`."""
    if left:
        what = (f"{prog} already up ({state.get('n')} hosts)" if state and state.get("complete")
                else f"{prog} leftovers exist ({left[0]}{', ...' if len(left) > 1 else ''})")
        raise Fail(f"{what}: run `scripts/{prog} down` first", 2)


@contextlib.contextmanager
def undone_on_failure(prog, down):
    """A failed or interrupted `up` runs DOWN(quiet=True) and fails with one line."""
    try:
        yield
    except BaseException as e:
        msg = str(e) if isinstance(e, Fail) else f"{type(e).__name__}: {e}"
        print(f"{prog}: up failed: {msg}; cleaning up", file=sys.stderr)
        try:
            down(quiet=True)
        except Fail as e2:
            print(f"{prog}: cleanup after failed up: {e2}", file=sys.stderr)
        if isinstance(e, KeyboardInterrupt):
            raise Fail("interrupted", 130)
        raise Fail("up failed (see above)", 1)


def print_not_up(prog, left):
    print(f"{prog}: not up" + (f"; leftovers (run down): {'; '.join(left)}" if left else ""))


def plural(n, word):
    return f"{n} {word}{'s' if n > 1 else ''}"
