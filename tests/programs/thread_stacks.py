"""A task whose threads other than the main one are in the program's own code, for the stacks
samples in tests/data/stacks/ (MODE, the first argument, says which; READY names the file it
creates once it is there, FEED the named pipe its blocked reads open):

- idle: helpers idle in queue.get, time.sleep and Event.wait, a generator between two items,
  and the main thread waiting inside TensorFlow (a queue's dequeue, as in a collective);
- py_function: a tf.data map's py_function blocked on a read;
- keras: a Keras Sequence (two workers) blocked on a read in __getitem__, under model.fit;
- feeder: a tf.data generator waiting on a queue that the program's own thread fills from a
  blocked read, beside an idle heartbeat thread.
"""
import os
import queue
import sys
import threading
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
import tensorflow as tf  # noqa: E402


def poll_metrics(events):
    while True:
        events.get()


def heartbeat():
    while True:
        time.sleep(30)


def wait_for_stop(stop):
    stop.wait()


def records():
    number = 0
    while True:
        number += 1
        yield float(number)


def read_feed(*_):
    with open(os.environ["FEED"]) as feed:
        return float(len(feed.readline()))


class Batches(tf.keras.utils.Sequence):
    def __len__(self):
        return 10

    def __getitem__(self, index):
        if index >= 2:
            read_feed()
        return tf.ones((4, 2)).numpy(), tf.ones((4, 1)).numpy()


def fed(lines):
    while True:
        yield float(len(lines.get()))


def feed(lines):
    while True:
        lines.put(read_feed())


def idle():
    threading.Thread(target=poll_metrics, args=(queue.Queue(),), daemon=True).start()
    threading.Thread(target=heartbeat, daemon=True).start()
    threading.Thread(target=wait_for_stop, args=(threading.Event(),), daemon=True).start()
    elements = iter(tf.data.Dataset.from_generator(
        records, output_signature=tf.TensorSpec((), tf.float32)))
    next(elements), next(elements)
    open(os.environ["READY"], "w").close()
    tf.queue.FIFOQueue(1, tf.float32).dequeue()


def py_function():
    elements = iter(tf.data.Dataset.range(3).map(
        lambda x: tf.py_function(read_feed, [x], tf.float32)))
    open(os.environ["READY"], "w").close()
    next(elements)


def keras():
    model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    open(os.environ["READY"], "w").close()
    model.fit(Batches(), epochs=1, workers=2, use_multiprocessing=False, verbose=0)


def feeder():
    lines = queue.Queue()
    threading.Thread(target=feed, args=(lines,), daemon=True).start()
    threading.Thread(target=heartbeat, daemon=True).start()
    elements = iter(tf.data.Dataset.from_generator(
        lambda: fed(lines), output_signature=tf.TensorSpec((), tf.float32)))
    open(os.environ["READY"], "w").close()
    next(elements)


if __name__ == "__main__":
    if sys.argv[1] != "idle":
        os.mkfifo(os.environ["FEED"])
    {"idle": idle, "py_function": py_function, "keras": keras, "feeder": feeder}[sys.argv[1]]()
