"""Errors that carry data; only the CLI turns them into a message and an exit code."""


class Problem(str):
    """A preflight problem line. WAITABLE: `launch --wait` may wait for it to pass (claimed or
    busy GPUs and ports); RACE: another run claimed a GPU between the preflight and the claim."""

    def __new__(cls, text, waitable=False, race=False):
        line = super().__new__(cls, text)
        line.waitable, line.race = waitable, race
        return line


class TfclusterError(Exception):
    """A known failure: one line for the user, and the exit code that goes with it."""

    exit_code = 1
    cause = None  # why a run ended so, when diagnosis named it (RunEnded)


class UsageError(TfclusterError):
    """Bad input (flags, inventory, cluster spec, example name): nothing was started."""

    exit_code = 2


class PreflightError(TfclusterError):
    """A host is not ready (unreachable, no TensorFlow, port busy...): nothing was started."""

    exit_code = 3


class RunEnded(TfclusterError):
    """A run ended without success. TASK: the task whose end decided it, when there is one;
    CAUSE: what diagnosis named (a tfcluster.diagnosis.Cause), when it named something."""

    def __init__(self, message, task=None, cause=None):
        super().__init__(message)
        self.task, self.cause = task, cause


class RunFailed(RunEnded):
    """The run ended badly."""

    exit_code = 1

    @classmethod
    def of(cls, cause):
        """The run failed for CAUSE, on its task: its sentence is the message."""
        return cls(str(cause), task=cause.task, cause=cause)


class CommandFailed(TfclusterError):
    """A program run for the user (pip) failed; its exit code is tfcluster's."""

    def __init__(self, message, exit_code=1):
        super().__init__(message)
        self.exit_code = exit_code


class RunStalled(RunFailed):
    """--on-stall stop: tasks stalled; the message is the stall's cause."""


class RunTimedOut(RunEnded):
    exit_code = 124


class RunInterrupted(RunEnded):
    exit_code = 130
