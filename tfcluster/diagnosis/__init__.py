"""Why a run hangs, fails or lags: stalls and their stacks, causes, the root cause, stragglers and
hints. A run's monitor reaches all of it through one object, entry.Diagnosis, and every cause it
names is a Cause."""
from tfcluster_agent.values import value_class

# What a Cause is about.
STALL = "stall"          # tasks that print nothing and compute nothing, and what they wait for
WAIT = "wait"            # a TF1 task that waits in CreateSession for a peer, and why
END = "end"              # a task's end that fails the run
STRAGGLER = "straggler"  # a training task under half its peers' median rate
SLOWEST = "slowest"      # the worker the others wait for in synchronous training


@value_class(frozen=True)
class Cause:
    """What diagnosis found: its KIND (above), the sentence that says it (wording.py), and the
    TASKS it is about, the one that decided it first."""
    kind: str
    text: str
    tasks: tuple = ()

    @property
    def task(self):
        return self.tasks[0] if self.tasks else None

    def __str__(self):
        return self.text
