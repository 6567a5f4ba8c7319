"""The Docker engine of dockerhosts: the one DOCKER_HOST names, else a private dockerd with its
own config, data-root, exec-root and socket under <repo>/.work/dockerhosts/ that leaves the
machine's firewall and sysctls as found; and what a dead one leaves (processes, cgroups)."""

import json
import os
import signal
import subprocess
from pathlib import Path

from .common import (REPO, Fail, StateFile, is_zombie, log_tail, processes_naming,
                     start_logged, started_from, tool, wait_until)

STATE = REPO / ".work" / "dockerhosts"
STATE_FILE = StateFile(STATE / "state.json")
SOCKET = STATE / "docker.sock"
CGROUP_PARENT = "tfcdh"


def client():
    # Debian's client matches Debian's dockerd; another one on PATH may be newer than the engine.
    if not os.environ.get("DOCKER_HOST") and Path("/usr/bin/docker").exists():
        return "/usr/bin/docker"
    return tool("docker")


def docker_env(state):
    env = dict(os.environ, DOCKER_BUILDKIT="0", DOCKER_CONFIG=str(STATE / "client"))
    if state.get("private_engine"):
        env["DOCKER_HOST"] = f"unix://{SOCKET}"
    elif state.get("docker_host"):
        env["DOCKER_HOST"] = state["docker_host"]
    return env


def docker(state, *args, check=True, timeout=120):
    try:
        p = subprocess.run([client(), *args], stdin=subprocess.DEVNULL, capture_output=True,
                           text=True, timeout=timeout, env=docker_env(state))
    except subprocess.TimeoutExpired:
        raise Fail(f"timed out after {timeout}s: docker {' '.join(args)}")
    if check and p.returncode != 0:
        err = (p.stderr or p.stdout).strip().splitlines()
        last = err[-1] if err else str(p.returncode)
        raise Fail(f"docker {' '.join(args[:2])} failed: "
                   + (last if len(last) < 300 else last[:150] + " ... " + last[-100:]))
    return p


def answers(state):
    return docker(state, "version", "--format", "{{.Server.Version}}", check=False,
                  timeout=10).returncode == 0


def dockerd_argv():
    return [tool("dockerd"), "--config-file", str(STATE / "daemon.json"),
            "--data-root", str(STATE / "data"), "--exec-root", str(STATE / "exec"),
            "--pidfile", str(STATE / "dockerd.pid"), "--host", f"unix://{SOCKET}",
            "--iptables=false", "--ip6tables=false", "--ip-forward=false", "--ip-masq=false",
            "--bridge=none", "--userland-proxy=false", "--cgroup-parent", CGROUP_PARENT]


def start(state, timeout=60):
    if len(str(SOCKET)) > 100:
        raise Fail(f"{SOCKET} is too long for a unix socket: use a shorter checkout path", 2)
    # Its own config file; the key path keeps dockerd from writing /etc/docker/key.json.
    (STATE / "daemon.json").write_text(json.dumps({"deprecated-key-path": str(STATE / "key.json")}))
    proc = start_logged(dockerd_argv(), STATE / "dockerd.log")
    state["engine_pid"] = proc.pid
    STATE_FILE.save(state)
    if not wait_until(lambda: proc.poll() is not None or answers(state), timeout, 0.2) \
            or proc.poll() is not None:
        raise Fail(f"dockerd did not answer within {timeout}s: "
                   f"{log_tail(STATE / 'dockerd.log', 2, '(no log)')}")


def stop(state):
    pid = state.get("engine_pid")
    if started_from(pid, STATE):
        os.kill(pid, signal.SIGTERM)  # dockerd stops its containerd with it
        wait_until(lambda: not Path(f"/proc/{pid}").exists() or is_zombie(pid), 30, 0.1)


def our_processes():
    """dockerd, containerd and shims whose command line names our state folder."""
    return processes_naming(STATE)


def cgroup_dirs():
    return sorted(Path("/sys/fs/cgroup").glob(f"*/{CGROUP_PARENT}")) + \
        sorted(Path("/sys/fs/cgroup").glob(CGROUP_PARENT))


def cgroup_pids():
    """Processes of our containers (a killed engine leaves them running)."""
    pids = set()
    for d in cgroup_dirs():
        for procs in d.rglob("cgroup.procs"):
            try:
                pids |= {int(p) for p in procs.read_text().split()}
            except OSError:
                pass
    return pids


def remove_cgroups():
    for d in cgroup_dirs():  # deepest first: rmdir works only on empty cgroups
        for sub in sorted((p for p in d.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            try:
                sub.rmdir()
            except OSError:
                pass
        try:
            d.rmdir()
        except OSError:
            pass
