#!/usr/bin/env python3
"""tfcluster task agent: runs on every host, standard library only.

The controller calls it once per action and host (locally or over SSH); it answers with one JSON
object on stdout. Each task runs in its own session and process group under a small supervisor
that records its pid and exit status in the run folder, so any later call (even from a new
controller) can see, stream and stop it.

Run folder layout (one per run and host): NAME.log, NAME.pgid (the task's process group id),
NAME.status (its exit status, written when it ends), NAME.supervisor (the supervisor's pid),
NAME.task.json (what was started) and .lease.
"""
import argparse
import base64
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time

LOG_CHUNK_LIMIT = 256 * 1024
HASHED_SUFFIXES = (".py", ".yml", ".yaml", ".json", ".txt")


def code_hash(directory):
    """Content hash of the trainer code: relative paths and bytes of every source file."""
    digest = hashlib.sha256()
    for root, dirs, files in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
        for name in sorted(files):
            if not name.endswith(HASHED_SUFFIXES):
                continue
            path = os.path.join(root, name)
            rel = os.path.relpath(path, directory).replace(os.sep, "/")
            with open(path, "rb") as handle:
                digest.update(rel.encode() + b"\0" + hashlib.sha256(handle.read()).digest())
    return digest.hexdigest()


def port_is_free(port):
    """True when nothing listens on PORT on any address (TF servers bind the wildcard address)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # Like gRPC, ignore TIME_WAIT leftovers of closed connections: only a listener counts.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True


def port_is_listening(port, host="127.0.0.1"):
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def group_alive(pgid):
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_int(path):
    try:
        with open(path) as handle:
            return int(handle.read().strip())
    except (OSError, ValueError):
        return None


def write_atomic(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as handle:
        handle.write(text)
    os.replace(tmp, path)


def task_names(run_dir):
    try:
        return sorted(n[:-len(".pgid")] for n in os.listdir(run_dir) if n.endswith(".pgid"))
    except FileNotFoundError:
        return []


def task_state(run_dir, name):
    pgid = read_int(os.path.join(run_dir, name + ".pgid"))
    code = read_int(os.path.join(run_dir, name + ".status"))
    alive = code is None and pgid is not None and group_alive(pgid)
    if code is None and not alive:
        # Supervisor gone without a record (killed from outside): the task's end is unknown.
        state = "lost"
    else:
        state = "running" if alive else "exited"
    return {"pid": pgid, "alive": alive, "exit": code, "state": state}


# ---------------------------------------------------------------- commands

def cmd_hash(args):
    print(code_hash(args.dir))


def python_report(python, cache_dir=None):
    """Version of TensorFlow importable by PYTHON, or the reason it is not.

    A successful import is remembered in CACHE_DIR, keyed by the interpreter and the installed
    TensorFlow package's path and modification time: a reinstall or upgrade invalidates it.
    """
    locate = ("import importlib.util, os; s = importlib.util.find_spec('tensorflow'); "
              "print(repr((os.path.realpath(s.origin), os.path.getmtime(s.origin))) if s else '')")
    try:
        found = subprocess.run([python, "-c", locate], capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        return {"python_ok": False, "error": "no interpreter at %s" % python}
    except (OSError, subprocess.TimeoutExpired) as err:
        return {"python_ok": False, "error": "cannot run %s: %s" % (python, err)}
    if found.returncode != 0 or not found.stdout.strip():
        return {"python_ok": False, "error": "%s cannot import tensorflow: it is not installed"
                % python}
    key = hashlib.sha256((os.path.realpath(python) + found.stdout).encode()).hexdigest()[:16]
    cache = os.path.join(cache_dir, ".preflight-%s.json" % key) if cache_dir else None
    if cache and os.path.exists(cache):
        with open(cache) as handle:
            return dict(json.load(handle), cached=True)
    probe = "import tensorflow as tf, sys; print(tf.__version__); print(sys.version.split()[0])"
    try:
        out = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=120,
                             env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    except subprocess.TimeoutExpired:
        return {"python_ok": False, "error": "importing tensorflow with %s took over 120 s" % python}
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["exit %d" % out.returncode])[-1]
        return {"python_ok": False, "error": "%s cannot import tensorflow: %s" % (python, last)}
    lines = out.stdout.strip().splitlines()
    report = {"python_ok": True, "tf_version": lines[-2], "python_version": lines[-1]}
    if cache:
        os.makedirs(cache_dir, exist_ok=True)
        write_atomic(cache, json.dumps(report))
    return report


def gpu_names():
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line for line in out.stdout.splitlines() if line.startswith("GPU ")]


def cmd_preflight(args):
    report = {"hostname": socket.gethostname(), "cpus": os.cpu_count() or 1,
              "agent_python": sys.executable}
    report.update(python_report(args.python, args.cache_dir))
    ports = [int(p) for p in args.ports.split(",") if p]
    report["ports"] = {str(p): port_is_free(p) for p in ports}
    report["code_hash"] = code_hash(args.code_dir) if os.path.isdir(args.code_dir) else None
    report["gpus"] = gpu_names()
    print(json.dumps(report))


def cmd_start(args):
    spec = json.loads(base64.b64decode(args.spec))
    os.makedirs(args.dir, exist_ok=True)
    # The lease starts now, so a controller that dies before its first poll still lets go.
    with open(os.path.join(args.dir, ".lease"), "a"):
        os.utime(os.path.join(args.dir, ".lease"))
    started = {}
    for task in spec["tasks"]:
        name = task["name"]
        if os.path.exists(os.path.join(args.dir, name + ".pgid")):
            raise SystemExit("task %s already started in %s" % (name, args.dir))
        with open(os.path.join(args.dir, name + ".task.json"), "w") as handle:
            json.dump(task, handle)
        subprocess.Popen([sys.executable, os.path.abspath(__file__), "supervise", "--dir", args.dir,
                          "--name", name, "--lease", str(spec.get("lease", 0))],
                         start_new_session=True, stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True)
    deadline = time.monotonic() + 10
    for task in spec["tasks"]:
        pid_file = os.path.join(args.dir, task["name"] + ".pgid")
        while not os.path.exists(pid_file) and time.monotonic() < deadline:
            time.sleep(0.02)
        started[task["name"]] = read_int(pid_file)
    print(json.dumps({"started": started}))


def cmd_supervise(args):
    """Run one task in its own process group; record pid and exit status; honour the lease."""
    base = os.path.join(args.dir, args.name)
    with open(base + ".task.json") as handle:
        task = json.load(handle)
    env = dict(os.environ)
    env.update(task.get("env", {}))
    for name, value in task.get("env_prepend", {}).items():
        env[name] = value + (os.pathsep + env[name] if env.get(name) else "")
    write_atomic(base + ".supervisor", str(os.getpid()))
    with open(base + ".log", "ab", buffering=0) as log:
        try:
            proc = subprocess.Popen(["/bin/sh", "-c", task["command"]], cwd=task.get("cwd") or None,
                                    env=env, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as err:
            log.write(("tfcluster agent: cannot start task: %s\n" % err).encode())
            write_atomic(base + ".pgid", "0")
            write_atomic(base + ".status", "127")
            return
        write_atomic(base + ".pgid", str(proc.pid))
        lease_file = os.path.join(args.dir, ".lease")
        while True:
            try:
                code = proc.wait(timeout=1.0)
                break
            except subprocess.TimeoutExpired:
                pass
            if args.lease and lease_expired(lease_file, args.lease):
                log.write(b"tfcluster agent: controller lease expired, stopping the task\n")
                kill_group(proc.pid, grace=5)
        code = proc.returncode
    # Signals map to the shell convention 128+N.
    write_atomic(base + ".status", str(code if code >= 0 else 128 - code))


def lease_expired(lease_file, lease_seconds):
    try:
        return time.time() - os.path.getmtime(lease_file) > lease_seconds
    except OSError:
        return False


def kill_group(pgid, grace):
    """TERM the group, KILL it after GRACE seconds; True when it is gone."""
    if not pgid or not group_alive(pgid):
        return True
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return True
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not group_alive(pgid):
            return True
        time.sleep(0.05)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return True
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if not group_alive(pgid):
            return True
        time.sleep(0.05)
    return False


def read_log(run_dir, name, offset, final):
    """New log text from OFFSET; only whole lines unless the task has ended."""
    path = os.path.join(run_dir, name + ".log")
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            data = handle.read(LOG_CHUNK_LIMIT)
    except FileNotFoundError:
        return "", offset
    if not final and len(data) < LOG_CHUNK_LIMIT:
        cut = data.rfind(b"\n") + 1
        data = data[:cut]
    return data.decode("utf-8", errors="replace"), offset + len(data)


def cmd_poll(args):
    offsets = json.loads(base64.b64decode(args.offsets)) if args.offsets else {}
    if os.path.isdir(args.dir):
        # The lease tells supervisors that a controller still watches this run.
        with open(os.path.join(args.dir, ".lease"), "a"):
            os.utime(os.path.join(args.dir, ".lease"))
    tasks = {}
    for name in task_names(args.dir):
        state = task_state(args.dir, name)
        text, offset = read_log(args.dir, name, int(offsets.get(name, 0)), not state["alive"])
        state.update(log=text, offset=offset)
        tasks[name] = state
    ports = [int(p) for p in args.listening.split(",") if p]
    print(json.dumps({"tasks": tasks, "listening": {str(p): port_is_listening(p) for p in ports}}))


def cmd_stop(args):
    names = args.names.split(",") if args.names else task_names(args.dir)
    result = {}
    for name in names:
        state = task_state(args.dir, name)
        if state["alive"]:
            gone = kill_group(state["pid"], args.grace)
            result[name] = "stopped" if gone else "still running"
        else:
            result[name] = "not running"
    ports = [int(p) for p in args.ports.split(",") if p]
    deadline = time.monotonic() + args.grace
    busy = [p for p in ports if not port_is_free(p)]
    while busy and time.monotonic() < deadline:
        time.sleep(0.1)
        busy = [p for p in busy if not port_is_free(p)]
    print(json.dumps({"tasks": result, "busy_ports": busy,
                      "remaining": [n for n in names if task_state(args.dir, n)["alive"]]}))


def cmd_files(args):
    names = sorted(os.listdir(args.dir)) if os.path.isdir(args.dir) else []
    print(json.dumps({"files": [n for n in names if n.endswith((".log", ".status", ".task.json"))]}))


def build_parser():
    parser = argparse.ArgumentParser(prog="agent.py", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    here = os.path.dirname(os.path.abspath(__file__))
    p = sub.add_parser("hash", help="print the trainer code's content hash")
    p.add_argument("--dir", default=here)
    p.set_defaults(func=cmd_hash)
    p = sub.add_parser("preflight", help="report interpreter, TensorFlow, ports, code hash, GPUs")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--ports", default="")
    p.add_argument("--code-dir", default=here)
    p.add_argument("--cache-dir", default=os.path.join(os.path.expanduser("~"), ".cache", "tfcluster"),
                   help="remember successful TensorFlow imports here")
    p.set_defaults(func=cmd_preflight)
    p = sub.add_parser("start", help="start tasks described by a base64 JSON spec")
    p.add_argument("--dir", required=True)
    p.add_argument("--spec", required=True)
    p.set_defaults(func=cmd_start)
    p = sub.add_parser("supervise", help=argparse.SUPPRESS)
    p.add_argument("--dir", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--lease", type=float, default=0)
    p.set_defaults(func=cmd_supervise)
    p = sub.add_parser("poll", help="task states and new log text")
    p.add_argument("--dir", required=True)
    p.add_argument("--offsets", default="")
    p.add_argument("--listening", default="")
    p.set_defaults(func=cmd_poll)
    p = sub.add_parser("stop", help="stop tasks (TERM, then KILL) and wait for their ports")
    p.add_argument("--dir", required=True)
    p.add_argument("--names", default="")
    p.add_argument("--ports", default="")
    p.add_argument("--grace", type=float, default=10)
    p.set_defaults(func=cmd_stop)
    p = sub.add_parser("files", help="list the run folder's logs and records")
    p.add_argument("--dir", required=True)
    p.set_defaults(func=cmd_files)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
