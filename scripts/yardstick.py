#!/usr/bin/env python3
"""yardstick: the CPU seconds (user + system) of `import tensorflow` in the venv, median of 3.

    scripts/yardstick.py [PYTHON]     prints the yardstick (PYTHON: default .venv/bin/python)

This machine's speed changes from day to day; a figure quoted beside the yardstick measured in
the same run (or as a multiple of it) can be compared across days. scripts/bench,
scripts/testsuite (CPU_OF=1) and scripts/cpu-of measure it. Standard library only.
"""
import os
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNS = 3


def import_cpu_seconds(python):
    """User + system CPU seconds of one `PYTHON -c "import tensorflow"` (its children too)."""
    with tempfile.TemporaryFile() as errors:
        proc = subprocess.Popen([python, "-c", "import tensorflow"], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=errors)
        # wait4: this child's own rusage, whatever else this process has running.
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = code = os.waitstatus_to_exitcode(status)
        if code != 0:
            errors.seek(0)
            raise SystemExit("yardstick: %s cannot import tensorflow (exit %d): run `make setup`"
                             "\n%s" % (python, code, errors.read().decode()[-1000:]))
    return usage.ru_utime + usage.ru_stime


class Yardstick:
    """The median of RUNS imports, with each run kept for the record."""

    def __init__(self, python=None, runs=RUNS):
        self.python = python or os.path.join(REPO, ".venv", "bin", "python")
        self.runs = [import_cpu_seconds(self.python) for _ in range(runs)]
        self.seconds = statistics.median(self.runs)

    def __str__(self):
        return "yardstick: `import tensorflow` %.2f CPU s (median of %d: %s)" % (
            self.seconds, len(self.runs), ", ".join("%.2f" % s for s in self.runs))

    def of(self, cpu_seconds):
        """CPU_SECONDS in yardsticks."""
        return cpu_seconds / self.seconds


if __name__ == "__main__":
    if len(sys.argv) > 2 or sys.argv[1:2] in (["-h"], ["--help"]):
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        sys.exit(2)
    stick = Yardstick(sys.argv[1] if len(sys.argv) > 1 else None)
    print("%.2f" % stick.seconds)
    print(stick, file=sys.stderr)
