"""A local "machine" of a launch lost at once: its task, the task's supervisor and the agent,
killed together (tests/test_spares_local.py, scripts/bench --only recovery)."""
import os
import signal


def parent_of(pid):
    with open("/proc/%d/stat" % pid) as handle:
        return int(handle.read().rsplit(")", 1)[1].split()[1])


def lose_local_machine(task_pid, launcher_pid):
    """Kill the task of TASK_PID with every ancestor below the launcher of LAUNCHER_PID (a
    local agent is the launcher's child): to the launcher, that machine is gone."""
    chain, pid = [], parent_of(task_pid)
    while pid not in (launcher_pid, 0, 1):
        chain.append(pid)
        pid = parent_of(pid)
    if pid != launcher_pid:
        raise RuntimeError("the agent of task %d is not a child of launcher %d"
                           % (task_pid, launcher_pid))
    os.killpg(os.getpgid(task_pid), signal.SIGKILL)
    for pid in chain:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # in the task's process group: gone already


def last_step_before_restart(points, task):
    """The highest step TASK reached before the run restarted, from the run's metrics POINTS
    (metrics.jsonl, in order): the steps before the first one lower than an earlier one."""
    last = None
    for point in points:
        if point.get("task") != task:
            continue
        if last is not None and point["step"] < last:
            return last
        last = point["step"] if last is None else max(last, point["step"])
    return last
