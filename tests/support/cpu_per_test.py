"""Each test's CPU seconds under scripts/cpu-of (loaded by conftest.py when CPU_OF_CGROUP is set):
the cgroup's usage read around each test, so every process the test started counts (agents, test
hosts' sshd and tasks; not Docker's containers). The 60 largest print at the session's end, and
the total in yardsticks (scripts/yardstick.py) where scripts/cpu-of measured one."""
import os
import time

import pytest

ROWS = []


def cgroup_cpu_seconds():
    group = os.environ["CPU_OF_CGROUP"]
    usage = os.path.join(group, "cpuacct.usage")
    if os.path.exists(usage):
        with open(usage) as handle:
            return int(handle.read()) / 1e9
    with open(os.path.join(group, "cpu.stat")) as handle:  # cgroup v2
        stat = dict(line.split() for line in handle)
    return int(stat["usage_usec"]) / 1e6


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    cpu, wall = cgroup_cpu_seconds(), time.monotonic()
    yield
    ROWS.append((cgroup_cpu_seconds() - cpu, time.monotonic() - wall, item.nodeid))


def pytest_terminal_summary(terminalreporter):
    terminalreporter.write_line("CPU s  wall s  test (setup + call + teardown), under scripts/cpu-of")
    for cpu, wall, nodeid in sorted(ROWS, reverse=True)[:60]:
        terminalreporter.write_line("%6.1f %6.1f  %s" % (cpu, wall, nodeid))
    total = sum(row[0] for row in ROWS)
    stick = float(os.environ.get("CPU_OF_YARDSTICK") or 0)  # scripts/cpu-of sets it
    terminalreporter.write_line("all tests: %.1f CPU s%s" % (total, " = %.1f yardsticks of %.2f CPU s"
                                                              % (total / stick, stick) if stick else ""))
