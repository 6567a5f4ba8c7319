"""mnist_async's two launches (it learns, then `--resume` trains on from its checkpoint) and
mnist_towers' single-device baseline without a cluster.

The other examples' --smoke checks (data_parallel, model_parallel, mnist_towers' two towers, the
census and TF2-strategy examples, CIFAR-10's sync mode) run on the every-example launches of
tests/test_labs_hosts.py (tests/example_smoke.py): one launch per example. The launch here runs
on the private local inventory (`local_env`: 1 chief, 3 workers, 2 ps slots on this machine);
the launcher's own --timeout bounds a hung trainer, and the fixture kills any leftover process
even when a test fails.
"""
import os
import subprocess
import sys

import pytest

from conftest import REPO
from example_checks import (assert_learned, check_metrics, check_run, check_tensorboard,
                            launch, result_line)

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
