"""Distributed wide & deep on the UCI Adult census data: TensorFlow's dist_test census_widendeep.

Wide part: a linear model over hashed categorical columns, bucketized age and crossed columns
(education x occupation, age bucket x education x occupation, country x occupation), trained with
FTRL. Deep part: embeddings of the categorical columns plus the numeric columns through a ReLU
network, trained with Adagrad. Both sum into one logit (income >50K). Variables live on the ps
tasks through replica_device_setter; workers train asynchronously (between-graph replication)
until the global step reaches --train_steps, then evaluate on adult.test in --eval_steps batches
and print the test accuracy and loss.
"""
import math

from trainers.common import bootstrap, data, loop, sessions

AGE_BOUNDARIES = [18.0, 25.0, 30.0, 35.0, 40.0, 45.0, 50.0, 55.0, 60.0, 65.0]
# Hash buckets of each categorical column (wide weights and deep embeddings alike).
HASH_BUCKETS = {"workclass": 100, "education": 1000, "marital_status": 100, "occupation": 1000,
                "relationship": 100, "race": 100, "gender": 10, "native_country": 1000}
# Wide-only crossed columns: (name, columns, buckets); "age_bucket" is the bucketized age.
CROSSES = [("education_x_occupation", ("education", "occupation"), 10000),
           ("age_x_education_x_occupation", ("age_bucket", "education", "occupation"), 1000000),
           ("country_x_occupation", ("native_country", "occupation"), 10000)]
DEEP_NUMERIC = ["age", "education_num", "capital_gain", "capital_loss", "hours_per_week"]


def build_parser():
    parser = bootstrap.trainer_parser(__doc__, mnist=False, checkpoints=False)
    parser.add_argument("--data_dir", default="/tmp/census-data", help="adult.data and adult.test")
    parser.add_argument("--dataset", default="census", choices=["census", "synthetic"],
                        help="synthetic: generated rows of the census schema, for offline runs")
    parser.add_argument("--model_dir", default="",
                        help="checkpoints: the chief saves here, a new run resumes from here")
    parser.add_argument("--train_steps", type=int, default=1000, help="global training steps")
    parser.add_argument("--eval_steps", type=int, default=1,
                        help="batches the test set is evaluated in (1: the whole set at once)")
    parser.add_argument("--batch_size", type=int, default=40)
    parser.add_argument("--hidden_units", default="100,50", help="deep part's layer sizes")
    parser.add_argument("--embedding_dim", type=int, default=8)
    parser.add_argument("--linear_learning_rate", type=float, default=0.1, help="FTRL, wide part")
    parser.add_argument("--dnn_learning_rate", type=float, default=0.05, help="Adagrad, deep part")
    parser.add_argument("--drop_missing", action="store_true",
                        help="skip rows with a missing value '?' (default: '?' is a category)")
    return parser


def load_dataset(args):
    """The census rows --dataset names: adult.data and adult.test in --data_dir, or synthetic."""
    if args.dataset == "synthetic":
        return data.synthetic_census()
    return data.load_census(args.data_dir, drop_missing=args.drop_missing)


def numeric_stats(dataset):
    """Mean and spread of each deep numeric column on the training set (capital_* in log1p)."""
    import numpy as np
    stats = {}
    for column in DEEP_NUMERIC:
        values = dataset.train_x[column].astype(np.float64)
        values = np.log1p(values) if column.startswith("capital") else values
        stats[column] = (float(values.mean()), float(values.std()) or 1.0)
    return stats


def placeholders(tf):
    """Placeholders for one batch of census rows: strings for categories, floats for numbers."""
    v1 = tf.compat.v1
    features = {c: v1.placeholder(tf.string, [None], name=c) for c in data.CENSUS_CATEGORICAL}
    features.update({c: v1.placeholder(tf.float32, [None], name=c) for c in data.CENSUS_NUMERIC})
    labels = v1.placeholder(tf.int64, [None], name="labels")
    return features, labels


def build_model(dataset, args, info):
    """The graph: placement, wide and deep parts, the two optimizers. Returns a dict."""
    import tensorflow as tf
    v1 = tf.compat.v1
    hidden = [int(h) for h in args.hidden_units.split(",") if h]
    stats = numeric_stats(dataset)
    with v1.device(v1.train.replica_device_setter(worker_device=info.device + "/cpu:0",
                                                  ps_device="/job:ps/cpu:0",
                                                  cluster=info.cluster_spec())):
        global_step = v1.train.get_or_create_global_step()
        features, labels = placeholders(tf)
        ids = {c: tf.strings.to_hash_bucket_fast(features[c], HASH_BUCKETS[c])
               for c in data.CENSUS_CATEGORICAL}
        age_bucket = tf.raw_ops.Bucketize(input=features["age"], boundaries=AGE_BOUNDARIES)
        strings = dict(features, age_bucket=tf.strings.as_string(age_bucket))
        wide_ids = dict(ids, age_bucket=tf.cast(age_bucket, tf.int64))
        wide_sizes = dict(HASH_BUCKETS, age_bucket=len(AGE_BOUNDARIES) + 1)
        for name, columns, buckets in CROSSES:
            joined = tf.strings.join([strings[c] for c in columns], separator="_X_")
            wide_ids[name] = tf.strings.to_hash_bucket_fast(joined, buckets)
            wide_sizes[name] = buckets

        with v1.variable_scope("wide"):
            wide_logit = v1.get_variable("bias", [1], initializer=v1.zeros_initializer())
            for name in sorted(wide_ids):
                weights = v1.get_variable(name, [wide_sizes[name], 1],
                                          initializer=v1.zeros_initializer())
                wide_logit = wide_logit + tf.gather(weights, wide_ids[name])
        with v1.variable_scope("deep"):
            parts = []
            for column in data.CENSUS_CATEGORICAL:
                table = v1.get_variable(
                    column + "_embedding", [HASH_BUCKETS[column], args.embedding_dim],
                    initializer=v1.truncated_normal_initializer(
                        stddev=1.0 / math.sqrt(args.embedding_dim)))
                parts.append(tf.gather(table, ids[column]))
            for column in DEEP_NUMERIC:
                mean, spread = stats[column]
                values = features[column]
                values = tf.math.log1p(values) if column.startswith("capital") else values
                parts.append(((values - mean) / spread)[:, None])
            layer = tf.concat(parts, axis=1)
            for index, units in enumerate(hidden + [1]):
                width = int(layer.shape[1])
                weights = v1.get_variable("layer%d_w" % index, [width, units],
                                          initializer=v1.glorot_uniform_initializer())
                bias = v1.get_variable("layer%d_b" % index, [units],
                                       initializer=v1.zeros_initializer())
                layer = tf.matmul(layer, weights) + bias
                if index < len(hidden):
                    layer = tf.nn.relu(layer)
            deep_logit = layer
        logit = tf.squeeze(wide_logit + deep_logit, axis=1)
        float_labels = tf.cast(labels, tf.float32)
        loss = tf.reduce_mean(
            tf.nn.sigmoid_cross_entropy_with_logits(labels=float_labels, logits=logit))
        predictions = tf.cast(logit > 0.0, tf.int64)
        accuracy = tf.reduce_mean(tf.cast(tf.equal(predictions, labels), tf.float32))
        wide_vars = v1.trainable_variables("wide")
        deep_vars = v1.trainable_variables("deep")
        wide_grads = tf.gradients(loss, wide_vars)
        deep_grads = tf.gradients(loss, deep_vars)
        wide_train = v1.train.FtrlOptimizer(args.linear_learning_rate).apply_gradients(
            list(zip(wide_grads, wide_vars)), global_step=global_step)
        deep_train = v1.train.AdagradOptimizer(args.dnn_learning_rate).apply_gradients(
            list(zip(deep_grads, deep_vars)))
        train_op = tf.group(wide_train, deep_train)
    return {"global_step": global_step, "features": features, "labels": labels, "loss": loss,
            "accuracy": accuracy, "train_op": train_op,
            "wide_params": sum(int(v.shape.num_elements()) for v in wide_vars),
            "deep_params": sum(int(v.shape.num_elements()) for v in deep_vars)}


def feed(model, rows, labels):
    values = {model["features"][c]: rows[c] for c in data.CENSUS_COLUMNS[:-1]}
    values[model["labels"]] = labels
    return values


def train(info, server, dataset, args):
    """The worker's loop; returns the results dict for the result line."""
    model = build_model(dataset, args, info)
    bootstrap.log("Worker %d: initializing session..." % info.index)
    sess, saver = sessions.graph_session(info, server, args.model_dir)
    bootstrap.log("Worker %d: session initialization complete (wide %d, deep %d parameters)."
                  % (info.index, model["wide_params"], model["deep_params"]))
    # The test set in --eval_steps batches (1: all at once).
    eval_batch = int(math.ceil(len(dataset.test_y) / float(max(1, args.eval_steps))))
    progress, evaluate = loop.train_replica(
        info, sess, saver, args, model, dataset, args.train_steps,
        feed=lambda batch: feed(model, *batch), eval_batch_size=eval_batch)
    if info.is_chief:
        sessions.save_checkpoint(sess, saver, args.model_dir, progress.step)
    loss, acc = evaluate()
    majority = max(dataset.test_y.mean(), 1.0 - dataset.test_y.mean())
    bootstrap.log("Worker %d: after %d global steps (%d local, %.2f s), on the %s test set "
                  "(%d rows): accuracy: %.4f  loss: %.4f  (majority class: %.4f)"
                  % (info.index, progress.step, progress.local_steps, progress.elapsed,
                     dataset.name, len(dataset.test_y), acc, loss, majority))
    return progress.result(loss, acc, dataset=dataset.name, synthetic=dataset.name != "census",
                           majority_accuracy=float(majority),
                           test_rows=int(len(dataset.test_y)), eval_steps=args.eval_steps,
                           wide_params=model["wide_params"], deep_params=model["deep_params"])


def run(options, cluster, dataset=None):
    """A worker trains wide & deep (its results dict), a ps serves (None)."""
    args = bootstrap.options(build_parser(), options)
    return sessions.run_between_graph(cluster, args, load_dataset, train, dataset)


if __name__ == "__main__":
    bootstrap.entry(build_parser, run, graph=True)
