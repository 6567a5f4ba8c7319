"""The client side of the test hosts' SSH: keys, a strict ssh command line, the first logins."""

import subprocess
import time

from .common import Fail, run, tool



def keygen(path, comment):
    run([tool("ssh-keygen"), "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])


def ssh_base(key, known_hosts, connect_timeout=5):
    """ssh with only KEY and only the host keys in KNOWN_HOSTS (checking on), no user config."""
    return [tool("ssh"), "-F", "/dev/null", "-i", str(key), "-o", "IdentitiesOnly=yes",
            "-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={known_hosts}",
            "-o", "GlobalKnownHostsFile=/dev/null", "-o", "StrictHostKeyChecking=yes",
            "-o", f"ConnectTimeout={connect_timeout}", "-o", "LogLevel=ERROR"]


def wait_for_logins(hosts, key, known_hosts, timeout, deadline, detail=lambda name: ""):
    """Until DEADLINE (TIMEOUT seconds after `up` began), a host-key-checked `ssh root@ADDR
    hostname` to every (name, addr) in HOSTS, all at once, until each prints its name; else Fail
    with the last answer and DETAIL(name)."""
    pending = {name: None for name, _ in hosts}
    addr = dict(hosts)
    last = {}
    while pending:
        for name in pending:
            if pending[name] is None:
                pending[name] = subprocess.Popen(
                    ssh_base(key, known_hosts) + [f"root@{addr[name]}", "hostname"],
                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    text=True)
        for name in list(pending):
            try:
                out, err = pending[name].communicate(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pending[name].kill()
                pending[name].communicate()
                raise Fail(f"ssh to {name} ({addr[name]}) timed out")
            if pending[name].returncode == 0 and out.strip() == name:
                del pending[name]
            else:
                last[name] = (err or out).strip().replace("\n", " | ")
                pending[name] = None
        if pending and time.monotonic() >= deadline:
            name = next(iter(pending))
            raise Fail(f"ssh root@{addr[name]} hostname did not print {name} "
                       f"within {timeout}s: "
                       f"{last.get(name, '')}{detail(name)}")
        if pending:
            time.sleep(0.1)  # retry interval of a polled condition (sshd just started)
