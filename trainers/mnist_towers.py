"""Synchronous data parallelism over the devices of one host: CNN towers on MNIST (seed 003).

The seed's CNN: conv 5x5 with 16 then 32 filters, each followed by 2x2 max-pooling, fully
connected layers of 256 and 128 units with dropout 0.5, softmax; Adam 1e-3, batch 512, 30 epochs.
Each step splits the mini-batch across --num_devices towers (GPUs when the host has enough of
them, else logical CPU devices made with tf.config.set_logical_device_configuration). The
variables live on the CPU; every tower computes the gradients of its part, the CPU averages them
and applies them once. --num_devices 1 is the single-device baseline the seed compares with.
Prints `Validation Accuracy = X` after every epoch and `Cost time: Y sec.` (training time only).

It is a single-task job: with a cluster (TF_CONFIG or flags) it starts its server and runs its
session there; without one it runs in-process. The chief checkpoints; a new run with the same
--checkpoint_dir resumes from the saved global step.
"""

from trainers.common import bootstrap, data, loop, sessions, towers

KERNEL = 5
CONV_DEPTHS = (16, 32)
FC_UNITS = (256, 128)


def build_parser():
    parser = bootstrap.trainer_parser(__doc__)
    parser.add_argument("--num_devices", type=int, default=2,
                        help="towers: GPUs when there are enough, else logical CPU devices")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch_size", type=int, default=512, help="split across the towers")
    parser.add_argument("--learning_rate", type=float, default=1e-3, help="Adam")
    parser.add_argument("--keep_prob", type=float, default=0.5, help="dropout keep probability")
    parser.add_argument("--validation_size", type=int, default=5000,
                        help="training examples held out for validation (at most a fifth)")
    parser.add_argument("--padding", choices=["auto", "valid", "same"], default="auto",
                        help="auto: VALID as the seed for 28x28 images, SAME for 8x8 digits")
    return parser


# ---------------------------------------------------------------- the model

def build_params(input_shape, num_classes, padding):
    """The CNN's variables, created once on the CPU and shared by every tower."""
    import tensorflow as tf
    v1 = tf.compat.v1
    height, width, channels = input_shape
    params, depth = {}, channels
    for i, out in enumerate(CONV_DEPTHS, 1):
        params["conv%d/weights" % i] = v1.Variable(
            v1.random_normal([KERNEL, KERNEL, depth, out], stddev=0.1), name="conv%d/weights" % i)
        params["conv%d/biases" % i] = v1.Variable(v1.zeros([out]), name="conv%d/biases" % i)
        depth = out
        if padding == "valid":
            height, width = height - KERNEL + 1, width - KERNEL + 1
        height, width = height // 2, width // 2
    size = height * width * depth
    if size < 1:
        raise SystemExit("images of shape %s are too small for VALID padding: use --padding same"
                         % (input_shape,))
    for i, units in enumerate(list(FC_UNITS) + [num_classes], 1):
        name = "fc%d" % i if i <= len(FC_UNITS) else "logits"
        params[name + "/weights"] = v1.Variable(
            v1.random_uniform([size, units], -0.1, 0.1), name=name + "/weights")
        params[name + "/biases"] = v1.Variable(v1.zeros([units]), name=name + "/biases")
        size = units
    return params


def tower_logits(params, images, keep_prob, padding):
    import tensorflow as tf
    net = images
    for i in range(1, len(CONV_DEPTHS) + 1):
        net = tf.nn.conv2d(net, params["conv%d/weights" % i], strides=[1, 1, 1, 1],
                           padding=padding.upper()) + params["conv%d/biases" % i]
        net = tf.nn.max_pool2d(tf.nn.relu(net), ksize=2, strides=2, padding="VALID")
    net = tf.reshape(net, [-1, int(params["fc1/weights"].shape[0])])
    for i in range(1, len(FC_UNITS) + 1):
        net = tf.nn.relu(tf.matmul(net, params["fc%d/weights" % i]) + params["fc%d/biases" % i])
        net = tf.nn.dropout(net, rate=1.0 - keep_prob)
    return tf.matmul(net, params["logits/weights"]) + params["logits/biases"]


def build_model(dataset, args, task_device, devices, padding):
    import tensorflow as tf
    v1 = tf.compat.v1
    cpu = task_device + "/device:CPU:0"
    model = {"towers": [], "devices": [task_device + d for d in devices]}
    with v1.device(cpu):
        global_step = v1.train.get_or_create_global_step()
        params = build_params(dataset.input_shape, dataset.num_classes, padding)
        names = sorted(params)
        keep_prob = v1.placeholder_with_default(1.0, [], name="keep_prob")
        optimizer = v1.train.AdamOptimizer(args.learning_rate)
    tower_grads, losses = [], []
    for i, device in enumerate(model["devices"]):
        with v1.device(device), v1.name_scope("tower%d" % i):
            x = v1.placeholder(tf.float32, (None,) + tuple(dataset.input_shape), name="x")
            y = v1.placeholder(tf.int64, [None], name="y")
            logits = tower_logits(params, x, keep_prob, padding)
            loss = tf.reduce_mean(
                tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
            tower_grads.append(tf.gradients(loss, [params[n] for n in names]))
            losses.append(loss)
            model["towers"].append({"x": x, "y": y, "logits": logits})
    with v1.device(cpu):
        grads = towers.average_gradients(tower_grads)
        model["train_op"] = optimizer.apply_gradients(
            list(zip(grads, [params[n] for n in names])), global_step=global_step)
        model["loss"] = tf.add_n(losses) / float(len(losses))
        first = model["towers"][0]
        model["accuracy"] = tf.reduce_mean(
            tf.cast(tf.equal(tf.argmax(first["logits"], 1), first["y"]), tf.float32))
        model["xent"] = losses[0]
    model.update(global_step=global_step, keep_prob=keep_prob)
    return model


def split_feed(model, batch_x, batch_y, keep_prob=None):
    """One part of the mini-batch per tower (the seed splits 512 into halves)."""
    import numpy as np
    feed = {}
    parts = np.array_split(np.arange(len(batch_x)), len(model["towers"]))
    for tower, part in zip(model["towers"], parts):
        feed[tower["x"]], feed[tower["y"]] = batch_x[part], batch_y[part]
    if keep_prob is not None:
        feed[model["keep_prob"]] = keep_prob
    return feed


def evaluate(sess, model, x, y, batch_size):
    """(cross entropy, accuracy) on (x, y) through the first tower, no dropout."""
    return loop.evaluate(sess, model, x, y, loop.feeder(model["towers"][0]), batch_size,
                         fetches=("xent", "accuracy"))


def tower_devices(stats):
    """{tower: [devices that ran its computation]} in the step stats of a traced step."""
    import tensorflow as tf
    observed = {}
    for dev in stats.dev_stats:
        spec = tf.DeviceSpec.from_string(dev.device)
        if not spec.device_type:
            continue
        for node in dev.node_stats:
            tower = node.node_name.split("/")[0]
            # A tower reads the variables where they live (the CPU); count its computation only.
            if tower.startswith("tower") and "ReadVariableOp" not in node.node_name:
                name = "%s:%d" % (spec.device_type, spec.device_index or 0)
                observed.setdefault(tower, set()).add(name)
    return {tower: sorted(devices) for tower, devices in sorted(observed.items())}


def split_validation(dataset, size):
    """(train, validation) arrays: the last SIZE training examples held out (at most a fifth)."""
    size = max(1, min(size, len(dataset.train_x) // 5))
    return (dataset.train_x[:-size], dataset.train_y[:-size],
            dataset.train_x[-size:], dataset.train_y[-size:])


# ---------------------------------------------------------------- training

def train(info, target, dataset, args, device_type, devices, env=None):
    """Train to --epochs on this host's towers, a validation after each epoch; the result."""
    import tensorflow as tf
    v1 = tf.compat.v1
    padding = args.padding
    if padding == "auto":
        padding = "valid" if min(dataset.input_shape[:2]) >= 28 else "same"
    task_device = info.device if info is not None else "/job:localhost/replica:0/task:0"
    model = build_model(dataset, args, task_device, devices, padding)
    saver = v1.train.Saver(max_to_keep=2)
    if info is not None:
        config = towers.device_config(sessions.session_config(info))
    else:
        config = towers.device_config(v1.ConfigProto(allow_soft_placement=True))
    sess = sessions.restore_or_initialize(sessions.session_manager(), target,
                                          v1.global_variables_initializer(), saver,
                                          args.checkpoint_dir, config)
    train_x, train_y, valid_x, valid_y = split_validation(dataset, args.validation_size)

    def validate():
        return evaluate(sess, model, valid_x, valid_y, args.batch_size)

    per_epoch = max(1, len(train_x) // args.batch_size)
    target_step = args.epochs * per_epoch
    start_step = int(sess.run(model["global_step"]))
    progress = loop.Progress(info, args, args.batch_size, start_step, *validate(),
                             expected_steps=target_step - start_step, env=env)
    bootstrap.log("Training on %d %s tower(s): %s; %d steps per epoch of batch %d, from step %d"
                  % (len(devices), device_type, ", ".join(model["devices"]), per_epoch,
                     args.batch_size, start_step))
    batches = data.batches(train_x, train_y, args.batch_size, seed=(args.seed, start_step))
    cost_time, step, history, observed = 0.0, start_step, [], None
    while step < target_step and not progress.draining():
        timer = bootstrap.Timer()
        epoch_end = min(target_step, (step // per_epoch + 1) * per_epoch)
        while step < epoch_end and not progress.draining():
            feed = split_feed(model, *next(batches), keep_prob=args.keep_prob)
            _, loss = loop.train_step(sess, progress, [model["train_op"], model["loss"]], feed)
            if observed is None:  # the first step ran traced: which devices ran each tower
                observed = tower_devices(progress.step_stats)
            step += 1  # a single task: nobody else moves the global step
            progress.tick(step, loss)
        cost_time += timer.seconds
        valid_loss, accuracy = validate()
        history.append(round(float(accuracy), 4))
        progress.point(step, valid_loss, accuracy=accuracy)
        bootstrap.log("EPOCH %d ..." % (step // per_epoch))
        bootstrap.log("Validation Accuracy = %.3f" % accuracy)
    progress.stop()
    bootstrap.log("Cost time: %s sec." % cost_time)
    extras = {"dataset": dataset.name, "towers": len(devices), "device_type": device_type,
              "tower_devices": model["devices"], "padding": padding,
              "batch_size": args.batch_size, "validation_accuracy": history,
              "tower_devices_observed": observed, "cost_time_s": round(cost_time, 3)}
    if (info is None or info.is_chief) and sessions.save_checkpoint(
            sess, saver, args.checkpoint_dir, step):
        extras["checkpoint_step"] = step
    # The result's loss and accuracy are on the test set, which training never saw.
    loss, accuracy = evaluate(sess, model, dataset.test_x, dataset.test_y, args.batch_size)
    sess.close()
    return progress.result(loss, accuracy, **extras)


def run(options, cluster=None, dataset=None, env=None):
    """Train on this host's towers; the result dict. CLUSTER: None, or a one-worker cluster;
    ENV: a bootstrap.TaskEnv (default: CLUSTER's)."""
    args = bootstrap.options(build_parser(), options)
    info = cluster
    if info is not None and (info.job != "worker" or info.num_ps or info.num_workers != 1):
        raise SystemExit("mnist_towers is a single-task job (one worker, no ps); got %s as %s"
                         % (info.jobs, info.label))
    dataset = dataset if dataset is not None else data.load_from_flags(args, flat=False)
    import tensorflow as tf
    device_type, devices = towers.make_devices(args.num_devices)  # before anything uses them
    env = env or (info.env if info is not None else bootstrap.TaskEnv())
    with tf.Graph().as_default():
        bootstrap.seed_everything(args.seed)
        target = ""
        if info is not None:
            target = sessions.start_server(
                info, towers.device_config(sessions.session_config(info))).target
        return train(info, target, dataset, args, device_type, devices, env)


if __name__ == "__main__":
    bootstrap.entry(build_parser, run, find_cluster=bootstrap.cluster_if_given)
