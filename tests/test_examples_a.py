"""End-to-end runs of mnist_async, data_parallel, model_parallel and mnist_towers.

Each test launches one catalog example through the CLI on the private local inventory
(`local_env`: 1 chief, 3 workers, 2 ps slots on this machine) with --smoke, then checks from one
launch: exit 0, a result in the one schema from every worker, real learning (seeded; margins
measured over repeated runs), at least 5 metrics points per training task, loadable TensorBoard
event files, the ps tasks stopped, nothing left behind. Each launch costs ~25 s (TensorFlow's
import in every process); the launcher's own --timeout bounds a hung trainer, and the fixture
kills any leftover process even when a test fails.
"""
import os
import subprocess
import sys

import pytest

from conftest import REPO
from example_checks import (assert_learned, check_metrics, check_run, check_tensorboard,
                            launch, metric_points, result_line)

pytestmark = pytest.mark.slow


def log_of(run_dir, name):
    with open(os.path.join(run_dir, name + ".log"), errors="replace") as handle:
        return handle.read()


def test_mnist_async_learns_and_resumes_from_its_checkpoint(local_env):
    workers = ["worker:0", "worker:1", "worker:2"]
    record, run_dir = launch(local_env, "mnist_async", run_id="test-async-1")
    results = check_run(record, workers)
    assert record["cluster"].keys() == {"ps", "worker"} and len(record["cluster"]["ps"]) == 1
    chief = results["worker:0"]
    # --smoke: 10 epochs of the 1500 digits at batch 100 = 150 global steps, shared by 3 workers.
    assert chief["start_step"] == 0 and chief["target_step"] == 150
    assert chief["others_finished"] is True
    assert chief["checkpoint_step"] == chief["global_step"] >= 150
    start = max(r["initial_loss"] for r in results.values())
    for label in workers:
        result = results[label]
        assert result["global_step"] >= 150, (label, result)
        # Measured (seed 0, with the start barrier): accuracy 0.90-0.91, loss 0.21 x the start.
        assert_learned(result, 0.7, 0.7, initial=start)
        log = log_of(run_dir, label.replace(":", "-"))
        for line in ("Test-Accuracy: ", "Total Time: ", "Final Cost: "):
            assert line in log, (label, line)
    assert sum(results[w]["local_steps"] for w in workers) >= 150
    check_metrics(run_dir, record, workers)
    check_tensorboard(run_dir, record, workers, chief="worker:0")

    # `--resume` with a larger target: the chief restores the first run's checkpoint and trains
    # on from the saved step (with one worker: fewer processes to start on a small machine).
    # The one launch test of --resume: mnist_replica restores through the same code
    # (trainers/common/sessions.py).
    record2, _ = launch(local_env, "mnist_async", "--epochs=14", run_id="test-async-2",
                        options=["--workers", "1", "--resume", "test-async-1"])
    resumed = check_run(record2, ["worker:0"])["worker:0"]
    assert resumed["start_step"] == chief["checkpoint_step"] > 0, resumed
    assert resumed["target_step"] == 14 * 15
    assert resumed["global_step"] == resumed["checkpoint_step"] == 14 * 15
    assert resumed["local_steps"] == 14 * 15 - chief["checkpoint_step"]
    assert resumed["initial_loss"] < 0.7 * start, "a resumed model starts trained"


def test_data_parallel_averages_one_gradient_per_worker_per_step(local_env):
    record, run_dir = launch(local_env, "data_parallel")
    tasks = ["chief:0", "worker:0", "worker:1"]
    results = check_run(record, tasks)
    assert set(record["cluster"]) == {"chief", "worker"} and len(record["cluster"]["worker"]) == 2
    master = results["chief:0"]
    steps = 60  # --smoke --train_steps
    assert master["role"] == "master" and master["start_step"] == 0
    assert master["global_step"] == master["applied_steps"] == steps
    # Each apply dequeued exactly one item per worker (counters), computed at that step (fresh).
    assert master["contributions"] == {"worker:0": steps, "worker:1": steps}
    assert master["fresh"] == {"worker:0": steps, "worker:1": steps}
    assert master["workers_finished"] is True
    for label in ("worker:0", "worker:1"):
        worker = results[label]
        assert worker["local_steps"] == worker["contributions"] == worker["fresh"] == steps
        assert worker["global_step"] == steps
        assert worker["initial_loss"] == master["initial_loss"]  # all started from one state
    # Seeded: the same start everywhere; measured accuracy 0.94, loss 0.12 x the start.
    assert_learned(master, 0.8, 0.3)
    # The master's step log names both workers and the step their gradients were computed at.
    assert "Master: step 60 applied the average of worker:0, worker:1 (computed at step 59/59)" \
        in log_of(run_dir, "chief-0")
    check_metrics(run_dir, record, tasks)
    check_tensorboard(run_dir, record, tasks, chief="chief:0")


def test_model_parallel_places_each_layer_on_its_own_ps(local_env):
    record, run_dir = launch(local_env, "model_parallel")
    result = check_run(record, ["worker:0"])["worker:0"]
    assert len(record["cluster"]["ps"]) == 2 and len(record["cluster"]["worker"]) == 1
    assert result["layers"] == {"layer1": 0, "layer2": 1}
    placement, observed = result["placement"], result["placement_observed"]
    layer_vars = [name for name in placement if name.startswith(("layer1/", "layer2/"))]
    assert {"layer1/weights", "layer1/biases", "layer2/weights", "layer2/biases"} <= set(layer_vars)
    for name in layer_vars:
        task = 0 if name.startswith("layer1/") else 1
        assert placement[name].startswith("/job:ps/task:%d" % task), (name, placement[name])
        # What the traced step saw: the variable's reads and updates ran on that ps task only.
        assert observed[name] == ["ps:%d" % task], (name, observed[name])
    assert result["global_step"] == 100
    # Seeded, one worker: measured accuracy 0.98, loss 0.03 x the start.
    assert_learned(result, 0.85, 0.2)
    assert "placement: layer2/weights" in log_of(run_dir, "worker-0")
    check_metrics(run_dir, record, ["worker:0"])
    check_tensorboard(run_dir, record, ["worker:0"], chief="worker:0")


def test_mnist_towers_two_devices_learn(local_env):
    record, run_dir = launch(local_env, "mnist_towers", "--num_devices=2")
    result = check_run(record, ["worker:0"])["worker:0"]
    assert list(record["cluster"]) == ["worker"] and len(record["cluster"]["worker"]) == 1
    assert result["towers"] == 2 and len(set(result["tower_devices"])) == 2
    observed = result["tower_devices_observed"]
    kind = result["device_type"]
    assert observed == {"tower0": ["%s:0" % kind], "tower1": ["%s:1" % kind]}, observed
    # Both logical devices ran compute in the traced step.
    assert {"/device:%s:0" % kind, "/device:%s:1" % kind} <= set(result["devices"])
    # Measured (seed 0): test accuracy 0.82, loss 0.28 x the start after 5 short epochs.
    assert_learned(result, 0.6, 0.6)
    assert len(result["validation_accuracy"]) == 5  # one per --smoke epoch
    log = log_of(run_dir, "worker-0")
    assert log.count("Validation Accuracy = ") == 5
    assert "Cost time: " in log
    check_metrics(run_dir, record, ["worker:0"])
    # Every epoch's validation accuracy is a metrics point too.
    assert sum(1 for p in metric_points(run_dir, "worker:0") if "accuracy" in p) >= 5
    check_tensorboard(run_dir, record, ["worker:0"], chief="worker:0")


def test_mnist_towers_single_device_baseline_runs_without_a_cluster(tmp_path):
    """The seed's 1-device baseline, standalone (no cluster, no server, no run folder): one
    tower, seeded, and no TensorBoard folder without $TFCLUSTER_RUN_DIR."""
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "TFCLUSTER_RUN_DIR")}
    env.update(PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(
        [sys.executable, "-m", "trainers.mnist_towers", "--dataset=digits", "--num_devices=1",
         "--epochs=2", "--batch_size=64", "--seed=3", "--log_every=4",
         "--checkpoint_dir=" + str(tmp_path / "ckpt")],
        cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=420)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = result_line(proc.stdout)
    assert result["towers"] == 1 and result["tower_devices_observed"] == {
        "tower0": ["%s:0" % result["device_type"]]}
    assert result["task"] == "local" and result["devices"] == ["/device:CPU:0"]
    assert result["checkpoint_step"] == result["global_step"] > 0
    assert proc.stdout.count("Validation Accuracy = ") == 2
    # 2 epochs of 18 steps, a point every 4 steps, plus the start, each epoch's and the end.
    assert proc.stdout.count("TFCLUSTER_METRIC ") == 1 + 36 // 4 + 2 + 1
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]
