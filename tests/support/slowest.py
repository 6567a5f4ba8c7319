"""The slowest-worker launches on this machine (tests/test_slowest_launch.py, and
tests/measurements.py): three synchronous workers, the watch's line, the run stopped."""
import re
import signal

from support.cli import Launch, run_record

# Enough compute per step that the limit shows in the step time, not only the all-reduce.
TRAINER = ["--train_steps=100000000", "--log_every=5", "--batch_size=1500", "--hidden_units=2048"]
SLOWEST = r"^tfcluster: (worker:\d) is the slowest: the others wait (\d+)% of each step for it$"


def matches(launch, pattern, start):
    """The matches of PATTERN in the launch's lines from index START on."""
    return [m for m in (re.match(pattern, line.rstrip("\n")) for line in launch.lines[start:])
            if m]


def launch_three_workers(inventory, runs_dir, example, ps, flags):
    """A 3-worker launch of EXAMPLE with PS ps tasks, once all three report points; its
    tasks."""
    launch = Launch(runs_dir, example, "--smoke", "-i", inventory, "--workers", "3", "--ps", ps,
                    "--chief", "0", "--plain", "--", *flags, *TRAINER)
    for label in ("worker:0", "worker:1", "worker:2"):
        launch.line(r"^\[%s localhost\] step \d" % label, 300, label + "'s first points")
    return launch, run_record(runs_dir)["tasks"]


def stop(launch):
    """The launcher's SIGINT (its teardown stops the tasks, the summary follows); its output."""
    if launch.proc.poll() is None:
        launch.proc.send_signal(signal.SIGINT)
    try:
        return launch.end(180)
    finally:
        launch.kill()
