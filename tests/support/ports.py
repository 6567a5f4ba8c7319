"""Free ports for the tests: each test takes a block of its session's range."""
import os

from tfcluster_agent.hostinfo import port_is_free as port_free

# Tests use their own port range so a user's runs on 2222+ never collide with them; each test
# takes a block of free ports. Sessions side by side (scripts/testsuite) get ranges of their own
# (TFCLUSTER_TEST_PORTS=LOW-HIGH), and so do the workers of one session (pytest-xdist): a free
# block may be taken by another session before it binds.
LOW, HIGH = map(int, os.environ.get("TFCLUSTER_TEST_PORTS", "24100-29000").split("-"))
if os.environ.get("PYTEST_XDIST_WORKER"):  # make check's workers (gw0, gw1, ...): a slice each
    _slice = (HIGH - LOW) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]) // 20 * 20
    LOW += _slice * int(os.environ["PYTEST_XDIST_WORKER"][2:])
    HIGH = LOW + _slice
TEST_PORT_RANGE = range(LOW, HIGH, 20)


def free_port_block(size=12):
    span = len(TEST_PORT_RANGE)
    start = (os.getpid() * 20) % span
    for offset in range(span):
        base = TEST_PORT_RANGE[(start + offset) % span]
        if base + size <= HIGH and all(port_free(p) for p in range(base, base + size)):
            return base
    raise AssertionError("no block of %d free ports in %s" % (size, TEST_PORT_RANGE))
