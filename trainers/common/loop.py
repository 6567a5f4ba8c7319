"""One task's training loop, the same for every trainer: its clock, a metrics point every
--log_every local steps (a TFCLUSTER_METRIC line for the controller and TensorBoard scalars under
$TFCLUSTER_RUN_DIR/tensorboard/<task>/), evaluation, and the final result in the one schema
(protocol.RESULT_KEYS plus the example's extras, among them `devices` and `num_gpus`).

Each point after the first carries `busy`: the seconds this process's threads ran or waited for a
CPU (/proc/self/task/*/schedstat) per second since the last point. In synchronous training every
worker takes the same steps, so a worker that waits for its peers is less busy than the one they
wait for, however contended the machine is (diagnosis/slowest.py compares them). A trainer that
times its collective apart (waited()) adds `wait`: the share of the time since the last point it
spent there, waiting for the slowest worker.

Host side: TensorFlow, numpy and the standard library only.
"""
import math
import os
import socket
import time

from tfcluster_agent import protocol
from trainers.common import bootstrap, data, models, sessions

POINTS_PER_TASK = 10  # metrics points a task reports when --log_every is left at 0


def evaluate(sess, model, x, y, feed=None, batch_size=0, fetches=("loss", "accuracy")):
    """(loss, accuracy) of the graph-mode MODEL on (x, y): the means of its tensors FETCHES over
    batches of BATCH_SIZE (0: all at once), fed by FEED((bx, by)) (default: MODEL's "x", "y")."""
    feed = feed or feeder(model)
    size = batch_size or len(y)
    totals = [0.0] * len(fetches)
    for start in range(0, len(y), size):
        batch = x[start:start + size], y[start:start + size]
        values = sess.run([model[name] for name in fetches], feed_dict=feed(batch))
        totals = [t + float(v) * len(batch[1]) for t, v in zip(totals, values)]
    return tuple(t / max(len(y), 1) for t in totals)


def feeder(model):
    """FEED(batch) for a MODEL with "x" and "y" placeholders."""
    return lambda batch: {model["x"]: batch[0], model["y"]: batch[1]}


def build_inputs(dataset, info, args):
    """A between-graph worker's endless shuffled batches of --batch_size from its shard of
    DATASET's training set, seeded by --seed and its index."""
    shard = dataset.shard(info.index, info.num_workers)
    return data.batches(shard.train_x, shard.train_y, args.batch_size,
                        seed=(args.seed, info.index))


def busy_seconds(threads="/proc/self/task"):
    """Seconds the threads of THREADS ran on a CPU or waited to run (a CPU limit's throttling
    included), summed; None where the kernel keeps no schedstat. Threads that ended are not
    counted: a point's figure may fall short while the thread pools change."""
    total = 0
    try:
        names = os.listdir(threads)
    except OSError:
        return None
    for name in names:
        try:
            with open(os.path.join(threads, name, "schedstat")) as handle:
                ran, waited = handle.read().split()[:2]
        except (OSError, ValueError):
            continue  # the thread ended meanwhile
        total += int(ran) + int(waited)
    return total / 1e9 if names else None


def num_gpus():
    import tensorflow as tf
    return len(tf.config.list_physical_devices("GPU"))


# ---------------------------------------------------------------- the training loop

class Scalars:
    """TensorBoard scalars for one task: an event file written directly (Event protos in a
    TFRecord), so the same code serves graph-mode and eager trainers. LOGDIR None: no-op."""

    def __init__(self, logdir):
        self._writer = None
        if not logdir:
            return
        import tensorflow as tf
        self._tf = tf
        os.makedirs(logdir, exist_ok=True)
        path = os.path.join(logdir, "events.out.tfevents.%d.%s.%d"
                            % (int(time.time()), socket.gethostname(), os.getpid()))
        self._writer = tf.io.TFRecordWriter(path)
        self._write(tf.compat.v1.Event(wall_time=time.time(), file_version="brain.Event:2"))

    @classmethod
    def for_task(cls, name, run_dir):
        """Under RUN_DIR/tensorboard/NAME/, the folder tfcluster collects; none without RUN_DIR."""
        return cls(os.path.join(run_dir, "tensorboard", name) if run_dir else None)

    def _write(self, event):
        self._writer.write(event.SerializeToString())
        self._writer.flush()

    def add(self, step, **values):
        if self._writer is None:
            return
        v1 = self._tf.compat.v1
        scalars = {tag: float(value) for tag, value in values.items() if value is not None}
        summary = v1.Summary(value=[v1.Summary.Value(tag=tag, simple_value=value)
                                    for tag, value in sorted(scalars.items())
                                    if math.isfinite(value)])
        self._write(v1.Event(wall_time=time.time(), step=int(step), summary=summary))

    def close(self):
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class Progress:
    """One task's training loop: its clock, a metrics point every --log_every local steps (a
    TFCLUSTER_METRIC line and TensorBoard scalars), and the final result in the one schema.

    EXPECTED_STEPS (this task's share of the steps) sets --log_every 0 to ~POINTS_PER_TASK.
    ENV (a bootstrap.TaskEnv, default INFO's) says where the TensorBoard events go."""

    def __init__(self, info, args, batch_size, start_step, initial_loss, initial_accuracy=None,
                 expected_steps=0, name=None, env=None):
        self.task = info.label if info is not None else "local"
        self.chief = info is None or info.is_chief
        self.batch_size = batch_size
        self.log_every = args.log_every or max(1, math.ceil(expected_steps / POINTS_PER_TASK))
        self.start_step = self.step = int(start_step)
        self.initial_loss, self.initial_accuracy = initial_loss, initial_accuracy
        self.local_steps = 0
        self.elapsed = None
        self.devices = None  # where TensorFlow ran this task's compute, once known
        self.step_stats = None
        env = env or (info.env if info is not None else bootstrap.TaskEnv())
        self.board = Scalars.for_task(name or (info.name if info is not None else "local"),
                                      env.run_dir)
        self.drain_file = env.drain_file
        self.drained = False  # the loop ended on the termination notice (draining())
        self.timer = bootstrap.Timer()
        self._last = (self.timer.seconds, 0, self.start_step)
        self._busy = busy_seconds()
        self._waited = None  # seconds in the collective since the last point, once timed
        self.point(self.start_step, initial_loss, accuracy=initial_accuracy)

    def tick(self, step, loss=None, **scalars):
        """After one local step that left the global step at STEP (LOSS: its batch loss)."""
        self.local_steps += 1
        self.step = int(step)
        if self.local_steps % self.log_every == 0:
            self.point(self.step, loss, **scalars)

    def waited(self, seconds):
        """This step spent SECONDS in the collective (its all-reduce), after its own compute."""
        self._waited = (self._waited or 0.0) + seconds

    def notice(self):
        """True when the termination notice is here: a stat."""
        return bool(self.drain_file) and os.path.exists(self.drain_file)

    def draining(self):
        """True once the termination notice reached this task (tfcluster drains the run): its
        loop ends as at its target, the chief checkpoints, the result says `drained`."""
        if not self.drained and self.notice():
            self.drain()
        return self.drained

    def drain(self):
        """End the loop on the termination notice (seen here, or by a peer: draining())."""
        if not self.drained:
            self.drained = True
            bootstrap.log("%s: termination notice at step %d: checkpointing and ending"
                          % (self.task, self.step))

    def point(self, step, loss=None, **scalars):
        now = self.timer.seconds
        since, local, global_step = self._last
        busy, busy_before = busy_seconds(), self._busy
        self._busy = busy
        rate = None
        if now > since and self.local_steps > local:
            rate = (self.local_steps - local) * self.batch_size / (now - since)
            if self.chief:
                scalars["global_steps_per_s"] = (int(step) - global_step) / (now - since)
            if busy is not None and busy_before is not None and busy >= busy_before:
                scalars["busy"] = round((busy - busy_before) / (now - since), 3)
            if self._waited is not None:
                scalars["wait"] = round(min(1.0, self._waited / (now - since)), 3)
        self._waited = None if self._waited is None else 0.0
        self._last = (now, self.local_steps, int(step))
        rate = round(rate, 1) if rate is not None else None
        protocol.report_metric(step, loss, rate, **scalars)
        self.board.add(step, loss=loss, examples_per_s=rate, **scalars)

    def stop(self):
        """End of training (before the final evaluation): freezes train_time_s."""
        if self.elapsed is None:
            self.elapsed = self.timer.seconds
        return self.elapsed

    def result(self, loss, accuracy, devices=None, global_step=None, **extras):
        """The result dict (one schema plus EXTRAS); reports the last metrics point."""
        devices = devices if devices is not None else (self.devices or [])
        elapsed = self.stop()
        step = self.step if global_step is None else int(global_step)
        rate = self.local_steps * self.batch_size / max(elapsed, 1e-9)
        result = {"loss": loss, "initial_loss": self.initial_loss, "accuracy": accuracy,
                  "global_step": step, "train_time_s": round(elapsed, 3),
                  "examples_per_s": round(rate, 1), "initial_accuracy": self.initial_accuracy,
                  "start_step": self.start_step, "local_steps": self.local_steps,
                  "task": self.task, "devices": list(devices), "num_gpus": num_gpus()}
        result.update(extras)
        if self.drained:
            result["drained"] = True
        protocol.report_metric(step, loss, round(rate, 1), accuracy=accuracy)
        self.board.add(step, loss=loss, accuracy=accuracy, examples_per_s=rate)
        self.board.close()
        return result


# A ps slowed down for seconds (traced by the profiler, on a loaded host) can refuse several
# resends in a row: the tries are spaced out, RESEND_WAIT s more each time (about 9 s in all).
RESEND_ATTEMPTS = 10
RESEND_WAIT = 0.2


def run_step(sess, fetches, feed_dict, attempts=RESEND_ATTEMPTS):
    """sess.run, taken again when a ps refused gRPC's own resend of this request ("received
    twice"): on a loaded host gRPC resends a slow RunGraph and TensorFlow aborts the copy
    (pytorch/xla#4084). In async training the step is simply taken again."""
    import tensorflow as tf
    for attempt in range(attempts):
        try:
            return sess.run(fetches, feed_dict=feed_dict)
        except tf.errors.AbortedError as err:
            if "received twice" not in str(err) or attempt == attempts - 1:
                raise
            bootstrap.log("a ps refused a resent request (received twice); taking the step again")
            time.sleep(RESEND_WAIT * (attempt + 1))


def train_step(sess, progress, fetches, feed_dict=None, task_device=None, options=None,
               retry=False):
    """One training step: FETCHES' values. The first step of PROGRESS runs traced, so that
    progress.devices says where TensorFlow ran the compute of TASK_DEVICE (None: of this
    process) and progress.step_stats where every node ran; the others run with the RunOptions
    OPTIONS, or with RETRY taken again after a refused resend (run_step)."""
    if progress.devices is None:
        values, progress.step_stats = models.traced_run(sess, fetches, feed_dict)
        progress.devices = models.placed_devices(progress.step_stats, task_device)
        return values
    if retry:
        return run_step(sess, fetches, feed_dict)
    return sess.run(fetches, feed_dict=feed_dict, options=options)


def train_replica(info, sess, saver, args, model, dataset, target, feed=None, eval_batch_size=0):
    """A between-graph worker's loop on its shard of DATASET up to global step TARGET;
    returns (its Progress, stopped; EVALUATE() -> test (loss, accuracy)).

    MODEL: "global_step", "loss", "accuracy", and "step_after" (the global step read after this
    task's update) or "train_op"; FEED(batch) -> feed_dict (default: "x" and "y"). The first
    step runs traced (train_step)."""
    feed = feed or feeder(model)

    def evaluate_test_set():
        return evaluate(sess, model, dataset.test_x, dataset.test_y, feed, eval_batch_size)

    batches = build_inputs(dataset, info, args)
    sessions.start_barrier(sess, info)
    start = int(sess.run(model["global_step"]))
    initial_loss, initial_accuracy = evaluate_test_set()
    progress = Progress(info, args, args.batch_size, start, initial_loss, initial_accuracy,
                        expected_steps=(target - start) / max(1, info.num_workers))
    step = start
    fetches = [model["loss"], model.get("step_after", model.get("train_op"))]
    while step < target and not progress.draining():
        loss, step = train_step(sess, progress, fetches, feed(next(batches)), info.device,
                                retry=True)
        if "step_after" not in model:
            # A fresh read: the step fetched with train_op may predate this update (#11753);
            # it too may meet a refused resend.
            step = run_step(sess, model["global_step"], None)
        progress.tick(step, loss)
        every = getattr(args, "save_every_steps", 0)
        if info.is_chief and every and progress.local_steps % every == 0:
            sessions.save_checkpoint(sess, saver, args.checkpoint_dir, progress.step)
    progress.stop()
    if progress.devices is None:  # no step left to take: trace the model on one example
        _, progress.step_stats = models.traced_run(
            sess, model["loss"], feed((dataset.test_x[:1], dataset.test_y[:1])))
        progress.devices = models.placed_devices(progress.step_stats, info.device)
    return progress, evaluate_test_set
