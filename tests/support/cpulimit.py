"""A CPU limit on a task's process group (root): a child cgroup with a CFS quota, cgroup v2's
cpu.max where the cpu controller is there, else v1's cpu hierarchy; always removed again."""
import contextlib
import os
import time

V2 = "/sys/fs/cgroup"
V1 = "/sys/fs/cgroup/cpu"
PERIOD_US = 100000


def cpu_hierarchy():
    """(the folder child cgroups go under, "v1" | "v2"), or None where no cpu controller can
    limit a child (no cgroup, or not root)."""
    try:
        with open(os.path.join(V2, "cgroup.subtree_control")) as handle:
            if "cpu" in handle.read().split():
                return V2, "v2"
    except OSError:
        pass
    if os.path.exists(os.path.join(V1, "cpu.cfs_quota_us")):
        return V1, "v1"
    return None


def group_members(pgid):
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            found.append(int(entry))
    return found


@contextlib.contextmanager
def cpu_limited(pgid, cores, name="tfcluster-test-cpulimit", period_us=PERIOD_US):
    """Hold process group PGID to CORES of CPU (a quota each PERIOD_US) while the block runs; its
    processes go back to the parent cgroup and the child cgroup is removed afterwards, whatever
    happens."""
    parent, version = cpu_hierarchy()
    folder = os.path.join(parent, "%s-%d" % (name, os.getpid()))
    os.mkdir(folder)
    try:
        if version == "v1":
            _write(os.path.join(folder, "cpu.cfs_period_us"), str(period_us))
        set_cores(folder, cores, period_us)
        for pid in group_members(pgid):
            with contextlib.suppress(ProcessLookupError, OSError):
                _write(os.path.join(folder, "cgroup.procs"), str(pid))
        yield folder
    finally:
        _empty(folder, parent)
        deadline = time.monotonic() + 10
        while True:
            try:
                os.rmdir(folder)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                _empty(folder, parent)
                time.sleep(0.1)


def set_cores(folder, cores, period_us=PERIOD_US):
    """The child cgroup FOLDER (cpu_limited's, with PERIOD_US) held to CORES of CPU from now on."""
    quota = int(cores * period_us)
    if os.path.exists(os.path.join(folder, "cpu.max")):
        _write(os.path.join(folder, "cpu.max"), "%d %d" % (quota, period_us))
    else:
        _write(os.path.join(folder, "cpu.cfs_quota_us"), str(quota))


def throttled(folder):
    """How often the limit held the group back: "N of M periods" (cpu.stat)."""
    stat = {}
    with open(os.path.join(folder, "cpu.stat")) as handle:
        for line in handle:
            key, value = line.split()
            stat[key] = value
    return "%s of %s periods" % (stat.get("nr_throttled", "?"), stat.get("nr_periods", "?"))


def _empty(folder, parent):
    try:
        with open(os.path.join(folder, "cgroup.procs")) as handle:
            pids = handle.read().split()
    except OSError:
        return
    for pid in pids:
        with contextlib.suppress(OSError):
            _write(os.path.join(parent, "cgroup.procs"), pid)


def _write(path, text):
    with open(path, "w") as handle:
        handle.write(text)
