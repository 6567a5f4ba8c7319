"""ParameterServerStrategy under Keras's model.fit (tf-keras; Keras 3 has no such strategy), as
a --cmd program: the chief fits, the workers and ps serve. STEPS steps in epochs of 20; each
epoch prints a TFCLUSTER_METRIC point."""
import os
import sys

os.environ["TF_USE_LEGACY_KERAS"] = "1"
import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

from tfcluster_agent import protocol  # noqa: E402

STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 200
EPOCH = 20


def serve(resolver):
    server = tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type,
                                  task_index=resolver.task_id, protocol="grpc", start=True)
    server.join()


def fit(resolver):
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    rng = tf.random.stateless_uniform
    x = rng((2000, 16), seed=(1, 2))
    y = tf.cast(tf.reduce_sum(x[:, :4], axis=1) > 2.0, tf.int64)

    def dataset_fn(context):
        return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(32).prefetch(2)

    with strategy.scope():
        model = tf_keras.Sequential([tf_keras.layers.Dense(64, activation="relu"),
                                     tf_keras.layers.Dense(2)])
        model.compile(optimizer=tf_keras.optimizers.SGD(0.1),
                      loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"], steps_per_execution=1)

    class Points(tf_keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            protocol.report_metric((epoch + 1) * EPOCH, loss=float(logs["loss"]),
                                   accuracy=float(logs["accuracy"]))

    history = model.fit(tf_keras.utils.experimental.DatasetCreator(dataset_fn),
                        epochs=STEPS // EPOCH, steps_per_epoch=EPOCH, callbacks=[Points()],
                        verbose=0)
    losses = history.history["loss"]
    protocol.report_result(dict(loss=losses[-1], initial_loss=losses[0],
                                accuracy=history.history["accuracy"][-1], global_step=STEPS))


def main():
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if resolver.task_type in ("worker", "ps"):
        serve(resolver)
    else:
        fit(resolver)


if __name__ == "__main__":
    main()
