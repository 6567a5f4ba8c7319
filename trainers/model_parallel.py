"""Model parallelism over parameter servers: each layer's parameters on its own ps task (seed 000).

2 ps + 1 worker. The network's layers are placed explicitly, not round robin: layer 1 (the
hidden ReLU layer) keeps its variables and optimizer slots on /job:ps/task:0, layer 2 (softmax)
on /job:ps/task:1, the global step with layer 1. The worker computes: every step it reads both
layers from their ps tasks and sends each one its update.

The result line reports `placement`, the device every variable was assigned, and
`placement_observed`, the tasks that actually ran each variable's ops in one traced training
step (from TensorFlow's step stats); --print_placement also logs them. With more ps tasks the
layers go to ps tasks 0 and 1; with a single ps task both layers share it.
"""
import math

from trainers import bootstrap, data

VARIABLE_OPS = ("Variable", "VariableV2", "VarHandleOp", "AutoReloadVariable")


def build_parser():
    parser = bootstrap.make_parser(__doc__.splitlines()[0])
    bootstrap.add_cluster_flags(parser)
    bootstrap.add_mnist_flags(parser)
    parser.add_argument("--train_steps", type=int, default=2000, help="target global step")
    parser.add_argument("--batch_size", type=int, default=100)
    parser.add_argument("--learning_rate", type=float, default=0.001, help="Adam")
    parser.add_argument("--hidden_units", type=int, default=256)
    parser.add_argument("--log_every", type=int, default=100, help="log every N steps")
    parser.add_argument("--print_placement", action="store_true",
                        help="log every variable's device (also in the result line)")
    bootstrap.add_checkpoint_flags(parser)
    return parser


def layer_device(ps_task, compute_device):
    """Device function: variables of this layer on ps task PS_TASK, its math on COMPUTE_DEVICE."""
    def place(op):
        node = op.node_def if hasattr(op, "node_def") else op
        if node.op in VARIABLE_OPS:
            return "/job:ps/task:%d/cpu:0" % ps_task
        return compute_device
    return place


def build_model(dataset, args, info):
    import tensorflow as tf
    v1 = tf.compat.v1
    inputs = int(dataset.train_x.shape[1])
    ps_for_layer = [0, min(1, info.num_ps - 1)]
    model = {"layers": {}}
    with v1.device(info.device):
        x = v1.placeholder(tf.float32, [None, inputs], name="x")
        y = v1.placeholder(tf.int64, [None], name="y")
    with v1.device(layer_device(ps_for_layer[0], info.device)):
        global_step = v1.train.get_or_create_global_step()
        with v1.variable_scope("layer1"):
            w1 = v1.Variable(v1.truncated_normal([inputs, args.hidden_units],
                                                 stddev=1.0 / math.sqrt(inputs)), name="weights")
            b1 = v1.Variable(v1.zeros([args.hidden_units]), name="biases")
            hidden = tf.nn.relu(tf.matmul(x, w1) + b1)
    with v1.device(layer_device(ps_for_layer[1], info.device)):
        with v1.variable_scope("layer2"):
            w2 = v1.Variable(v1.truncated_normal([args.hidden_units, dataset.num_classes],
                                                 stddev=1.0 / math.sqrt(args.hidden_units)),
                             name="weights")
            b2 = v1.Variable(v1.zeros([dataset.num_classes]), name="biases")
            logits = tf.matmul(hidden, w2) + b2
    with v1.device(info.device):
        xent = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y,
                                                                             logits=logits))
        accuracy = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, 1), y), tf.float32))
        # Adam's slots are colocated with their variable, so they follow the layer's ps task.
        train_op = v1.train.AdamOptimizer(args.learning_rate).minimize(xent,
                                                                       global_step=global_step)
        with v1.control_dependencies([train_op]):
            step_after = global_step.read_value()
    model.update(layers={"layer1": ps_for_layer[0], "layer2": ps_for_layer[1]},
                 global_step=global_step, x=x, y=y, xent=xent, accuracy=accuracy,
                 train_op=train_op, step_after=step_after)
    return model


def short_device(device):
    """'/job:ps/replica:0/task:1/device:CPU:0' -> 'ps:1' (the task, the unit the test checks)."""
    import tensorflow as tf
    spec = tf.DeviceSpec.from_string(device)
    return "%s:%d" % (spec.job, spec.task or 0) if spec.job else device


def placement(sess=None, model=None, feed=None):
    """{variable: assigned device}, and with a session {variable: [tasks that ran its ops]}."""
    import tensorflow as tf
    v1 = tf.compat.v1
    variables = v1.global_variables()
    assigned = {v.op.name: v.device for v in variables}
    if sess is None:
        return assigned, None
    metadata = v1.RunMetadata()
    sess.run(model["train_op"], feed_dict=feed, run_metadata=metadata,
             options=v1.RunOptions(trace_level=v1.RunOptions.FULL_TRACE))
    ran = {}
    for dev in metadata.step_stats.dev_stats:
        for node in dev.node_stats:
            ran.setdefault(node.node_name, set()).add(short_device(dev.device))
    observed = {}
    for var in variables:
        # The ops that read or update a variable run where the variable lives.
        users = [op.name for op in var.op.outputs[0].consumers()]
        observed[var.op.name] = sorted({task for name in users for task in ran.get(name, ())})
    return assigned, observed


def evaluate(sess, model, dataset):
    feed = {model["x"]: dataset.test_x, model["y"]: dataset.test_y}
    xent, acc = sess.run([model["xent"], model["accuracy"]], feed_dict=feed)
    return float(xent), float(acc)


def train(info, server, dataset, args):
    import tensorflow as tf
    v1 = tf.compat.v1
    model = build_model(dataset, args, info)
    saver = v1.train.Saver(max_to_keep=2)
    config = bootstrap.session_config(info)
    sess = bootstrap.prepare_session(info, server, bootstrap.session_manager(),
                                     v1.global_variables_initializer(), saver,
                                     args.checkpoint_dir, config)
    start_step = int(sess.run(model["global_step"]))
    initial_xent, initial_acc = evaluate(sess, model, dataset)
    shard = dataset.shard(info.index, info.num_workers)
    batches = data.batches(shard.train_x, shard.train_y, args.batch_size, seed=info.index)
    assigned, observed = placement()
    if start_step < args.train_steps:
        batch_x, batch_y = next(batches)
        # The first step runs traced: its step stats say which task ran each variable's ops.
        assigned, observed = placement(sess, model, {model["x"]: batch_x, model["y"]: batch_y})
    for name in sorted(assigned):
        if args.print_placement:
            bootstrap.log("placement: %-28s %-22s ran on %s" % (
                name, assigned[name], ",".join((observed or {}).get(name, [])) or "-"))
    timer = bootstrap.Timer()
    step = int(sess.run(model["global_step"]))
    local_steps = 1 if step > start_step else 0
    while step < args.train_steps:
        batch_x, batch_y = next(batches)
        xent, step = sess.run([model["xent"], model["step_after"]],
                              feed_dict={model["x"]: batch_x, model["y"]: batch_y})
        step, local_steps = int(step), local_steps + 1
        if local_steps % args.log_every == 0:
            bootstrap.log("Worker %d: step %d, batch cross entropy %.4f"
                          % (info.index, step, xent))
        if info.is_chief and args.save_every_steps and local_steps % args.save_every_steps == 0:
            bootstrap.save_checkpoint(sess, saver, args.checkpoint_dir, step)
    elapsed = timer.seconds
    step = int(sess.run(model["global_step"]))
    results = {"task": info.label, "dataset": dataset.name, "start_step": start_step,
               "global_step": step, "local_steps": local_steps, "layers": model["layers"],
               "placement": assigned, "placement_observed": observed}
    if info.is_chief and bootstrap.save_checkpoint(sess, saver, args.checkpoint_dir, step):
        results["checkpoint_step"] = step
    final_xent, accuracy = evaluate(sess, model, dataset)
    bootstrap.log("After %d steps: test accuracy %.4f, test cross entropy %.4f (%.2fs)"
                  % (step, accuracy, final_xent, elapsed))
    results.update(accuracy=accuracy, initial_accuracy=initial_acc, final_xent=final_xent,
                   initial_xent=initial_xent, train_time_s=round(elapsed, 3),
                   examples_per_s=round(local_steps * args.batch_size / max(elapsed, 1e-9), 1))
    sess.close()
    return results


def run(argv):
    args = build_parser().parse_args(argv)
    info = bootstrap.cluster_from_args(args)
    if info.num_ps < 1:
        raise SystemExit("model_parallel needs ps tasks to hold the layers (2 by default)")
    return bootstrap.run_between_graph(
        info, lambda: data.load_images(args.dataset, args.data_dir),
        lambda info, server, dataset: train(info, server, dataset, args))


if __name__ == "__main__":
    raise SystemExit(bootstrap.main_guard(run))
