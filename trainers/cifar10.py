"""CIFAR-10 CNN: one host with device towers, or five ways of sharing parameters on ps tasks.

The network is TensorFlow's CIFAR-10 tutorial model: random 24x24 crops and flips, per-image
standardization, two 5x5 convolutions (64 filters) with max-pooling and local response
normalization, fully connected 384 and 192, softmax; plain SGD.

Every worker trains a local copy of the parameters: it computes gradients on its copy, sends them
to the ps tasks and receives parameters back. --mode decides how (seed 004):

  sync         each round the ps applies the mean of ONE gradient from EVERY worker, then
               replies to all of them (worker 0 aggregates; the others wait for its token)
  async        the ps applies a worker's gradients under a lock (a one-token queue on the ps)
               and replies with the parameters read after that update, still under the lock
  async_stale  the ps replies at once with its current parameters; the gradients wait in a
               queue on the ps and an applier thread of worker 0 applies them later (all
               those waiting in one update, which for SGD equals applying them in turn)
  hogwild      lock-free: apply ops with use_locking=False, reply with the latest parameters
  multi_ps     like async without the lock, every variable partitioned across 2+ ps tasks
  local        one process, --num_devices towers (CPUs or GPUs) averaging their gradients

Each run reports counters kept on the ps (gradients pushed, applied, under the lock, rounds
with every worker...) in its result line, so the defining behaviour of each mode can be checked.
"""
import math
import os
import threading
import time
import zlib

import numpy as np

from trainers import bootstrap, data

MODES = ("sync", "async", "async_stale", "hogwild", "multi_ps", "local")
COUNTERS = ("pushed", "applied", "applied_under_lock", "lock_violations", "full_rounds",
            "done_workers")
APPLY_OP_PREFIXES = ("Apply", "ResourceApply", "SparseApply", "ResourceSparseApply")


def build_parser():
    parser = bootstrap.make_parser(__doc__.splitlines()[0])
    bootstrap.add_cluster_flags(parser)
    parser.add_argument("--mode", default="sync", help="one of: " + ", ".join(MODES))
    parser.add_argument("--data_dir", default="/tmp/cifar10_data",
                        help="the binary batches (or their cifar-10-batches-bin folder)")
    parser.add_argument("--dataset", default="cifar10", choices=["cifar10", "synthetic"],
                        help="synthetic: generated 32x32x3 images of 10 classes, for offline runs")
    parser.add_argument("--train_steps", type=int, default=10000,
                        help="global steps: parameter updates (sync: rounds; async modes: "
                             "gradients sent by all workers together)")
    parser.add_argument("--batch_size", type=int, default=128, help="per worker (local: in all)")
    parser.add_argument("--learning_rate", type=float, default=0.1)
    parser.add_argument("--image_size", type=int, default=24, help="side of the random crops")
    parser.add_argument("--conv_filters", type=int, default=64, help="filters of both convolutions")
    parser.add_argument("--fc_units", default="384,192", help="the two fully connected layers")
    parser.add_argument("--init", default="he", choices=["he", "tutorial"],
                        help="weight initialization: He scaling, or the tutorial's fixed stddevs")
    parser.add_argument("--num_gpus", type=int, default=0,
                        help="GPUs per task (workers compute there; local mode uses them as towers)")
    parser.add_argument("--num_devices", type=int, default=0,
                        help="local mode: towers, GPUs when --num_gpus > 0 else CPU devices "
                             "(0: every GPU, or 2 CPU devices)")
    parser.add_argument("--max_pending", type=int, default=16,
                        help="async_stale: gradients that may wait on the ps before a push blocks")
    parser.add_argument("--eval_examples", type=int, default=0,
                        help="test images evaluated at the start and end (0: all)")
    parser.add_argument("--op_timeout_s", type=float, default=300.0,
                        help="fail instead of waiting longer for another task (queues, locks)")
    parser.add_argument("--log_every", type=int, default=20, help="local steps between log lines")
    bootstrap.add_checkpoint_flags(parser)
    return parser


def check_mode(mode, info=None):
    """The mode, validated; the error lists the allowed values."""
    if mode not in MODES:
        raise SystemExit("unknown --mode %r: choose one of %s" % (mode, ", ".join(MODES)))
    if info is not None and mode != "local":
        if info.num_ps < 1:
            raise SystemExit("--mode %s needs at least one ps task" % mode)
        if mode == "multi_ps" and info.num_ps < 2:
            raise SystemExit("--mode multi_ps partitions the variables across ps tasks but the "
                             "cluster has %d: launch with --ps 2 (or the cifar10_multi_ps example)"
                             % info.num_ps)
    return mode


# ---------------------------------------------------------------- inputs

def load_dataset(args):
    return data.load_cifar(args.dataset, args.data_dir)


def crop(images, size, rng=None):
    """Random crops and left-right flips (training, RNG given) or the centre crop (evaluation)."""
    count, side = len(images), images.shape[1]
    if size >= side:
        return images
    if rng is None:
        offset = (side - size) // 2
        return images[:, offset:offset + size, offset:offset + size]
    rows = rng.integers(0, side - size + 1, size=count)
    cols = rng.integers(0, side - size + 1, size=count)
    out = np.empty((count, size, size, images.shape[3]), dtype=images.dtype)
    for i in range(count):
        out[i] = images[i, rows[i]:rows[i] + size, cols[i]:cols[i] + size]
    flip = rng.random(count) < 0.5
    out[flip] = out[flip, :, ::-1]
    return out


def training_batches(dataset, args, seed):
    rng = np.random.default_rng(seed + 1000)
    for images, labels in data.batches(dataset.train_x, dataset.train_y, args.batch_size, seed):
        yield crop(images, args.image_size, rng), labels


# ---------------------------------------------------------------- the network

def param_specs(args, num_classes=10):
    """(name, shape, stddev or None for a bias with that constant) of every parameter."""
    filters = args.conv_filters
    fc1, fc2 = [int(u) for u in args.fc_units.split(",")]
    pooled = int(math.ceil(args.image_size / 4.0))
    return [("conv1_w", [5, 5, 3, filters], 5e-2), ("conv1_b", [filters], 0.0),
            ("conv2_w", [5, 5, filters, filters], 5e-2), ("conv2_b", [filters], 0.1),
            ("fc1_w", [pooled * pooled * filters, fc1], 0.04), ("fc1_b", [fc1], 0.1),
            ("fc2_w", [fc1, fc2], 0.04), ("fc2_b", [fc2], 0.1),
            ("out_w", [fc2, num_classes], 1.0 / fc2), ("out_b", [num_classes], 0.0)]


def initializer(tf, spec, scheme="he"):
    """Biases: constants. Weights: the tutorial's fixed stddevs, or He scaling (sqrt(2/fan_in),
    which leaves the early loss plateau of the fixed stddevs behind)."""
    name, shape, value = spec
    if name.endswith("_b"):
        return tf.compat.v1.constant_initializer(value)
    if scheme == "he":
        fan_in = int(np.prod(shape[:-1]))
        value = 1.0 / fan_in if name == "out_w" else math.sqrt(2.0 / fan_in)
    return tf.compat.v1.truncated_normal_initializer(stddev=value, seed=zlib.crc32(name.encode()))


def inference(tf, images, params):
    """Logits of uint8 IMAGES (N x S x S x 3) with PARAMS (tensors, in param_specs order)."""
    conv1_w, conv1_b, conv2_w, conv2_b, fc1_w, fc1_b, fc2_w, fc2_b, out_w, out_b = params
    x = tf.image.per_image_standardization(tf.cast(images, tf.float32))
    x = tf.nn.relu(tf.nn.conv2d(x, conv1_w, strides=1, padding="SAME") + conv1_b)
    x = tf.nn.max_pool2d(x, ksize=3, strides=2, padding="SAME")
    x = tf.nn.lrn(x, 4, bias=1.0, alpha=0.001 / 9.0, beta=0.75)
    x = tf.nn.relu(tf.nn.conv2d(x, conv2_w, strides=1, padding="SAME") + conv2_b)
    x = tf.nn.lrn(x, 4, bias=1.0, alpha=0.001 / 9.0, beta=0.75)
    x = tf.nn.max_pool2d(x, ksize=3, strides=2, padding="SAME")
    x = tf.reshape(x, [-1, int(fc1_w.shape[0])])
    x = tf.nn.relu(tf.matmul(x, fc1_w) + fc1_b)
    x = tf.nn.relu(tf.matmul(x, fc2_w) + fc2_b)
    return tf.matmul(x, out_w) + out_b


def loss_and_accuracy(tf, logits, labels):
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels,
                                                                         logits=logits))
    accuracy = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, 1), labels), tf.float32))
    return loss, accuracy


def inputs(tf, args, name):
    v1 = tf.compat.v1
    images = v1.placeholder(tf.uint8, [None, args.image_size, args.image_size, 3],
                            name=name + "_images")
    labels = v1.placeholder(tf.int64, [None], name=name + "_labels")
    return images, labels


# ---------------------------------------------------------------- parameters on the ps

def parts_of(param):
    """The variables holding PARAM: its partitions, or itself."""
    return list(param) if hasattr(param, "_get_variable_list") else [param]


def value_of(param):
    return param.as_tensor() if hasattr(param, "_get_variable_list") else param.read_value()


def split_gradient(tf, grad, param):
    parts = parts_of(param)
    if len(parts) == 1:
        return [(grad, parts[0])]
    sizes = [int(p.shape[0]) for p in parts]
    return list(zip(tf.split(grad, sizes, axis=0), parts))


def apply_ops_locking(graph):
    """{op type: sorted use_locking values} of every optimizer apply op in GRAPH."""
    found = {}
    for op in graph.get_operations():
        if op.type.startswith(APPLY_OP_PREFIXES):
            found.setdefault(op.type, set()).add(bool(op.get_attr("use_locking")))
    return {k: sorted(v) for k, v in found.items()}


def build_distributed(dataset, args, info):
    """The between-graph model of one worker for a ps mode; returns a dict of ops and tensors."""
    import tensorflow as tf
    v1 = tf.compat.v1
    mode = args.mode
    if args.num_gpus > 0:
        worker_device = "%s/device:GPU:%d" % (info.device, info.index % args.num_gpus)
    else:
        worker_device = "%s/cpu:0" % info.device
    specs = param_specs(args, dataset.num_classes)
    partitioner = v1.fixed_size_partitioner(info.num_ps) if mode == "multi_ps" else None
    queue_device = "/job:ps/task:0/cpu:0"
    m = {"worker_device": worker_device}
    setter = v1.train.replica_device_setter(worker_device=worker_device, ps_device="/job:ps/cpu:0",
                                            cluster=info.cluster_spec())
    with v1.device(setter):
        global_step = v1.train.get_or_create_global_step()
        with v1.variable_scope("params", partitioner=partitioner):
            params = [v1.get_variable(s[0], s[1], initializer=initializer(tf, s, args.init))
                      for s in specs]
        with v1.variable_scope("counters"):
            counters = {name: v1.get_variable(name, [], tf.int64, v1.zeros_initializer(),
                                              trainable=False) for name in COUNTERS}
            holders = v1.get_variable("lock_holders", [], tf.int64, v1.zeros_initializer(),
                                      trainable=False)
    with v1.device(worker_device):
        local = [v1.get_variable("local/" + s[0], s[1], initializer=v1.zeros_initializer(),
                                 trainable=False, collections=[v1.GraphKeys.LOCAL_VARIABLES])
                 for s in specs]
        images, labels = inputs(tf, args, "train")
        logits = inference(tf, images, local)
        loss, accuracy = loss_and_accuracy(tf, logits, labels)
        grads = tf.gradients(loss, local)
        eval_images, eval_labels = inputs(tf, args, "eval")
        eval_loss, eval_accuracy = loss_and_accuracy(
            tf, inference(tf, eval_images, [value_of(p) for p in params]), eval_labels)

    def pull(after):
        """Copy the ps parameters into the local copy, read after the ops in AFTER."""
        with tf.control_dependencies(after):
            return tf.group(*[l.assign(value_of(p)) for l, p in zip(local, params)])

    def apply(gradients, use_locking):
        optimizer = v1.train.GradientDescentOptimizer(args.learning_rate, use_locking=use_locking)
        pairs = []
        for grad, param in zip(gradients, params):
            pairs.extend(split_gradient(tf, grad, param))
        return optimizer.apply_gradients(pairs)

    m.update(global_step=global_step, params=params, counters=counters, local=local,
             images=images, labels=labels, loss=loss, accuracy=accuracy,
             eval_images=eval_images, eval_labels=eval_labels, eval_loss=eval_loss,
             eval_accuracy=eval_accuracy, local_init=pull([]))
    shapes = [s[1] for s in specs]
    with v1.device(worker_device):
        if mode == "sync":
            _build_sync(tf, m, info, grads, apply, pull, shapes, queue_device)
        elif mode == "async":
            _build_async(tf, m, grads, apply, pull, holders, queue_device)
        elif mode == "async_stale":
            _build_stale(tf, m, args, grads, apply, pull, shapes, queue_device)
        else:  # hogwild, multi_ps
            _build_lock_free(tf, m, grads, apply, pull, reply_after_apply=(mode == "multi_ps"))
        m["mark_done"] = counters["done_workers"].assign_add(1)
    m["apply_ops_locking"] = apply_ops_locking(v1.get_default_graph())
    m["partition_devices"] = {s[0]: [v.device for v in parts_of(p)] for s, p in zip(specs, params)}
    return m


def _build_sync(tf, m, info, grads, apply, pull, shapes, queue_device):
    """Workers push (id, gradients) and wait for a token; worker 0 applies the mean of one
    gradient per worker and hands every worker a token carrying the new global step."""
    v1 = tf.compat.v1
    n = info.num_workers
    counters, step = m["counters"], m["global_step"]
    with v1.device(queue_device):
        grad_queue = v1.FIFOQueue(n, [tf.int32] + [tf.float32] * len(shapes), [[]] + shapes,
                                  shared_name="cifar10_sync_gradients", name="sync_gradients")
        tokens = [v1.FIFOQueue(n, [tf.int64], [[]], shared_name="cifar10_sync_token_%d" % i,
                               name="sync_token_%d" % i) for i in range(n)]
    enqueue = grad_queue.enqueue([tf.constant(info.index, tf.int32)] + grads)
    with tf.control_dependencies([enqueue]):
        m["push"] = counters["pushed"].assign_add(1)
    # Only worker 0 runs this: one gradient of each worker per round (they wait for tokens).
    taken = grad_queue.dequeue_many(n)
    mean = [tf.reduce_mean(g, axis=0) for g in taken[1:]]
    applied = apply(mean, use_locking=True)
    with tf.control_dependencies([applied]):
        everyone = tf.equal(tf.size(tf.unique(taken[0]).y), n)
        bookkeeping = [counters["applied"].assign_add(n),
                       counters["full_rounds"].assign_add(tf.cast(everyone, tf.int64)),
                       step.assign_add(1)]
    with tf.control_dependencies(bookkeeping):
        new_step = step.read_value()
        m["aggregate"] = tf.group(*[q.enqueue([new_step]) for q in tokens])
    token = tokens[info.index].dequeue()
    m["wait"] = tf.group(pull([token]))
    m["token"] = token


def _build_async(tf, m, grads, apply, pull, holders, queue_device):
    """Acquire the ps lock (take its one token), apply, read the parameters back, release."""
    v1 = tf.compat.v1
    counters, step = m["counters"], m["global_step"]
    with v1.device(queue_device):
        lock = v1.FIFOQueue(1, [tf.int32], [[]], shared_name="cifar10_async_lock",
                            name="async_lock")
    m["lock_size"] = lock.size()
    m["lock_init"] = lock.enqueue([tf.constant(0, tf.int32)])
    with tf.control_dependencies(grads):          # compute first, then queue for the lock
        token = lock.dequeue()
    with tf.control_dependencies([token]):
        inside = holders.assign_add(1)            # 1 when this worker alone holds the lock
        pushed = counters["pushed"].assign_add(1)
    with tf.control_dependencies([inside, pushed]):
        applied = apply(grads, use_locking=True)
    with tf.control_dependencies([applied]):
        new_step = step.assign_add(1)
        alone = tf.cast(tf.equal(inside, 1), tf.int64)
        marks = [counters["applied"].assign_add(1),
                 counters["applied_under_lock"].assign_add(alone),
                 counters["lock_violations"].assign_add(1 - alone)]
    reply = pull([new_step] + marks)
    with tf.control_dependencies([reply]):
        seen_step = step.read_value()             # the version of the parameters just read
    with tf.control_dependencies([seen_step]):
        left = holders.assign_sub(1)
    with tf.control_dependencies([left]):
        release = lock.enqueue([token])
    with tf.control_dependencies([release]):
        m["step"] = tf.stack([tf.identity(new_step), tf.identity(seen_step)])


def _build_stale(tf, m, args, grads, apply, pull, shapes, queue_device):
    """Push gradients into a ps queue and take the current parameters at once; worker 0's
    applier thread drains the queue."""
    v1 = tf.compat.v1
    counters, step = m["counters"], m["global_step"]
    with v1.device(queue_device):
        queue = v1.FIFOQueue(args.max_pending, [tf.float32] * len(shapes), shapes,
                             shared_name="cifar10_stale_gradients", name="stale_gradients")
    reply = pull(grads)                           # current parameters, not waiting for ours
    enqueue = queue.enqueue(grads)
    with tf.control_dependencies([enqueue, reply]):
        pushed = counters["pushed"].assign_add(1)
    with tf.control_dependencies([pushed]):
        applied_now = counters["applied"].read_value()
    m["step"] = tf.stack([pushed, applied_now])
    # The applier (worker 0's thread) blocks until a gradient waits, takes it and every other
    # one waiting, and applies their sum in one update (for plain SGD the same as applying them
    # in turn). Once the queue is closed and empty its dequeue fails and the applier ends.
    first = queue.dequeue()
    first = [first] if len(shapes) == 1 else first
    with tf.control_dependencies(first):
        waiting = queue.size()
    rest = queue.dequeue_many(waiting)
    rest = [rest] if len(shapes) == 1 else rest
    applied = apply([f + tf.reduce_sum(r, axis=0) for f, r in zip(first, rest)],
                    use_locking=True)
    count = 1 + tf.cast(waiting, tf.int64)
    with tf.control_dependencies([applied]):
        m["apply_waiting"] = tf.group(counters["applied"].assign_add(count),
                                      step.assign_add(count))
    m["close_queue"] = queue.close()


def _build_lock_free(tf, m, grads, apply, pull, reply_after_apply):
    """Apply without any lock (use_locking=False). hogwild replies with the parameters as they
    are at once; multi_ps replies after its update reached every ps."""
    counters, step = m["counters"], m["global_step"]
    with tf.control_dependencies(grads):
        pushed = counters["pushed"].assign_add(1)
    with tf.control_dependencies([pushed]):
        applied = apply(grads, use_locking=False)
    with tf.control_dependencies([applied]):
        new_step = step.assign_add(1)
        mark = counters["applied"].assign_add(1)
    reply = pull([new_step, mark] if reply_after_apply else grads)
    with tf.control_dependencies([reply, mark]):
        m["step"] = tf.stack([tf.identity(new_step), tf.identity(new_step)])


# ---------------------------------------------------------------- training

def evaluate(sess, images, labels, loss, accuracy, dataset, args, batch=500):
    count = args.eval_examples or len(dataset.test_y)
    test_x, test_y = dataset.test_x[:count], dataset.test_y[:count]
    loss_sum = correct = 0.0
    for start in range(0, len(test_y), batch):
        x = crop(test_x[start:start + batch], args.image_size)
        y = test_y[start:start + batch]
        batch_loss, batch_acc = sess.run([loss, accuracy], feed_dict={images: x, labels: y})
        loss_sum += batch_loss * len(y)
        correct += batch_acc * len(y)
    return float(loss_sum / len(test_y)), float(correct / len(test_y))


def read_counters(sess, m):
    values = sess.run(m["counters"])
    values["global_step"] = sess.run(m["global_step"])
    return {k: int(v) for k, v in values.items()}


def train_distributed(info, server, dataset, args):
    """One worker of a ps mode; returns the results dict for the result line."""
    import tensorflow as tf
    v1 = tf.compat.v1
    m = build_distributed(dataset, args, info)
    saver = v1.train.Saver(var_list=v1.global_variables(), max_to_keep=2)
    manager = bootstrap.session_manager(
        local_init_op=m["local_init"],
        ready_for_local_init_op=v1.report_uninitialized_variables(v1.global_variables()))
    config = bootstrap.session_config(info)
    bootstrap.log("Worker %d (%s): initializing session..." % (info.index, args.mode))
    sess = bootstrap.prepare_session(info, server, manager, v1.global_variables_initializer(),
                                     saver, args.checkpoint_dir, config,
                                     max_wait_secs=args.op_timeout_s)
    options = v1.RunOptions(timeout_in_ms=int(args.op_timeout_s * 1000))
    start = read_counters(sess, m)
    holders = sorted({d.split("/device:")[0] for devices in m["partition_devices"].values()
                      for d in devices})
    bootstrap.log("Worker %d (%s): session ready; %d parameters held by %s"
                  % (info.index, args.mode, len(m["partition_devices"]), ", ".join(holders)))
    if args.mode == "async" and info.is_chief and sess.run(m["lock_size"]) == 0:
        sess.run(m["lock_init"])
    eval_args = (m["eval_images"], m["eval_labels"], m["eval_loss"], m["eval_accuracy"], dataset,
                 args)
    initial_loss, initial_acc = evaluate(sess, *eval_args)
    bootstrap.log("Worker %d: before training (global step %d): test loss %.4f, accuracy %.4f"
                  % (info.index, start["global_step"], initial_loss, initial_acc))
    applier = None
    if args.mode == "async_stale" and info.is_chief:
        applier = StaleApplier(sess, m, options)
        applier.start()
    shard = dataset.shard(info.index, info.num_workers)
    batches = training_batches(shard, args, seed=info.index)
    facts = {"replies_after_own_update": 0, "max_lag": 0, "lagging_steps": 0}
    timer = bootstrap.Timer()
    local_step, losses = 0, []
    # Progress toward --train_steps: the global step, or for async_stale the gradients pushed
    # (the global step there counts applications, which lag behind on purpose).
    target = args.train_steps
    progress = start["pushed"] if args.mode == "async_stale" else start["global_step"]
    while progress < target:
        images, labels = next(batches)
        feed = {m["images"]: images, m["labels"]: labels}
        if args.mode == "sync":
            _, loss = sess.run([m["push"], m["loss"]], feed_dict=feed, options=options)
            if info.is_chief:
                sess.run(m["aggregate"], options=options)
            _, progress = sess.run([m["wait"], m["token"]], options=options)
        else:
            (first, second), loss = sess.run([m["step"], m["loss"]], feed_dict=feed,
                                              options=options)
            if args.mode == "async_stale":
                progress, lag = first, first - second
                facts["max_lag"] = max(facts["max_lag"], int(lag))
                facts["lagging_steps"] += int(lag > 0)
            else:
                progress = first
                facts["replies_after_own_update"] += int(first == second)
        local_step += 1
        losses.append(float(loss))
        if local_step % args.log_every == 0:
            bootstrap.log("Worker %d (%s): local step %d, progress %d/%d, batch loss %.4f"
                          % (info.index, args.mode, local_step, progress, target, loss))
    elapsed = timer.seconds
    sess.run(m["mark_done"])
    if info.is_chief:
        _wait_for_others(sess, m, info, start, applier, args.op_timeout_s)
    end = read_counters(sess, m)
    if info.is_chief:
        bootstrap.save_checkpoint(sess, saver, args.checkpoint_dir, end["global_step"])
    final_loss, final_acc = evaluate(sess, *eval_args)
    counters = {k: end[k] - start[k] for k in end}
    bootstrap.log("Worker %d (%s): %d local steps in %.2f s; counters %s"
                  % (info.index, args.mode, local_step, elapsed, counters))
    bootstrap.log("Worker %d (%s): after global step %d: test loss %.4f, accuracy %.4f (%s)"
                  % (info.index, args.mode, end["global_step"], final_loss, final_acc,
                     dataset.name))
    result = common_result(info.label, args, dataset, local_step, elapsed, losses,
                           (initial_loss, initial_acc), (final_loss, final_acc))
    result.update(global_step=end["global_step"], start_step=start["global_step"],
                  counters=counters, counters_final=info.is_chief, num_workers=info.num_workers,
                  num_ps=info.num_ps, apply_ops_locking=m["apply_ops_locking"],
                  ps_tasks_per_variable={name: sorted({d.split("/device:")[0] for d in devices})
                                         for name, devices in m["partition_devices"].items()})
    if args.mode == "async":
        result["replies_after_own_update"] = facts["replies_after_own_update"]
    if args.mode == "async_stale":
        result.update(max_lag=facts["max_lag"], lagging_steps=facts["lagging_steps"])
        if applier is not None:
            result["applier_runs"] = applier.runs
    if args.mode == "multi_ps":
        result["partition_devices"] = m["partition_devices"]
    return result


def _wait_for_others(sess, m, info, start, applier, timeout):
    """Worker 0 waits until every worker is done (and the applier has drained the queue), so
    the counters it reports are final."""
    deadline = time.monotonic() + timeout
    while sess.run(m["counters"]["done_workers"]) - start["done_workers"] < info.num_workers:
        if time.monotonic() > deadline:
            raise SystemExit("other workers did not finish within %gs" % timeout)
        time.sleep(0.05)
    if applier is not None:
        sess.run(m["close_queue"])      # no more pushes: the applier drains what is left
        applier.join(max(1.0, deadline - time.monotonic()))
        if applier.is_alive() or applier.error:
            raise SystemExit("the applier did not drain the gradient queue: %s"
                             % (applier.error or "timed out"))


class StaleApplier(threading.Thread):
    """async_stale: applies the gradients waiting in the ps queue until the queue is closed and
    empty. The workers never wait for it (only a full queue would block a push)."""

    def __init__(self, sess, m, options):
        super().__init__(name="stale-applier", daemon=True)
        self.sess, self.m, self.options = sess, m, options
        self.runs = 0
        self.error = None

    def run(self):
        import tensorflow as tf
        try:
            while True:
                try:
                    self.sess.run(self.m["apply_waiting"], options=self.options)
                except tf.errors.OutOfRangeError:
                    return                  # closed and drained
                self.runs += 1
        except Exception as err:  # reported by the worker's main thread
            self.error = "%s: %s" % (type(err).__name__, err)


def common_result(label, args, dataset, local_step, elapsed, losses, initial, final):
    window = max(1, min(10, len(losses)))
    return {"task": label, "mode": args.mode, "dataset": dataset.name,
            "synthetic": dataset.name != "cifar10", "local_steps": local_step,
            "initial_loss": initial[0], "initial_accuracy": initial[1],
            "loss": final[0], "accuracy": final[1],
            "first_batch_loss": float(np.mean(losses[:window])) if losses else None,
            "last_batch_loss": float(np.mean(losses[-window:])) if losses else None,
            "train_time_s": round(elapsed, 3),
            "examples_per_s": round(local_step * args.batch_size / max(elapsed, 1e-9), 1)}


# ---------------------------------------------------------------- local: towers on one host

def build_local(dataset, args):
    """Variables on the CPU, one tower per device on a slice of the batch, mean gradients."""
    import tensorflow as tf
    v1 = tf.compat.v1
    if not args.num_devices:
        args.num_devices = args.num_gpus or 2
    if args.num_gpus and args.num_devices > args.num_gpus:
        raise SystemExit("--num_devices %d: this task sees only %d GPU(s)"
                         % (args.num_devices, args.num_gpus))
    if args.batch_size % args.num_devices:
        raise SystemExit("--batch_size %d must be a multiple of --num_devices %d"
                         % (args.batch_size, args.num_devices))
    kind = "GPU" if args.num_gpus > 0 else "CPU"
    devices = ["/device:%s:%d" % (kind, i) for i in range(args.num_devices)]
    specs = param_specs(args, dataset.num_classes)
    with v1.device("/device:CPU:0"):
        global_step = v1.train.get_or_create_global_step()
        params = [v1.get_variable(s[0], s[1], initializer=initializer(tf, s, args.init))
                  for s in specs]
        images, labels = inputs(tf, args, "train")
        image_parts = tf.split(images, args.num_devices)
        label_parts = tf.split(labels, args.num_devices)
    tower_grads, tower_losses = [], []
    for index, device in enumerate(devices):
        with v1.device(device), v1.name_scope("tower_%d" % index):
            loss, _ = loss_and_accuracy(tf, inference(tf, image_parts[index], params),
                                        label_parts[index])
            tower_grads.append(tf.gradients(loss, params))
            tower_losses.append(loss)
    with v1.device("/device:CPU:0"):
        mean = [tf.add_n(list(g)) / float(len(devices)) for g in zip(*tower_grads)]
        optimizer = v1.train.GradientDescentOptimizer(args.learning_rate)
        train_op = optimizer.apply_gradients(list(zip(mean, params)), global_step=global_step)
        loss = tf.add_n(tower_losses) / float(len(devices))
        eval_images, eval_labels = inputs(tf, args, "eval")
        eval_loss, eval_accuracy = loss_and_accuracy(tf, inference(tf, eval_images, params),
                                                     eval_labels)
    return {"global_step": global_step, "images": images, "labels": labels, "loss": loss,
            "train_op": train_op, "eval_images": eval_images, "eval_labels": eval_labels,
            "eval_loss": eval_loss, "eval_accuracy": eval_accuracy, "devices": devices,
            "tower_loss_devices": [t.device for t in tower_losses]}


def train_local(dataset, args, label="local"):
    import tensorflow as tf
    v1 = tf.compat.v1
    m = build_local(dataset, args)
    intra, inter = bootstrap.thread_counts()
    config = v1.ConfigProto(allow_soft_placement=True, intra_op_parallelism_threads=intra,
                            inter_op_parallelism_threads=inter)
    if args.num_gpus == 0:
        config.device_count["CPU"] = args.num_devices
    saver = v1.train.Saver(max_to_keep=2)
    manager = bootstrap.session_manager()
    sess = manager.prepare_session("", init_op=v1.global_variables_initializer(), saver=saver,
                                   checkpoint_dir=args.checkpoint_dir or None, config=config)
    session_devices = sorted(d.name for d in sess.list_devices())
    bootstrap.log("local: %d towers on %s; session devices %s"
                  % (args.num_devices, m["devices"], session_devices))
    eval_args = (m["eval_images"], m["eval_labels"], m["eval_loss"], m["eval_accuracy"], dataset,
                 args)
    initial = evaluate(sess, *eval_args)
    start_step = int(sess.run(m["global_step"]))
    batches = training_batches(dataset, args, seed=0)
    timer = bootstrap.Timer()
    local_step, step, losses = 0, start_step, []
    while step < args.train_steps:
        images, labels = next(batches)
        _, loss = sess.run([m["train_op"], m["loss"]],
                           feed_dict={m["images"]: images, m["labels"]: labels})
        step += 1  # this process alone updates the variables
        local_step += 1
        losses.append(float(loss))
        if local_step % args.log_every == 0:
            bootstrap.log("local: step %d, batch loss %.4f" % (step, loss))
    elapsed = timer.seconds
    bootstrap.save_checkpoint(sess, saver, args.checkpoint_dir, step)
    final = evaluate(sess, *eval_args)
    bootstrap.log("local: after step %d (%.2f s): test loss %.4f, accuracy %.4f (%s)"
                  % (step, elapsed, final[0], final[1], dataset.name))
    result = common_result(label, args, dataset, local_step, elapsed, losses, initial, final)
    result.update(global_step=step, start_step=start_step, num_devices=args.num_devices,
                  tower_devices=m["tower_loss_devices"], session_devices=session_devices)
    return result


def run(argv):
    args = build_parser().parse_args(argv)
    check_mode(args.mode)
    if args.mode == "local":
        label = "local"
        if args.job_name or os.environ.get("TF_CONFIG"):
            label = bootstrap.cluster_from_args(args).label
        dataset = load_dataset(args)
        import tensorflow as tf
        tf.compat.v1.disable_eager_execution()
        bootstrap.report(train_local(dataset, args, label))
        return 0
    info = bootstrap.cluster_from_args(args)
    check_mode(args.mode, info)
    return bootstrap.run_between_graph(
        info, lambda: load_dataset(args),
        lambda info, server, dataset: train_distributed(info, server, dataset, args))


if __name__ == "__main__":
    raise SystemExit(bootstrap.main_guard(run))
