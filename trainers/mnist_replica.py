"""Distributed MNIST with between-graph replication: TensorFlow's dist_test mnist_replica for TF 2.

One hidden ReLU layer and softmax, Adam; variables on the ps tasks through replica_device_setter;
asynchronous by default, synchronous with --sync_replicas (SyncReplicasOptimizer). Training ends
when the global step reaches --train_steps; each worker then prints its validation cross entropy.
"""
import math

from trainers import bootstrap, data


def build_parser():
    parser = bootstrap.make_parser(__doc__.splitlines()[0])
    bootstrap.add_cluster_flags(parser)
    bootstrap.add_mnist_flags(parser)
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
    bootstrap.add_checkpoint_flags(parser)
    return parser


def build_model(dataset, args, info, num_workers):
    """The graph: placement, the network, the (sync) optimizer. Returns a dict of tensors/ops."""
    import tensorflow as tf
    v1 = tf.compat.v1
    if args.num_gpus > 0:
        worker_device = "%s/device:GPU:%d" % (info.device, info.index % args.num_gpus)
    else:
        worker_device = "%s/cpu:0" % info.device
    model = {}
    with v1.device(v1.train.replica_device_setter(worker_device=worker_device,
                                                  ps_device="/job:ps/cpu:0",
                                                  cluster=info.cluster_spec())):
        global_step = v1.train.get_or_create_global_step()
        inputs = int(dataset.train_x.shape[1])
        hid_w = v1.Variable(v1.truncated_normal([inputs, args.hidden_units],
                                                stddev=1.0 / math.sqrt(inputs)), name="hid_w")
        hid_b = v1.Variable(v1.zeros([args.hidden_units]), name="hid_b")
        sm_w = v1.Variable(v1.truncated_normal([args.hidden_units, dataset.num_classes],
                                               stddev=1.0 / math.sqrt(args.hidden_units)),
                           name="sm_w")
        sm_b = v1.Variable(v1.zeros([dataset.num_classes]), name="sm_b")
        x = v1.placeholder(tf.float32, [None, inputs], name="x")
        y = v1.placeholder(tf.int64, [None], name="y")
        hidden = tf.nn.relu(tf.matmul(x, hid_w) + hid_b)
        logits = tf.matmul(hidden, sm_w) + sm_b
        cross_entropy = tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
        accuracy = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, 1), y), tf.float32))
        optimizer = v1.train.AdamOptimizer(args.learning_rate)
        if args.sync_replicas:
            replicas = args.replicas_to_aggregate or num_workers
            optimizer = v1.train.SyncReplicasOptimizer(
                optimizer, replicas_to_aggregate=replicas, total_num_replicas=num_workers,
                name="mnist_sync_replicas")
        model["train_op"] = optimizer.minimize(cross_entropy, global_step=global_step)
    model.update(global_step=global_step, x=x, y=y, cross_entropy=cross_entropy,
                 accuracy=accuracy, optimizer=optimizer)
    return model


def evaluate(sess, model, dataset):
    feed = {model["x"]: dataset.test_x, model["y"]: dataset.test_y}
    xent, acc = sess.run([model["cross_entropy"], model["accuracy"]], feed_dict=feed)
    return float(xent), float(acc)


def train(info, server, dataset, args):
    """The worker's loop; returns the results dict for the result line."""
    import tensorflow as tf
    v1 = tf.compat.v1
    num_workers = info.num_workers
    model = build_model(dataset, args, info, num_workers)
    local_init_op = ready_for_local_init_op = None
    if args.sync_replicas:
        optimizer = model["optimizer"]
        local_init_op = optimizer.chief_init_op if info.is_chief else optimizer.local_step_init_op
        ready_for_local_init_op = optimizer.ready_for_local_init_op
        chief_queue_runner = optimizer.get_chief_queue_runner()
        init_tokens_op = optimizer.get_init_tokens_op()
    saver = v1.train.Saver(max_to_keep=2)
    manager = bootstrap.session_manager(local_init_op=local_init_op,
                                        ready_for_local_init_op=ready_for_local_init_op)
    init_op = v1.global_variables_initializer()
    config = bootstrap.session_config(info)
    bootstrap.log("Worker %d: initializing session..." % info.index)
    sess = bootstrap.prepare_session(info, server, manager, init_op, saver,
                                     args.checkpoint_dir, config)
    bootstrap.log("Worker %d: session initialization complete." % info.index)
    coord = None
    if args.sync_replicas and info.is_chief:
        sess.run(init_tokens_op)
        coord = tf.train.Coordinator()
        chief_queue_runner.create_threads(sess, coord=coord, daemon=True, start=True)

    start_step = sess.run(model["global_step"])
    initial_xent, initial_acc = evaluate(sess, model, dataset)
    bootstrap.log("After %d training step(s), validation cross entropy = %g"
                  % (start_step, initial_xent))
    timer = bootstrap.Timer()
    shard = dataset.shard(info.index, num_workers)
    batches = data.batches(shard.train_x, shard.train_y, args.batch_size, seed=info.index)
    local_step, step = 0, start_step
    while step < args.train_steps:
        batch_x, batch_y = next(batches)
        sess.run(model["train_op"], feed_dict={model["x"]: batch_x, model["y"]: batch_y})
        local_step += 1
        # A fresh read: the step fetched with train_op may predate this update (sync hang #11753).
        step = sess.run(model["global_step"])
        if local_step % 20 == 0:
            bootstrap.log("Worker %d: training step %d done (global step: %d)"
                          % (info.index, local_step, step))
        if (info.is_chief and args.save_every_steps
                and local_step % args.save_every_steps == 0):
            bootstrap.save_checkpoint(sess, saver, args.checkpoint_dir, step)
    elapsed = timer.seconds
    bootstrap.log("Training ends @ %.3f s; local steps %d" % (elapsed, local_step))
    if info.is_chief:
        bootstrap.save_checkpoint(sess, saver, args.checkpoint_dir, step)
    final_xent, final_acc = evaluate(sess, model, dataset)
    bootstrap.log("After %d training step(s), validation cross entropy = %g" % (step, final_xent))
    if coord is not None:
        coord.request_stop()
    return {"task": info.label, "dataset": dataset.name, "sync": bool(args.sync_replicas),
            "start_step": int(start_step), "global_step": int(step), "local_steps": local_step,
            "initial_xent": initial_xent, "final_xent": final_xent,
            "initial_accuracy": initial_acc, "accuracy": final_acc,
            "train_time_s": round(elapsed, 3),
            "examples_per_s": round(local_step * args.batch_size / max(elapsed, 1e-9), 1)}


def run(argv):
    args = build_parser().parse_args(argv)
    info = bootstrap.cluster_from_args(args)
    if args.download_only:
        data.load_images(args.dataset, args.data_dir)
        bootstrap.log("data present in %s" % args.data_dir)
        return 0
    return bootstrap.run_between_graph(
        info, lambda: data.load_images(args.dataset, args.data_dir),
        lambda info, server, dataset: train(info, server, dataset, args),
        existing_servers=args.existing_servers)


if __name__ == "__main__":
    raise SystemExit(bootstrap.main_guard(run))
