"""A worker of CIFAR-10's ps modes (--mode sync, async, async_stale, hogwild, multi_ps): its
session, its training loop, and its wait for the others at the end. The modes' graphs are
modes.py; why the asynchronous ones divide the learning rate, the package's docstring."""
import time

from trainers.cifar10 import model, modes
from trainers.common import bootstrap, loop, sessions


def learning_rate(args, info):
    """sync keeps --learning_rate; the asynchronous modes divide it by workers + 1 (see the
    package's docstring)."""
    if args.mode in modes.MODES and args.mode != "sync":
        return args.learning_rate / (info.num_workers + 1)
    return args.learning_rate


def read_counters(sess, m):
    values = sess.run(m["counters"])
    values["global_step"] = sess.run(m["global_step"])
    return {k: int(v) for k, v in values.items()}


def train(info, server, dataset, args):
    """One worker of a ps mode; returns the results dict for the result line."""
    import tensorflow as tf
    v1 = tf.compat.v1
    rate = learning_rate(args, info)
    m = modes.build_model(dataset, args, info, rate)
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
    options = sessions.timeout(args.op_timeout_s)
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
    batches = model.build_inputs(dataset.shard(info.index, info.num_workers), args,
                                 seed=args.seed * 1000 + info.index)
    share = 1 if args.mode == "sync" else info.num_workers
    progress = loop.Progress(info, args, args.batch_size, start["global_step"], *initial,
                             expected_steps=(args.train_steps - start["global_step"]) // share)
    trace, rounds, ps_used = {}, {}, []
    # Progress toward --train_steps: the global step, or for async_stale the gradients pushed
    # (the global step there counts applications, which lag behind on purpose).
    done = start["pushed"] if args.mode == "async_stale" else start["global_step"]
    version = int(sess.run(m["refresh"]))
    while done < args.train_steps and not progress.draining():
        images, labels = next(batches)
        feed = {m["images"]: images, m["labels"]: labels, m["version_in"]: version,
                m["local_step_in"]: progress.local_steps}
        traced = progress.devices is None
        out = loop.train_step(sess, progress, m["step"], feed, info.device, options)
        if traced:  # the first step ran traced: which ps tasks it reached
            ps_used = sorted({"/job:ps/task:%d" % (d.task or 0) for d in map(
                tf.DeviceSpec.from_string,
                (s.device for s in progress.step_stats.dev_stats if s.node_stats))
                if d.job == "ps"})
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
    if progress.drained and info.is_chief:  # now: the wait for the others may outlast the drain
        sessions.save_checkpoint(sess, saver, args.checkpoint_dir, sess.run(m["global_step"]))
    sess.run(m["mark_done"])
    wait_for_others(sess, m, info, start, applier, args.op_timeout_s)
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


def wait_for_others(sess, m, info, start, applier, timeout):
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
