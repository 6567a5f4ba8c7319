"""A MultiWorkerMirroredStrategy program whose worker 1 hangs before its first collective.

Worker 1 waits for data (a file, MWMS_RELEASE) and then exits 0 without training; the other
workers wait for it in their first all-reduce.
"""
import json
import os
import sys
import time

# No Keras here: tf-keras's import instead of Keras 3's (~1.4 s of CPU less per task).
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
import tensorflow as tf  # noqa: E402

index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]


def wait_for_data():
    while not os.path.exists(os.environ["MWMS_RELEASE"]):
        time.sleep(0.2)


strategy = tf.distribute.MultiWorkerMirroredStrategy()
print("worker %d: strategy ready" % index, flush=True)
if index == 1:
    wait_for_data()
    print("worker 1: no data, leaving", flush=True)
    sys.exit(0)


@tf.function
def step():
    ones = strategy.run(lambda: tf.constant(1.0))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, ones, axis=None)


for number in range(3):
    print("step %d: %s" % (number, float(step())), flush=True)
