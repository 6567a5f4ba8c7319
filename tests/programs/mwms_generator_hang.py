"""A MultiWorkerMirroredStrategy program whose worker 1's tf.data generator blocks on a read.

Each step all-reduces one element of each worker's dataset (Dataset.from_generator). Worker 1's
generator yields two elements, then reads the named pipe MWMS_FEED, which no one writes: its
main thread waits in TensorFlow for the next element, and worker 0 waits in the all-reduce.
"""
import json
import os

# No Keras here: tf-keras's import instead of Keras 3's (~1.4 s of CPU less per task).
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
import tensorflow as tf  # noqa: E402

index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]


def records():
    number = 0
    while True:
        if index == 1 and number == 2:
            with open(os.environ["MWMS_FEED"]) as feed:  # blocks until a writer opens the pipe
                number += len(feed.readline())
        number += 1
        yield float(number)


strategy = tf.distribute.MultiWorkerMirroredStrategy()
if index == 1 and not os.path.exists(os.environ["MWMS_FEED"]):
    os.mkfifo(os.environ["MWMS_FEED"])
elements = iter(tf.data.Dataset.from_generator(
    records, output_signature=tf.TensorSpec(shape=(), dtype=tf.float32)))
print("worker %d: strategy ready" % index, flush=True)


@tf.function
def step(value):
    values = strategy.run(lambda: value)
    return strategy.reduce(tf.distribute.ReduceOp.SUM, values, axis=None)


for number in range(5):
    print("step %d: %s" % (number, float(step(next(elements)))), flush=True)
