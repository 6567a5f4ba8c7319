"""The models several trainers share, and where a traced step says TensorFlow ran them.

- `mlp_logits`: the MNIST network of mnist_replica, mnist_async, data_parallel and model_parallel
  (graph mode): one hidden layer, softmax logits, each layer placeable on its own device.
- `Classifier` (via `build_classifier`): the same network as a tf.Module for the TF2 strategies
  (ps_strategy, multi_worker_mirrored), with its `evaluate`.
- `traced_run` and `placed_devices`: which devices of a task ran a graph-mode step.
"""
import contextlib
import math

VARIABLE_OPS = ("Variable", "VariableV2", "VarHandleOp", "AutoReloadVariable")


def variables_on(variable_device, compute_device):
    """Device function: variables on VARIABLE_DEVICE, every other op on COMPUTE_DEVICE."""
    def place(op):
        node = op.node_def if hasattr(op, "node_def") else op
        return variable_device if node.op in VARIABLE_OPS else compute_device
    return place


def dense_layer(x, units, name, activation=None, init="truncated_normal"):
    """NAME/weights (normal, stddev 1/sqrt(fan-in)) and NAME/biases (zeros); (output, [w, b])."""
    import tensorflow as tf
    v1 = tf.compat.v1
    fan_in = int(x.shape[1])
    normal = v1.truncated_normal if init == "truncated_normal" else v1.random_normal
    with v1.variable_scope(name):
        weights = v1.Variable(normal([fan_in, units], stddev=1.0 / math.sqrt(fan_in)),
                              name="weights")
        biases = v1.Variable(v1.zeros([units]), name="biases")
    out = tf.matmul(x, weights) + biases
    return (activation(out) if activation else out), [weights, biases]


def mlp_logits(x, hidden_units, num_classes, activation=None, init="truncated_normal",
               layer_devices=(None, None)):
    """The MNIST MLP: layer1 (hidden, ACTIVATION, ReLU by default), layer2 (logits).

    LAYER_DEVICES: a device (or device function) for each layer's variables and ops; None keeps
    the enclosing placement. Returns (logits, [layer1 w, b, layer2 w, b])."""
    import tensorflow as tf

    def placed(device):
        return tf.compat.v1.device(device) if device is not None else contextlib.nullcontext()

    with placed(layer_devices[0]):
        hidden, first = dense_layer(x, hidden_units, "layer1", activation or tf.nn.relu, init)
    with placed(layer_devices[1]):
        logits, second = dense_layer(hidden, num_classes, "layer2", None, init)
    return logits, first + second


def replicated_mlp(info, dataset, hidden_units, worker_device=None, **mlp_options):
    """The MLP for between-graph replication: variables and the global step on the ps tasks
    (replica_device_setter), compute on WORKER_DEVICE (default: this task). A model dict with
    "setter" (build the optimizer under it), global_step, x, y, loss and accuracy."""
    import tensorflow as tf
    v1 = tf.compat.v1
    setter = v1.train.replica_device_setter(worker_device=worker_device or info.device,
                                            ps_device="/job:ps/cpu:0",
                                            cluster=info.cluster_spec())
    with v1.device(setter):
        global_step = v1.train.get_or_create_global_step()
        x = v1.placeholder(tf.float32, [None, int(dataset.train_x.shape[1])], name="x")
        y = v1.placeholder(tf.int64, [None], name="y")
        logits, _ = mlp_logits(x, hidden_units, dataset.num_classes, **mlp_options)
        loss, accuracy = xent_and_accuracy(logits, y)
    return {"setter": setter, "global_step": global_step, "x": x, "y": y, "loss": loss,
            "accuracy": accuracy}


def xent_and_accuracy(logits, labels):
    """Mean softmax cross entropy and accuracy of LOGITS against integer LABELS."""
    import tensorflow as tf
    xent = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels,
                                                                         logits=logits))
    accuracy = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, 1), labels), tf.float32))
    return xent, accuracy


def add_classifier_flags(parser, steps_help):
    """The TF2 strategy examples' flags: the Classifier and its plain-SGD loop."""
    parser.add_argument("--hidden_units", type=int, default=100)
    parser.add_argument("--train_steps", type=int, default=1000, help=steps_help)
    parser.add_argument("--batch_size", type=int, default=100, help="global batch per step")
    parser.add_argument("--learning_rate", type=float, default=0.1, help="plain SGD")
    return parser


def build_classifier(tf, dataset, args):
    """The MLP for DATASET's flat inputs and classes, --hidden_units wide, as a tf.Module (build
    it inside strategy.scope() to distribute its variables), with a `steps` counter; initial
    weights from stateless ops seeded by --seed."""
    inputs, hidden, classes = int(dataset.train_x.shape[1]), args.hidden_units, dataset.num_classes
    seed = args.seed

    class Classifier(tf.Module):
        def __init__(self):
            super().__init__(name="classifier")
            self.hid_w = tf.Variable(tf.random.stateless_truncated_normal(
                [inputs, hidden], seed=[seed, 1], stddev=1.0 / math.sqrt(inputs)), name="hid_w")
            self.hid_b = tf.Variable(tf.zeros([hidden]), name="hid_b")
            self.sm_w = tf.Variable(tf.random.stateless_truncated_normal(
                [hidden, classes], seed=[seed, 2], stddev=1.0 / math.sqrt(hidden)), name="sm_w")
            self.sm_b = tf.Variable(tf.zeros([classes]), name="sm_b")
            self.steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="steps")

        @property
        def named_params(self):
            return {"hid_w": self.hid_w, "hid_b": self.hid_b, "sm_w": self.sm_w,
                    "sm_b": self.sm_b}

        @property
        def params(self):
            return list(self.named_params.values())

        def __call__(self, x):
            hidden_out = tf.nn.relu(tf.matmul(x, self.hid_w) + self.hid_b)
            return tf.matmul(hidden_out, self.sm_w) + self.sm_b

    return Classifier()


def evaluate(tf, model, dataset):
    """(test loss, test accuracy, device that computed them) of a Classifier, eagerly."""
    logits = model(tf.constant(dataset.test_x))
    loss, accuracy = xent_and_accuracy(logits, tf.constant(dataset.test_y, tf.int64))
    return float(loss), float(accuracy), logits.device


# ---------------------------------------------------------------- what ran where

def traced_run(sess, fetches, feed_dict=None):
    """Run FETCHES once traced: (their values, step stats: which device ran each node)."""
    import tensorflow as tf
    v1 = tf.compat.v1
    metadata = v1.RunMetadata()
    values = sess.run(fetches, feed_dict=feed_dict, run_metadata=metadata,
                      options=v1.RunOptions(trace_level=v1.RunOptions.FULL_TRACE))
    return values, metadata.step_stats


def local_device(name):
    """'/job:worker/replica:0/task:1/device:CPU:0' -> '/device:CPU:0'."""
    import tensorflow as tf
    spec = tf.DeviceSpec.from_string(name)
    return "/device:%s:%d" % (spec.device_type, spec.device_index or 0)


def placed_devices(step_stats, task_device=None):
    """The devices of TASK_DEVICE ('/job:worker/task:0'; None: any) that ran nodes of a traced
    step, as '/device:CPU:0': where TensorFlow actually placed the task's compute."""
    import tensorflow as tf
    found = set()
    task = tf.DeviceSpec.from_string(task_device) if task_device else None
    for dev in step_stats.dev_stats:
        spec = tf.DeviceSpec.from_string(dev.device)
        if not spec.device_type or not dev.node_stats:
            continue
        # A local session's devices (job localhost) are all this task's.
        if task is None or spec.job == "localhost" or \
                (spec.job == task.job and (spec.task or 0) == (task.task or 0)):
            found.add(local_device(dev.device))
    return sorted(found)
