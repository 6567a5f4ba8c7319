"""CIFAR-10 CNN: five ways of sharing parameters on ps tasks, or device towers on one host.

Seed 004. The network and its inputs are in model.py, the ps modes (sync, async,
async_stale, hogwild, multi_ps) in modes.py and a worker's loop in ps.py, the local towers in
local.py; this file holds the flags and run(). Plain SGD, --learning_rate 0.1, batch 128.

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
from trainers.cifar10 import local, model, modes, ps
from trainers.common import bootstrap, sessions

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
    bootstrap.choose("--mode", mode, MODES)
    if info is not None and mode != "local":
        if info.num_ps < 1:
            raise SystemExit("--mode %s needs at least one ps task" % mode)
        if mode == "multi_ps" and info.num_ps < 2:
            raise SystemExit("--mode multi_ps partitions the variables across ps tasks but the "
                             "cluster has %d: launch with --ps 2 (or the cifar10_multi_ps example)"
                             % info.num_ps)
    return mode


def find_cluster(args, environ):
    """The cluster the flags or TF_CONFIG name; --mode local may run without one. The mode is
    checked first."""
    if check_mode(args.mode) == "local":
        return bootstrap.cluster_if_given(args, environ)
    return bootstrap.cluster_from_args(args, environ)


def run(options, cluster=None, dataset=None, env=None):
    """This task's part: a worker trains and returns its results dict, a ps serves (None);
    --mode=local trains in this process alone (CLUSTER may be None then; ENV, a
    bootstrap.TaskEnv, is CLUSTER's by default)."""
    args = bootstrap.options(build_parser(), options)
    check_mode(args.mode)
    if args.mode == "local":
        return local.train(dataset if dataset is not None else model.load_dataset(args), args,
                           cluster, env)
    check_mode(args.mode, cluster)
    return sessions.run_between_graph(cluster, args, model.load_dataset, ps.train, dataset)
