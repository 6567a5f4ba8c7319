"""End-to-end runs of the census, CIFAR-10 and TF2-strategy examples through the launcher.

Each launch runs the example's --smoke settings on the local_env inventory (everything on this
machine) and checks, from run.json, that it succeeded, learned, stopped its ps tasks and left
nothing behind; each CIFAR-10 mode's DEFINING behaviour is checked from the counters its trainer
keeps on the ps and reports in its result line. About 25-40 s per launch.
"""
import os
import subprocess
import sys

import pytest

import example_checks as checks
from conftest import REPO, assert_run_clean, run_record, tfcluster

LAUNCH_TIMEOUT = 240


def launch(env, name, *options, trainer_args=()):
    """`tfcluster launch NAME --smoke`; returns run.json after checking the run succeeded."""
    inventory, runs_dir = env
    argv = ["launch", name, "-i", inventory, "--smoke", "--timeout", str(LAUNCH_TIMEOUT)]
    argv += list(options)
    if trainer_args:
        argv += ["--"] + list(trainer_args)
    tfcluster(*argv, runs_dir=runs_dir, timeout=LAUNCH_TIMEOUT + 60, check=0)
    record = run_record(runs_dir)
    assert record["state"] == "succeeded", record.get("failure")
    assert record["exit_code"] == 0
    for label, task in record["tasks"].items():
        if task["job"] == "ps":
            assert task["state"] == "stopped", "%s: %s" % (label, task["state"])
    assert_run_clean(record)
    return record


def results(record, *labels):
    found = record.get("results", {})
    missing = [label for label in labels if label not in found]
    assert not missing, "no result line from %s (got %s)" % (missing, sorted(found))
    return [found[label] for label in labels]


def assert_learned(result, accuracy, loss_ratio):
    """Accuracy well above chance and the test loss well below where it started."""
    assert result["accuracy"] >= accuracy, result
    assert result["loss"] <= loss_ratio * result["initial_loss"], result


# ---------------------------------------------------------------- census wide & deep

@pytest.mark.slow
def test_census_widendeep(local_env):
    record, run_dir = checks.launch(local_env, "census_widendeep")
    workers = ["worker:0", "worker:1"]
    found = checks.check_run(record, workers)
    # A worker that starts late sees an already trained model: the start is the highest loss.
    start = max(r["initial_loss"] for r in found.values())
    for result in found.values():
        assert result["synthetic"] and result["dataset"] == "synthetic-census"
        assert result["test_rows"] == 1000 and result["eval_steps"] == 1
        assert result["global_step"] >= 300
        assert result["wide_params"] > 1000000 and result["deep_params"] > 0
        # Measured over seeded runs: accuracy = majority + 0.10-0.13, loss 0.45-0.5 x start.
        assert result["accuracy"] >= result["majority_accuracy"] + 0.05, result
        assert result["loss"] <= 0.65 * start, result
    checks.check_metrics(run_dir, record, workers)
    checks.check_tensorboard(run_dir, record, workers, chief="worker:0")


# ---------------------------------------------------------------- CIFAR-10, five ps modes

def cifar_results(record, num_ps=1):
    chief, other = results(record, "worker:0", "worker:1")
    for result in (chief, other):
        assert result["synthetic"] and result["num_ps"] == num_ps and result["num_workers"] == 2
        assert result["local_steps"] > 0, result
    assert chief["counters_final"], chief
    return chief, other


def test_cifar10_sync(local_env):
    """Each round the ps applies one gradient from EVERY worker: applied = 2 x rounds."""
    record = launch(local_env, "cifar10")
    chief, other = cifar_results(record)
    counters = chief["counters"]
    assert chief["mode"] == "sync"
    assert counters["global_step"] == 300
    assert counters["applied"] == 2 * counters["global_step"]
    assert counters["full_rounds"] == counters["global_step"]      # both workers in every round
    assert counters["pushed"] == counters["applied"]
    assert chief["local_steps"] == other["local_steps"] == counters["global_step"]
    assert chief["apply_ops_locking"] == {"ResourceApplyGradientDescent": [True]}
    assert_learned(chief, 0.3, 0.75)


def test_cifar10_async(local_env):
    """The ps applies each gradient under its lock and replies with what it read after."""
    record = launch(local_env, "cifar10", trainer_args=["--mode=async"])
    chief, other = cifar_results(record)
    counters = chief["counters"]
    assert chief["mode"] == "async"
    assert counters["applied"] == counters["pushed"] == counters["global_step"] >= 300
    assert counters["applied_under_lock"] == counters["applied"]
    assert counters["lock_violations"] == 0
    assert chief["local_steps"] + other["local_steps"] == counters["applied"]
    for result in (chief, other):
        # The parameters each reply carried were read after this worker's own update and
        # before anyone else's (the step read back is the one its update produced).
        assert result["replies_after_own_update"] == result["local_steps"], result
    assert_learned(chief, 0.3, 0.75)


def test_cifar10_async_stale(local_env):
    """The worker's step returns before its gradients are applied; all applied by the end."""
    record = launch(local_env, "cifar10", trainer_args=["--mode=async_stale", "--train_steps=500"])
    chief, other = cifar_results(record)
    counters = chief["counters"]
    assert chief["mode"] == "async_stale"
    assert max(chief["max_lag"], other["max_lag"]) >= 1        # applied lagged behind pushed
    assert chief["lagging_steps"] + other["lagging_steps"] > 0
    assert counters["pushed"] == chief["local_steps"] + other["local_steps"] >= 500
    assert counters["applied"] == counters["pushed"]             # ... and caught up at the end
    assert 0 < chief["applier_runs"] <= counters["applied"]
    assert_learned(chief, 0.3, 0.75)


def test_cifar10_hogwild(local_env):
    """Lock-free: every apply op has use_locking=False; every gradient pushed is applied."""
    record = launch(local_env, "cifar10", trainer_args=["--mode=hogwild"])
    chief, other = cifar_results(record)
    counters = chief["counters"]
    assert chief["mode"] == "hogwild"
    for result in (chief, other):
        locking = result["apply_ops_locking"]
        assert locking and all(values == [False] for values in locking.values()), locking
    assert counters["applied"] == counters["pushed"] == chief["local_steps"] + other["local_steps"]
    assert counters["applied_under_lock"] == 0
    assert_learned(chief, 0.3, 0.75)


def test_cifar10_multi_ps(local_env):
    """Every variable is split into partitions on ps:0 and ps:1."""
    record = launch(local_env, "cifar10_multi_ps")
    chief, other = cifar_results(record, num_ps=2)
    assert chief["mode"] == "multi_ps"
    assert set(record["tasks"]) >= {"ps:0", "ps:1"}
    for result in (chief, other):
        for name, devices in result["partition_devices"].items():
            assert len(devices) == 2, (name, devices)
            assert result["ps_tasks_per_variable"][name] == ["/job:ps/task:0", "/job:ps/task:1"]
    assert chief["counters"]["applied"] == chief["counters"]["pushed"]
    assert_learned(chief, 0.3, 0.75)


def test_cifar10_local_towers(tmp_path):
    """--mode local: one process, two CPU devices, one tower each (no cluster, no launcher)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPO)
    env.pop("TF_CONFIG", None)
    proc = subprocess.run(
        [sys.executable, "-m", "trainers.cifar10", "--mode=local", "--num_devices=2",
         "--dataset=synthetic", "--train_steps=150", "--batch_size=32", "--conv_filters=16",
         "--fc_units=64,32", "--learning_rate=0.05", "--checkpoint_dir", str(tmp_path / "ckpt")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    from tfcluster.runs import results_from_log
    result = results_from_log(proc.stdout)
    assert result["mode"] == "local" and result["num_devices"] == 2
    assert result["tower_devices"] == ["/device:CPU:0", "/device:CPU:1"]
    assert sum(d.endswith("/device:CPU:1") for d in result["session_devices"]) == 1
    assert result["global_step"] == 150
    assert os.listdir(tmp_path / "ckpt")
    assert_learned(result, 0.5, 0.5)


# ---------------------------------------------------------------- TF2 strategies

@pytest.mark.slow
def test_ps_strategy(local_env):
    """The chief's coordinator trains on variables sharded over both ps; workers and ps are
    stopped by the launcher once the chief succeeded."""
    record, run_dir = checks.launch(local_env, "ps_strategy")
    chief = checks.check_run(record, ["chief:0"])["chief:0"]
    assert chief["strategy"] == "ParameterServerStrategy"
    assert chief["num_workers"] == 2 and chief["num_ps"] == 2
    assert chief["steps_applied"] == chief["scheduled_steps"] == chief["global_step"] == 200
    for name, tasks in chief["ps_tasks_per_variable"].items():
        assert [t.replace("/replica:0", "") for t in tasks] == ["/job:ps/task:0", "/job:ps/task:1"], (
            name, tasks)
    # Seeded; measured accuracy 0.93-0.95, loss 0.1 x the start.
    checks.assert_learned(chief, 0.8, 0.4)
    for label in ("worker:0", "worker:1", "ps:0", "ps:1"):
        assert record["tasks"][label]["state"] == "stopped", (label, record["tasks"][label])
    checks.check_metrics(run_dir, record, ["chief:0"])
    checks.check_tensorboard(run_dir, record, ["chief:0"], chief="chief:0")


@pytest.mark.slow
def test_multi_worker_mirrored(local_env):
    """Both workers train in lock-step (same parameters at the end) and exit cleanly."""
    record, run_dir = checks.launch(local_env, "multi_worker_mirrored")
    workers = ["worker:0", "worker:1"]
    found = checks.check_run(record, workers)
    first, second = found["worker:0"], found["worker:1"]
    for result in (first, second):
        assert result["strategy"] == "MultiWorkerMirroredStrategy"
        assert result["replicas_in_sync"] == 2 and result["global_step"] == 200
        # Seeded and synchronous: measured accuracy 0.94, loss 0.1 x the start.
        checks.assert_learned(result, 0.8, 0.4)
    assert first["param_checksum"] == pytest.approx(second["param_checksum"], rel=1e-6)
    assert first["accuracy"] == second["accuracy"]
    assert first["initial_loss"] == second["initial_loss"]  # one seeded start
    checks.check_metrics(run_dir, record, workers)
    checks.check_tensorboard(run_dir, record, workers, chief="worker:0")
