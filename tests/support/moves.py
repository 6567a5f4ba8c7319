"""What a run that moved to a spare must show, for the spare tests on local machines and on the
test hosts alike."""
import time

from support.cli import metrics_points, run_record
from hostlib.lose import last_step_before_restart

MAX_REDONE = 50  # the trainers checkpoint every 50 steps


def assert_moved_once(launcher, out, runs_dir, run_id, lost, spare, tasks):
    """The launch succeeded after one move of TASKS from LOST to SPARE, every task resumed from
    one checkpoint step, and worker:0 redid at most MAX_REDONE steps; returns (record, move)."""
    assert launcher.returncode == 0, out[-4000:]
    record = run_record(runs_dir, run_id)
    move, = record["moves"]
    assert (move["lost"], move["spare"], move["tasks"]) == (lost, spare, tasks), move
    starts = {r["start_step"] for r in record["results"].values()}
    assert len(starts) == 1, record["results"]
    redone = last_step_before_restart(metrics_points(runs_dir, run_id), "worker:0") - starts.pop()
    assert 0 <= redone <= MAX_REDONE, (redone, record["results"])
    return record, move


def assert_fails_naming_the_lost_machine(launcher, lose, address):
    """LOSE() one machine of the running LAUNCHER's run, which has no spare: the launch fails
    within 30 s, naming ADDRESS as the lost machine; returns its output."""
    try:
        cut_at = time.monotonic()
        lose()
        out, _ = launcher.communicate(timeout=120)
        seconds = time.monotonic() - cut_at
    finally:
        launcher.kill()
    assert launcher.returncode == 1, out[-3000:]
    assert seconds <= 30, seconds
    assert "lost machine %s" % address in out and "no spare machine left" in out, out[-2000:]
    return out
