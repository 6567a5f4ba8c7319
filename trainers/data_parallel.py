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
from trainers.common import bootstrap, data, loop, models, sessions

MASTER_JOB = "chief"


def build_parser():
    parser = bootstrap.trainer_parser(__doc__)
    parser.add_argument("--train_steps", type=int, default=1000,
                        help="target global step (one step = one averaged update)")
    parser.add_argument("--batch_size", type=int, default=100, help="per worker and step")
    parser.add_argument("--learning_rate", type=float, default=0.5,
                        help="gradient descent step size")
    parser.add_argument("--hidden_units", type=int, default=100)
    parser.add_argument("--step_timeout_secs", type=float, default=600.0,
                        help="longest wait for a gradient or a token before giving up")
    parser.add_argument("--finish_wait_secs", type=float, default=120.0,
                        help="how long the master waits for the workers to finish at the end")
    return parser


def master_device():
    return "/job:%s/task:0" % MASTER_JOB


def build_model(dataset, args, info):
    """Parameters and counters on the master; the network computed on this task."""
    import tensorflow as tf
    v1 = tf.compat.v1
    num_workers = info.num_workers
    with v1.device(models.variables_on(master_device(), info.device)):
        global_step = v1.train.get_or_create_global_step()
        x = v1.placeholder(tf.float32, [None, int(dataset.train_x.shape[1])], name="x")
        y = v1.placeholder(tf.int64, [None], name="y")
        logits, params = models.mlp_logits(x, args.hidden_units, dataset.num_classes)
        loss, accuracy = models.xent_and_accuracy(logits, y)
        contributions = [v1.Variable(tf.constant(0, tf.int64), trainable=False,
                                     name="contributions_worker_%d" % i)
                         for i in range(num_workers)]
        fresh = [v1.Variable(tf.constant(0, tf.int64), trainable=False,
                             name="fresh_worker_%d" % i) for i in range(num_workers)]
    model = dict(global_step=global_step, params=params, contributions=contributions,
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


def session_config(info):
    """Each task talks to the master and itself only (a worker never waits on the other one)."""
    config = sessions.session_config(info, device_filters=False)
    config.device_filters[:] = sorted({master_device(), info.device})
    return config


def counters(sess, model):
    contributions, fresh = sess.run([model["contributions"], model["fresh"]])
    return ({"worker:%d" % i: int(c) for i, c in enumerate(contributions)},
            {"worker:%d" % i: int(f) for i, f in enumerate(fresh)})


def master_step(info, sess, saver, model, dataset, args, progress):
    """The master's TRAIN_STEP() -> the new global step: one item from every worker's gradient
    queue, averaged and applied once; the round logged every --log_every steps and at the end,
    a checkpoint every --save_every_steps."""
    bootstrap.log("Master: waiting for %d workers' gradients from global step %d to %d "
                  "(initial loss %.4f)" % (info.num_workers, progress.start_step,
                                           args.train_steps, progress.initial_loss))
    options = sessions.timeout(args.step_timeout_secs)
    fetches = [model["apply_step"], model["stamps"], model["worker_losses"]]

    def train_step():
        step, stamps, losses = loop.train_step(sess, progress, fetches, None, info.device, options)
        progress.tick(step, float(losses.mean()))
        if progress.local_steps % progress.log_every == 0 or progress.step >= args.train_steps:
            bootstrap.log("Master: step %d applied the average of %s (computed at step %s), "
                          "worker losses %s" % (step, ", ".join("worker:%d" % i
                                                                for i in range(len(stamps))),
                                                "/".join(str(int(s)) for s in stamps),
                                                " ".join("%.4f" % v for v in losses)))
        if args.save_every_steps and progress.local_steps % args.save_every_steps == 0:
            sessions.save_checkpoint(sess, saver, args.checkpoint_dir, step)
        return step
    return train_step


def worker_step(info, sess, saver, model, dataset, args, progress):
    """A worker's TRAIN_STEP() -> the new global step: its gradient on a batch of its shard put
    into its queue on the master, then the wait for its token."""
    batches = loop.build_inputs(dataset, info, args)
    options = sessions.timeout(args.step_timeout_secs)
    feed, fetches = loop.feeder(model), [model["step"], model["loss"]]

    def train_step():
        step, loss = loop.train_step(sess, progress, fetches, feed(next(batches)), info.device,
                                     options)
        progress.tick(step, loss)
        return step
    return train_step


def finish_master(info, sess, saver, model, args, progress, evaluate):
    """The master's end: its counters, its checkpoint, its test figures, and the wait (up to
    --finish_wait_secs) for every worker's `done`."""
    contributions, fresh = counters(sess, model)
    bootstrap.log("Master: %d steps in %.2fs; contributions %s; fresh %s"
                  % (progress.local_steps, progress.elapsed, contributions, fresh))
    extras = {"role": "master", "applied_steps": progress.local_steps,
              "contributions": contributions, "fresh": fresh}
    if sessions.save_checkpoint(sess, saver, args.checkpoint_dir, progress.step):
        extras["checkpoint_step"] = progress.step
    loss, accuracy = evaluate()
    extras["workers_finished"] = sessions.finished_within(
        sess, model["wait_done"], args.finish_wait_secs,
        "not every worker finished within %gs" % args.finish_wait_secs)
    bootstrap.log("Master: test accuracy %.4f, test loss %.4f" % (accuracy, loss))
    return progress.result(loss, accuracy, **extras)


def finish_worker(info, sess, saver, model, args, progress, evaluate):
    """A worker's end: its test figures and counters, then its `done` in the master's queue."""
    loss, accuracy = evaluate()
    contributions, fresh = counters(sess, model)
    sess.run(model["done"], options=sessions.timeout(args.finish_wait_secs))
    bootstrap.log("Worker %d: sent %d gradients in %.2fs; test accuracy %.4f, test loss %.4f"
                  % (info.index, progress.local_steps, progress.elapsed, accuracy, loss))
    return progress.result(loss, accuracy, role="worker",
                           contributions=contributions[info.label], fresh=fresh[info.label])


def train(info, server, dataset, args):
    """This task's loop to --train_steps, the master's or a worker's (their train_step and end
    differ); its results dict."""
    model = build_model(dataset, args, info)
    sess, saver = sessions.graph_session(info, server, args.checkpoint_dir,
                                          config=session_config(info))
    master = info.job == MASTER_JOB

    def evaluate():
        return loop.evaluate(sess, model, dataset.test_x, dataset.test_y)

    start_step = int(sess.run(model["global_step"]))
    examples = args.batch_size * (info.num_workers if master else 1)  # per global step
    progress = loop.Progress(info, args, examples, start_step, *evaluate(),
                             expected_steps=args.train_steps - start_step)
    train_step = (master_step if master else worker_step)(info, sess, saver, model, dataset,
                                                          args, progress)
    step = start_step
    while step < args.train_steps and not progress.draining():
        step = train_step()
    progress.stop()
    results = (finish_master if master else finish_worker)(info, sess, saver, model, args,
                                                           progress, evaluate)
    sess.close()
    results.update(dataset=dataset.name, num_workers=info.num_workers,
                   batch_size=args.batch_size, target_step=args.train_steps)
    return results


def run(options, cluster, dataset=None):
    """The master applies, the workers send gradients (each its results dict). They exchange
    through queues on the master: each task needs its server (in one process: one server per
    task, each task in its own thread)."""
    args = bootstrap.options(build_parser(), options)
    info = cluster
    if info.job not in (MASTER_JOB, "worker"):
        raise SystemExit("data_parallel runs a %s (the master) and workers, not %r: put the "
                         "master in the inventory's [chief] group" % (MASTER_JOB, info.job))
    if MASTER_JOB not in info.jobs or info.num_workers < 1:
        raise SystemExit("data_parallel needs 1 %s task (the master) and at least 1 worker; "
                         "the cluster has %s" % (MASTER_JOB, info.jobs))
    dataset = dataset if dataset is not None else data.load_from_flags(args)
    import tensorflow as tf
    with tf.Graph().as_default():
        bootstrap.seed_everything(args.seed)
        server = sessions.start_server(info, session_config(info))
        return train(info, server, dataset, args)


if __name__ == "__main__":
    bootstrap.entry(build_parser, run, graph=True)
