"""How the workers of seed 004 share the CIFAR-10 parameters on the ps tasks (--mode).

Every worker trains a local copy of the parameters: it computes gradients on its copy, sends
them to the ps and gets parameters back (a "pull"). The modes differ in when the ps applies
gradients and what the reply carries:

  sync         each round the ps applies the mean of ONE gradient from EVERY worker, then
               replies to all of them (worker 0 aggregates; the others wait for its token)
  async        the ps applies a worker's gradients under a lock (a one-token queue on the ps)
               and replies with the parameters read after that update, still under the lock
  async_stale  the ps replies at once with its current parameters; the gradients wait in a
               queue on the ps and an applier thread of worker 0 applies them later (all
               those waiting in one update, which for SGD equals applying them in turn)
  hogwild      lock-free: apply ops with use_locking=False, and the reply does not wait for
               them
  multi_ps     like hogwild, but every variable is partitioned across 2+ ps tasks and the
               reply waits for this worker's update
Every mode but sync divides the learning rate by workers + 1 (see __init__.py).

Each step returns what it observed, so a test can check a mode by what happened:
  version      the global step read just after the parameters a reply carried: never older
               than those parameters (the next gradient is computed on them)
  applied_to   the global step of the parameters a gradient was applied to
  span         the ps clock (tf.timestamp on ps:0) as this worker's update starts, and once
               it is applied and the reply received (async: the time it held the lock)
  grad_sum     the sum of every element of this worker's gradient (float64)
The sync aggregator also returns, per round, the workers and versions of the gradients it took
and the change of the sum of all parameters (float64); the async_stale applier the worker,
local step, version and applied_to of every gradient it applied.
"""
import threading

from trainers.cifar10 import model

MODES = ("sync", "async", "async_stale", "hogwild", "multi_ps")
COUNTERS = ("pushed", "applied", "done_workers")
PS0 = "/job:ps/task:0/cpu:0"


def parts_of(param):
    """The variables holding PARAM: its partitions, or itself."""
    return list(param) if hasattr(param, "_get_variable_list") else [param]


def value_of(param):
    return param.as_tensor() if hasattr(param, "_get_variable_list") else param.read_value()


def split_gradient(tf, grad, param):
    parts = parts_of(param)
    if len(parts) == 1:
        return [(grad, parts[0])]
    sizes = [int(p.shape[0]) for p in parts]
    return list(zip(tf.split(grad, sizes, axis=0), parts))


def total(tf, tensors):
    """Sum of every element of TENSORS, in float64."""
    return tf.add_n([tf.reduce_sum(tf.cast(t, tf.float64)) for t in tensors])


def build_model(dataset, args, info, learning_rate):
    """The between-graph model of one worker in ps mode ARGS.mode; a dict of ops and tensors."""
    import tensorflow as tf
    v1 = tf.compat.v1
    if args.num_gpus > 0:
        worker_device = "%s/device:GPU:%d" % (info.device, info.index % args.num_gpus)
    else:
        worker_device = "%s/cpu:0" % info.device
    specs = model.param_specs(args, dataset.num_classes)
    partitioner = v1.fixed_size_partitioner(info.num_ps) if args.mode == "multi_ps" else None
    setter = v1.train.replica_device_setter(worker_device=worker_device, ps_device="/job:ps/cpu:0",
                                            cluster=info.cluster_spec())
    with v1.device(setter):
        global_step = v1.train.get_or_create_global_step()
        with v1.variable_scope("params", partitioner=partitioner):
            params = [v1.get_variable(s[0], s[1], initializer=model.initializer(
                tf, s, args.init, args.seed)) for s in specs]
        with v1.variable_scope("counters"):
            counters = {name: v1.get_variable(name, [], tf.int64, v1.zeros_initializer(),
                                              trainable=False) for name in COUNTERS}
    with v1.device(worker_device):
        local = [v1.get_variable("local/" + s[0], s[1], initializer=v1.zeros_initializer(),
                                 trainable=False, collections=[v1.GraphKeys.LOCAL_VARIABLES])
                 for s in specs]
        images, labels = model.placeholders(tf, args, "train")
        loss, _ = model.loss_and_accuracy(tf, model.inference(tf, images, local), labels)
        grads = tf.gradients(loss, local)
        if args.clip_norm > 0:  # one stale gradient must not throw the model off (__init__.py)
            grads, _ = tf.clip_by_global_norm(grads, args.clip_norm)
        version_in = v1.placeholder(tf.int64, [], name="version_in")
        local_step_in = v1.placeholder(tf.int64, [], name="local_step_in")
        evaluation = model.build_eval(tf, args, [value_of(p) for p in params])

    def pull(after):
        """Copy the ps parameters into the local copy after the ops in AFTER; returns the
        global step read after the copy (the version of what was read, or newer)."""
        with tf.control_dependencies(after):
            copied = tf.group(*[l.assign(value_of(p)) for l, p in zip(local, params)])
        with tf.control_dependencies([copied]):
            return global_step.read_value()

    def apply(gradients, use_locking):
        optimizer = v1.train.GradientDescentOptimizer(learning_rate, use_locking=use_locking)
        pairs = []
        for grad, param in zip(gradients, params):
            pairs.extend(split_gradient(tf, grad, param))
        return optimizer.apply_gradients(pairs)

    def ps_clock(after):
        with v1.device(PS0), tf.control_dependencies(after):
            return tf.timestamp()

    m = dict(global_step=global_step, params=params, counters=counters, images=images,
             labels=labels, version_in=version_in, local_step_in=local_step_in,
             eval=evaluation, local_init=pull([]).op, refresh=pull([]),
             partition_devices={s[0]: [v.device for v in parts_of(p)]
                                for s, p in zip(specs, params)})
    parts = dict(tf=tf, m=m, info=info, grads=grads, apply=apply, pull=pull, clock=ps_clock,
                 step=global_step, counters=counters)
    with v1.device(worker_device):
        m["step"] = {"loss": loss, "grad_sum": total(tf, grads)}
        BUILDERS[args.mode](args=args, shapes=[s[1] for s in specs], **parts)
        m["mark_done"] = counters["done_workers"].assign_add(1)
    return m


def _build_sync(tf, m, info, grads, apply, pull, step, counters, shapes, **_):
    """Workers push (id, version, gradients) and wait for a token; worker 0 applies the mean of
    one gradient per worker and hands every worker a token carrying the new global step."""
    v1 = tf.compat.v1
    n = info.num_workers
    with v1.device(PS0):
        grad_queue = v1.FIFOQueue(n, [tf.int32, tf.int64] + [tf.float32] * len(shapes),
                                  [[], []] + shapes, shared_name="cifar10_sync_gradients",
                                  name="sync_gradients")
        tokens = [v1.FIFOQueue(n, [tf.int64], [[]], shared_name="cifar10_sync_token_%d" % i,
                               name="sync_token_%d" % i) for i in range(n)]
    enqueue = grad_queue.enqueue([tf.constant(info.index, tf.int32), m["version_in"]] + grads)
    with tf.control_dependencies([enqueue]):
        m["step"]["pushed"] = counters["pushed"].assign_add(1)
    # Only worker 0 runs this; the others are waiting for their tokens meanwhile.
    taken = grad_queue.dequeue_many(n)
    with v1.device(PS0):
        with tf.control_dependencies(taken):
            before = total(tf, [value_of(p) for p in m["params"]])
            applied_to = step.read_value()
        with tf.control_dependencies([before, applied_to]):
            applied = apply([tf.reduce_mean(g, axis=0) for g in taken[2:]], use_locking=True)
        with tf.control_dependencies([applied]):
            after = total(tf, [value_of(p) for p in m["params"]])
            new_step = step.assign_add(1)
            marked = counters["applied"].assign_add(n)
    with tf.control_dependencies([new_step, marked]):
        handed = tf.group(*[q.enqueue([new_step]) for q in tokens])
    with tf.control_dependencies([handed]):
        m["aggregate"] = {"workers": tf.identity(taken[0]), "versions": tf.identity(taken[1]),
                          "applied_to": tf.identity(applied_to),
                          "update_sum": after - before}
    token = tokens[info.index].dequeue()
    m["wait"] = {"progress": token, "version": pull([token])}


def _build_async(tf, m, info, grads, apply, pull, clock, step, counters, **_):
    """Acquire the ps lock (take its one token), apply, read the parameters back, release."""
    v1 = tf.compat.v1
    with v1.device(PS0):
        lock = v1.FIFOQueue(1, [tf.int32], [[]], shared_name="cifar10_async_lock",
                            name="async_lock")
    m["lock_size"] = lock.size()
    m["lock_init"] = lock.enqueue([tf.constant(0, tf.int32)])
    with tf.control_dependencies(grads):          # compute first, then queue for the lock
        token = lock.dequeue()
    start = clock([token])
    with tf.control_dependencies([start]):
        applied_to = step.read_value()
    with tf.control_dependencies([applied_to]):
        applied = apply(grads, use_locking=True)
    with tf.control_dependencies([applied]):
        new_step = step.assign_add(1)
        marks = [counters["applied"].assign_add(1), counters["pushed"].assign_add(1)]
    version = pull([new_step] + marks)
    end = clock([version])
    with tf.control_dependencies([end]):
        release = lock.enqueue([token])
    with tf.control_dependencies([release]):
        m["step"].update(progress=tf.identity(new_step), version=tf.identity(version),
                         applied_to=tf.identity(applied_to), span=tf.stack([start, end]))


def _build_stale(tf, m, info, args, grads, apply, pull, step, counters, shapes, **_):
    """Push gradients into a ps queue and take the current parameters at once; worker 0's
    applier thread drains the queue."""
    v1 = tf.compat.v1
    with v1.device(PS0):
        queue = v1.FIFOQueue(args.max_pending, [tf.int32, tf.int64, tf.int64]
                             + [tf.float32] * len(shapes), [[], [], []] + shapes,
                             shared_name="cifar10_stale_gradients", name="stale_gradients")
    version = pull(grads)                         # current parameters, not waiting for ours
    enqueue = queue.enqueue([tf.constant(info.index, tf.int32), m["local_step_in"],
                             m["version_in"]] + grads)
    with tf.control_dependencies([enqueue, version]):
        pushed = counters["pushed"].assign_add(1)
    m["step"].update(progress=pushed, version=version)
    # The applier takes the first gradient waiting and every other one waiting, and applies
    # their sum in one update. The step moves first, so a version read never understates
    # what the parameters hold. Once the queue is closed and empty the applier ends.
    first = queue.dequeue()
    with tf.control_dependencies(first):
        waiting = queue.size()
    rest = queue.dequeue_many(waiting)
    with tf.control_dependencies(first + rest):
        applied_to = step.read_value()
    count = 1 + tf.cast(waiting, tf.int64)
    with tf.control_dependencies([applied_to]):
        bumped = step.assign_add(count)
    with tf.control_dependencies([bumped]):
        applied = apply([f + tf.reduce_sum(r, axis=0) for f, r in zip(first[3:], rest[3:])],
                        use_locking=True)
    with tf.control_dependencies([applied]):
        marked = counters["applied"].assign_add(count)
    with tf.control_dependencies([marked]):
        m["apply_waiting"] = {
            "worker": tf.concat([[first[0]], rest[0]], 0),
            "local_step": tf.concat([[first[1]], rest[1]], 0),
            "version": tf.concat([[first[2]], rest[2]], 0),
            "applied_to": tf.fill([count], applied_to)}
    m["close_queue"] = queue.close()


def _build_lock_free(tf, m, args, grads, apply, pull, clock, step, counters, **_):
    """Apply without any lock (use_locking=False). hogwild replies with the parameters as they
    are at once; multi_ps replies after its update reached every ps."""
    with tf.control_dependencies(grads):
        pushed = counters["pushed"].assign_add(1)
    start = clock([pushed])
    with tf.control_dependencies([start]):
        applied = apply(grads, use_locking=False)
    with tf.control_dependencies([applied]):
        new_step = step.assign_add(1)
        marked = counters["applied"].assign_add(1)
    version = pull([new_step, marked] if args.mode == "multi_ps" else grads)
    end = clock([new_step, marked, version])      # the update applied and the reply received
    with tf.control_dependencies([end]):
        m["step"].update(progress=tf.identity(new_step), version=tf.identity(version),
                         span=tf.stack([start, end]))


BUILDERS = {"sync": _build_sync, "async": _build_async, "async_stale": _build_stale,
            "hogwild": _build_lock_free, "multi_ps": _build_lock_free}


class StaleApplier(threading.Thread):
    """async_stale: applies the gradients waiting in the ps queue until the queue is closed and
    empty, and keeps what each application returned. The workers never wait for it (only a
    full queue would block a push)."""

    def __init__(self, sess, m, options):
        super().__init__(name="stale-applier", daemon=True)
        self.sess, self.m, self.options = sess, m, options
        self.applied = {key: [] for key in m["apply_waiting"]}
        self.runs = 0
        self.error = None

    def run(self):
        import tensorflow as tf
        try:
            while True:
                try:
                    out = self.sess.run(self.m["apply_waiting"], options=self.options)
                except tf.errors.OutOfRangeError:
                    return                  # closed and drained
                for key, values in out.items():
                    self.applied[key].extend(int(v) for v in values)
                self.runs += 1
        except Exception as err:  # reported by the worker's main thread
            self.error = "%s: %s" % (type(err).__name__, err)
