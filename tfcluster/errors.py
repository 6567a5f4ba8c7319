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


class UsageError(TfclusterError):
    """Bad input (flags, inventory, cluster spec, example name): nothing was started."""

    exit_code = 2


class PreflightError(TfclusterError):
    """A host is not ready (unreachable, no TensorFlow, port busy...): nothing was started."""

    exit_code = 3


class RunFailed(TfclusterError):
    """The run ended badly; TASK is the task whose failure ended it, when there is one."""

    exit_code = 1

    def __init__(self, message, task=None):
        super().__init__(message)
        self.task = task


class CommandFailed(TfclusterError):
    """A program run for the user (pip) failed; its exit code is tfcluster's."""

    def __init__(self, message, exit_code=1):
        super().__init__(message)
        self.exit_code = exit_code


class RunTimedOut(TfclusterError):
    exit_code = 124


class RunInterrupted(TfclusterError):
    exit_code = 130
