"""End-to-end runs of mnist_async, data_parallel, model_parallel and mnist_towers.

Each test launches one catalog example through the CLI on the private local inventory
(`local_env`: 1 chief, 3 workers, 2 ps slots on this machine) with --smoke, then checks run.json:
exit 0, a result line from every worker, real learning, the ps tasks stopped, nothing left behind.
Each launch costs ~25 s (TensorFlow's import in every process); the launcher's own --timeout bounds
a hung trainer, and the fixture kills any leftover process even when a test fails.
"""
import json
import os
import subprocess
import sys

from conftest import REPO, assert_run_clean, run_record, tfcluster

LAUNCH_TIMEOUT = 180  # the launcher stops everything itself after this long


def launch(local_env, example, *trainer_args, run_id=None, options=()):
    """`tfcluster launch EXAMPLE --smoke [OPTIONS] [-- TRAINER_ARGS]`; returns (run.json, folder)."""
    inventory, runs_dir = local_env
    run_id = run_id or "test-" + example
    argv = ["launch", example, "-i", inventory, "--smoke", "--run-id", run_id,
            "--timeout", str(LAUNCH_TIMEOUT)] + list(options)
    if trainer_args:
        argv += ["--"] + list(trainer_args)
    tfcluster(*argv, runs_dir=runs_dir, check=0, timeout=LAUNCH_TIMEOUT + 90)
    record = run_record(runs_dir, run_id)
    return record, os.path.join(runs_dir, run_id)


def check_run(record, trackers):
    """Succeeded, every tracked task's result present, ps tasks stopped, nothing left running."""
    assert record["state"] == "succeeded", record.get("failure")
    assert sorted(record.get("results", {})) == sorted(trackers), record.get("results")
    for label, task in record["tasks"].items():
        if task["job"] == "ps":
            assert task["state"] == "stopped", (label, task)
        else:
            assert task["state"] == "succeeded" and task["exit"] == 0, (label, task)
    assert_run_clean(record)


def log_of(run_dir, name):
    with open(os.path.join(run_dir, name + ".log"), errors="replace") as handle:
        return handle.read()


def test_mnist_async_learns_and_resumes_from_its_checkpoint(local_env, tmp_path):
    workers = ["worker:0", "worker:1", "worker:2"]
    checkpoints = str(tmp_path / "async-checkpoints")
    record, run_dir = launch(local_env, "mnist_async", "--checkpoint_dir=" + checkpoints,
                             run_id="test-async-1")
    check_run(record, workers)
    assert record["cluster"].keys() == {"ps", "worker"} and len(record["cluster"]["ps"]) == 1
    results = record["results"]
    chief = results["worker:0"]
    # --smoke: 10 epochs of the 1500 digits at batch 100 = 150 global steps, shared by 3 workers.
    assert chief["start_step"] == 0 and chief["target_step"] == 150
    assert chief["others_finished"] is True
    assert chief["checkpoint_step"] == chief["global_step"] >= 150
    for label in workers:
        result = results[label]
        assert result["global_step"] >= 150, (label, result)
        assert result["accuracy"] > 0.5, (label, result)
        assert result["final_cost"] < 0.6 * chief["initial_cost"], (label, result)
        for key in ("train_time_s", "examples_per_s", "initial_cost"):
            assert key in result, (label, key)
        log = log_of(run_dir, label.replace(":", "-"))
        for line in ("Test-Accuracy: ", "Total Time: ", "Final Cost: "):
            assert line in log, (label, line)
    assert sum(results[w]["local_steps"] for w in workers) >= 150

    # Launched again with the same checkpoint folder and a larger target, it continues from the
    # saved step (with one worker: fewer processes to start on a small machine).
    record2, _ = launch(local_env, "mnist_async", "--checkpoint_dir=" + checkpoints,
                        "--epochs=14", run_id="test-async-2", options=["--workers", "1"])
    check_run(record2, ["worker:0"])
    resumed = record2["results"]["worker:0"]
    assert resumed["start_step"] == chief["checkpoint_step"] > 0, resumed
    assert resumed["target_step"] == 14 * 15
    assert resumed["global_step"] == resumed["checkpoint_step"] == 14 * 15
    assert resumed["local_steps"] == 14 * 15 - chief["checkpoint_step"]


def test_data_parallel_averages_one_gradient_per_worker_per_step(local_env):
    record, run_dir = launch(local_env, "data_parallel")
    check_run(record, ["chief:0", "worker:0", "worker:1"])
    assert set(record["cluster"]) == {"chief", "worker"} and len(record["cluster"]["worker"]) == 2
    results = record["results"]
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
        assert worker["initial_xent"] == master["initial_xent"]  # all started from one state
    assert master["final_xent"] < 0.6 * master["initial_xent"], master
    assert master["accuracy"] > 0.5, master
    # The master's step log names both workers and the step their gradients were computed at.
    assert "Master: step 60 applied the average of worker:0, worker:1 (computed at step 59/59)" \
        in log_of(run_dir, "chief-0")


def test_model_parallel_places_each_layer_on_its_own_ps(local_env):
    record, run_dir = launch(local_env, "model_parallel")
    check_run(record, ["worker:0"])
    assert len(record["cluster"]["ps"]) == 2 and len(record["cluster"]["worker"]) == 1
    result = record["results"]["worker:0"]
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
    assert result["final_xent"] < 0.6 * result["initial_xent"], result
    assert result["accuracy"] > 0.5, result
    assert "placement: layer2/weights" in log_of(run_dir, "worker-0")


def test_mnist_towers_two_devices_learn(local_env):
    record, run_dir = launch(local_env, "mnist_towers", "--num_devices=2")
    check_run(record, ["worker:0"])
    assert list(record["cluster"]) == ["worker"] and len(record["cluster"]["worker"]) == 1
    result = record["results"]["worker:0"]
    assert result["towers"] == 2 and len(set(result["devices"])) == 2
    observed = result["tower_devices_observed"]
    kind = result["device_type"]
    assert observed == {"tower0": ["%s:0" % kind], "tower1": ["%s:1" % kind]}, observed
    assert result["accuracy"] > 0.5, result
    assert result["final_xent"] < 0.6 * result["initial_xent"], result
    log = log_of(run_dir, "worker-0")
    assert log.count("Validation Accuracy = ") == 5  # one per --smoke epoch
    assert "Cost time: " in log


def test_mnist_towers_single_device_baseline_runs_without_a_cluster(tmp_path):
    """The seed's 1-device baseline, standalone (no cluster, no server): one tower."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env.update(PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(
        [sys.executable, "-m", "trainers.mnist_towers", "--dataset=digits", "--num_devices=1",
         "--epochs=2", "--batch_size=64", "--checkpoint_dir=" + str(tmp_path / "ckpt")],
        cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("TFCLUSTER_RESULT ")]
    assert len(lines) == 1, proc.stdout[-3000:]
    result = json.loads(lines[0].split(" ", 1)[1])
    assert result["towers"] == 1 and result["tower_devices_observed"] == {
        "tower0": ["%s:0" % result["device_type"]]}
    assert result["checkpoint_step"] == result["global_step"] > 0
    assert proc.stdout.count("Validation Accuracy = ") == 2
