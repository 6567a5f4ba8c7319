"""CIFAR-10 (seed 004) through the launcher: each ps mode's semantics proven by what happened.

One --smoke launch per mode (small model, synthetic data, fixed --seed); the sync and multi_ps
modes' are the `cifar10` and `cifar10_multi_ps` examples' own --smoke runs, checked on the
every-example launches of tests/test_labs_hosts.py (tests/example_smoke.py, with these margins). Each worker's result
line carries what every step observed (see trainers/cifar10/modes.py): the version of the
parameters its gradient was computed on, the version it was applied to, the ps clock around
its update, the sum of its gradient; the sync aggregator and the async_stale applier report
what they applied. The tests draw the proof from those observations, and check learning with
a margin measured over repeated runs (example_smoke.CIFAR10_LEARNED).
"""
import os
import subprocess
import sys

import pytest

from support import example_checks as checks
from support.example_smoke import CIFAR10_LEARNED, check_cifar10_run
from support import REPO

pytestmark = pytest.mark.slow

STEPS = "--train_steps=120"
# The asynchronous modes divide the rate by workers + 1: this gives them the smoke rate (0.03)
# the learning margins were measured at.
ASYNC_RATE = "--learning_rate=0.09"


def launch(local_env, example, mode, *trainer_args):
    """A --smoke launch of STEPS; (worker 0's result, worker 1's) once the run succeeded in the
    one schema, with its metrics points and TensorBoard curves, and learned (check_cifar10_run)."""
    record, run_dir = checks.launch(local_env, example, STEPS, *trainer_args)
    return check_cifar10_run(record, run_dir, mode)


def overlapping(spans_a, spans_b):
    """Pairs of ps-clock intervals, one from each list, that overlap in time."""
    return [(a, b) for a in spans_a for b in spans_b if a[0] < b[1] and b[0] < a[1]]


def own_update_missing(trace):
    """Steps whose parameters did not yet hold this worker's previous gradient: the version
    read (never older than the parameters) is at most the one that gradient was applied to."""
    applied_to, version = trace["applied_to"], trace["version"]
    return sum(1 for k in range(len(version) - 1) if version[k + 1] <= applied_to[k])


# ---------------------------------------------------------------- the five ps modes

def test_async_applies_under_a_lock_and_replies_after(local_env):
    """No two updates on the ps overlapped in time, and every reply held the worker's own
    update (the version read is the one its update produced)."""
    chief, other = launch(local_env, "cifar10", "async", "--mode=async", ASYNC_RATE)
    assert not overlapping(chief["trace"]["span"], other["trace"]["span"])
    for result in (chief, other):
        trace = result["trace"]
        assert trace["version"][1:] == [a + 1 for a in trace["applied_to"][:-1]]
        assert own_update_missing(trace) == 0
    applied = sorted(chief["trace"]["applied_to"] + other["trace"]["applied_to"])
    assert applied == list(range(len(applied))) and len(applied) == chief["global_step"]


def test_async_stale_applies_gradients_after_replying(local_env):
    """Every gradient pushed was applied once, on parameters newer than it was computed on, and
    workers computed gradients on parameters that did not yet hold their own last one."""
    # At the rate of the other modes (ASYNC_RATE) 120 steps ended at accuracy 0.39 and 0.79.
    chief, other = launch(local_env, "cifar10", "async_stale", "--mode=async_stale",
                          "--train_steps=300")
    applied = chief["applied"]
    pushes = sorted(zip(applied["worker"], applied["local_step"]))
    assert pushes == sorted([(0, k) for k in range(chief["local_steps"])]
                            + [(1, k) for k in range(other["local_steps"])])
    stale = [a - v for a, v in zip(applied["applied_to"], applied["version"])]
    assert min(stale) >= 0 and sum(s > 0 for s in stale) > 0, stale
    missing = 0
    for index, result in enumerate((chief, other)):
        at = {k: a for w, k, a in zip(applied["worker"], applied["local_step"],
                                      applied["applied_to"]) if w == index}
        trace = dict(result["trace"], applied_to=[at[k] for k in range(result["local_steps"])])
        missing += own_update_missing(trace)
    assert missing > 0


def test_hogwild_updates_overlap(local_env):
    """Lock-free: updates of the two workers were observed on the ps at the same time (about
    one update in 25 overlaps one of the other worker's: 5 overlaps in 120 steps, so 300 here)."""
    chief, other = launch(local_env, "cifar10", "hogwild", "--mode=hogwild", "--train_steps=300")
    assert overlapping(chief["trace"]["span"], other["trace"]["span"])


# ---------------------------------------------------------------- local towers

def test_local_towers_run_on_two_devices(tmp_path):
    """--mode local: one process; a traced step shows both CPU devices computing."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPO)
    env.pop("TF_CONFIG", None)
    proc = subprocess.run(
        [sys.executable, "-m", "trainers.cifar10", "--mode=local", "--num_devices=2",
         "--dataset=synthetic", "--train_steps=100", "--batch_size=32", "--conv_filters=16",
         "--fc_units=64,32", "--learning_rate=0.05", "--checkpoint_dir", str(tmp_path / "ckpt")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = checks.result_line(proc.stdout)
    checks.check_schema(result)
    assert result["mode"] == "local" and result["num_devices"] == 2
    assert result["devices"] == ["/device:CPU:0", "/device:CPU:1"]
    assert result["global_step"] == 100
    assert os.listdir(tmp_path / "ckpt")
    checks.assert_learned(result, **CIFAR10_LEARNED)
