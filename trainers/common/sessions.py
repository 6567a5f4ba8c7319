"""Servers, sessions and checkpoints of the graph-mode (tf.compat.v1) trainers: a task's server,
its session (between-graph replication with device filters, or in-process without a server),
the start barrier, and checkpoints. Host side: TensorFlow and the standard library only."""
from trainers.common import bootstrap, checkpoints

# The shared variable every task increments at the start barrier.
BARRIER = "tfcluster_start_barrier"


def session_config(info, device_filters=True):
    """ConfigProto for a between-graph replica.

    Device filters keep a worker from waiting on other workers in CreateSession: without them a
    worker blocks forever once another worker has exited (TensorFlow issues #7376, #11753).
    In process there is no other task to filter out.
    """
    import tensorflow as tf
    config = tf.compat.v1.ConfigProto(allow_soft_placement=True,
                                      intra_op_parallelism_threads=info.env.intra_op_threads,
                                      inter_op_parallelism_threads=info.env.inter_op_threads)
    if device_filters and info.job != "ps" and not info.in_process:
        config.device_filters[:] = ["/job:ps", info.device]
    return config


class InProcessServer:
    """Stands in for the server of an in-process cluster: sessions are local."""
    target = ""


def start_server(info, config=None):
    if info.in_process:
        return InProcessServer()
    import tensorflow as tf
    server = tf.compat.v1.train.Server(info.cluster_spec(), job_name=info.job,
                                       task_index=info.index,
                                       config=config or session_config(info), start=True)
    bootstrap.log("%s serving at %s" % (info.label, info.jobs[info.job][info.index]))
    return server


def serve_forever(server, info):
    """A ps task serves until the launcher stops it: TensorFlow has no remote shutdown."""
    bootstrap.log("%s joined; it serves until tfcluster stops it" % info.label)
    server.join()


class ExistingServer:
    """Stands in for this task's server when it was started apart (trainers.grpc_server)."""
    def __init__(self, info):
        self.target = "grpc://" + info.jobs[info.job][info.index]


def run_between_graph(info, args, load_dataset, train, dataset=None, existing_servers=False):
    """The classic replica program: a ps serves until stopped (None); a worker trains and
    returns its results dict.

    A worker trains on DATASET, else on LOAD_DATASET(ARGS) (loaded on workers only, before the
    server starts): TRAIN(info, server, dataset, ARGS) returns the results dict. With
    EXISTING_SERVERS the workers use servers started apart. The graph (a new one: runs in one
    process do not share it) is seeded with --seed before TRAIN builds it."""
    if info.job not in ("ps", "worker"):
        raise SystemExit("--job_name must be ps or worker, not %r" % info.job)
    if existing_servers and info.job == "ps":
        raise SystemExit("with --existing_servers only workers run this program; "
                         "start the ps servers with `python -m trainers.grpc_server`")
    if info.job == "worker" and dataset is None:
        dataset = load_dataset(args)
    import tensorflow as tf
    with tf.Graph().as_default():
        bootstrap.seed_everything(args.seed)
        server = ExistingServer(info) if existing_servers else start_server(info)
        if info.job == "ps":
            serve_forever(server, info)
            return None
        return train(info, server, dataset, args)


def session_manager(ready_op=None, local_init_op=None, ready_for_local_init_op=None):
    """TensorFlow's SessionManager polling every half second instead of every 30 s."""
    import tensorflow as tf
    v1 = tf.compat.v1
    return v1.train.SessionManager(
        local_init_op=local_init_op,
        ready_op=ready_op if ready_op is not None else v1.report_uninitialized_variables(),
        ready_for_local_init_op=ready_for_local_init_op, recovery_wait_secs=0.5)


def prepare_session(info, server, manager, init_op, saver, checkpoint_dir, config,
                    max_wait_secs=300):
    """The chief restores the last checkpoint or initialises; the others wait for it."""
    if info.in_process:
        localize_devices()
    if info.is_chief:
        sess = restore_or_initialize(manager, server.target, init_op, saver, checkpoint_dir,
                                     config)
    else:
        sess = manager.wait_for_session(server.target, config=config, max_wait_secs=max_wait_secs)
    return sess


def restore_or_initialize(manager, target, init_op, saver, checkpoint_dir, config):
    """MANAGER's session on TARGET: restored from CHECKPOINT_DIR's newest complete checkpoint
    (checkpoints.latest), else initialised by INIT_OP."""
    found = checkpoints.latest(checkpoint_dir, bootstrap.log)
    if found is not None:
        bootstrap.log("restoring checkpoint %s" % found.folder)
    return manager.prepare_session(target, init_op=init_op, saver=saver, config=config,
                                   checkpoint_filename_with_path=found and found.entry)


def localize_devices(graph=None):
    """Every op of GRAPH (the default graph) on this process's devices: its job and task are
    dropped, its device type and index kept. A local session cannot honour /job:ps placements
    that ops are colocated on, even with soft placement."""
    import tensorflow as tf
    graph = graph or tf.compat.v1.get_default_graph()
    for op in graph.get_operations():
        if op.device:
            spec = tf.DeviceSpec.from_string(op.device)
            op._set_device(spec.replace(job=None, replica=None, task=None).to_string())


def graph_session(info, server, checkpoint_dir, config=None, **manager_ops):
    """(session, saver) of a between-graph replica, built after its graph: the chief restores
    or initialises, the others wait. MANAGER_OPS go to session_manager()."""
    import tensorflow as tf
    v1 = tf.compat.v1
    start_barrier_ops(info)
    saver = v1.train.Saver(max_to_keep=2)
    sess = prepare_session(info, server, session_manager(**manager_ops),
                           v1.global_variables_initializer(), saver, checkpoint_dir,
                           config if config is not None else session_config(info))
    return sess, saver


def start_barrier_ops(info):
    """The graph's start barrier, for start_barrier(): each worker leaves a token in every
    other worker's queue on ps:0, then takes num_workers - 1 tokens from its own."""
    import tensorflow as tf
    v1 = tf.compat.v1
    count = info.num_workers
    if count < 2 or not info.num_ps or info.job != "worker":
        return
    with v1.device("/job:ps/task:0/cpu:0"):
        queues = [v1.FIFOQueue(count, [tf.int32], shapes=[[]], name="start_barrier_%d" % i,
                               shared_name="%s_%d" % (BARRIER, i)) for i in range(count)]
        arrive = tf.group(*[q.enqueue(info.index) for i, q in enumerate(queues)
                            if i != info.index])
        wait = queues[info.index].dequeue_many(count - 1)
    v1.add_to_collection(BARRIER, arrive)
    v1.add_to_collection(BARRIER, wait)


def start_barrier(sess, info, timeout_s=600):
    """Wait until every worker got here, so that all of them train: without it a worker whose
    start (TensorFlow's import) was slower can find the target step already reached."""
    import tensorflow as tf
    ops = tf.compat.v1.get_collection(BARRIER)
    if not ops or info.env.restarted:
        return  # a restarted worker rejoins a job under way: nobody waits for it any more
    sess.run(ops[0])
    try:
        sess.run(ops[1], options=timeout(timeout_s))
    except tf.errors.DeadlineExceededError:
        raise SystemExit("%s: the other workers did not start within %ds"
                         % (info.label, timeout_s))


def timeout(seconds):
    """RunOptions that give a sess.run up after SECONDS (DeadlineExceededError)."""
    import tensorflow as tf
    return tf.compat.v1.RunOptions(timeout_in_ms=int(seconds * 1000))


def finished_within(sess, fetches, seconds, warning):
    """Run FETCHES (a wait for the other tasks) for at most SECONDS: True when it finished,
    else False, with WARNING logged."""
    import tensorflow as tf
    try:
        sess.run(fetches, options=timeout(seconds))
        return True
    except tf.errors.DeadlineExceededError:
        bootstrap.log("WARNING: " + warning)
        return False


def save_checkpoint(sess, saver, checkpoint_dir, global_step):
    """The chief's checkpoint of GLOBAL_STEP, committed whole into CHECKPOINT_DIR (none
    without one); its folder."""
    if not checkpoint_dir:
        return None
    found = checkpoints.save_graph(sess, saver, checkpoint_dir, global_step)
    bootstrap.log("saved checkpoint %s" % found.folder)
    return found.folder
