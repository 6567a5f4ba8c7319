"""TensorFlow's multi-worker Keras tutorial (tensorflow.org/tutorials/distribute/
multi_worker_with_keras), as one file: MultiWorkerMirroredStrategy reads TF_CONFIG, which
tfcluster sets for every task, and model.fit trains in step on every worker. Nothing in it knows
about tfcluster:

    tfcluster launch --cmd "python examples/keras_multi_worker.py" --workers 2 --ps 0 --chief 0 \
        --env TF_USE_LEGACY_KERAS=1

It needs tf-keras (TensorFlow 2.16+ ships Keras 3, whose model.fit does not run under
MultiWorkerMirroredStrategy) and TF_USE_LEGACY_KERAS=1. The tutorial's MNIST download is replaced
by scikit-learn's bundled 8x8 digits, so it runs offline.
"""
import json
import os

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

per_worker_batch_size = 64
tf_config = json.loads(os.environ["TF_CONFIG"])
num_workers = len(tf_config["cluster"]["worker"])


def digits_dataset(batch_size):
    digits = load_digits()
    x_train = (digits.images / np.float32(16)).astype(np.float32)
    y_train = digits.target.astype(np.int64)
    return tf.data.Dataset.from_tensor_slices(
        (x_train, y_train)).shuffle(2000, seed=1).repeat().batch(batch_size)


def build_and_compile_cnn_model():
    model = tf.keras.Sequential([
        tf.keras.layers.InputLayer(input_shape=(8, 8)),
        tf.keras.layers.Reshape(target_shape=(8, 8, 1)),
        tf.keras.layers.Conv2D(32, 3, activation="relu"),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(128, activation="relu"),
        tf.keras.layers.Dense(10),
    ])
    model.compile(
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=tf.keras.optimizers.SGD(learning_rate=0.05),
        metrics=["accuracy"])
    return model


strategy = tf.distribute.MultiWorkerMirroredStrategy()
global_batch_size = per_worker_batch_size * num_workers
multi_worker_dataset = digits_dataset(global_batch_size)
with strategy.scope():
    multi_worker_model = build_and_compile_cnn_model()
history = multi_worker_model.fit(multi_worker_dataset, epochs=3, steps_per_epoch=70, verbose=2)
print("loss by epoch:", " ".join("%.4f" % loss for loss in history.history["loss"]))
print("accuracy by epoch:", " ".join("%.4f" % acc for acc in history.history["accuracy"]))
