"""Keras model.fit on 2 workers: TensorFlow's multi-worker tutorial, launched unmodified with
--cmd; with tf-keras it learns, without TF_USE_LEGACY_KERAS the failure report says what to do."""
import os
import subprocess
import sys

import pytest

from support import REPO
from support.cli import assert_run_clean, run_record, tfcluster

pytestmark = pytest.mark.slow

PROGRAM = "python %s" % os.path.join(REPO, "examples", "keras_multi_worker.py")
TWO_WORKERS = ("--workers", "2", "--ps", "0", "--chief", "0", "--plain")


def epoch_figures(log, name):
    """The figures of the program's "NAME by epoch: a b c" line."""
    line = next(line for line in log.splitlines() if line.startswith(name + " by epoch:"))
    return [float(value) for value in line.split(":", 1)[1].split()]


def test_keras_tutorial_learns_on_two_workers_with_tf_keras(local_env):
    inventory, runs_dir = local_env
    tfcluster("launch", "--cmd", PROGRAM, "-i", inventory, *TWO_WORKERS, "--run-id", "keras",
              "--env", "TF_USE_LEGACY_KERAS=1", "--success", "all_workers",
              runs_dir=runs_dir, check=0)
    record = run_record(runs_dir, "keras")
    assert record["state"] == "succeeded"
    for name in ("worker-0", "worker-1"):
        with open(os.path.join(runs_dir, "keras", name + ".log")) as handle:
            log = handle.read()
        loss, accuracy = epoch_figures(log, "loss"), epoch_figures(log, "accuracy")
        assert len(loss) == 3 and loss[-1] < 0.5 * loss[0], loss
        assert accuracy[-1] > 0.8, accuracy  # 10 classes: chance is 0.1
    assert_run_clean(record)


def test_keras3_multi_worker_failure_names_the_fix(local_env):
    inventory, runs_dir = local_env
    proc = tfcluster("launch", "--cmd", PROGRAM, "-i", inventory, *TWO_WORKERS, "--run-id", "k3",
                     runs_dir=runs_dir, check=1, env={"TF_USE_LEGACY_KERAS": "0"})
    hints = [line for line in proc.stdout.splitlines() if "TF_USE_LEGACY_KERAS=1" in line]
    assert len(hints) == 1, proc.stdout[-3000:]
    assert "--env TF_USE_LEGACY_KERAS=1" in hints[0] and "tf-keras" in hints[0]
    assert_run_clean(run_record(runs_dir, "k3"))


@pytest.mark.parametrize("legacy", ["1", ""])
def test_trainers_import_tensorflow_without_keras_and_keep_tf_keras_usable(legacy):
    """bootstrap.import_tensorflow leaves Keras 3, tf-keras and scikit-learn unimported
    (TensorFlow's eager import of Keras's optimizers skipped) and the collector running;
    tf.keras and `import tensorflow.keras` then load tf-keras (TF_USE_LEGACY_KERAS=1) or Keras 3,
    as after a plain import."""
    probe = ("import gc, sys; from trainers.common import bootstrap; bootstrap.import_tensorflow(); "
             "print(sorted({'keras', 'tf_keras', 'sklearn'} & set(sys.modules)), gc.isenabled()); "
             "import tensorflow as tf, tensorflow.keras as k; "
             "print(k.__file__.split('site-packages/')[1], tf.keras.layers.Dense.__module__)")
    env = dict(os.environ, TF_USE_LEGACY_KERAS=legacy, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=REPO)
    proc = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    before, after = proc.stdout.splitlines()[-2:]
    assert before == "[] True", proc.stdout
    expected = (["tf_keras/api/_v2/keras/__init__.py", "tf_keras.src.layers.core.dense"] if legacy
                else ["keras/_tf_keras/keras/__init__.py", "keras.src.layers.core.dense"])
    assert after.split() == expected, proc.stdout
