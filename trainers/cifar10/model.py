"""The CIFAR-10 network of seed 004 (TensorFlow's CIFAR-10 tutorial model) and its inputs.

Random 24x24 crops and flips, per-image standardization, two 5x5 convolutions (64 filters) with
max-pooling and local response normalization, fully connected 384 and 192, softmax. Parameters
are plain tensors passed in, so one function serves the ps modes (a worker's local copy) and the
local towers (variables on the CPU).
"""
import math
import zlib

import numpy as np

from trainers.common import data, loop


def add_model_flags(parser):
    parser.add_argument("--image_size", type=int, default=24, help="side of the random crops")
    parser.add_argument("--conv_filters", type=int, default=64, help="filters of both convolutions")
    parser.add_argument("--fc_units", default="384,192", help="the two fully connected layers")
    parser.add_argument("--init", default="he", choices=["he", "tutorial"],
                        help="weight initialization: He scaling, or the tutorial's fixed stddevs")
    parser.add_argument("--eval_examples", type=int, default=0,
                        help="test images evaluated at the start and end (0: all)")
    return parser


# ---------------------------------------------------------------- inputs

def load_dataset(args):
    """The dataset --dataset names: CIFAR-10's binary batches in --data_dir, or synthetic."""
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


def build_inputs(dataset, args, seed):
    """Endless cropped, flipped, shuffled batches; the same SEED gives the same stream."""
    rng = np.random.default_rng(seed + 1000)
    for images, labels in data.batches(dataset.train_x, dataset.train_y, args.batch_size, seed):
        yield crop(images, args.image_size, rng), labels


def placeholders(tf, args, name):
    v1 = tf.compat.v1
    images = v1.placeholder(tf.uint8, [None, args.image_size, args.image_size, 3],
                            name=name + "_images")
    labels = v1.placeholder(tf.int64, [None], name=name + "_labels")
    return images, labels


# ---------------------------------------------------------------- the network

def param_specs(args, num_classes=10):
    """(name, shape, stddev or the constant of a bias) of every parameter."""
    filters = args.conv_filters
    fc1, fc2 = [int(u) for u in args.fc_units.split(",")]
    pooled = int(math.ceil(args.image_size / 4.0))
    return [("conv1_w", [5, 5, 3, filters], 5e-2), ("conv1_b", [filters], 0.0),
            ("conv2_w", [5, 5, filters, filters], 5e-2), ("conv2_b", [filters], 0.1),
            ("fc1_w", [pooled * pooled * filters, fc1], 0.04), ("fc1_b", [fc1], 0.1),
            ("fc2_w", [fc1, fc2], 0.04), ("fc2_b", [fc2], 0.1),
            ("out_w", [fc2, num_classes], 1.0 / fc2), ("out_b", [num_classes], 0.0)]


def initializer(tf, spec, scheme="he", seed=0):
    """Biases: constants. Weights: the tutorial's fixed stddevs, or He scaling (sqrt(2/fan_in),
    which leaves the early loss plateau of the fixed stddevs behind). Seeded per parameter, so
    every task builds the same initial values; a partition (multi_ps) takes its slice of the
    whole parameter's values, so partitioning does not change the model."""
    name, shape, value = spec
    if name.endswith("_b"):
        return tf.compat.v1.constant_initializer(value)
    if scheme == "he":
        fan_in = int(np.prod(shape[:-1]))
        value = 1.0 / fan_in if name == "out_w" else math.sqrt(2.0 / fan_in)
    whole = tf.compat.v1.truncated_normal_initializer(
        stddev=value, seed=(zlib.crc32(name.encode()) + seed) % (2 ** 31))

    def initial(part_shape, dtype=tf.float32, partition_info=None):
        if partition_info is None:
            return whole(part_shape, dtype)
        return tf.slice(whole(shape, dtype), partition_info.var_offset, part_shape)
    return initial


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


def build_eval(tf, args, params):
    """The model with PARAMS on held-out images: {"x": images, "y": labels, "loss", "accuracy"}."""
    images, labels = placeholders(tf, args, "eval")
    loss, accuracy = loss_and_accuracy(tf, inference(tf, images, params), labels)
    return {"x": images, "y": labels, "loss": loss, "accuracy": accuracy}


def evaluate(sess, model_eval, dataset, args, batch=500):
    """(loss, accuracy) of MODEL_EVAL (build_eval's) on the first --eval_examples test images,
    centre-cropped."""
    count = args.eval_examples or len(dataset.test_y)
    return loop.evaluate(sess, model_eval, dataset.test_x[:count], dataset.test_y[:count],
                         lambda b: {model_eval["x"]: crop(b[0], args.image_size),
                                    model_eval["y"]: b[1]}, batch)



def extras(args, dataset, **more):
    """What every CIFAR-10 result reports beside the schema's keys."""
    return dict(mode=args.mode, dataset=dataset.name, synthetic=dataset.name != "cifar10",
                seed=args.seed, batch_size=args.batch_size, **more)
