"""CIFAR-10 CNN: five ways of sharing parameters on ps tasks, or device towers on one host.

Seed 004. The network and its inputs are in model.py, the ps modes (sync, async,
async_stale, hogwild, multi_ps) in modes.py, the local towers in local.py; this
file holds the flags and a worker's training loop. Plain SGD, --learning_rate 0.1, batch 128.

Every ps mode clips each worker's gradient to global norm 5 (--clip_norm; at the start the
norm is 1 to 3), and the asynchronous modes divide the learning rate by (workers + 1); sync
keeps it. Their gradients land on parameters that moved since they were read: by up to one
update of every other worker, and in hogwild and async_stale, whose reply does not wait for
the update, the worker's own last one too. Delayed SGD stays stable only with a rate shrunk about
1 / (delay + 1), and lock-free updates (hogwild, multi_ps) also race. Measured on the full-size
model, synthetic data, 400 steps, 2 workers (benchmarks/RESULTS.md, "CIFAR-10 modes at full
size"): at 0.1, hogwild diverged (batch loss 6.3 at step 40, then stuck at ln 10 = 2.30) and
multi_ps ended at accuracy 0.09; async_stale reached 0.51 at 0.1 and 0.84 at 0.033; hogwild at
0.05 still spiked (batch loss 4.5 at step 160); at 0.033 (the rule) and 0.025 it reached 1.0.
At 0.033 async and multi_ps still spiked (batch loss 3.4 and 17.8 early on): one stale
gradient can throw the model off, hence the clipping.
"""
import time

from trainers.cifar10 import local, model, modes
from trainers.common import bootstrap, loop, models, sessions

MODES = modes.MODES + ("local",)


def build_parser():
    # A package run by -m: its usage lines name the program, not its __main__.py.
    parser = bootstrap.make_parser(__doc__.splitlines()[0], prog="cifar10.py")
    bootstrap.add_cluster_flags(parser)
    parser.add_argument("--mode", default="sync", help="one of: " + ", ".join(MODES))
    parser.add_argument("--data_dir", default="/tmp/cifar10_data",
                        help="the binary batches (or their cifar-10-batches-bin folder)")
    parser.add_argument("--dataset", default="cifar10",
                        choices=["cifar10", "fashion_mnist", "synthetic"],
                        help="synthetic: generated 32x32x3 images of 10 classes, for offline runs")
    parser.add_argument("--train_steps", type=int, default=10000,
                        help="global steps: parameter updates (sync: rounds; async modes: "
                             "gradients sent by all workers together)")
    parser.add_argument("--batch_size", type=int, default=128, help="per worker (local: in all)")
    parser.add_argument("--learning_rate", type=float, default=0.1,
                        help="plain SGD (asynchronous modes: divided by the number of workers + 1)")
    parser.add_argument("--clip_norm", type=float, default=5.0,
                        help="ps modes: clip each gradient to this global norm (0: off)")
    model.add_model_flags(parser)
    parser.add_argument("--num_gpus", type=int, default=0,
                        help="GPUs per task (workers compute there; local mode uses them as towers)")
    parser.add_argument("--num_devices", type=int, default=0,
                        help="local mode: towers, GPUs when --num_gpus > 0 else CPU devices "
                             "(0: every GPU, or 2 CPU devices)")
    parser.add_argument("--max_pending", type=int, default=16,
                        help="async_stale: gradients that may wait on the ps before a push blocks")
    parser.add_argument("--op_timeout_s", type=float, default=300.0,
                        help="fail instead of waiting longer for another task (queues, locks)")
    bootstrap.add_training_flags(parser)
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


def learning_rate(args, info):
    """sync keeps --learning_rate; the asynchronous modes divide it by workers + 1 (see the
    module docstring)."""
    if args.mode in modes.MODES and args.mode != "sync":
        return args.learning_rate / (info.num_workers + 1)
    return args.learning_rate


def read_counters(sess, m):
    values = sess.run(m["counters"])
    values["global_step"] = sess.run(m["global_step"])
    return {k: int(v) for k, v in values.items()}


def train_distributed(info, server, dataset, args):
    """One worker of a ps mode; returns the results dict for the result line."""
    import tensorflow as tf
    v1 = tf.compat.v1
    rate = learning_rate(args, info)
    m = modes.build(dataset, args, info, rate)
    sessions.start_barrier_ops(info)
    saver = v1.train.Saver(var_list=v1.global_variables(), max_to_keep=2)
    manager = sessions.session_manager(
        local_init_op=m["local_init"],
        ready_for_local_init_op=v1.report_uninitialized_variables(v1.global_variables()))
    bootstrap.log("Worker %d (%s): initializing session..." % (info.index, args.mode))
    sess = sessions.prepare_session(info, server, manager, v1.global_variables_initializer(),
                                     saver, args.checkpoint_dir, sessions.session_config(info),
                                     max_wait_secs=args.op_timeout_s)
    sessions.start_barrier(sess, info)
    options = v1.RunOptions(timeout_in_ms=int(args.op_timeout_s * 1000))
    start = read_counters(sess, m)
    if args.mode == "async" and info.is_chief and sess.run(m["lock_size"]) == 0:
        sess.run(m["lock_init"])
    initial = model.evaluate(sess, m["eval"], dataset, args)
    bootstrap.log("Worker %d: before training (global step %d): test loss %.4f, accuracy %.4f"
                  % (info.index, start["global_step"], initial[0], initial[1]))
    applier = None
    if args.mode == "async_stale" and info.is_chief:
        applier = modes.StaleApplier(sess, m, options)
        applier.start()
    batches = model.training_batches(dataset.shard(info.index, info.num_workers), args,
                                     seed=args.seed * 1000 + info.index)
    share = 1 if args.mode == "sync" else info.num_workers
    progress = loop.Progress(info, args, args.batch_size, start["global_step"], *initial,
                             expected_steps=(args.train_steps - start["global_step"]) // share)
    trace, rounds, ps_used = {}, {}, []
    # Progress toward --train_steps: the global step, or for async_stale the gradients pushed
    # (the global step there counts applications, which lag behind on purpose).
    done = start["pushed"] if args.mode == "async_stale" else start["global_step"]
    version = int(sess.run(m["refresh"]))
    while done < args.train_steps:
        images, labels = next(batches)
        feed = {m["images"]: images, m["labels"]: labels, m["version_in"]: version,
                m["local_step_in"]: progress.local_steps}
        if progress.devices is None:  # the first step runs traced: where the compute ran
            out, stats = models.traced_run(sess, m["step"], feed)
            progress.devices = models.placed_devices(stats, info.device)
            ps_used = sorted({"/job:ps/task:%d" % (d.task or 0) for d in map(
                tf.DeviceSpec.from_string, (s.device for s in stats.dev_stats if s.node_stats))
                if d.job == "ps"})
        else:
            out = sess.run(m["step"], feed_dict=feed, options=options)
        if args.mode == "sync":
            if info.is_chief:
                record(rounds, sess.run(m["aggregate"], options=options))
            out.update(sess.run(m["wait"], options=options))
        record(trace, {"version": version, "applied_to": out.get("applied_to"),
                       "span": out.get("span"), "grad_sum": out["grad_sum"],
                       "step": out["progress"]})
        version, done = int(out["version"]), int(out["progress"])
        progress.tick(done, float(out["loss"]))
    elapsed = progress.stop()
    sess.run(m["mark_done"])
    _wait_for_others(sess, m, info, start, applier, args.op_timeout_s)
    end = read_counters(sess, m)
    if info.is_chief:
        sessions.save_checkpoint(sess, saver, args.checkpoint_dir, end["global_step"])
    final = model.evaluate(sess, m["eval"], dataset, args)
    bootstrap.log("Worker %d (%s): %d local steps in %.2f s; after global step %d: test loss "
                  "%.4f, accuracy %.4f (%s)" % (info.index, args.mode, progress.local_steps,
                                                elapsed, end["global_step"], final[0], final[1],
                                                dataset.name))
    more = dict(counters={k: end[k] - start[k] for k in end},
                num_workers=info.num_workers, num_ps=info.num_ps, learning_rate=rate,
                trace=trace,
                ps_tasks_used=ps_used,
                ps_tasks_per_variable={name: sorted({d.split("/device:")[0] for d in devices})
                                       for name, devices in m["partition_devices"].items()})
    if rounds:
        more["rounds"] = rounds
    if applier is not None:
        more.update(applied=applier.applied, applier_runs=applier.runs)
    return progress.result(final[0], final[1], global_step=end["global_step"],
                           **model.extras(args, dataset, **more))


def record(columns, values):
    """Append each of VALUES (numbers or arrays) to its column, as plain JSON values."""
    for key, value in values.items():
        if value is not None:
            columns.setdefault(key, []).append(value.tolist() if hasattr(value, "tolist")
                                               else value)


def _wait_for_others(sess, m, info, start, applier, timeout):
    """Wait until every worker is done and every gradient pushed is applied (worker 0's applier
    drains the async_stale queue), so the counters and model each worker reports are final."""
    deadline = time.monotonic() + timeout
    counters = m["counters"]

    def wait(condition, failure):
        while not condition():
            if time.monotonic() > deadline:
                raise SystemExit("%s within %gs (--op_timeout_s)" % (failure, timeout))
            time.sleep(0.05)

    wait(lambda: sess.run(counters["done_workers"]) - start["done_workers"] >= info.num_workers,
         "other workers did not finish")
    if applier is not None:
        sess.run(m["close_queue"])      # no more pushes: the applier drains what is left
        applier.join(max(1.0, deadline - time.monotonic()))
        if applier.is_alive() or applier.error:
            raise SystemExit("the applier did not drain the gradient queue: %s"
                             % (applier.error or "timed out"))
    wait(lambda: sess.run(counters["applied"]) >= sess.run(counters["pushed"]),
         "the gradients pushed were not all applied")


def run(options, cluster, env=None):
    """This task's part: a worker trains and returns its results dict, a ps serves (None);
    --mode=local trains in this process alone (CLUSTER may be None then; ENV, a
    bootstrap.TaskEnv, is CLUSTER's by default). OPTIONS: a dict (or parsed flags) over the
    flags' defaults."""
    args = bootstrap.options(build_parser(), options)
    check_mode(args.mode)
    if args.mode == "local":
        return local.run(args, cluster, env)
    check_mode(args.mode, cluster)
    return sessions.run_between_graph(
        cluster, lambda: model.load(args),
        lambda info, server, dataset: train_distributed(info, server, dataset, args),
        seed=args.seed)


def main(argv, environ):
    """The command line and the environment, read here only; the result line at the end."""
    args = build_parser().parse_args(argv)
    check_mode(args.mode)
    local = args.mode == "local"
    cluster = None
    if not local or bootstrap.has_cluster(args, environ):
        cluster = bootstrap.cluster_from_args(args, environ)
    if not local:
        bootstrap.graph_mode()  # local mode makes its devices first, then turns graph mode on
    return bootstrap.report_and_exit(run(args, cluster, bootstrap.TaskEnv.from_environ(environ)))
