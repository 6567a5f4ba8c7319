"""What every trainer shares: the cluster, flags, seeds, and the entry point (`entry`: the one
place that reads the command line and the environment, and prints the result line). Servers,
sessions and checkpoints are sessions.py; the training loop itself (clock, metrics,
TensorBoard, result schema) is loop.py.

Host side: imports TensorFlow, numpy and the standard library only, never tfcluster.
"""
import argparse
import dataclasses
import functools
import json
import os
import random
import sys
import time

from tfcluster_agent import clusterspec, protocol

DEFAULT_SEED = 0


@dataclasses.dataclass(frozen=True)
class TaskEnv:
    """What the launcher tells a task through its environment, read once, at the entry point."""
    run_dir: str = ""           # TFCLUSTER_RUN_DIR: TensorBoard events go under it
    restarted: bool = False     # TFCLUSTER_RESTARTS: a restarted task skips the start barrier
    intra_op_threads: int = 0   # TF_NUM_INTRAOP_THREADS (0: TensorFlow chooses)
    inter_op_threads: int = 0   # TF_NUM_INTEROP_THREADS
    drain_file: str = ""        # TFCLUSTER_DRAIN_FILE: the termination notice appears there
    cluster_file: str = ""      # TFCLUSTER_CLUSTER_FILE: the new cluster, when some tasks moved

    @classmethod
    def from_environ(cls, environ):
        return cls(run_dir=environ.get("TFCLUSTER_RUN_DIR", ""),
                   drain_file=environ.get(protocol.DRAIN_FILE_ENV, ""),
                   cluster_file=environ.get(protocol.CLUSTER_FILE_ENV, ""),
                   restarted=bool(environ.get("TFCLUSTER_RESTARTS")),
                   intra_op_threads=int(environ.get("TF_NUM_INTRAOP_THREADS", 0) or 0),
                   inter_op_threads=int(environ.get("TF_NUM_INTEROP_THREADS", 0) or 0))


class ClusterInfo(protocol.TaskNames):
    """This task's place in the cluster: {job: [host:port]}, its job name and index, its label
    (worker:0) and file name (worker-0), and its environment (a TaskEnv).

    IN_PROCESS: no server; every job's devices are this process's (a local session, soft
    placement), so a between-graph program runs as one task in a test."""

    def __init__(self, jobs, job, index, env=None, in_process=False):
        self.jobs = {name: list(addresses) for name, addresses in jobs.items() if addresses}
        self.job = job
        self.index = index
        self.env = env or TaskEnv()
        self.in_process = in_process

    @property
    def num_workers(self):
        return len(self.jobs.get("worker", []))

    @property
    def num_ps(self):
        return len(self.jobs.get("ps", []))

    @property
    def is_chief(self):
        """The chief task, or worker 0 when the cluster has no chief job."""
        if "chief" in self.jobs:
            return self.job == "chief" and self.index == 0
        return self.job == "worker" and self.index == 0

    @property
    def device(self):
        return "/job:%s/task:%d" % (self.job, self.index)

    def compute_device(self, num_gpus=0):
        """Where this task computes: its GPU (index modulo NUM_GPUS) or its CPU."""
        if num_gpus > 0:
            return "%s/device:GPU:%d" % (self.device, self.index % num_gpus)
        return "%s/cpu:0" % self.device

    def cluster_spec(self):
        import tensorflow as tf
        return tf.train.ClusterSpec(self.jobs)


def add_cluster_flags(parser):
    """The classic flags; TF_CONFIG is used when --job_name is not given."""
    group = parser.add_argument_group("cluster (default: from TF_CONFIG)")
    group.add_argument("--ps_hosts", default="", help="comma-separated host:port of the ps tasks")
    group.add_argument("--worker_hosts", default="", help="comma-separated host:port of the workers")
    group.add_argument("--cluster_spec", default="",
                       help="dist_test form: 'worker|h:p;h:p,ps|h:p' (instead of the two above)")
    group.add_argument("--job_name", default="", help="ps or worker (or chief)")
    group.add_argument("--task_index", "--task_id", type=int, default=0, dest="task_index",
                       help="index of this task within its job")
    return parser


def parse_dist_test_spec(text):
    """--cluster_spec's {job: [host:port]}; a bad spec ends the program in one line."""
    try:
        return clusterspec.parse_cluster_spec(text)
    except clusterspec.ClusterSpecError as err:
        raise SystemExit("--cluster_spec: %s" % err) from None


def cluster_from_args(args, environ):
    """The cluster of the command line ARGS, else of ENVIRON's TF_CONFIG, with ENVIRON's TaskEnv:
    the one place a trainer reads its environment."""
    env = TaskEnv.from_environ(environ)
    if args.job_name:
        if args.cluster_spec:
            jobs = parse_dist_test_spec(args.cluster_spec)
        else:
            jobs = {"ps": [h for h in args.ps_hosts.split(",") if h],
                    "worker": [h for h in args.worker_hosts.split(",") if h]}
        return ClusterInfo(jobs, args.job_name, args.task_index, env)
    return cluster_from_tf_config(environ)


def cluster_if_given(args, environ):
    """The cluster the command line or TF_CONFIG names; None when neither does (a program that
    can run alone, outside any cluster)."""
    if args.job_name or environ.get("TF_CONFIG"):
        return cluster_from_args(args, environ)
    return None


def cluster_from_tf_config(environ):
    if environ.get("TF_CONFIG"):
        config = json.loads(environ["TF_CONFIG"])
        return ClusterInfo(config["cluster"], config["task"]["type"],
                           int(config["task"]["index"]), TaskEnv.from_environ(environ))
    raise SystemExit("no cluster given: pass --job_name with --ps_hosts/--worker_hosts "
                     "(or --cluster_spec), or set TF_CONFIG")


def in_process_cluster(jobs=None, job="worker", index=0, env=None):
    """A cluster whose tasks all run in this process (tests): JOBS default to one worker."""
    jobs = jobs or {"worker": ["localhost:0"]}
    return ClusterInfo(jobs, job, index, env, in_process=True)


def options(parser, given):
    """GIVEN (a dict, or the parsed command line) over PARSER's defaults, as a frozen dataclass
    whose fields are the flags' destinations; a key the parser does not know is an error."""
    values = vars(parser.parse_args([]))
    given = vars(given) if isinstance(given, argparse.Namespace) else dict(given)
    unknown = sorted(set(given) - set(values))
    if unknown:
        raise TypeError("unknown option(s) %s; known: %s" % (", ".join(unknown),
                                                            ", ".join(sorted(values))))
    values.update(given)
    cls = dataclasses.make_dataclass("Options", sorted(values), frozen=True)
    return cls(**values)


def choose(what, value, allowed):
    """VALUE when ALLOWED has it; else the program ends in one line naming WHAT (a flag) and the
    values allowed."""
    if value not in allowed:
        raise SystemExit("unknown %s %r: choose one of %s" % (what, value, ", ".join(allowed)))
    return value


def add_mnist_flags(parser):
    """Where the MNIST-shaped examples read their data."""
    parser.add_argument("--data_dir", default="/tmp/mnist-data", help="MNIST IDX .gz files")
    parser.add_argument("--dataset", default="mnist",
                        choices=["mnist", "fashion_mnist", "digits"],
                        help="digits: scikit-learn's bundled 8x8 digits, for offline runs")
    return parser


def add_training_flags(parser, log_every=0):
    """--seed and --log_every, which every trainer's loop (Progress) reads."""
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED,
                        help="seeds python, numpy and TensorFlow (initial weights, batch order)")
    parser.add_argument("--log_every", type=int, default=log_every,
                        help="a metrics point every N local steps (0: about ten per task)")
    return parser


def seed_everything(seed):
    """Python, numpy and TensorFlow (the default graph in graph mode, the global seed eagerly)."""
    import numpy as np
    import tensorflow as tf
    random.seed(seed)
    np.random.seed(seed)
    tf.random.set_seed(seed)


def add_checkpoint_flags(parser, default_dir=""):
    parser.add_argument("--checkpoint_dir", default=default_dir,
                        help="where the chief saves checkpoints; a new run resumes from the last one")
    parser.add_argument("--save_every_steps", type=int, default=0,
                        help="chief saves a checkpoint every N global steps (0: only at the end)")
    return parser


def log(message):
    print(message, flush=True)


def make_parser(description, prog=None):
    """PROG: the program's name in usage lines (default: the file run, argv[0])."""
    return argparse.ArgumentParser(prog=prog, description=description,
                                   formatter_class=argparse.ArgumentDefaultsHelpFormatter)


def trainer_parser(doc, mnist=True, checkpoints=True):
    """The parser a trainer starts from: DOC's first line, the cluster flags, --seed and
    --log_every, and unless switched off the checkpoint flags and where MNIST data is read."""
    parser = make_parser(doc.splitlines()[0])
    add_cluster_flags(parser)
    add_training_flags(parser)
    if checkpoints:
        add_checkpoint_flags(parser)
    if mnist:
        add_mnist_flags(parser)
    return parser


class Timer:
    def __init__(self):
        self.start = time.monotonic()

    @property
    def seconds(self):
        return time.monotonic() - self.start


# ---------------------------------------------------------------- the entry point

def quiet_tensorflow():
    """TensorFlow's C++ INFO lines drown the training output; warnings still show."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")


def main_guard(main):
    """Run a trainer's MAIN(argv, environ) quietly, on this process's command line and
    environment; Ctrl-C exits 130. A SystemExit message (bad flags, missing data) prints and
    exits 1, without a traceback."""
    quiet_tensorflow()
    try:
        return main(sys.argv[1:], os.environ)
    except KeyboardInterrupt:
        return 130


# Keras 3 and tf-keras (TF_USE_LEGACY_KERAS=1).
KERAS_PACKAGES = ("keras", "tf_keras")


def import_tensorflow():
    """Imports TensorFlow for a trainer (none uses Keras), at about half its CPU cost:
    - Python's cycle collector paused, and what the import made kept out of later collections
      (gc.freeze): the collector's passes were a quarter of the import's CPU seconds (perf);
    - without the eager import of Keras's optimizers in TensorFlow's __init__, which it skips when
      Keras cannot be imported. Keras 3 brings scikit-learn and SciPy with it (its scikit-learn
      wrappers; the trainers' digits come with scikit-learn), tf-keras ~500 modules of its own:
      together about a third of the import (benchmarks/RESULTS.md). Both are unimportable for
      the import's duration only, so `tf.keras` still loads on first use, as after a plain
      import."""
    import gc
    blocked = [name for name in KERAS_PACKAGES if name not in sys.modules]
    gc.disable()
    for name in blocked:
        sys.modules[name] = None
    try:
        import tensorflow as tf
    finally:
        for name in blocked:
            del sys.modules[name]
        gc.freeze()
        gc.enable()
    restore_keras_paths(tf)


def restore_keras_paths(tf):
    """The folders TensorFlow's __init__ puts first in tf.__path__, where `import
    tensorflow.keras` finds Keras's API; None in those it looked up while Keras was blocked."""
    from tensorflow.python.tools import module_util
    legacy = getattr(tf, "_tf_uses_legacy_keras", False)  # its reading of TF_USE_LEGACY_KERAS
    # __init__ prepends "keras._tf_keras.keras"'s parent, then the Keras API's in front of it.
    wanted = ("tf_keras.api._v2.keras" if legacy else "keras.api._v2.keras", "keras._tf_keras.keras")
    for index, name in enumerate(wanted):
        if len(tf.__path__) > index and tf.__path__[index] is None:
            tf.__path__[index] = module_util.get_parent_dir_for_name(name)


def graph_mode():
    """The process runs TensorFlow 1.x-style graphs (the entry point of a graph trainer)."""
    import tensorflow as tf
    tf.compat.v1.disable_eager_execution()


def ensure_inter_op_threads(environ, minimum):
    """At least MINIMUM inter-op threads in ENVIRON, before TensorFlow starts (it reads
    TF_NUM_INTEROP_THREADS then) and before the TaskEnv is read from it."""
    current = int(environ.get("TF_NUM_INTEROP_THREADS", 0) or 0)
    if current and current < minimum:
        environ["TF_NUM_INTEROP_THREADS"] = str(minimum)


def entry(build_parser, run, **how):
    """A trainer's `if __name__ == "__main__":` line: main() on this process's command line and
    environment, quietly; exits with its status. HOW: main()'s keywords."""
    raise SystemExit(main_guard(functools.partial(main, build_parser, run, **how)))


def main(build_parser, run, argv, environ, graph=False, find_cluster=cluster_from_args,
         inter_op_threads=0, grpc_options=""):
    """A trainer's command line ARGV and environment ENVIRON, read here only: the flags of
    BUILD_PARSER(), the cluster FIND_CLUSTER(args, environ) (default: the flags', else
    TF_CONFIG's; None: the program runs alone), graph mode when GRAPH (a bool, or a function of
    the flags), at least INTER_OP_THREADS TensorFlow inter-op threads, GRPC_OPTIONS as
    TensorFlow's gRPC channel options unless ENVIRON sets its own. Then RUN(args, cluster),
    or alone RUN(args, None, env=the TaskEnv), and the result line of a task that trained (a ps
    has none). Returns the exit status: 0, or protocol.DRAINED_EXIT when the task ended on the
    termination notice."""
    args = build_parser().parse_args(argv)
    if inter_op_threads:
        ensure_inter_op_threads(environ, inter_op_threads)
    if grpc_options:
        environ.setdefault("TF_GRPC_DEFAULT_OPTIONS", grpc_options)
    cluster = find_cluster(args, environ)
    import_tensorflow()
    if graph(args) if callable(graph) else graph:
        graph_mode()
    if cluster is None:
        result = run(args, None, env=TaskEnv.from_environ(environ))
    else:
        result = run(args, cluster)
    if result is not None:
        protocol.report_result(result)  # the one line the launcher collects into run.json
        if result.get("drained"):
            return protocol.DRAINED_EXIT
    return 0
