"""A local "machine" of a launch lost at once: its task, the task's supervisor and the agent,
killed together (tests/test_spares_local.py, scripts/bench --only recovery)."""
import os
import signal


def parent_of(pid):
    with open("/proc/%d/stat" % pid) as handle:
        return int(handle.read().rsplit(")", 1)[1].split()[1])


def lose_local_machine(task_pid, launcher_pid):
    """Kill the task of TASK_PID with every ancestor below the launcher of LAUNCHER_PID (a
    local agent is the launcher's child): to the launcher, that machine is gone. The agent goes
    first, as with a machine that dies: it reports nothing of its task's end."""
    chain, pid = [], parent_of(task_pid)
    while pid not in (launcher_pid, 0, 1):
        chain.append(pid)
        pid = parent_of(pid)
    if pid != launcher_pid:
        raise RuntimeError("the agent of task %d is not a child of launcher %d"
                           % (task_pid, launcher_pid))
    group = os.getpgid(task_pid)
    for pid in reversed(chain):  # the agent, then the task's supervisor
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    os.killpg(group, signal.SIGKILL)


def last_step_before_restart(points, task):
    """The highest step TASK reached before the run restarted, from the run's metrics POINTS
    (metrics.jsonl, in order): the steps before its second evaluation before training (a point
    with an accuracy and no rate: the trainers make one at each start), or before a step lower
    than an earlier one. A restart from the very step reached shows no lower step."""
    last, starts = None, 0
    for point in points:
        if point.get("task") != task:
            continue
        if "accuracy" in point and "examples_per_s" not in point:
            starts += 1
            if starts > 1:
                return last
        if last is not None and point["step"] < last:
            return last
        last = point["step"] if last is None else max(last, point["step"])
    return last
