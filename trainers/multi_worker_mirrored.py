"""TF2 MultiWorkerMirroredStrategy: synchronous all-reduce training across workers, no ps.

Every worker holds a full copy of the variables (a tf.Module; custom training loop, plain SGD,
no Keras, which does not support this strategy any more). Each step every worker computes the
gradients of its own shard of the batch; a collective all-reduce sums them across the workers and
each applies the same update, so the copies stay identical. The strategy blocks until every
worker of the cluster has started. At the end every worker evaluates its copy on the test set and
prints its loss and accuracy, with a checksum of its parameters that must match the others'.
"""
import math
import shutil
import tempfile

import numpy as np

from trainers import bootstrap, data

COLLECTIVES = ("auto", "ring", "nccl")


def build_parser():
    parser = bootstrap.make_parser(__doc__.splitlines()[0])
    bootstrap.add_cluster_flags(parser)
    bootstrap.add_mnist_flags(parser)
    parser.add_argument("--hidden_units", type=int, default=100)
    parser.add_argument("--train_steps", type=int, default=1000, help="synchronous steps")
    parser.add_argument("--batch_size", type=int, default=100,
                        help="global batch per step, split evenly across the workers")
    parser.add_argument("--learning_rate", type=float, default=0.1)
    parser.add_argument("--collective", default="auto", choices=COLLECTIVES,
                        help="all-reduce implementation (ring: gRPC, nccl: GPUs)")
    parser.add_argument("--log_every", type=int, default=50)
    bootstrap.add_checkpoint_flags(parser)
    return parser


def make_strategy(tf, info, args):
    """The strategy over this run's workers; create it before any other TensorFlow op."""
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        info.cluster_spec(), task_type=info.job, task_id=info.index, rpc_layer="grpc")
    implementation = {"auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
                      "ring": tf.distribute.experimental.CommunicationImplementation.RING,
                      "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL}
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=implementation[args.collective])
    return tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver,
                                                     communication_options=options)


def build_model(tf, inputs, hidden, classes):
    """A tf.Module with mirrored variables when created inside strategy.scope()."""

    class Classifier(tf.Module):
        def __init__(self):
            super().__init__(name="classifier")
            self.hid_w = tf.Variable(tf.random.stateless_truncated_normal(
                [inputs, hidden], seed=[1, 0], stddev=1.0 / math.sqrt(inputs)), name="hid_w")
            self.hid_b = tf.Variable(tf.zeros([hidden]), name="hid_b")
            self.sm_w = tf.Variable(tf.random.stateless_truncated_normal(
                [hidden, classes], seed=[2, 0], stddev=1.0 / math.sqrt(hidden)), name="sm_w")
            self.sm_b = tf.Variable(tf.zeros([classes]), name="sm_b")
            self.steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="steps")

        @property
        def params(self):
            return [self.hid_w, self.hid_b, self.sm_w, self.sm_b]

        def __call__(self, x):
            hidden_out = tf.nn.relu(tf.matmul(x, self.hid_w) + self.hid_b)
            return tf.matmul(hidden_out, self.sm_w) + self.sm_b

    return Classifier()


def evaluate(tf, model, dataset):
    logits = model(tf.constant(dataset.test_x))
    labels = tf.constant(dataset.test_y)
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels,
                                                                         logits=logits))
    accuracy = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, 1), labels), tf.float32))
    return float(loss), float(accuracy)


def checksum(model):
    """Sum of all parameters of this worker's copy: equal on every worker when in sync."""
    return float(sum(np.asarray(p.numpy(), dtype=np.float64).sum() for p in model.params))


def train(info, strategy, dataset, args):
    import tensorflow as tf
    workers = strategy.num_replicas_in_sync
    if args.batch_size % workers:
        raise SystemExit("--batch_size %d is not a multiple of the %d replicas"
                         % (args.batch_size, workers))
    with strategy.scope():
        model = build_model(tf, int(dataset.train_x.shape[1]), args.hidden_units,
                            dataset.num_classes)
    checkpoint = tf.train.Checkpoint(model=model)
    restored = None
    if args.checkpoint_dir:
        latest = tf.train.latest_checkpoint(args.checkpoint_dir)
        if latest:
            checkpoint.restore(latest)
            restored = latest
    per_replica_batch = args.batch_size // workers

    def dataset_fn(context):
        # Each worker's input pipeline reads its own share of the examples.
        share = slice(context.input_pipeline_id, None, context.num_input_pipelines)
        return (tf.data.Dataset.from_tensor_slices((dataset.train_x[share],
                                                    dataset.train_y[share]))
                .shuffle(4096, seed=context.input_pipeline_id).repeat()
                .batch(per_replica_batch, drop_remainder=True).prefetch(2))

    iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))
    params = model.params
    learning_rate = args.learning_rate
    global_batch = float(args.batch_size)

    @tf.function
    def train_step(batches):
        def step_fn(x, y):
            with tf.GradientTape() as tape:
                losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=model(x))
                loss = tf.reduce_sum(losses) / global_batch
            return loss, tape.gradient(loss, params)
        loss, grads = strategy.run(step_fn, args=next(batches))
        # All-reduce across the workers: every worker gets the same summed gradients.
        grads = [strategy.reduce(tf.distribute.ReduceOp.SUM, g, axis=None) for g in grads]
        for param, grad in zip(params, grads):
            param.assign_sub(learning_rate * grad)
        model.steps.assign_add(1)
        return strategy.reduce(tf.distribute.ReduceOp.SUM, loss, axis=None)

    start_step = int(model.steps.numpy())
    initial_loss, initial_acc = evaluate(tf, model, dataset)
    bootstrap.log("%s: %d replicas in sync; before training: test loss %.4f, accuracy %.4f"
                  % (info.label, workers, initial_loss, initial_acc))
    timer = bootstrap.Timer()
    batch_losses = []
    for step in range(start_step + 1, args.train_steps + 1):
        loss = float(train_step(iterator))
        batch_losses.append(loss)
        if step % args.log_every == 0:
            bootstrap.log("%s: step %d, loss %.4f" % (info.label, step, loss))
    elapsed = timer.seconds
    steps = int(model.steps.numpy())
    loss, acc = evaluate(tf, model, dataset)
    total = checksum(model)
    bootstrap.log("%s: after %d synchronous steps (%.2f s): test loss %.4f, accuracy %.4f (%s); "
                  "parameter checksum %.6f" % (info.label, steps, elapsed, loss, acc,
                                                dataset.name, total))
    if args.checkpoint_dir:
        # Every worker must take part in saving; only the chief's copy is kept.
        target = args.checkpoint_dir if info.is_chief else tempfile.mkdtemp(prefix="mwms-")
        path = tf.train.CheckpointManager(checkpoint, target, max_to_keep=2).save()
        if info.is_chief:
            bootstrap.log("saved checkpoint %s" % path)
        else:
            shutil.rmtree(target, ignore_errors=True)
    window = max(1, min(10, len(batch_losses)))
    return {"task": info.label, "strategy": "MultiWorkerMirroredStrategy",
            "dataset": dataset.name, "replicas_in_sync": workers, "start_step": start_step,
            "global_step": steps, "local_steps": steps - start_step, "restored": restored,
            "initial_loss": initial_loss, "initial_accuracy": initial_acc, "loss": loss,
            "accuracy": acc, "param_checksum": total,
            "first_batch_loss": float(np.mean(batch_losses[:window])) if batch_losses else None,
            "last_batch_loss": float(np.mean(batch_losses[-window:])) if batch_losses else None,
            "train_time_s": round(elapsed, 3),
            "examples_per_s": round((steps - start_step) * args.batch_size
                                    / max(elapsed, 1e-9), 1)}


def run(argv):
    args = build_parser().parse_args(argv)
    info = bootstrap.cluster_from_args(args)
    if info.job not in ("worker", "chief"):
        raise SystemExit("MultiWorkerMirroredStrategy has no %r tasks: launch workers only"
                         % info.job)
    import tensorflow as tf
    strategy = make_strategy(tf, info, args)
    dataset = data.load_images(args.dataset, args.data_dir)
    bootstrap.report(train(info, strategy, dataset, args))
    return 0


if __name__ == "__main__":
    raise SystemExit(bootstrap.main_guard(run))
