"""TF2 MultiWorkerMirroredStrategy: synchronous all-reduce training across workers, no ps.

Every worker holds a full copy of the variables (a tf.Module; custom training loop, plain SGD,
no Keras, which does not support this strategy any more). Each step every worker computes the
gradients of its own shard of the batch; a collective all-reduce sums them across the workers and
each applies the same update, so the copies stay identical. The strategy blocks until every
worker of the cluster has started. At the end every worker evaluates its copy on the test set and
prints its loss and accuracy, with a checksum of its parameters that must match the others'.
"""
import os
import time

import numpy as np

from trainers.common import bootstrap, checkpoints, data, loop, models, strategies


def build_parser():
    parser = bootstrap.trainer_parser(__doc__)
    models.add_classifier_flags(parser, "synchronous steps")
    parser.add_argument("--collective", default="auto", choices=strategies.COLLECTIVES,
                        help="all-reduce implementation (ring: gRPC, nccl: GPUs)")
    return parser


def checksum(model):
    """Sum of all parameters of this worker's copy: equal on every worker when in sync."""
    return float(sum(np.asarray(p.numpy(), dtype=np.float64).sum() for p in model.params))


def adopt_newest(tf, strategy, model):
    """Every worker takes the state of the worker whose restored copy is the newest (the first
    of them): the same step and parameters everywhere before the first all-reduce."""
    variables = list(model.params) + [model.steps]

    @tf.function
    def newest():
        def replica_fn():
            context = tf.distribute.get_replica_context()
            # Every replica's step, by a sum of one-hot vectors (all_gather's collective
            # crashed TensorFlow's profiler when a trace ran).
            mine = tf.one_hot(context.replica_id_in_sync_group, context.num_replicas_in_sync)
            steps = context.all_reduce(tf.distribute.ReduceOp.SUM,
                                       mine * tf.cast(model.steps, tf.float32))
            source = tf.equal(tf.cast(tf.argmax(steps), tf.int32),
                              context.replica_id_in_sync_group)
            return [context.all_reduce(tf.distribute.ReduceOp.SUM, tf.where(
                source, tf.cast(v, tf.float32), tf.zeros(v.shape, tf.float32)))
                for v in variables]
        return strategy.run(replica_fn)

    for variable, value in zip(variables, newest()):
        variable.assign(tf.cast(strategy.experimental_local_results(value)[0], variable.dtype))


def train(info, strategy, dataset, args):
    """This worker's synchronous loop to --train_steps; returns the results dict."""
    import tensorflow as tf
    workers = strategy.num_replicas_in_sync
    if args.batch_size % workers:
        raise SystemExit("--batch_size %d is not a multiple of the %d replicas"
                         % (args.batch_size, workers))
    with strategy.scope():
        model = models.build_classifier(tf, dataset, args)
    saves = restored = None
    if args.checkpoint_dir:
        # Every worker takes part in saving and keeps its copy (the chief's is the folder's
        # own): a worker moved to a spare machine restores none, and takes its peers' state.
        save_dir = args.checkpoint_dir if info.is_chief else os.path.join(
            args.checkpoint_dir, "%s-%d" % (info.job, info.index))
        saves = checkpoints.ObjectCheckpoints(tf, save_dir, log=bootstrap.log, model=model)
        restored = saves.restore()
        adopt_newest(tf, strategy, model)
    per_replica_batch = args.batch_size // workers

    def build_inputs(context):
        # Each worker's input pipeline reads its own share of the examples.
        share = slice(context.input_pipeline_id, None, context.num_input_pipelines)
        return (tf.data.Dataset.from_tensor_slices((dataset.train_x[share],
                                                    dataset.train_y[share]))
                .shuffle(4096, seed=args.seed + context.input_pipeline_id).repeat()
                .batch(per_replica_batch, drop_remainder=True).prefetch(2))

    iterator = iter(strategy.distribute_datasets_from_function(build_inputs))
    params = model.params
    learning_rate = args.learning_rate
    global_batch = float(args.batch_size)

    # A step is two functions: this worker's own gradients, then the all-reduce, timed apart
    # (the time in the second is the wait for the slowest worker, loop.Progress.waited).
    @tf.function
    def gradients(batches, notice):
        def step_fn(x, y):
            with tf.GradientTape() as tape:
                losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=model(x))
                loss = tf.reduce_sum(losses) / global_batch
            return tf.stack([loss, notice]), tape.gradient(loss, params)
        return strategy.run(step_fn, args=next(batches))

    @tf.function
    def all_reduce(status, grads):
        # Every worker gets the same summed gradients.
        grads = [strategy.reduce(tf.distribute.ReduceOp.SUM, g, axis=None) for g in grads]
        for param, grad in zip(params, grads):
            param.assign_sub(learning_rate * grad)
        model.steps.assign_add(1)
        # [the batch loss, the replicas that saw the termination notice], the same on every
        # worker: all of them end (and save, together) after the same step.
        return strategy.reduce(tf.distribute.ReduceOp.SUM, status, axis=None)

    def save(step):
        found = saves.save(step)
        if info.is_chief:
            bootstrap.log("saved checkpoint %s" % found.folder)
        return step

    start_step = int(model.steps.numpy())
    initial_loss, initial_acc, _ = models.evaluate(tf, model, dataset)
    bootstrap.log("%s: %d replicas in sync; before training: test loss %.4f, accuracy %.4f"
                  % (info.label, workers, initial_loss, initial_acc))
    progress = loop.Progress(info, args, args.batch_size, start_step, initial_loss, initial_acc,
                             expected_steps=args.train_steps - start_step)
    saved = None
    for step in range(start_step + 1, args.train_steps + 1):
        status, grads = gradients(iterator, tf.constant(float(progress.notice())))
        computed = time.monotonic()
        loss, notices = all_reduce(status, grads).numpy()
        progress.waited(time.monotonic() - computed)
        progress.tick(step, float(loss))
        if notices:
            progress.drain()
            break
        if saves is not None and args.save_every_steps and step % args.save_every_steps == 0:
            saved = save(step)
    progress.stop()
    steps = int(model.steps.numpy())
    if saves is not None and saved != steps:
        save(steps)
    loss, acc, _ = models.evaluate(tf, model, dataset)
    total = checksum(model)
    bootstrap.log("%s: after %d synchronous steps (%.2f s): test loss %.4f, accuracy %.4f (%s); "
                  "parameter checksum %.6f" % (info.label, steps, progress.elapsed, loss, acc,
                                                dataset.name, total))
    # The replicas run where the strategy put them (GPU:i when the worker has GPUs).
    return progress.result(
        loss, acc, devices=[models.local_device(d) for d in strategy.extended.worker_devices],
        global_step=steps, strategy="MultiWorkerMirroredStrategy", dataset=dataset.name,
        replicas_in_sync=workers, restored=restored, param_checksum=total)


def run(options, cluster, dataset=None):
    """This worker trains (its results dict); in process, the strategy runs on this process's
    devices alone (no collective over gRPC)."""
    args = bootstrap.options(build_parser(), options)
    info = cluster
    if info.job not in ("worker", "chief"):
        raise SystemExit("MultiWorkerMirroredStrategy has no %r tasks: launch workers only"
                         % info.job)
    bootstrap.seed_everything(args.seed)
    strategy = strategies.make_strategy("multi_worker_mirrored", info, collective=args.collective)
    dataset = dataset if dataset is not None else data.load_from_flags(args)
    return train(info, strategy, dataset, args)


if __name__ == "__main__":
    bootstrap.entry(build_parser, run)
