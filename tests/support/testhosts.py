"""pytest fixture `testhosts`: 3 real SSH hosts (network namespaces) for a session.

tests/conftest.py registers it (pytest_plugins); a test names it:

    def test_something(testhosts):
        testhosts.inventory    # Path of inventory/testhosts.yml
        testhosts.hosts        # [("th1", "10.231.0.11"), ("th2", ...), ("th3", ...)]
        testhosts.key          # client private key (Path)
        testhosts.known_hosts  # known_hosts with every host key (Path)
        testhosts.ssh("th1", "hostname")   # CompletedProcess
        with testhosts.outsider() as argv: # a 4th machine on the bridge, in no inventory
            subprocess.run(argv + ["python3", ...])

The fixture runs `scripts/testhosts up 3` once per session and ALWAYS runs
`scripts/testhosts down` at teardown, even when up or a test failed. It skips
(with the reason) when not root or when ip/sshd/ssh are missing. A lock file
(support.locks.TESTHOSTS_LOCK) serialises concurrent pytest sessions on
one machine; stale hosts from a crashed run are removed with `down` before `up`.

`leftovers()` lists whatever testhosts left behind (tfc-* namespaces and links,
sshd processes started from .testhosts, /opt binds, state dir, inventory).
`exclusive()` is for tests that run their own up/down cycle: it pauses the
session hosts (if they are up); they come back before the next test that uses them.
"""

import contextlib
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from support.locks import TESTHOSTS_LOCK, hold_lock
from hostlib import labusers, netns, ssh
from hostlib import testhosts as th
from hostlib.common import find_tools, missing_tools_message

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "testhosts"
SESSION_HOSTS = 3
OUTSIDER_ADDR = "10.231.0.200"  # HostSet.outsider(): far above the hosts' 10.231.0.11..30

# One session host set per process: the registry lives in sys.modules, not in this module's
# globals, should the module be imported under a second name.
_REGISTRY = sys.modules.setdefault("_tfc_testhosts_registry",
                                  types.ModuleType("_tfc_testhosts_registry"))
if not hasattr(_REGISTRY, "session_hosts"):
    _REGISTRY.session_hosts = None


def skip_reason():
    """Why testhosts cannot run here, or None."""
    if os.geteuid() != 0:
        return "testhosts needs root (it creates network namespaces)"
    _, missing = find_tools(th.TOOLS)
    if missing:
        return missing_tools_message("testhosts", missing, th.TOOLS)
    if not Path("/usr/bin/python3").exists():
        return "testhosts hosts use /usr/bin/python3, which is missing"
    return None


def run_script(*args, timeout=120):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout)


def leftovers():
    """Anything testhosts (or a test's lab users) left on this machine (empty list == clean)."""
    return th.leftovers() + labusers.leftovers()


# ---------------------------------------------------------------- session lock

def _acquire_session_lock(timeout=600):
    """Hold the test hosts' lock for the rest of this pytest process (re-entrant)."""
    if getattr(_REGISTRY, "lock_fd", None) is None:
        _REGISTRY.lock_fd = hold_lock(TESTHOSTS_LOCK, timeout)


# ---------------------------------------------------------------- host set


class HostSet:
    """N testhosts: paths, names, and an ssh helper. up()/down() run the script."""

    def __init__(self, n):
        self.n = n
        self.inventory = th.INVENTORY
        self.key = th.CLIENT_KEY
        self.known_hosts = th.KNOWN_HOSTS
        self.state_dir = th.STATE
        self.hosts = [(th.Host(i).name, th.Host(i).addr) for i in range(1, n + 1)]
        self.is_up = False

    def up(self):
        left = leftovers()
        if left:  # a crashed run; we hold the session lock, so nobody else uses them
            self.down()
        r = run_script("up", self.n)
        if r.returncode != 0:
            self.down(check=False)
            raise RuntimeError(f"testhosts up {self.n} failed ({r.returncode}): "
                               f"{r.stderr.strip()} {r.stdout.strip()}")
        self.is_up = True
        return r

    def down(self, check=True):
        r = run_script("down")
        self.is_up = False
        if check and r.returncode != 0:
            raise RuntimeError(f"testhosts down failed ({r.returncode}): {r.stderr.strip()}")
        return r

    def addr(self, host):
        if isinstance(host, int):
            return self.hosts[host - 1][1]
        return dict(self.hosts)[host]

    def ssh_argv(self, host, command, known_hosts=None, connect_timeout=5):
        return ssh.ssh_base(self.key, known_hosts or self.known_hosts, connect_timeout) + [
            f"root@{self.addr(host)}", command]

    def ssh(self, host, command, timeout=30, **kw):
        return subprocess.run(self.ssh_argv(host, command, **kw), stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=timeout)

    def link(self, i, updown):
        r = run_script("link", i, updown)
        if r.returncode != 0:
            raise RuntimeError(f"testhosts link {i} {updown} failed: {r.stderr.strip()}")

    def sshd(self, i, action):
        r = run_script("sshd", i, action)
        if r.returncode != 0:
            raise RuntimeError(f"testhosts sshd {i} {action} failed: {r.stderr.strip()}")

    def netns_argv(self, host):
        """argv prefix running a command in HOST's network namespace, without SSH."""
        i = host if isinstance(host, int) else [n for n, _ in self.hosts].index(host) + 1
        return ["ip", "netns", "exec", th.Host(i).ns]

    @contextlib.contextmanager
    def outsider(self):
        """A machine on the hosts' bridge that no inventory names: network namespace tfc-out at
        OUTSIDER_ADDR. Yields its `ip netns exec` argv prefix; removed on exit (and by `down`,
        which removes every tfc-* namespace, should the test process die)."""
        ns, veth = "tfc-out", "tfc-vout"
        try:
            netns.add_namespace(ns, veth, OUTSIDER_ADDR)
            yield ["ip", "netns", "exec", ns]
        finally:
            netns.remove_namespace(ns, veth)


@contextlib.contextmanager
def exclusive():
    """Run own up/down cycles: pause the session hosts if up. They come back before the next
    test that uses them (pytest_runtest_setup), so tests of their own in a row pay one `up`."""
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    _acquire_session_lock()
    session = _REGISTRY.session_hosts
    if session is not None and session.is_up:
        session.down()
    try:
        yield
    finally:
        run_script("down")  # whatever the test did


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """The session hosts up again (exclusive() leaves them down) before any fixture of a test
    that uses them is set up, module fixtures included."""
    session = _REGISTRY.session_hosts
    if session is not None and not session.is_up and "testhosts" in item.fixturenames:
        session.up()


@pytest.fixture(scope="session")
def testhosts():
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    if _REGISTRY.session_hosts is not None:  # set up by another registration of this fixture
        yield _REGISTRY.session_hosts
        return
    _acquire_session_lock()
    hs = HostSet(SESSION_HOSTS)
    _REGISTRY.session_hosts = hs
    try:
        hs.up()
        yield hs
    finally:
        _REGISTRY.session_hosts = None
        hs.down(check=False)
        left = leftovers()
        if left:
            # last resort, then report loudly
            run_script("down")
            left = leftovers()
            if left:
                raise RuntimeError("testhosts left behind: " + "; ".join(left))
