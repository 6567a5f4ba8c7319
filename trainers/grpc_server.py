"""A bare TensorFlow gRPC server, like dist_test's grpc_tensorflow_server.py: start and serve.

For clusters whose servers are started apart from the training program (mnist_replica
--existing_servers connects to them).
"""
from trainers.common import bootstrap, sessions


def build_parser():
    parser = bootstrap.make_parser(__doc__.splitlines()[0])
    parser.add_argument("--cluster_spec", default="",
                        help="'worker|h:p;h:p,ps|h:p' (default: the cluster in TF_CONFIG)")
    parser.add_argument("--job_name", default="", help="this server's job")
    parser.add_argument("--task_id", type=int, default=0, help="this server's index in its job")
    parser.add_argument("--gpu_memory_fraction", type=float, default=1.0,
                        help="share of each GPU's memory this server may take")
    return parser


def start(options, cluster):
    """This task's server, started (it serves until the process ends: TensorFlow has no
    remote shutdown). OPTIONS: a dict (or parsed flags) over the flags' defaults; CLUSTER: a
    bootstrap.ClusterInfo."""
    args = bootstrap.options(build_parser(), options)
    import tensorflow as tf
    config = sessions.session_config(cluster, device_filters=False)
    config.gpu_options.per_process_gpu_memory_fraction = args.gpu_memory_fraction
    return tf.compat.v1.train.Server(cluster.cluster_spec(), job_name=cluster.job,
                                     task_index=cluster.index, config=config, start=True)


def find_cluster(args, environ):
    """--cluster_spec with --job_name and --task_id, else the cluster in TF_CONFIG."""
    if args.cluster_spec:
        return bootstrap.ClusterInfo(bootstrap.parse_dist_test_spec(args.cluster_spec),
                                     args.job_name, args.task_id,
                                     bootstrap.TaskEnv.from_environ(environ))
    return bootstrap.cluster_from_tf_config(environ)


def run(options, cluster):
    """Start this task's server and serve until stopped (no result)."""
    sessions.serve_forever(start(options, cluster), cluster)


if __name__ == "__main__":
    bootstrap.entry(build_parser, run, find_cluster=find_cluster)
