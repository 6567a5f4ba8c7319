"""pytest's hooks and the fixtures every test file can use; the helpers are in tests/support/."""
import os
import signal
import sys

import pytest

# pytest keeps the test modules it rewrote for their asserts only where bytecode may be written:
# with PYTHONDONTWRITEBYTECODE set, each pytest process (and each xdist worker) rewrote all 181
# of them again (benchmarks/RESULTS.md). This process writes them under tests/; the programs
# the tests start keep the environment's choice.
sys.dont_write_bytecode = False

# scripts/testsuite starts two sessions in the background, which starts them ignoring Ctrl-C; it
# passes an interrupt on, which must stop the tests and run their fixtures' teardown.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)
sys.path.insert(0, TESTS)
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "scripts"))  # hostlib, the test hosts' library
# The helpers' failed asserts explain themselves as a test's do.
pytest.register_assert_rewrite("support")

from support.cli import assert_pictures_drawn, local_inventory_text  # noqa: E402
from support.procs import stop_leftovers  # noqa: E402

# Fixtures of their own modules, registered here once: testhosts, readable_copy, agent, fake_gpus
# and smi_in_process.
pytest_plugins = ["support.testhosts", "support.other_users", "support.agents", "support.gpus"]
if os.environ.get("CPU_OF_CGROUP"):  # under scripts/cpu-of: each test's CPU seconds
    pytest_plugins.append("support.cpu_per_test")

# scripts/testsuite runs the main session as two shards side by side (TFCLUSTER_TEST_SHARD):
# "rest" the tests that need root or the test hosts (one set per machine), "local" the others
# but the containers: the fast tier and the TensorFlow launches on this machine.
SHARDS = ("local", "rest")


def shard_of(item):
    local = (not item.get_closest_marker("root") and not item.get_closest_marker("docker")
             and "testhosts" not in item.fixturenames)
    return "local" if local else "rest"


def pytest_collection_modifyitems(config, items):
    shard = os.environ.get("TFCLUSTER_TEST_SHARD")
    if not shard:
        return
    assert shard in SHARDS, "TFCLUSTER_TEST_SHARD is one of %s, not %r" % (SHARDS, shard)
    kept = [item for item in items if shard_of(item) == shard]
    config.hook.pytest_deselected(items=[item for item in items if shard_of(item) != shard])
    items[:] = kept


@pytest.fixture(autouse=True)
def umask_left_as_found():
    """A test (or the code it calls in-process) that leaves the umask changed fails: whatever
    the session runs afterwards (a wheelhouse's pack, files handed to another user) would
    inherit it."""
    before = os.umask(0o022)
    os.umask(before)
    yield
    after = os.umask(before)
    assert after == before, "the umask was left at %04o (was %04o)" % (after, before)


@pytest.fixture
def local_env(tmp_path):
    """(inventory path, runs dir) on this machine, in a temporary folder."""
    inventory = tmp_path / "local.yml"
    inventory.write_text(local_inventory_text(str(tmp_path / "work")))
    runs_dir = tmp_path / "runs"
    yield str(inventory), str(runs_dir)
    assert_pictures_drawn(str(runs_dir))
    leftovers = stop_leftovers(str(tmp_path))
    assert not leftovers, "processes of the test were still running: %s" % leftovers
