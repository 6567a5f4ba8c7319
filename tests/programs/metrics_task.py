"""A user's own program (`--cmd`) as the README's "Watching training" describes it: a metrics
line per point and a result line on stdout, and tf.summary scalars in
$TFCLUSTER_RUN_DIR/tensorboard/<task>/, the folder tfcluster collects. It fits y = 3x by
gradient descent, so its loss really falls."""
import os
import time

import tensorflow as tf

from trainers import protocol

task = os.environ["TFCLUSTER_TASK"]  # e.g. worker:1
folder = os.path.join(os.environ["TFCLUSTER_RUN_DIR"], "tensorboard", task.replace(":", "-"))
writer = tf.summary.create_file_writer(folder)
x = tf.linspace(-1.0, 1.0, 64)
y = 3.0 * x
weight = tf.Variable(0.0)
started = time.monotonic()
initial = None
with writer.as_default():
    for step in range(1, 9):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((weight * x - y) ** 2)
        weight.assign_sub(0.5 * tape.gradient(loss, weight))
        loss = float(loss)
        initial = loss if initial is None else initial
        rate = 64 * step / (time.monotonic() - started)
        protocol.report_metric(step, loss=loss, examples_per_s=rate, target_step=8)
        tf.summary.scalar("loss", loss, step=step)
        tf.summary.scalar("examples_per_s", rate, step=step)
writer.flush()
protocol.report_result({"loss": loss, "initial_loss": initial, "accuracy": 1.0, "global_step": 8,
                        "train_time_s": time.monotonic() - started, "examples_per_s": rate})
