"""End-to-end runs of the census and TF2-strategy examples through the launcher (CIFAR-10's
are in test_cifar10.py).

Each launch runs the example's --smoke settings on the local_env inventory (everything on this
machine) and checks, from run.json, that it succeeded, learned, stopped its ps tasks and left
nothing behind. About 25-40 s per launch.
"""
import pytest

import example_checks as checks


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
        # Measured (seed 0): accuracy 0.91 against a majority of 0.75, loss 0.28 x the start.
        assert result["accuracy"] >= result["majority_accuracy"] + 0.05, result
        assert result["loss"] <= 0.65 * start, result
    checks.check_metrics(run_dir, record, workers)
    checks.check_tensorboard(run_dir, record, workers, chief="worker:0")


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
        tasks = [t.replace("/replica:0", "") for t in tasks]
        assert tasks == ["/job:ps/task:0", "/job:ps/task:1"], (name, tasks)
    checks.assert_learned(chief, 0.8, 0.5)  # measured (seed 0): 0.95, loss 0.15 x the start
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
        checks.assert_learned(result, 0.8, 0.5)  # measured (seed 0): 0.94, 0.14 x the start
    assert first["param_checksum"] == pytest.approx(second["param_checksum"], rel=1e-6)
    assert first["accuracy"] == second["accuracy"]
    assert first["initial_loss"] == second["initial_loss"]  # one seeded start
    checks.check_metrics(run_dir, record, workers)
    checks.check_tensorboard(run_dir, record, workers, chief="worker:0")
