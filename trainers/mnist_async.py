"""Asynchronous data parallelism with shared parameters: a sigmoid network on MNIST (seed 001).

One hidden sigmoid layer and softmax, plain gradient descent. The parameters live on the ps task
(replica_device_setter); every worker trains on its own shard and applies its gradients to them
as soon as they are computed, without waiting for the others. Training runs for --epochs passes
over the whole training set, counted in global steps (--train_steps overrides), so a run launched
again with the same --checkpoint_dir continues from the saved global step up to the new target.

Defaults (the seed's example only fixes the network, the data, 20 epochs and 1 ps + 3 workers):
100 hidden units, batch 100, learning rate 0.5 (gradient descent; the seed's 0.0005 barely moves
a sigmoid network in 20 epochs). At the end every worker prints `Test-Accuracy`, `Total Time` and
`Final Cost` (cross entropy on the test set) and its result line. The chief waits (up to
--finish_wait_secs) for the other workers to finish so its final checkpoint holds the final state.
"""
import math

from trainers.common import bootstrap, data, loop, models, sessions


def build_parser():
    parser = bootstrap.trainer_parser(__doc__)
    parser.add_argument("--epochs", type=int, default=20,
                        help="passes over the whole training set, shared by all workers")
    parser.add_argument("--train_steps", type=int, default=0,
                        help="target global step; overrides --epochs when > 0")
    parser.add_argument("--batch_size", type=int, default=100)
    parser.add_argument("--learning_rate", type=float, default=0.5,
                        help="gradient descent step size")
    parser.add_argument("--hidden_units", type=int, default=100)
    parser.add_argument("--finish_wait_secs", type=float, default=120.0,
                        help="how long the chief waits for the other workers before its final save")
    return parser


def steps_per_epoch(dataset, batch_size):
    """Global steps that make one pass over the whole training set."""
    return max(1, math.ceil(len(dataset.train_x) / batch_size))


def target_step(dataset, args):
    if args.train_steps > 0:
        return args.train_steps
    return args.epochs * steps_per_epoch(dataset, args.batch_size)


def build_model(dataset, args, info):
    """Variables on the ps tasks, computation on this worker. Returns a dict of tensors/ops."""
    import tensorflow as tf
    v1 = tf.compat.v1
    model = models.replicated_mlp(info, dataset, args.hidden_units, activation=tf.sigmoid,
                                  init="random_normal")
    global_step = model["global_step"]
    with v1.device(model["setter"]):
        train_op = v1.train.GradientDescentOptimizer(args.learning_rate).minimize(
            model["loss"], global_step=global_step)
        with v1.control_dependencies([train_op]):
            step_after = global_step.read_value()  # includes this update (and maybe others')
    # The end-of-run rendezvous: each other worker leaves one item; the chief collects them.
    with v1.device("/job:ps/task:0/cpu:0"):
        done_queue = v1.FIFOQueue(max(1, info.num_workers), [tf.int32], shapes=[[]],
                                  shared_name="mnist_async_done", name="done_queue")
        done = done_queue.enqueue(tf.constant(info.index, tf.int32))
        others = max(0, info.num_workers - 1)
        wait_done = done_queue.dequeue_many(others) if others else tf.no_op()
    model.update(train_op=train_op, step_after=step_after, done=done, wait_done=wait_done)
    return model


def train(info, server, dataset, args):
    """One worker's loop; returns the results dict for the result line."""
    model = build_model(dataset, args, info)
    sess, saver = sessions.graph_session(info, server, args.checkpoint_dir)
    target = target_step(dataset, args)
    bootstrap.log("Worker %d: training to global step %d (%d per epoch)"
                  % (info.index, target, steps_per_epoch(dataset, args.batch_size)))
    progress, evaluate = loop.train_replica(info, sess, saver, args, model, dataset, target)
    extras = {"dataset": dataset.name, "target_step": target, "batch_size": args.batch_size,
              "learning_rate": args.learning_rate}
    if info.is_chief and not progress.drained:  # a drain saves at once: all got the notice
        extras["others_finished"] = sessions.finished_within(
            sess, model["wait_done"], args.finish_wait_secs,
            "the other workers did not finish within %gs; saving anyway" % args.finish_wait_secs)
    if info.is_chief:
        step = int(sess.run(model["global_step"]))
        if sessions.save_checkpoint(sess, saver, args.checkpoint_dir, step):
            extras["checkpoint_step"] = step
    final_cost, accuracy = evaluate()
    step = int(sess.run(model["global_step"]))
    if not info.is_chief:
        sess.run(model["done"])
    bootstrap.log("Test-Accuracy: %2.4f" % accuracy)
    bootstrap.log("Total Time: %3.2fs" % progress.elapsed)
    bootstrap.log("Final Cost: %.4f" % final_cost)
    sess.close()
    return progress.result(final_cost, accuracy, global_step=step, **extras)


def run(options, cluster, dataset=None):
    """A worker trains to the target step (its results dict), a ps serves (None)."""
    args = bootstrap.options(build_parser(), options)
    return sessions.run_between_graph(cluster, args, data.load_from_flags, train, dataset)


if __name__ == "__main__":
    bootstrap.entry(build_parser, run, graph=True)
