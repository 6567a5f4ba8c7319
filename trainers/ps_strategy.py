"""TF2 ParameterServerStrategy: a ClusterCoordinator on the chief, variables sharded over the ps.

The TF2 form of between-graph ps training. The ps and worker tasks only start a gRPC server and
join; the chief builds the strategy (from the cluster tfcluster gives it), creates the model's
variables, which the variable partitioner splits into shards across the ps tasks, and schedules
training steps that the coordinator dispatches to whichever worker is free. The model is a
one-hidden-layer ReLU network on MNIST (or scikit-learn's digits) in a tf.Module with a custom
training loop (plain SGD): no Keras, which does not support this strategy any more.

The run succeeds when the chief exits 0; tfcluster then stops the workers and ps tasks (they
serve until stopped: TensorFlow has no remote shutdown).
"""
import math

import numpy as np

from trainers import bootstrap, data

PARTITIONERS = ("fixed", "min_size", "none")


def build_parser():
    parser = bootstrap.make_parser(__doc__.splitlines()[0])
    bootstrap.add_cluster_flags(parser)
    bootstrap.add_mnist_flags(parser)
    parser.add_argument("--hidden_units", type=int, default=100)
    parser.add_argument("--train_steps", type=int, default=1000,
                        help="training steps the coordinator schedules (one batch each)")
    parser.add_argument("--batch_size", type=int, default=100, help="per step")
    parser.add_argument("--learning_rate", type=float, default=0.1)
    parser.add_argument("--partitioner", default="fixed", choices=PARTITIONERS,
                        help="fixed: every variable in --num_shards shards; min_size: shards of "
                             "at least --min_shard_bytes (at most one per ps); none: no sharding")
    parser.add_argument("--num_shards", type=int, default=0, help="fixed: shards (0: one per ps)")
    parser.add_argument("--min_shard_bytes", type=int, default=256 << 10)
    parser.add_argument("--log_every", type=int, default=50,
                        help="scheduled steps between fetching and printing a loss")
    bootstrap.add_checkpoint_flags(parser)
    return parser


def make_partitioner(tf, args, num_ps):
    """The variable partitioner named by --partitioner."""
    partitioners = tf.distribute.experimental.partitioners
    if args.partitioner == "fixed":
        return partitioners.FixedShardsPartitioner(num_shards=args.num_shards or num_ps)
    if args.partitioner == "min_size":
        return partitioners.MinSizePartitioner(min_shard_bytes=args.min_shard_bytes,
                                               max_shards=num_ps)
    if args.partitioner == "none":
        return None
    raise SystemExit("unknown --partitioner %r: choose one of %s"
                     % (args.partitioner, ", ".join(PARTITIONERS)))


def make_strategy(tf, info, args):
    """ParameterServerStrategy over this run's cluster; it reads the cluster when created."""
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        info.cluster_spec(), task_type=info.job, task_id=info.index, rpc_layer="grpc")
    return tf.distribute.ParameterServerStrategy(
        resolver, variable_partitioner=make_partitioner(tf, args, info.num_ps))


def build_model(tf, inputs, hidden, classes):
    """A tf.Module with its variables; create it inside strategy.scope() to place them."""

    class Classifier(tf.Module):
        def __init__(self):
            super().__init__(name="classifier")
            self.hid_w = tf.Variable(tf.random.truncated_normal(
                [inputs, hidden], stddev=1.0 / math.sqrt(inputs), seed=1), name="hid_w")
            self.hid_b = tf.Variable(tf.zeros([hidden]), name="hid_b")
            self.sm_w = tf.Variable(tf.random.truncated_normal(
                [hidden, classes], stddev=1.0 / math.sqrt(hidden), seed=2), name="sm_w")
            self.sm_b = tf.Variable(tf.zeros([classes]), name="sm_b")
            self.steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="steps_applied")

        @property
        def params(self):
            return [self.hid_w, self.hid_b, self.sm_w, self.sm_b]

        @property
        def named_params(self):
            return dict(zip(["hid_w", "hid_b", "sm_w", "sm_b"], self.params))

        def __call__(self, x):
            hidden_out = tf.nn.relu(tf.matmul(x, self.hid_w) + self.hid_b)
            return tf.matmul(hidden_out, self.sm_w) + self.sm_b

    return Classifier()


def shards(variable):
    """The variables holding VARIABLE: its shards (ShardedVariable) or itself."""
    return list(getattr(variable, "variables", [variable]))


def evaluate(tf, model, dataset):
    logits = model(tf.constant(dataset.test_x))
    labels = tf.constant(dataset.test_y)
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels,
                                                                         logits=logits))
    accuracy = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, 1), labels), tf.float32))
    return float(loss), float(accuracy)


def train(info, dataset, args):
    """The chief: strategy, coordinator, variables, the scheduled loop; returns the results."""
    import tensorflow as tf
    strategy = make_strategy(tf, info, args)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        model = build_model(tf, int(dataset.train_x.shape[1]), args.hidden_units,
                            dataset.num_classes)
    variables = [v for p in model.params for v in shards(p)]
    shard_devices = {name: [v.device for v in shards(p)] for name, p in model.named_params.items()}
    bootstrap.log("chief: %d workers, %d ps; variable shards: %s"
                  % (info.num_workers, info.num_ps, shard_devices))
    checkpoint = tf.train.Checkpoint(model=model)
    restored = None
    if args.checkpoint_dir:
        latest = tf.train.latest_checkpoint(args.checkpoint_dir)
        if latest:
            checkpoint.restore(latest)
            restored = latest
            bootstrap.log("chief: restored %s" % latest)
    start_steps = int(model.steps.numpy())
    train_x, train_y = dataset.train_x, dataset.train_y

    def dataset_fn():
        return (tf.data.Dataset.from_tensor_slices((train_x, train_y))
                .shuffle(len(train_y), seed=0).repeat().batch(args.batch_size, drop_remainder=True)
                .prefetch(2))

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
    learning_rate = args.learning_rate

    @tf.function
    def train_step(batches):
        def step_fn(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                    labels=y, logits=model(x)))
            grads = tape.gradient(loss, variables)
            for variable, grad in zip(variables, grads):
                variable.assign_sub(learning_rate * grad)
            model.steps.assign_add(1)
            return loss
        x, y = next(batches)
        return strategy.run(step_fn, args=(x, y))

    initial_loss, initial_acc = evaluate(tf, model, dataset)
    bootstrap.log("chief: before training: test loss %.4f, accuracy %.4f"
                  % (initial_loss, initial_acc))
    timer = bootstrap.Timer()
    fetched = []
    for step in range(1, args.train_steps + 1):
        remote = coordinator.schedule(train_step, args=(iterator,))
        if step % args.log_every == 0 or step == args.train_steps:
            loss = float(remote.fetch())   # waits for this step only
            fetched.append(loss)
            bootstrap.log("chief: scheduled %d steps, loss of step %d: %.4f" % (step, step, loss))
    coordinator.join()
    elapsed = timer.seconds
    applied = int(model.steps.numpy()) - start_steps
    loss, acc = evaluate(tf, model, dataset)
    bootstrap.log("chief: %d steps applied by %d workers in %.2f s; test loss %.4f, accuracy %.4f"
                  " (%s)" % (applied, info.num_workers, elapsed, loss, acc, dataset.name))
    saved = None
    if args.checkpoint_dir:
        saved = tf.train.CheckpointManager(checkpoint, args.checkpoint_dir, max_to_keep=2).save()
        bootstrap.log("saved checkpoint %s" % saved)
    return {"task": info.label, "strategy": "ParameterServerStrategy", "dataset": dataset.name,
            "num_workers": info.num_workers, "num_ps": info.num_ps,
            "partitioner": args.partitioner, "shard_devices": shard_devices,
            "ps_tasks_per_variable": {name: sorted({d.split("/device:")[0] for d in devices})
                                      for name, devices in shard_devices.items()},
            "scheduled_steps": args.train_steps, "steps_applied": applied,
            "global_step": int(model.steps.numpy()), "restored": restored,
            "initial_loss": initial_loss, "initial_accuracy": initial_acc,
            "loss": loss, "accuracy": acc, "fetched_losses": [round(v, 4) for v in fetched],
            "train_time_s": round(elapsed, 3),
            "examples_per_s": round(applied * args.batch_size / max(elapsed, 1e-9), 1)}


def ensure_inter_op_threads(minimum=2, environ=None):
    """At least MINIMUM inter-op threads, set before TensorFlow starts (it reads the variable).

    With a single inter-op thread (what a fair share of a 2-core host gives 5 tasks) the
    coordinator's first scheduled step never finishes: the worker running the multi-device
    function and the ps tasks it sends to wait on each other (measured with TF 2.21).
    """
    import os
    environ = os.environ if environ is None else environ
    current = int(environ.get("TF_NUM_INTEROP_THREADS", 0) or 0)
    if current and current < minimum:
        environ["TF_NUM_INTEROP_THREADS"] = str(minimum)
    return int(environ.get("TF_NUM_INTEROP_THREADS", 0) or 0)


def run(argv):
    args = build_parser().parse_args(argv)
    info = bootstrap.cluster_from_args(args)
    ensure_inter_op_threads()
    if info.job in ("ps", "worker"):
        # Workers too only serve: the chief's coordinator sends them the functions to run.
        server = bootstrap.start_server(info, config=_server_config(info))
        bootstrap.serve_forever(server, info)
        return 0
    if info.job != "chief":
        raise SystemExit("ps_strategy tasks are chief, worker or ps, not %r" % info.job)
    if info.num_ps < 1 or info.num_workers < 1:
        raise SystemExit("ParameterServerStrategy needs ps and worker tasks besides the chief "
                         "(the cluster has %d ps, %d workers)" % (info.num_ps, info.num_workers))
    dataset = data.load_images(args.dataset, args.data_dir)
    dataset = data.Dataset(dataset.name, dataset.train_x, dataset.train_y.astype(np.int64),
                           dataset.test_x, dataset.test_y.astype(np.int64), dataset.num_classes)
    bootstrap.report(train(info, dataset, args))
    return 0


def _server_config(info):
    """Thread counts only: the coordinator sets its own device filters."""
    return bootstrap.session_config(info, device_filters=False)


if __name__ == "__main__":
    raise SystemExit(bootstrap.main_guard(run))
