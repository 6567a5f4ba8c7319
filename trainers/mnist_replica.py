"""Distributed MNIST with between-graph replication: TensorFlow's dist_test mnist_replica for TF 2.

One hidden ReLU layer and softmax, Adam; variables on the ps tasks through replica_device_setter;
asynchronous by default, synchronous with --sync_replicas (SyncReplicasOptimizer). Training ends
when the global step reaches --train_steps; each worker then prints its validation cross entropy.
"""
from trainers.common import bootstrap, data, loop, models, sessions


def build_parser():
    parser = bootstrap.trainer_parser(__doc__)
    parser.add_argument("--download_only", action="store_true",
                        help="only check that the data is present, then exit")
    parser.add_argument("--num_gpus", type=int, default=1, help="GPUs per worker (0 for CPU)")
    parser.add_argument("--replicas_to_aggregate", type=int, default=None,
                        help="replicas to aggregate per sync step (default: number of workers)")
    parser.add_argument("--hidden_units", type=int, default=100)
    parser.add_argument("--train_steps", type=int, default=200, help="global training steps")
    parser.add_argument("--batch_size", type=int, default=100)
    parser.add_argument("--learning_rate", type=float, default=0.01)
    parser.add_argument("--sync_replicas", action="store_true",
                        help="aggregate gradients of all replicas before each update")
    parser.add_argument("--existing_servers", action="store_true",
                        help="use servers started elsewhere (grpc_server.py) instead of our own")
    return parser


def build_model(dataset, args, info, num_workers):
    """The graph: placement, the network, the (sync) optimizer. Returns a dict of tensors/ops."""
    import tensorflow as tf
    v1 = tf.compat.v1
    model = models.replicated_mlp(info, dataset, args.hidden_units,
                                  worker_device=info.compute_device(args.num_gpus))
    with v1.device(model["setter"]):
        optimizer = v1.train.AdamOptimizer(args.learning_rate)
        if args.sync_replicas:
            optimizer = v1.train.SyncReplicasOptimizer(
                optimizer, replicas_to_aggregate=args.replicas_to_aggregate or num_workers,
                total_num_replicas=num_workers, name="mnist_sync_replicas")
        train_op = optimizer.minimize(model["loss"], global_step=model["global_step"])
    model.update(optimizer=optimizer, train_op=train_op)
    return model


def train(info, server, dataset, args):
    """The worker's loop; returns the results dict for the result line."""
    import tensorflow as tf
    model = build_model(dataset, args, info, info.num_workers)
    manager_ops = {}
    if args.sync_replicas:
        optimizer = model["optimizer"]
        manager_ops = {"local_init_op": optimizer.chief_init_op if info.is_chief
                       else optimizer.local_step_init_op,
                       "ready_for_local_init_op": optimizer.ready_for_local_init_op}
        chief_queue_runner = optimizer.get_chief_queue_runner()
        init_tokens_op = optimizer.get_init_tokens_op()
    bootstrap.log("Worker %d: initializing session..." % info.index)
    sess, saver = sessions.graph_session(info, server, args.checkpoint_dir, **manager_ops)
    bootstrap.log("Worker %d: session initialization complete." % info.index)
    coord = None
    if args.sync_replicas and info.is_chief:
        sess.run(init_tokens_op)
        coord = tf.train.Coordinator()
        queue_threads = chief_queue_runner.create_threads(sess, coord=coord, daemon=True,
                                                          start=True)

    progress, evaluate = loop.train_replica(info, sess, saver, args, model, dataset,
                                            args.train_steps)
    bootstrap.log("Training ends @ %.3f s; local steps %d" % (progress.elapsed,
                                                              progress.local_steps))
    if info.is_chief:
        sessions.save_checkpoint(sess, saver, args.checkpoint_dir, progress.step)
    loss, accuracy = evaluate()
    bootstrap.log("After %d training step(s), validation cross entropy = %g"
                  % (progress.step, loss))
    if coord is not None:
        # The queue runner's threads leave sess.run before Python ends: one that returns from
        # it while the interpreter finalizes is killed inside TensorFlow's C++ and aborts the
        # process after its result (exit 134). Closing the session cancels their pending runs.
        coord.request_stop()
        sess.close()
        coord.join(queue_threads, stop_grace_period_secs=30, ignore_live_threads=True)
    return progress.result(loss, accuracy, dataset=dataset.name, sync=bool(args.sync_replicas))


def run(options, cluster, dataset=None):
    """A worker trains (its results dict), a ps serves (None); --download_only checks the data."""
    args = bootstrap.options(build_parser(), options)
    if args.download_only:
        data.load_from_flags(args)
        bootstrap.log("data present in %s" % args.data_dir)
        return None
    return sessions.run_between_graph(cluster, args, data.load_from_flags, train, dataset,
                                      existing_servers=args.existing_servers)


if __name__ == "__main__":
    bootstrap.entry(build_parser, run, graph=True)
