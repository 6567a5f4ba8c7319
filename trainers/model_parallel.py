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
from trainers.common import bootstrap, data, loop, models, sessions


def build_parser():
    parser = bootstrap.trainer_parser(__doc__)
    parser.add_argument("--train_steps", type=int, default=2000, help="target global step")
    parser.add_argument("--batch_size", type=int, default=100)
    parser.add_argument("--learning_rate", type=float, default=0.001, help="Adam")
    parser.add_argument("--hidden_units", type=int, default=256)
    parser.add_argument("--print_placement", action="store_true",
                        help="log every variable's device (also in the result line)")
    return parser


def layer_device(ps_task, compute_device):
    """Device function: variables of this layer on ps task PS_TASK, its math on COMPUTE_DEVICE."""
    return models.variables_on("/job:ps/task:%d/cpu:0" % ps_task, compute_device)


def build_model(dataset, args, info):
    import tensorflow as tf
    v1 = tf.compat.v1
    ps_for_layer = [0, min(1, info.num_ps - 1)]
    with v1.device(info.device):
        x = v1.placeholder(tf.float32, [None, int(dataset.train_x.shape[1])], name="x")
        y = v1.placeholder(tf.int64, [None], name="y")
    # The global step lives with layer 1; each layer's math runs on this worker.
    with v1.device(layer_device(ps_for_layer[0], info.device)):
        global_step = v1.train.get_or_create_global_step()
    logits, _ = models.mlp_logits(x, args.hidden_units, dataset.num_classes, layer_devices=[
        layer_device(ps, info.device) for ps in ps_for_layer])
    with v1.device(info.device):
        xent, accuracy = models.xent_and_accuracy(logits, y)
        # Adam's slots are colocated with their variable, so they follow the layer's ps task.
        train_op = v1.train.AdamOptimizer(args.learning_rate).minimize(xent,
                                                                       global_step=global_step)
        with v1.control_dependencies([train_op]):
            step_after = global_step.read_value()
    return {"layers": {"layer1": ps_for_layer[0], "layer2": ps_for_layer[1]},
            "global_step": global_step, "x": x, "y": y, "loss": xent, "accuracy": accuracy,
            "train_op": train_op, "step_after": step_after}


def short_device(device):
    """'/job:ps/replica:0/task:1/device:CPU:0' -> 'ps:1' (the task, the unit the test checks)."""
    import tensorflow as tf
    spec = tf.DeviceSpec.from_string(device)
    return "%s:%d" % (spec.job, spec.task or 0) if spec.job else device


def placement(step_stats=None):
    """{variable: assigned device}, and from a traced step {variable: [tasks that ran its ops]}."""
    import tensorflow as tf
    variables = tf.compat.v1.global_variables()
    assigned = {v.op.name: v.device for v in variables}
    if step_stats is None:
        return assigned, None
    ran = {}
    for dev in step_stats.dev_stats:
        for node in dev.node_stats:
            ran.setdefault(node.node_name, set()).add(short_device(dev.device))
    observed = {}
    for var in variables:
        # The ops that read or update a variable run where the variable lives.
        users = [op.name for op in var.op.outputs[0].consumers()]
        observed[var.op.name] = sorted({task for name in users for task in ran.get(name, ())})
    return assigned, observed


def train(info, server, dataset, args):
    model = build_model(dataset, args, info)
    sess, saver = sessions.graph_session(info, server, args.checkpoint_dir)
    progress, evaluate = loop.train_replica(info, sess, saver, args, model, dataset,
                                            args.train_steps)
    # The first step ran traced: its step stats say which task ran each variable's ops.
    assigned, observed = placement(progress.step_stats)
    if args.print_placement:
        for name in sorted(assigned):
            bootstrap.log("placement: %-28s %-22s ran on %s" % (
                name, assigned[name], ",".join((observed or {}).get(name, [])) or "-"))
    step = int(sess.run(model["global_step"]))
    extras = {"dataset": dataset.name, "layers": model["layers"], "placement": assigned,
              "placement_observed": observed}
    if info.is_chief and sessions.save_checkpoint(sess, saver, args.checkpoint_dir, step):
        extras["checkpoint_step"] = step
    loss, accuracy = evaluate()
    bootstrap.log("After %d steps: test accuracy %.4f, test cross entropy %.4f (%.2fs)"
                  % (step, accuracy, loss, progress.elapsed))
    sess.close()
    return progress.result(loss, accuracy, global_step=step, **extras)


def run(options, cluster, dataset=None):
    """The worker trains with each layer on its own ps task (its results dict), a ps serves."""
    args = bootstrap.options(build_parser(), options)
    if cluster.num_ps < 1:
        raise SystemExit("model_parallel needs ps tasks to hold the layers (2 by default)")
    return sessions.run_between_graph(cluster, args, data.load_from_flags, train, dataset)


if __name__ == "__main__":
    bootstrap.entry(build_parser, run, graph=True)
