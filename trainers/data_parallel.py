"""Synchronous data parallelism: a master holds the parameters, workers send it gradients (seed 000).

Topology: the `chief` job (1 task) is the master; the `worker` job (2 tasks by default) computes
loss and gradients on its own shard. Every variable lives on the master. The exchange, built from
TensorFlow's own queues, all of them on the master:

    worker i, each step:  read the parameters and the global step, compute its gradients, put
                          (global step read, gradients, loss) into ITS OWN gradient queue
                          (capacity 1), then block on ITS OWN token queue.
    master, each step:    take exactly one item from every worker's gradient queue, average the
                          gradients, apply them once, add 1 to every worker's contribution counter
                          (and to its `fresh` counter when the item was computed at the current
                          global step), then put the new global step into every token queue.

A worker cannot send a second gradient before the master has applied its first (it waits for its
token), and the apply step cannot run without one item from each worker, so every step averages
exactly one gradient per worker, computed from the current parameters. The counters are variables
(saved in checkpoints too) that prove it: after N steps from a fresh start, every worker's
contribution and fresh counts equal N and so does the global step.

The end: workers stop when a token carries the target step. Each one then evaluates (reading the
master's parameters), leaves an item in the master's `done` queue and exits; the master, after its
last apply, saves its checkpoint and waits (up to --finish_wait_secs) for every worker's `done`
before it exits, so no worker is left talking to a master that is gone.

The model: one hidden ReLU layer and softmax, gradient descent on the averaged gradient.
"""
import math

from trainers import bootstrap, data

MASTER_JOB = "chief"
VARIABLE_OPS = ("Variable", "VariableV2", "VarHandleOp", "AutoReloadVariable")


def build_parser():
    parser = bootstrap.make_parser(__doc__.splitlines()[0])
    bootstrap.add_cluster_flags(parser)
    bootstrap.add_mnist_flags(parser)
    parser.add_argument("--train_steps", type=int, default=1000,
                        help="target global step (one step = one averaged update)")
    parser.add_argument("--batch_size", type=int, default=100, help="per worker and step")
    parser.add_argument("--learning_rate", type=float, default=0.5,
                        help="gradient descent step size")
    parser.add_argument("--hidden_units", type=int, default=100)
    parser.add_argument("--log_every", type=int, default=50,
                        help="the master logs the workers' contributions every N steps")
    parser.add_argument("--step_timeout_secs", type=float, default=600.0,
                        help="longest wait for a gradient or a token before giving up")
    parser.add_argument("--finish_wait_secs", type=float, default=120.0,
                        help="how long the master waits for the workers to finish at the end")
    bootstrap.add_checkpoint_flags(parser)
    return parser


def master_device():
    return "/job:%s/task:0" % MASTER_JOB


def split_placement(variable_device, compute_device):
    """Device function: variables on VARIABLE_DEVICE, every other op on COMPUTE_DEVICE."""
    def place(op):
        node = op.node_def if hasattr(op, "node_def") else op
        return variable_device if node.op in VARIABLE_OPS else compute_device
    return place


def build_model(dataset, args, info):
    """Parameters and counters on the master; the network computed on this task."""
    import tensorflow as tf
    v1 = tf.compat.v1
    inputs = int(dataset.train_x.shape[1])
    num_workers = info.num_workers
    model = {"num_workers": num_workers}
    with v1.device(split_placement(master_device(), info.device)):
        global_step = v1.train.get_or_create_global_step()
        w1 = v1.Variable(v1.truncated_normal([inputs, args.hidden_units],
                                             stddev=1.0 / math.sqrt(inputs)), name="hid_w")
        b1 = v1.Variable(v1.zeros([args.hidden_units]), name="hid_b")
        w2 = v1.Variable(v1.truncated_normal([args.hidden_units, dataset.num_classes],
                                             stddev=1.0 / math.sqrt(args.hidden_units)),
                         name="sm_w")
        b2 = v1.Variable(v1.zeros([dataset.num_classes]), name="sm_b")
        params = [w1, b1, w2, b2]
        contributions = [v1.Variable(tf.constant(0, tf.int64), trainable=False,
                                     name="contributions_worker_%d" % i)
                         for i in range(num_workers)]
        fresh = [v1.Variable(tf.constant(0, tf.int64), trainable=False,
                             name="fresh_worker_%d" % i) for i in range(num_workers)]
        x = v1.placeholder(tf.float32, [None, inputs], name="x")
        y = v1.placeholder(tf.int64, [None], name="y")
        logits = tf.matmul(tf.nn.relu(tf.matmul(x, w1) + b1), w2) + b2
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y,
                                                                             logits=logits))
        accuracy = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, 1), y), tf.float32))
    model.update(global_step=global_step, params=params, contributions=contributions,
                 fresh=fresh, x=x, y=y, loss=loss, accuracy=accuracy)

    dtypes = [tf.int64] + [tf.float32] * len(params) + [tf.float32]
    shapes = [[]] + [p.shape for p in params] + [[]]
    with v1.device(master_device()):
        grad_queues = [v1.FIFOQueue(1, dtypes, shapes=shapes,
                                    shared_name="dp_gradients_worker_%d" % i,
                                    name="gradients_worker_%d" % i) for i in range(num_workers)]
        token_queues = [v1.FIFOQueue(-1, [tf.int64], shapes=[[]],
                                     shared_name="dp_tokens_worker_%d" % i,
                                     name="tokens_worker_%d" % i) for i in range(num_workers)]
        done_queue = v1.FIFOQueue(num_workers, [tf.int32], shapes=[[]],
                                  shared_name="dp_done", name="done")

    if info.job == "worker":
        i = info.index
        with v1.device(info.device):
            grads = tf.gradients(loss, params)
            stamp = tf.identity(global_step.read_value(), name="step_read")
        with v1.device(master_device()):
            send = grad_queues[i].enqueue([stamp] + grads + [loss])
            with v1.control_dependencies([send]):
                model["step"] = token_queues[i].dequeue()
            model["done"] = done_queue.enqueue(tf.constant(i, tf.int32))
    else:
        model.update(build_apply(args, model, grad_queues, token_queues))
        with v1.device(master_device()):
            model["wait_done"] = done_queue.dequeue_many(num_workers)
    return model


def build_apply(args, model, grad_queues, token_queues):
    """The master's step: one item from each worker, averaged, applied once, tokens out."""
    import tensorflow as tf
    v1 = tf.compat.v1
    params, global_step = model["params"], model["global_step"]
    with v1.device(master_device()):
        items = [queue.dequeue() for queue in grad_queues]
        stamps = [item[0] for item in items]
        losses = [item[-1] for item in items]
        current = global_step.read_value()
        is_fresh = [tf.cast(tf.equal(stamp, current), tf.int64) for stamp in stamps]
        averaged = [tf.add_n([item[1 + k] for item in items]) / float(len(items))
                    for k in range(len(params))]
        with v1.control_dependencies(is_fresh):
            apply = v1.train.GradientDescentOptimizer(args.learning_rate).apply_gradients(
                list(zip(averaged, params)), global_step=global_step)
        with v1.control_dependencies([apply]):
            counted = ([c.assign_add(1) for c in model["contributions"]]
                       + [f.assign_add(n) for f, n in zip(model["fresh"], is_fresh)])
        with v1.control_dependencies(counted):
            new_step = global_step.read_value()
            released = [queue.enqueue(new_step) for queue in token_queues]
        with v1.control_dependencies(released):
            new_step = tf.identity(new_step)
    return {"apply_step": new_step, "stamps": tf.stack(stamps), "worker_losses": tf.stack(losses)}


def evaluate(sess, model, dataset):
    feed = {model["x"]: dataset.test_x, model["y"]: dataset.test_y}
    loss, acc = sess.run([model["loss"], model["accuracy"]], feed_dict=feed)
    return float(loss), float(acc)


def session_config(info):
    """Each task talks to the master and itself only (a worker never waits on the other one)."""
    config = bootstrap.session_config(info, device_filters=False)
    config.device_filters[:] = sorted({master_device(), info.device})
    return config


def run_options(seconds):
    import tensorflow as tf
    return tf.compat.v1.RunOptions(timeout_in_ms=int(seconds * 1000))


def counters(sess, model):
    contributions, fresh = sess.run([model["contributions"], model["fresh"]])
    return ({"worker:%d" % i: int(c) for i, c in enumerate(contributions)},
            {"worker:%d" % i: int(f) for i, f in enumerate(fresh)})


def train_master(info, sess, saver, model, dataset, args):
    """The master's loop: apply until the target step, save, wait for the workers' `done`."""
    import tensorflow as tf
    start_step = int(sess.run(model["global_step"]))
    initial_loss, initial_acc = evaluate(sess, model, dataset)
    bootstrap.log("Master: waiting for %d workers' gradients from global step %d to %d "
                  "(initial loss %.4f)" % (model["num_workers"], start_step, args.train_steps,
                                           initial_loss))
    timer = bootstrap.Timer()
    step, applied = start_step, 0
    options = run_options(args.step_timeout_secs)
    while step < args.train_steps:
        step, stamps, losses = sess.run(
            [model["apply_step"], model["stamps"], model["worker_losses"]], options=options)
        step, applied = int(step), applied + 1
        if applied % args.log_every == 0 or step >= args.train_steps:
            bootstrap.log("Master: step %d applied the average of %s (computed at step %s), "
                          "worker losses %s" % (step, ", ".join("worker:%d" % i
                                                                for i in range(len(stamps))),
                                                "/".join(str(int(s)) for s in stamps),
                                                " ".join("%.4f" % v for v in losses)))
        if args.save_every_steps and applied % args.save_every_steps == 0:
            bootstrap.save_checkpoint(sess, saver, args.checkpoint_dir, step)
    elapsed = timer.seconds
    contributions, fresh = counters(sess, model)
    bootstrap.log("Master: %d steps in %.2fs; contributions %s; fresh %s"
                  % (applied, elapsed, contributions, fresh))
    results = {"role": "master", "applied_steps": applied, "contributions": contributions,
               "fresh": fresh}
    path = bootstrap.save_checkpoint(sess, saver, args.checkpoint_dir, step)
    if path:
        results["checkpoint_step"] = step
    final_loss, accuracy = evaluate(sess, model, dataset)
    try:
        sess.run(model["wait_done"], options=run_options(args.finish_wait_secs))
        results["workers_finished"] = True
    except tf.errors.DeadlineExceededError:
        bootstrap.log("WARNING: not every worker finished within %gs" % args.finish_wait_secs)
        results["workers_finished"] = False
    bootstrap.log("Master: test accuracy %.4f, test loss %.4f" % (accuracy, final_loss))
    results.update(start_step=start_step, global_step=step, accuracy=accuracy,
                   initial_accuracy=initial_acc, final_xent=final_loss, initial_xent=initial_loss,
                   train_time_s=round(elapsed, 3),
                   examples_per_s=round(applied * args.batch_size * model["num_workers"]
                                        / max(elapsed, 1e-9), 1))
    return results


def train_worker(info, sess, model, dataset, args):
    """A worker's loop: send one gradient, wait for the token, until the target step."""
    start_step = int(sess.run(model["global_step"]))
    initial_loss, initial_acc = evaluate(sess, model, dataset)
    shard = dataset.shard(info.index, info.num_workers)
    batches = data.batches(shard.train_x, shard.train_y, args.batch_size, seed=info.index)
    options = run_options(args.step_timeout_secs)
    timer = bootstrap.Timer()
    step, local_steps = start_step, 0
    while step < args.train_steps:
        batch_x, batch_y = next(batches)
        step = int(sess.run(model["step"], feed_dict={model["x"]: batch_x, model["y"]: batch_y},
                            options=options))
        local_steps += 1
        if local_steps % args.log_every == 0:
            bootstrap.log("Worker %d: sent %d gradients; global step %d"
                          % (info.index, local_steps, step))
    elapsed = timer.seconds
    final_loss, accuracy = evaluate(sess, model, dataset)
    contributions, fresh = counters(sess, model)
    sess.run(model["done"], options=run_options(args.finish_wait_secs))
    bootstrap.log("Worker %d: sent %d gradients in %.2fs; test accuracy %.4f, test loss %.4f"
                  % (info.index, local_steps, elapsed, accuracy, final_loss))
    return {"role": "worker", "start_step": start_step, "global_step": step,
            "local_steps": local_steps, "contributions": contributions[info.label],
            "fresh": fresh[info.label], "accuracy": accuracy, "initial_accuracy": initial_acc,
            "final_xent": final_loss, "initial_xent": initial_loss,
            "train_time_s": round(elapsed, 3),
            "examples_per_s": round(local_steps * args.batch_size / max(elapsed, 1e-9), 1)}


def train(info, server, dataset, args):
    import tensorflow as tf
    v1 = tf.compat.v1
    model = build_model(dataset, args, info)
    saver = v1.train.Saver(max_to_keep=2)
    sess = bootstrap.prepare_session(info, server, bootstrap.session_manager(),
                                     v1.global_variables_initializer(), saver,
                                     args.checkpoint_dir, session_config(info))
    if info.job == MASTER_JOB:
        results = train_master(info, sess, saver, model, dataset, args)
    else:
        results = train_worker(info, sess, model, dataset, args)
    sess.close()
    results.update(task=info.label, dataset=dataset.name, num_workers=info.num_workers,
                   batch_size=args.batch_size, target_step=args.train_steps)
    return results


def run(argv):
    args = build_parser().parse_args(argv)
    info = bootstrap.cluster_from_args(args)
    if info.job not in (MASTER_JOB, "worker"):
        raise SystemExit("data_parallel runs a %s (the master) and workers, not %r: put the "
                         "master in the inventory's [chief] group" % (MASTER_JOB, info.job))
    if MASTER_JOB not in info.jobs or info.num_workers < 1:
        raise SystemExit("data_parallel needs 1 %s task (the master) and at least 1 worker; "
                         "the cluster has %s" % (MASTER_JOB, info.jobs))
    dataset = data.load_images(args.dataset, args.data_dir)
    import tensorflow as tf
    tf.compat.v1.disable_eager_execution()
    server = bootstrap.start_server(info, session_config(info))
    bootstrap.report(train(info, server, dataset, args))
    return 0


if __name__ == "__main__":
    raise SystemExit(bootstrap.main_guard(run))
