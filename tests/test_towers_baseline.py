"""mnist_towers' single-device baseline, the seed's, run alone: no cluster, no launcher.

The built-in examples' launches are checked on the every-example run of tests/test_labs_hosts.py
(tests/example_smoke.py: one launch per example, mnist_async's resume included), CIFAR-10's ps
modes in tests/test_cifar10.py.
"""
import os
import subprocess
import sys

import pytest

from support import REPO
from support.example_checks import result_line

pytestmark = pytest.mark.slow


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
