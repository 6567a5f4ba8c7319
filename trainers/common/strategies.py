"""The one factory of the TF2 trainers' tf.distribute strategies: a strategy by name, over a
task's cluster (as tensorflow/models' distribute_utils picks one from a string). Create it
before any other TensorFlow op: that is when it reads the cluster. Host side."""
from trainers.common import bootstrap

STRATEGIES = ("multi_worker_mirrored", "parameter_server")
# How ParameterServerStrategy splits each variable across the ps tasks.
PARTITIONERS = ("fixed", "min_size", "none")
# MultiWorkerMirroredStrategy's all-reduce: ring over gRPC, NCCL on GPUs, or TensorFlow's choice.
COLLECTIVES = ("auto", "ring", "nccl")


def make_strategy(name, info, partitioner="fixed", num_shards=0, min_shard_bytes=256 << 10,
                  collective="auto"):
    """The strategy NAME (one of STRATEGIES) over INFO's cluster; an unknown name, partitioner
    or collective ends the program in one line that lists the allowed values.

    parameter_server: variables split by PARTITIONER (fixed: NUM_SHARDS shards, 0: one per ps;
    min_size: shards of at least MIN_SHARD_BYTES, at most one per ps; none: no split).
    multi_worker_mirrored: all-reduce by COLLECTIVE; in process, on this process's devices
    alone (no cluster to reach)."""
    bootstrap.choose("strategy", name, STRATEGIES)
    bootstrap.choose("--partitioner", partitioner, PARTITIONERS)
    bootstrap.choose("--collective", collective, COLLECTIVES)
    import tensorflow as tf
    distribute = tf.distribute
    if name == "parameter_server":
        return distribute.ParameterServerStrategy(
            resolver(tf, info), variable_partitioner=variable_partitioner(
                tf, partitioner, info.num_ps, num_shards, min_shard_bytes))
    implementation = getattr(distribute.experimental.CommunicationImplementation,
                             collective.upper())
    return distribute.MultiWorkerMirroredStrategy(
        cluster_resolver=resolver(tf, info, tf.train.ClusterSpec({}) if info.in_process else None),
        communication_options=distribute.experimental.CommunicationOptions(
            implementation=implementation))


def resolver(tf, info, spec=None):
    """INFO's task in SPEC (default: INFO's cluster), as the strategies read a cluster."""
    return tf.distribute.cluster_resolver.SimpleClusterResolver(
        spec if spec is not None else info.cluster_spec(), task_type=info.job,
        task_id=info.index, rpc_layer="grpc")


def variable_partitioner(tf, name, num_ps, num_shards, min_shard_bytes):
    """The variable partitioner NAME (one of PARTITIONERS) over NUM_PS ps tasks."""
    partitioners = tf.distribute.experimental.partitioners
    if name == "fixed":
        return partitioners.FixedShardsPartitioner(num_shards=num_shards or num_ps)
    if name == "min_size":
        return partitioners.MinSizePartitioner(min_shard_bytes=min_shard_bytes,
                                               max_shards=num_ps)
    return None
