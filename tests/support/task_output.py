"""What tasks print and dump, as tests feed it to the diagnosis: TF1's CreateSession wait, a
task's stacks, the states of the tasks they come from."""
from tfcluster.runs.record import TaskStatus

CREATE_SESSION = ("I0000 00:00:1795692285.474252   15716 master.cc:278] CreateSession still "
                  "waiting for response from worker: /job:ps/replica:0/task:0")


def stack_of(*frames):
    lines = ["# worker-0 on h at now: every process of its group",
             "# pid 10 (sh) state S in do_wait: no Python stacks",
             "# pid 11 (python) state S in futex_wait, main thread 0x00000000000000aa",
             "Current thread 0x00000000000000aa (most recent call first):"]
    return "\n".join(lines + ['  File "%s", line %d in %s' % f for f in frames]) + "\n"


IN_COLLECTIVE = stack_of(
    ("/v/lib/python3.11/site-packages/tensorflow/python/eager/execute.py", 53, "quick_execute"),
    ("/home/u/train.py", 30, "<module>"))
WAITING = stack_of(("/usr/lib/python3.11/threading.py", 320, "wait"),
                   ("/home/u/train.py", 14, "wait_for_data"), ("/home/u/train.py", 40, "<module>"))


def states(**alive):
    return {label.replace("_", ":"): TaskStatus(alive=up, exit=None if up else 0,
                                                state="running" if up else "exited")
            for label, up in alive.items()}
