"""Every example trainer called in-process (the fast tier): its run() on a cluster whose tasks
all live in this process, handed tiny data (scikit-learn's digits or synthetic arrays; the
flags' --data_dir names a folder that does not exist, so nothing else is read), a handful of
steps. Checks the loop (it learns), its metrics lines and the result in the one schema; and the
entry point every program's __main__ calls, and the one strategy factory.

Graph-mode trainers build in a graph of their own and use local sessions: no server, no gRPC.
Three need servers by design and get them here, in this process, on free loopback ports:
data_parallel (the master and its worker exchange through queues on the master's server),
ps_strategy (the coordinator reaches its workers over gRPC only) and grpc_server (it is one).
TensorFlow cannot stop a server: theirs end, and their ports are freed, with the test process.
"""
import io
import json
import os
import random
import tempfile
import threading

import pytest

import trainers
from support.ports import free_port_block
from support.procs import wait_for
from tfcluster_agent import protocol
from trainers import (census_widendeep, cifar10, data_parallel, grpc_server, mnist_async,
                      mnist_replica, mnist_towers, model_parallel, multi_worker_mirrored,
                      ps_strategy)
from trainers.common import bootstrap, checkpoints, data, loop, strategies, towers

CIFAR_TINY = {"batch_size": 16, "conv_filters": 4, "fc_units": "16,8", "image_size": 16,
              "eval_examples": 100, "learning_rate": 0.05, "num_gpus": 0}


@pytest.fixture(scope="module")
def digits():
    return data.load_digits()


@pytest.fixture(scope="module")
def cifar():
    """CIFAR-10's shapes, small: 1000 training and 100 test images."""
    return data.synthetic_cifar10(train=1000, test=100)


@pytest.fixture
def absent(tmp_path):
    """Options whose data folder does not exist: the run must train on the data it is handed."""
    return {"data_dir": str(tmp_path / "absent")}


@pytest.fixture(scope="module")
def tf(tmp_path_factory):
    """TensorFlow, with 2 logical CPU devices when this process has not used its devices yet
    (the tower trainers' default); quiet. Its temporary files (autograph's modules, whose
    bytecode TensorFlow never removes) go to a folder of the test session's, not /tmp."""
    before, tempfile.tempdir = tempfile.tempdir, str(tmp_path_factory.mktemp("tf-tmp"))
    try:
        yield import_quiet_tensorflow()
    finally:
        tempfile.tempdir = before


def import_quiet_tensorflow():
    bootstrap.quiet_tensorflow()
    bootstrap.import_tensorflow()  # as a trainer imports it
    import tensorflow
    try:
        towers.make_devices(2)
    except RuntimeError:
        pass  # devices already in use: the tower tests then see as many as there are
    return tensorflow


def tower_count(tf):
    return min(2, len(tf.config.list_logical_devices("CPU")))


def lines(out, kind):
    return [v for k, v in filter(None, map(protocol.parse_line, out.splitlines())) if k == kind]


def check(result, out, task, learned=True):
    """The result dialect (the schema's keys and types, one result line's worth of JSON), the
    metrics lines the loop printed, and that the model learned."""
    assert set(protocol.RESULT_KEYS) <= set(result), sorted(result)
    for key in ("loss", "initial_loss", "accuracy", "train_time_s", "examples_per_s"):
        assert isinstance(result[key], (int, float)) and not isinstance(result[key], bool), key
    assert isinstance(result["global_step"], int) and result["global_step"] > 0
    assert result["local_steps"] > 0 and result["examples_per_s"] > 0
    assert result["task"] == task and isinstance(result["devices"], list) and result["devices"]
    stream = io.StringIO()
    protocol.report_result(result, stream)
    (line,) = lines(stream.getvalue(), "result")
    assert line["global_step"] == result["global_step"]
    points = lines(out, "metric")
    assert len(points) >= 3, out[-2000:]
    steps = [p["step"] for p in points]
    assert steps == sorted(steps) and steps[-1] == result["global_step"]
    assert points[0]["loss"] == pytest.approx(result["initial_loss"])
    assert points[-1]["loss"] == pytest.approx(result["loss"])
    assert any(p.get("examples_per_s", 0) > 0 for p in points[1:])
    if learned:
        assert result["loss"] < result["initial_loss"], (result["initial_loss"], result["loss"])
    json.dumps(result)  # nothing but JSON types


def one_ps_one_worker(ps=1):
    return bootstrap.in_process_cluster({"ps": ["localhost:%d" % i for i in range(ps)],
                                         "worker": ["localhost:9"]})


# ---------------------------------------------------------------- between-graph, no server

def test_mnist_replica_async(tf, capsys, digits, absent):
    result = mnist_replica.run(dict(absent, train_steps=40, num_gpus=0, batch_size=32,
                                    learning_rate=0.02), one_ps_one_worker(), dataset=digits)
    out = capsys.readouterr().out
    check(result, out, "worker:0")
    assert result["global_step"] == 40 and result["sync"] is False
    assert result["dataset"] == "digits"  # the data handed in, not --dataset's
    assert result["accuracy"] > 0.5  # ten classes: chance is 0.1
    assert "validation cross entropy" in out


def test_mnist_replica_sync_replicas(tf, capsys, digits, absent):
    result = mnist_replica.run(dict(absent, train_steps=20, num_gpus=0, sync_replicas=True,
                                    learning_rate=0.02), one_ps_one_worker(), dataset=digits)
    check(result, capsys.readouterr().out, "worker:0")
    assert result["sync"] is True and result["global_step"] >= 20


def test_options_refuse_an_unknown_key():
    with pytest.raises(TypeError, match="train_stepz"):
        mnist_replica.run({"train_stepz": 3}, one_ps_one_worker())


def test_mnist_async(tf, capsys, tmp_path, digits):
    """Its chief commits a whole checkpoint (checkpoints.commit); a second run resumes there."""
    options = {"data_dir": str(tmp_path / "absent"), "train_steps": 40, "batch_size": 32,
               "checkpoint_dir": str(tmp_path / "ckpt")}
    result = mnist_async.run(options, one_ps_one_worker(), dataset=digits)
    out = capsys.readouterr().out
    check(result, out, "worker:0")
    assert result["others_finished"] is True and result["checkpoint_step"] == 40
    saved = checkpoints.latest(options["checkpoint_dir"])
    assert "Test-Accuracy" in out and saved.step == 40
    assert os.path.basename(saved.entry) == "model.ckpt-40"
    again = mnist_async.run(dict(options, train_steps=50), one_ps_one_worker(), dataset=digits)
    assert "restoring checkpoint %s" % saved.folder in capsys.readouterr().out
    assert again["start_step"] == 40 and again["checkpoint_step"] == 50


def test_model_parallel(tf, capsys, digits, absent):
    result = model_parallel.run(dict(absent, train_steps=40, learning_rate=0.01),
                                one_ps_one_worker(ps=2), dataset=digits)
    check(result, capsys.readouterr().out, "worker:0")
    # Layer 1 on ps:0, layer 2 on ps:1 as the program asks (in process: on this process's CPU).
    assert result["layers"] == {"layer1": 0, "layer2": 1}
    assert result["placement"] and result["placement_observed"]


def test_census_widendeep(tf, capsys, absent):
    result = census_widendeep.run(dict(absent, train_steps=60, eval_steps=1),
                                  one_ps_one_worker(), dataset=data.synthetic_census())
    check(result, capsys.readouterr().out, "worker:0")
    assert result["synthetic"] is True and result["wide_params"] > 0 and result["deep_params"] > 0


@pytest.mark.parametrize("mode", ["sync", "async", "async_stale", "hogwild", "multi_ps"])
def test_cifar10_modes(tf, capsys, cifar, absent, mode):
    cluster = one_ps_one_worker(ps=2 if mode == "multi_ps" else 1)
    result = cifar10.run(dict(CIFAR_TINY, **absent, mode=mode, train_steps=8, max_pending=2),
                         cluster, dataset=cifar)
    # A few steps of a tiny CNN on synthetic images need not lower the loss (tests/test_cifar10.py
    # checks learning); every gradient pushed must have been applied, once per global step.
    check(result, capsys.readouterr().out, "worker:0", learned=False)
    assert result["mode"] == mode and result["global_step"] == 8
    assert result["counters"] == {"pushed": 8, "applied": 8, "done_workers": 1,
                                  "global_step": 8}


# ---------------------------------------------------------------- one task, its own devices

def test_cifar10_local_towers(tf, capsys, cifar, absent):
    count = tower_count(tf)
    result = cifar10.run(dict(CIFAR_TINY, **absent, mode="local", train_steps=20,
                              num_devices=count), None, dataset=cifar)
    check(result, capsys.readouterr().out, "local", learned=False)  # see test_cifar10_modes
    assert result["num_devices"] == count and result["global_step"] == 20
    # One tower per device, each computing its slice of the batch there.
    assert len(set(result["tower_devices"])) == count
    assert result["loss"] != result["initial_loss"]


def test_mnist_towers(tf, capsys, absent):
    count = tower_count(tf)
    result = mnist_towers.run(dict(absent, num_devices=count, epochs=2, batch_size=64),
                              dataset=data.load_digits(flat=False))
    check(result, capsys.readouterr().out, "local")
    assert result["accuracy"] > 0.3


# ---------------------------------------------------------------- TF2 strategies

def test_multi_worker_mirrored(tf, capsys, digits, absent):
    result = multi_worker_mirrored.run(dict(absent, train_steps=40, batch_size=32,
                                            learning_rate=0.5),
                                       bootstrap.in_process_cluster(), dataset=digits)
    check(result, capsys.readouterr().out, "worker:0")
    assert result["replicas_in_sync"] == 1 and result["accuracy"] > 0.5


@pytest.mark.slow  # twenty runs: ~1.5 s of CPU each
def test_multi_worker_mirrored_drains_leave_a_whole_checkpoint_at_or_after_the_drain(
        tf, capsys, digits, absent, tmp_path, monkeypatch):
    """20 drains at random steps: the termination notice appears after a random step; the loop
    ends within a step, its checkpoint is complete (checkpoints.latest verifies it) and of that
    step or later, the result says `drained`, and the next run resumes there."""
    notice = tmp_path / "drain"
    tick, drain_at = loop.Progress.tick, {}

    def tick_then_notice(progress, step, loss=None, **scalars):
        tick(progress, step, loss, **scalars)
        if step >= drain_at["step"]:
            notice.touch()

    monkeypatch.setattr(loop.Progress, "tick", tick_then_notice)
    cluster = bootstrap.in_process_cluster(env=bootstrap.TaskEnv(drain_file=str(notice)))
    options = dict(absent, train_steps=10 ** 6, batch_size=32, learning_rate=0.5,
                   checkpoint_dir=str(tmp_path / "ckpt"), save_every_steps=7)
    rng, start = random.Random(42), 0
    for _ in range(20):
        drain_at["step"] = start + rng.randint(1, 12)
        result = multi_worker_mirrored.run(options, cluster, dataset=digits)
        saved = checkpoints.latest(options["checkpoint_dir"])
        assert result["drained"] is True and result["start_step"] == start, result
        assert saved.step == result["global_step"] == drain_at["step"] + 1, (saved, drain_at)
        notice.unlink()
        start = saved.step
    assert "termination notice at step" in capsys.readouterr().out


# ---------------------------------------------------------------- servers in this process

def loopback_cluster(jobs, job, index=0):
    """A cluster on free loopback ports, JOBS: {job: task count}; ClusterInfo of JOB:INDEX."""
    base = free_port_block(sum(jobs.values()) + 1)
    ports = iter(range(base, base + 20))
    spec = {name: ["localhost:%d" % next(ports) for _ in range(count)]
            for name, count in jobs.items()}
    return lambda job=job, index=index: bootstrap.ClusterInfo(spec, job, index)


def test_grpc_server_serves_mnist_replica_with_existing_servers(tf, capsys):
    cluster = loopback_cluster({"worker": 1}, "worker")
    server = grpc_server.start({}, cluster())
    assert server.target.startswith("grpc://localhost:")
    # The data by its flags, as on the command line: --dataset digits.
    result = mnist_replica.run({"dataset": "digits", "train_steps": 20, "num_gpus": 0,
                                "existing_servers": True}, cluster())
    check(result, capsys.readouterr().out, "worker:0")


def test_data_parallel_master_and_worker(tf, capsys, digits, absent):
    cluster = loopback_cluster({"chief": 1, "worker": 1}, "chief")
    options = dict(absent, train_steps=20, batch_size=32, step_timeout_secs=60,
                   finish_wait_secs=60)
    results = {}

    def task(job):
        try:
            results[job] = data_parallel.run(options, cluster(job), dataset=digits)
        except BaseException as err:  # seen by the assertion below
            results[job] = err

    threads = [threading.Thread(target=task, args=(job,), daemon=True)
               for job in ("chief", "worker")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a task did not finish in 120 s"
    out = capsys.readouterr().out
    master, worker = results["chief"], results["worker"]
    assert isinstance(master, dict) and isinstance(worker, dict), results
    assert master["global_step"] == worker["global_step"] == 20
    # Every step averaged exactly one gradient of the worker's, computed at the current step.
    assert worker["contributions"] == worker["fresh"] == 20
    assert master["workers_finished"] is True
    assert set(protocol.RESULT_KEYS) <= set(master) and master["loss"] < master["initial_loss"]
    assert len(lines(out, "metric")) >= 6


def test_a_moved_worker_reaches_the_coordinators_failure_handler(tf, tmp_path):
    """trainers/common/moves.py on TensorFlow's own ServerDef and eager context, with a stand-in
    coordinator: the cluster file's workers replace the handler's, and its reconnection fails as
    a lost worker does while a worker address takes no connection."""
    import socket
    import types
    from tensorflow.core.protobuf import tensorflow_server_pb2
    from tensorflow.python.eager import context
    from trainers.common import moves
    listener = socket.create_server(("127.0.0.1", 0))
    live = "127.0.0.1:%d" % listener.getsockname()[1]
    with socket.create_server(("127.0.0.1", 0)) as gone:
        closed = "127.0.0.1:%d" % gone.getsockname()[1]
    server_def = tensorflow_server_pb2.ServerDef(job_name="chief", task_index=0, protocol="grpc")
    server_def.cluster.job.add(name="chief").tasks[0] = "127.0.0.1:1"
    workers = server_def.cluster.job.add(name="worker")
    workers.tasks[0], workers.tasks[1] = live, closed
    handler = types.SimpleNamespace(_server_def=server_def)
    coordinator = types.SimpleNamespace(_cluster=types.SimpleNamespace(failure_handler=handler))
    eager, updated, said = context.context(), [], []
    eager.update_server_def = updated.append  # TensorFlow's would connect this process
    path = tmp_path / "cluster.json"
    stop = moves.follow_moves(coordinator, said.append, str(path))
    try:
        with pytest.raises(tf.errors.UnavailableError,
                           match="/job:worker/replica:0/task:1 at %s: .*refused" % closed):
            eager.update_server_def(handler._server_def)
        assert updated == []
        path.write_text(json.dumps({"chief": ["127.0.0.1:1"], "worker": [live, live]}))
        wait_for(lambda: moves.worker_addresses(handler._server_def) == [(0, live), (1, live)],
                 10, "the moved worker's address in the handler")
        eager.update_server_def(handler._server_def)
        assert updated == [handler._server_def]
        assert said == ["chief: the cluster changed; workers now at %s, %s" % (live, live)]
        assert [j.name for j in handler._server_def.cluster.job] == ["chief", "worker"]
    finally:
        stop()
        listener.close()
    assert "update_server_def" not in vars(eager)
    assert moves.follow_moves(coordinator, said.append, "") is None


def test_ps_strategy_chief(tf, capsys, digits, absent):
    """Last: the coordinator connects this process's eager context to the cluster for good."""
    cluster = loopback_cluster({"chief": 1, "worker": 1, "ps": 1}, "chief")
    for job in ("worker", "ps"):
        ps_strategy.start_server(cluster(job))
    # A partitioner the factory does not know ends the run before any TensorFlow work.
    with pytest.raises(SystemExit, match="unknown --partitioner 'bogus': choose one of fixed, "
                                         "min_size, none"):
        ps_strategy.run(dict(absent, partitioner="bogus"), cluster(), dataset=digits)
    result = ps_strategy.run(dict(absent, train_steps=30, batch_size=32, learning_rate=0.5),
                             cluster(), dataset=digits)
    check(result, capsys.readouterr().out, "chief:0")
    assert result["steps_applied"] == 30 and result["num_ps"] == 1


# ---------------------------------------------------------------- the entry point's one read

def test_the_environment_is_read_at_the_entry_point_only():
    """Library code takes what it needs as arguments: only main_guard, under the entry point
    every trainer's __main__ calls, touches os.environ and sys.argv."""
    import pathlib
    folder = pathlib.Path(bootstrap.__file__).parent.parent
    readers = {str(path.relative_to(folder)) for path in folder.rglob("*.py")
               if "os.environ" in path.read_text() or "sys.argv" in path.read_text()}
    assert readers == {"common/bootstrap.py"}
    source = pathlib.Path(bootstrap.__file__).read_text()
    outside = [line for line in source.split("\ndef ")
               if ("os.environ" in line or "sys.argv" in line)
               and not line.startswith(("main_guard(", "quiet_tensorflow("))]
    assert outside == []


def test_cluster_and_task_env_come_from_the_environ_given():
    environ = {"TF_CONFIG": json.dumps({"cluster": {"worker": ["a:1", "b:2"], "ps": ["c:3"]},
                                        "task": {"type": "worker", "index": 1}}),
               "TFCLUSTER_RUN_DIR": "/runs/r1", "TFCLUSTER_RESTARTS": "1",
               "TF_NUM_INTRAOP_THREADS": "3", "TF_NUM_INTEROP_THREADS": ""}
    args = mnist_replica.build_parser().parse_args([])
    info = bootstrap.cluster_from_args(args, environ)
    assert (info.job, info.index, info.num_workers, info.num_ps) == ("worker", 1, 2, 1)
    assert info.env == bootstrap.TaskEnv(run_dir="/runs/r1", restarted=True,
                                         intra_op_threads=3, inter_op_threads=0)
    flags = mnist_replica.build_parser().parse_args(
        ["--job_name=ps", "--ps_hosts=c:3", "--worker_hosts=a:1"])
    assert bootstrap.cluster_from_args(flags, {}).label == "ps:0"
    with pytest.raises(SystemExit, match="no cluster given"):
        bootstrap.cluster_from_args(args, {})


def test_entry_reads_flags_and_environment_then_runs_and_prints_the_result_line(capsys):
    calls = []

    def run(args, cluster, env=None):
        calls.append((args, cluster, env))
        return None if cluster is not None and cluster.job == "ps" else {"loss": 0.5}

    # Alone (no cluster named): RUN gets the environment's TaskEnv; its result is the line.
    graph = []
    assert bootstrap.main(mnist_towers.build_parser, run, ["--epochs=3"],
                          {"TFCLUSTER_RUN_DIR": "/runs/r"}, graph=graph.append,
                          find_cluster=bootstrap.cluster_if_given) == 0
    ((args, cluster, env),) = calls
    assert args.epochs == 3 and cluster is None and env.run_dir == "/runs/r" and graph == [args]
    assert lines(capsys.readouterr().out, "result") == [{"loss": 0.5}]
    # A task that ended on the termination notice (its file named by the environment) exits
    # with TensorFlow's own status for it.
    drained = {"drained": True}
    assert bootstrap.main(mnist_towers.build_parser, lambda *a, **k: drained, [],
                          {protocol.DRAIN_FILE_ENV: "/runs/r/drain"},
                          find_cluster=bootstrap.cluster_if_given) == protocol.DRAINED_EXIT == 42
    assert lines(capsys.readouterr().out, "result") == [drained]
    # TF_CONFIG's cluster, the inter-op threads raised before TensorFlow and the TaskEnv read
    # them; a ps has no result line.
    environ = {"TF_NUM_INTEROP_THREADS": "1", "TF_CONFIG": json.dumps(
        {"cluster": {"chief": ["a:1"], "ps": ["c:3"]}, "task": {"type": "ps", "index": 0}})}
    assert bootstrap.main(ps_strategy.build_parser, run, [], environ, inter_op_threads=2) == 0
    _, cluster, env = calls[-1]
    assert cluster.label == "ps:0" and env is None and cluster.env.inter_op_threads == 2
    assert environ["TF_NUM_INTEROP_THREADS"] == "2"
    assert lines(capsys.readouterr().out, "result") == []
    with pytest.raises(SystemExit, match="no cluster given"):
        bootstrap.main(mnist_replica.build_parser, run, [], {})
    # CIFAR-10 checks its mode before it looks for a cluster; local mode runs alone.
    parse = cifar10.build_parser().parse_args
    with pytest.raises(SystemExit, match="unknown --mode 'bogus': choose one of sync, async"):
        cifar10.find_cluster(parse(["--mode=bogus"]), {})
    assert cifar10.find_cluster(parse(["--mode=local"]), {}) is None


def test_the_strategy_factory_lists_the_names_it_knows():
    info = bootstrap.in_process_cluster()
    with pytest.raises(SystemExit, match="unknown strategy 'mirrored': choose one of "
                                         "multi_worker_mirrored, parameter_server$"):
        strategies.make_strategy("mirrored", info)
    with pytest.raises(SystemExit, match="unknown --collective 'gloo': choose one of auto, ring, "
                                         "nccl$"):
        strategies.make_strategy("multi_worker_mirrored", info, collective="gloo")


def test_user_programs_import_protocol_from_trainers():
    """The README's `from trainers import protocol` (tests/programs/metrics_task.py uses it)."""
    assert trainers.protocol is protocol
