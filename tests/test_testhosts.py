"""Tests for scripts/testhosts: real SSH hosts in network namespaces.

Needs root, iproute2 and openssh-server (skips otherwise). The lifecycle and
crash tests run their own up/down cycles (under `exclusive()`); the rest share
the session fixture `testhosts` (3 hosts). Everything is torn down even when a
test fails.
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pytest  # noqa: E402

from support.testhosts import (  # noqa: E402
    HostSet, SCRIPT, exclusive, leftovers, run_script, skip_reason)
from hostlib import netns  # noqa: E402
from hostlib import testhosts as th  # noqa: E402
from hostlib.common import find_tools, missing_tools_message, tcp_open, wait_until  # noqa: E402


pytestmark = pytest.mark.root  # most of it makes network namespaces; all of it is about them

needs_hosts = pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))


def no_traceback(r):
    assert "Traceback" not in r.stderr + r.stdout, r.stderr


# ------------------------------------------------------------ no root needed


@pytest.mark.parametrize("args", [[], ["up"], ["up", "0"], ["up", "129"], ["up", "x"],
                                  ["link", "1"], ["link", "1", "sideways"], ["bogus"]])
def test_usage_errors_exit_2(args):
    r = run_script(*args)
    assert r.returncode == 2, (args, r.stdout, r.stderr)
    no_traceback(r)


def test_missing_tools_names_debian_packages(tmp_path):
    found, missing = find_tools(th.TOOLS, path=str(tmp_path))
    assert {"ip", "sshd"} <= set(missing)
    msg = missing_tools_message("testhosts", missing, th.TOOLS)
    assert "iproute2" in msg and "openssh-server" in msg and "\n" not in msg


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv")
                    or not os.path.exists("/usr/bin/python3"),
                    reason="needs root, setpriv and /usr/bin/python3 to run as another user")
@pytest.mark.parametrize("tool, why", [("testhosts", "it creates network namespaces"),
                                       ("dockerhosts", "it runs a Docker engine")])
def test_not_root_one_line_exit_2(readable_copy, tool, why):
    """An ordinary user runs the script from a checkout where it can read the scripts and
    nothing else (state, inventory and compose folders closed): the one-line refusal."""
    checkout = readable_copy("scripts/" + tool, "scripts/hostlib")
    for closed in (".testhosts", ".work", "inventory", "deploy"):
        os.mkdir(os.path.join(checkout, closed), 0o700)
    r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                        "/usr/bin/python3", os.path.join(checkout, "scripts", tool), "status"],
                       cwd="/", capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip() == f"{tool} needs root ({why}): run as root"
    no_traceback(r)


# ------------------------------------------------------------ own up/down cycles


@needs_hosts
def test_lifecycle_up2_down_twice():
    with exclusive():
        hs = HostSet(2)
        try:
            r = run_script("up", 2)
            assert r.returncode == 0, r.stderr
            for name, addr in hs.hosts:
                out = hs.ssh(name, "hostname")
                assert out.returncode == 0 and out.stdout.strip() == name, out.stderr

            inv = th.INVENTORY.read_text()
            assert "th1: {ansible_host: 10.231.0.11}" in inv
            assert "th2: {ansible_host: 10.231.0.12}" in inv
            assert str(hs.key) in inv and str(hs.known_hosts) in inv

            r = run_script("status")
            assert r.returncode == 0, r.stdout + r.stderr
            assert len([ln for ln in r.stdout.splitlines() if "sshd=alive" in ln]) == 2

            r = run_script("up", 2)  # already up: refused, hosts untouched
            assert r.returncode == 2 and "down" in r.stderr
            no_traceback(r)
            assert hs.ssh("th1", "true").returncode == 0
        finally:
            d1 = run_script("down")
        assert d1.returncode == 0, d1.stderr
        assert leftovers() == []
        assert not th.INVENTORY.exists() and not th.STATE.exists()
        assert [ln for ln in subprocess.run(["ip", "-o", "link"], capture_output=True,
                                            text=True).stdout.splitlines() if "tfc-" in ln] == []
        d2 = run_script("down")
        assert d2.returncode == 0, d2.stderr
        assert leftovers() == []


@needs_hosts
def test_single_host_inventory_has_worker_slot():
    with exclusive():
        try:
            r = run_script("up", 1)
            assert r.returncode == 0, r.stderr
            from ansible.inventory.manager import InventoryManager
            from ansible.parsing.dataloader import DataLoader
            im = InventoryManager(loader=DataLoader(), sources=[str(th.INVENTORY)])
            assert [h.name for h in im.groups["ps"].get_hosts()] == ["th1"]
            workers = im.groups["worker"].get_hosts()
            assert [h.name for h in workers] == ["th1-w"]
            assert workers[0].vars["ansible_host"] == "10.231.0.11"
        finally:
            assert run_script("down").returncode == 0
        assert leftovers() == []


@needs_hosts
def test_down_after_crashed_up():
    """SIGKILL `up` half-way (a real crash), then `down` must remove everything."""
    with exclusive():
        proc = subprocess.Popen([sys.executable, str(SCRIPT), "up", "4"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            # crash it once at least one host namespace exists
            assert wait_until(lambda: any(n.startswith("tfc-th") for n in netns.list_netns())
                              or proc.poll() is not None, 20, 0.01)
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            assert leftovers(), "the crash should have left something behind"
            # plus a stray process inside a namespace that is not sshd
            ns = next(n for n in netns.list_netns() if n.startswith("tfc-th"))
            stray = subprocess.Popen(["ip", "netns", "exec", ns, "sleep", "300"],
                                     start_new_session=True)
            assert wait_until(lambda: stray.pid in netns.netns_pids(ns), 30, 0.02)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
            r = run_script("down")
        assert r.returncode == 0, r.stderr
        assert stray.wait(10) is not None  # killed by down
        assert leftovers() == []
        assert run_script("down").returncode == 0


# ------------------------------------------------------------ session hosts


def test_hostnames_differ(testhosts):
    names = []
    for name, _ in testhosts.hosts:
        r = testhosts.ssh(name, "hostname")
        assert r.returncode == 0, r.stderr
        names.append(r.stdout.strip())
    assert names == [n for n, _ in testhosts.hosts] == ["th1", "th2", "th3"]


def test_opt_is_private(testhosts):
    probe = f"/opt/tfc-probe-{uuid.uuid4().hex[:8]}"
    assert not os.path.exists(probe)
    try:
        r = testhosts.ssh("th1", f"echo hello > {probe} && cat {probe}")
        assert r.returncode == 0 and r.stdout.strip() == "hello", r.stderr
        assert testhosts.ssh("th2", f"test -e {probe}").returncode == 1
        assert testhosts.ssh("th3", f"test -e {probe}").returncode == 1
        assert not os.path.exists(probe), "th1's /opt leaked onto the machine"
        # every host starts with an empty /opt (its own deploy root)
        r = testhosts.ssh("th2", "ls -A /opt")
        assert r.returncode == 0 and r.stdout.strip() == ""
    finally:
        testhosts.ssh("th1", f"rm -f {probe}")


def test_host_to_host_tcp(testhosts):
    for src, dst in [("th1", "10.231.0.12"), ("th1", "10.231.0.13"), ("th3", "10.231.0.11")]:
        r = testhosts.ssh(src, "/usr/bin/python3 -c 'import socket; "
                               f"socket.create_connection((\"{dst}\", 22), 3); print(\"ok\")'")
        assert r.returncode == 0 and r.stdout.strip() == "ok", (src, dst, r.stderr)
    # hosts reach the controller over the bridge too (a listening socket on 10.231.0.1)
    srv = socket.create_server(("10.231.0.1", 0))
    try:
        port = srv.getsockname()[1]
        r = testhosts.ssh("th2", "/usr/bin/python3 -c 'import socket; "
                                 f"socket.create_connection((\"10.231.0.1\", {port}), 3)'")
        assert r.returncode == 0, r.stderr
    finally:
        srv.close()


def test_host_key_checking_is_on(testhosts, tmp_path):
    empty = tmp_path / "known_hosts_empty"
    empty.write_text("")
    r = testhosts.ssh("th1", "hostname", known_hosts=empty)
    assert r.returncode == 255
    assert "Host key verification failed" in r.stderr
    # th2's key presented as th1's: must be refused too
    lines = testhosts.known_hosts.read_text().splitlines()
    th2_key = next(ln for ln in lines if ln.startswith("10.231.0.12 ")).split(None, 1)[1]
    wrong = tmp_path / "known_hosts_wrong"
    wrong.write_text(f"10.231.0.11 {th2_key}\n")
    r = testhosts.ssh("th1", "hostname", known_hosts=wrong)
    assert r.returncode == 255


def test_link_down_makes_host_unreachable(testhosts):
    addr = testhosts.addr("th2")
    try:
        testhosts.link(2, "down")
        assert wait_until(lambda: not tcp_open(addr, 22, 0.3), 10), "th2 still reachable"
        r = testhosts.ssh("th1", "/usr/bin/python3 -c 'import socket; "
                                 f"socket.create_connection((\"{addr}\", 22), 1)'")
        assert r.returncode != 0  # not from its peers either
        r = testhosts.ssh("th2", "hostname", connect_timeout=1)
        assert r.returncode == 255
    finally:
        testhosts.link(2, "up")
    assert wait_until(lambda: tcp_open(addr, 22, 0.3), 10), "th2 did not come back"
    r = testhosts.ssh("th2", "hostname")
    assert r.returncode == 0 and r.stdout.strip() == "th2", r.stderr


def test_inventory_works_with_ansible(testhosts, tmp_path):
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    im = InventoryManager(loader=DataLoader(), sources=[str(testhosts.inventory)])
    assert [h.name for h in im.groups["ps"].get_hosts()] == ["th1"]
    assert [h.name for h in im.groups["worker"].get_hosts()] == ["th2", "th3"]
    ansible = Path(sys.executable).parent / "ansible"
    if not ansible.exists():
        pytest.skip("ansible CLI not installed next to this python")
    # no ControlPersist masters: nothing may outlive the hosts
    env = dict(os.environ, ANSIBLE_HOST_KEY_CHECKING="True", ANSIBLE_NOCOLOR="1",
               ANSIBLE_SSH_ARGS="-o ControlMaster=no")
    r = subprocess.run([str(ansible), "all", "-i", str(testhosts.inventory),
                        "-m", "command", "-a", "hostname"],
                       capture_output=True, text=True, timeout=120, env=env,
                       cwd=tmp_path)  # from any folder: the key paths are absolute
    assert r.returncode == 0, r.stdout + r.stderr
    for name in ("th1", "th2", "th3"):
        assert f"{name} | CHANGED | rc=0 >>\n{name}" in r.stdout


@pytest.mark.root
def test_inventory_says_offline(testhosts):
    """The hosts reach no registry: deploy.yml must install from the wheelhouse without -e."""
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.vars.manager import VariableManager
    loader = DataLoader()
    im = InventoryManager(loader=loader, sources=[str(testhosts.inventory)])
    variables = VariableManager(loader=loader, inventory=im)
    for name, _ in testhosts.hosts:
        assert variables.get_vars(host=im.get_host(name))["tensorflow_install_mode"] == "offline"
