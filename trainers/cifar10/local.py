"""CIFAR-10 on one host: --num_devices towers averaging their gradients (seeds 004 and 003).

The towers are mnist_towers' (common/towers.py: the same devices, the same gradient average):
GPUs when the host has enough of them, else logical CPU devices. The variables live on the CPU;
each tower computes the gradients of its slice of the batch on its device, the CPU averages and
applies them.
"""
from trainers.cifar10 import model
from trainers.common import bootstrap, loop, sessions, towers


def build_model(dataset, args, devices):
    """Variables on the CPU, one tower per device on a slice of the batch, mean gradients."""
    import tensorflow as tf
    v1 = tf.compat.v1
    specs = model.param_specs(args, dataset.num_classes)
    with v1.device("/device:CPU:0"):
        global_step = v1.train.get_or_create_global_step()
        params = [v1.get_variable(s[0], s[1], initializer=model.initializer(
            tf, s, args.init, args.seed)) for s in specs]
        images, labels = model.placeholders(tf, args, "train")
        image_parts = tf.split(images, len(devices))
        label_parts = tf.split(labels, len(devices))
    tower_grads, tower_losses = [], []
    for index, device in enumerate(devices):
        with v1.device(device), v1.name_scope("tower_%d" % index):
            loss, _ = model.loss_and_accuracy(tf, model.inference(tf, image_parts[index], params),
                                              label_parts[index])
            tower_grads.append(tf.gradients(loss, params))
            tower_losses.append(loss)
    with v1.device("/device:CPU:0"):
        mean = towers.average_gradients(tower_grads)
        optimizer = v1.train.GradientDescentOptimizer(args.learning_rate)
        train_op = optimizer.apply_gradients(list(zip(mean, params)), global_step=global_step)
        loss = tf.add_n(tower_losses) / float(len(devices))
        evaluation = model.build_eval(tf, args, params)
    return {"global_step": global_step, "images": images, "labels": labels, "loss": loss,
            "train_op": train_op, "eval": evaluation,
            "tower_loss_devices": [t.device for t in tower_losses]}


def check_devices(args):
    """The tower count: --num_devices, else every GPU, else 2 CPU devices."""
    count = args.num_devices or args.num_gpus or 2
    if args.num_gpus and count > args.num_gpus:
        raise SystemExit("--num_devices %d: this task sees only %d GPU(s)"
                         % (count, args.num_gpus))
    if args.batch_size % count:
        raise SystemExit("--batch_size %d must be a multiple of --num_devices %d"
                         % (args.batch_size, count))
    return count


def train(dataset, args, info=None, env=None):
    """Train to --train_steps in this process (in a graph of its own); returns the result
    dict. INFO (None outside a cluster) names the task in its metrics; ENV: a
    bootstrap.TaskEnv (default: INFO's)."""
    import tensorflow as tf
    count = check_devices(args)
    _, devices = towers.make_devices(count)  # before anything touches the devices
    env = env or (info.env if info is not None else bootstrap.TaskEnv())
    with tf.Graph().as_default():
        return train_in_graph(tf, dataset, args, info, env, count, devices)


def train_in_graph(tf, dataset, args, info, env, count, devices):
    v1 = tf.compat.v1
    bootstrap.seed_everything(args.seed)
    m = build_model(dataset, args, devices)
    config = towers.device_config(v1.ConfigProto(
        allow_soft_placement=True, intra_op_parallelism_threads=env.intra_op_threads,
        inter_op_parallelism_threads=env.inter_op_threads))
    saver = v1.train.Saver(max_to_keep=2)
    sess = sessions.restore_or_initialize(sessions.session_manager(), "",
                                          v1.global_variables_initializer(), saver,
                                          args.checkpoint_dir, config)
    session_devices = sorted(d.name for d in sess.list_devices())
    bootstrap.log("local: %d towers on %s; session devices %s"
                  % (count, devices, session_devices))
    initial = model.evaluate(sess, m["eval"], dataset, args)
    start_step = step = int(sess.run(m["global_step"]))
    batches = model.build_inputs(dataset, args, seed=args.seed * 1000)
    progress = loop.Progress(info, args, args.batch_size, start_step, *initial,
                             expected_steps=args.train_steps - start_step, env=env)
    while step < args.train_steps and not progress.draining():
        feed = dict(zip((m["images"], m["labels"]), next(batches)))
        _, loss = loop.train_step(sess, progress, [m["train_op"], m["loss"]], feed)
        step += 1  # this process alone updates the variables
        progress.tick(step, float(loss))
    elapsed = progress.stop()
    sessions.save_checkpoint(sess, saver, args.checkpoint_dir, step)
    final = model.evaluate(sess, m["eval"], dataset, args)
    bootstrap.log("local: after step %d (%.2f s): test loss %.4f, accuracy %.4f (%s)"
                  % (step, elapsed, final[0], final[1], dataset.name))
    return progress.result(final[0], final[1], global_step=step, **model.extras(
        args, dataset, num_devices=count, tower_devices=m["tower_loss_devices"],
        session_devices=session_devices))
