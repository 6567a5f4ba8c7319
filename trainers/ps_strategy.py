"""TF2 ParameterServerStrategy: a ClusterCoordinator on the chief, variables sharded over the ps.

The TF2 form of between-graph ps training. The ps and worker tasks only start a gRPC server and
join; the chief builds the strategy (from the cluster tfcluster gives it), creates the model's
variables, which the variable partitioner splits into shards across the ps tasks, and schedules
training steps that the coordinator dispatches to whichever worker is free. The model is a
one-hidden-layer ReLU network on MNIST (or scikit-learn's digits) in a tf.Module with a custom
training loop (plain SGD): no Keras, which does not support this strategy any more.

A worker lost with its machine is moved by tfcluster to a spare, alone: the coordinator goes
on with the workers it has and takes the moved one back at its new address (common/moves.py).

The run succeeds when the chief exits 0; tfcluster then stops the workers and ps tasks (they
serve until stopped: TensorFlow has no remote shutdown).
"""
from trainers.common import bootstrap, checkpoints, data, loop, models, moves, sessions, strategies


def build_parser():
    parser = bootstrap.trainer_parser(__doc__)
    models.add_classifier_flags(parser, "training steps the coordinator schedules")
    parser.add_argument("--partitioner", default="fixed", choices=strategies.PARTITIONERS,
                        help="fixed: every variable in --num_shards shards; min_size: shards of "
                             "at least --min_shard_bytes (at most one per ps); none: no sharding")
    parser.add_argument("--num_shards", type=int, default=0, help="fixed: shards (0: one per ps)")
    parser.add_argument("--min_shard_bytes", type=int, default=256 << 10)
    return parser


def shards(variable):
    """The variables holding VARIABLE: its shards (ShardedVariable) or itself."""
    return list(getattr(variable, "variables", [variable]))


def train(info, dataset, args):
    """The chief: strategy, coordinator, variables, the scheduled loop; returns the results."""
    import tensorflow as tf
    bootstrap.seed_everything(args.seed)
    strategy = strategies.make_strategy(
        "parameter_server", info, partitioner=args.partitioner, num_shards=args.num_shards,
        min_shard_bytes=args.min_shard_bytes)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    moves.follow_moves(coordinator, bootstrap.log, info.env.cluster_file)  # a worker moved
    with strategy.scope():
        model = models.build_classifier(tf, dataset, args)
    variables = [v for p in model.params for v in shards(p)]
    shard_devices = {name: [v.device for v in shards(p)] for name, p in model.named_params.items()}
    bootstrap.log("chief: %d workers, %d ps; variable shards: %s"
                  % (info.num_workers, info.num_ps, shard_devices))
    saves, restored = None, None
    if args.checkpoint_dir:
        saves = checkpoints.ObjectCheckpoints(tf, args.checkpoint_dir, log=bootstrap.log,
                                              model=model)
        restored = saves.restore()
    start_steps = int(model.steps.numpy())
    train_x, train_y = dataset.train_x, dataset.train_y

    def build_inputs():
        return (tf.data.Dataset.from_tensor_slices((train_x, train_y))
                .shuffle(len(train_y), seed=args.seed).repeat()
                .batch(args.batch_size, drop_remainder=True).prefetch(2))

    iterator = iter(coordinator.create_per_worker_dataset(build_inputs))
    learning_rate = args.learning_rate

    @tf.function
    def train_step(batches):
        def step_fn(x, y):
            with tf.GradientTape() as tape:
                loss, _ = models.xent_and_accuracy(model(x), y)
            grads = tape.gradient(loss, variables)
            for variable, grad in zip(variables, grads):
                variable.assign_sub(learning_rate * grad)
            model.steps.assign_add(1)
            return loss
        x, y = next(batches)
        return strategy.run(step_fn, args=(x, y))

    initial_loss, initial_acc, _ = models.evaluate(tf, model, dataset)
    progress = loop.Progress(info, args, args.batch_size, start_steps, initial_loss, initial_acc,
                             expected_steps=args.train_steps)
    scheduled = 0
    for step in range(1, args.train_steps + 1):
        if progress.draining():
            break
        scheduled = step
        remote = coordinator.schedule(train_step, args=(iterator,))
        loss = None
        if step % progress.log_every == 0:
            loss = float(remote.fetch())   # waits for this step only
        progress.tick(start_steps + step, loss)
    coordinator.join()
    progress.stop()
    if saves is not None:
        bootstrap.log("saved checkpoint %s" % saves.save(int(model.steps.numpy())).folder)
    applied = int(model.steps.numpy()) - start_steps
    loss, acc, device = models.evaluate(tf, model, dataset)
    bootstrap.log("chief: %d steps applied by %d workers in %.2f s; test loss %.4f, accuracy %.4f"
                  " (%s)" % (applied, info.num_workers, progress.elapsed, loss, acc,
                             dataset.name))
    # The chief's own compute is the evaluation; the training steps run on the workers.
    return progress.result(
        loss, acc, devices=[models.local_device(device)], global_step=int(model.steps.numpy()),
        strategy="ParameterServerStrategy", dataset=dataset.name,
        num_workers=info.num_workers, num_ps=info.num_ps, partitioner=args.partitioner,
        shard_devices=shard_devices,
        ps_tasks_per_variable={name: sorted({d.split("/device:")[0] for d in devices})
                               for name, devices in shard_devices.items()},
        scheduled_steps=scheduled, steps_applied=applied, restored=restored)


def run(options, cluster, dataset=None):
    """The chief trains (its results dict); ps and workers serve (None). The coordinator
    reaches the workers over gRPC only: in one process, start their servers first
    (start_server)."""
    args = bootstrap.options(build_parser(), options)
    info = cluster
    if info.job in ("ps", "worker"):
        # Workers too only serve: the chief's coordinator sends them the functions to run.
        sessions.serve_forever(start_server(info), info)
        return None
    if info.job != "chief":
        raise SystemExit("ps_strategy tasks are chief, worker or ps, not %r" % info.job)
    if info.num_ps < 1 or info.num_workers < 1:
        raise SystemExit("ParameterServerStrategy needs ps and worker tasks besides the chief "
                         "(the cluster has %d ps, %d workers)" % (info.num_ps, info.num_workers))
    return train(info, dataset if dataset is not None else data.load_from_flags(args), args)


def start_server(info):
    """A ps or worker task's server (thread counts only: the coordinator sets its own device
    filters)."""
    return sessions.start_server(info, config=sessions.session_config(info, device_filters=False))


if __name__ == "__main__":
    # With a single inter-op thread (what a fair share of a 2-core host gives 5 tasks) the
    # coordinator's first scheduled step never finishes: the worker running the multi-device
    # function and the ps tasks it sends to wait on each other (measured with TF 2.21).
    bootstrap.entry(build_parser, run, inter_op_threads=2, grpc_options=moves.GRPC_OPTIONS)
