"""A task's lower CPU priority (launch --nice), standard library only.

Where the kernel groups processes by session for the scheduler (sched_autogroup_enabled, on by
default in Debian's kernels), a niceness only orders the processes of one session against each
other. Every task is a session of its own, so the task's session's autogroup gets the niceness
too: without it, a task would still weigh as much as everything else on the machine together
(the agent, the controller, a user's shell)."""
import errno
import os
import time

AUTOGROUP = "/proc/self/autogroup"
# Without CAP_SYS_ADMIN the kernel takes one autogroup change every 100 ms, machine-wide.
AUTOGROUP_TRIES = 10


def lower_priority(niceness):
    """This process (and what it starts) at NICENESS, and its session's autogroup too; never
    higher than it is. Where there is no autogroup, the niceness alone."""
    if niceness > os.getpriority(os.PRIO_PROCESS, 0):
        os.setpriority(os.PRIO_PROCESS, 0, niceness)
    for _ in range(AUTOGROUP_TRIES):
        try:
            with open(AUTOGROUP) as handle:  # "/autogroup-123 nice 0"
                if int(handle.read().split()[-1]) >= niceness:
                    return
            with open(AUTOGROUP, "w") as handle:
                handle.write(str(niceness))
            return
        except OSError as err:
            if err.errno != errno.EAGAIN:
                return  # no autogroups in this kernel
            time.sleep(0.1)
        except (ValueError, IndexError):
            return
