"""A user's own program (`--cmd`) as the README's "Watching training" describes it: a metrics
line per point and a result line on stdout, and TensorBoard scalars in
$TFCLUSTER_RUN_DIR/tensorboard/<task>/, the folder tfcluster collects (written with the
trainers' own `Scalars`, which needs no tensorboard package). It fits y = 3x by gradient
descent, so its loss really falls."""
import os
import time

# No Keras here: tf-keras's import instead of Keras 3's (~1.4 s of CPU less per task).
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
import tensorflow as tf  # noqa: E402

from trainers import protocol  # as the README tells user programs to
from trainers.common.loop import Scalars

task = os.environ["TFCLUSTER_TASK"]  # e.g. worker:1
scalars = Scalars.for_task(task.replace(":", "-"), os.environ.get("TFCLUSTER_RUN_DIR"))
x = tf.linspace(-1.0, 1.0, 64)
y = 3.0 * x
weight = tf.Variable(0.0)
started = time.monotonic()
initial = None
for step in range(1, 9):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((weight * x - y) ** 2)
    weight.assign_sub(0.5 * tape.gradient(loss, weight))
    loss = float(loss)
    initial = loss if initial is None else initial
    rate = 64 * step / (time.monotonic() - started)
    protocol.report_metric(step, loss=loss, examples_per_s=rate, target_step=8)
    scalars.add(step, loss=loss, examples_per_s=rate)
scalars.close()
protocol.report_result({"loss": loss, "initial_loss": initial, "accuracy": 1.0, "global_step": 8,
                        "train_time_s": time.monotonic() - started, "examples_per_s": rate})
