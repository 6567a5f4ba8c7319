"""A ParameterServerStrategy chief that goes on when a worker moves to another machine.

TensorFlow's ClusterCoordinator waits for a lost worker and reconnects with the cluster it read
at the start (its WorkerPreemptionHandler keeps that ServerDef and calls
`context.update_server_def` with it until the worker answers). When tfcluster moves a lost
worker to a spare, the worker has a new address: tfcluster writes the new cluster to the file
$TFCLUSTER_CLUSTER_FILE names, and `follow_moves` hands it to the handler. Two things make that
work, both on TensorFlow 2.21's private names (checked at the start; without them a move waits,
as TensorFlow does, for the old address):
- the handler's `_server_def` is replaced by one with the new worker addresses;
- its call to `update_server_def` first checks that every worker address accepts a connection,
  and otherwise fails as a lost worker does (UnavailableError), so the handler tries again with
  the newest definition instead of waiting on the lost machine for good.
"""
import json
import socket
import threading
import time

POLL_SECONDS = 0.5
CONNECT_SECONDS = 2.0

# TensorFlow's gRPC channel options (TF_GRPC_DEFAULT_OPTIONS, read by the clients): a call to a
# worker whose machine vanished (a cut link, a power cut) fails within seconds, through
# keepalive pings and the TCP_USER_TIMEOUT gRPC derives from them, instead of after TCP's
# retransmissions (15 minutes); a connection to its old address gives up after 2 s.
GRPC_OPTIONS = ("grpc.keepalive_time_ms=10000,grpc.keepalive_timeout_ms=5000,"
                "grpc.min_reconnect_backoff_ms=2000")


def follow_moves(coordinator, log, path):
    """Watch the cluster file PATH ($TFCLUSTER_CLUSTER_FILE) in a thread and hand each new
    cluster's worker addresses to COORDINATOR's failure handler. Returns a function that stops
    following, or None when there is no file to watch or this TensorFlow lacks the names it
    needs (LOG says so)."""
    from tensorflow.python.eager import context
    from tensorflow.python.framework import errors
    if not path:
        return None  # not started by tfcluster: nothing moves
    handler = getattr(getattr(coordinator, "_cluster", None), "failure_handler", None)
    eager = context.context()
    if handler is None or not hasattr(handler, "_server_def") or \
            not hasattr(eager, "update_server_def"):
        log("chief: a worker that moves to another machine cannot be followed: this "
            "TensorFlow's coordinator has no WorkerPreemptionHandler._server_def")
        return None
    update = eager.update_server_def

    def update_when_reachable(server_def, *args, **kwargs):
        for index, address in worker_addresses(server_def):
            why = unreachable(address)
            if why:
                time.sleep(1.0)  # the handler retries at once
                raise errors.UnavailableError(None, None, "/job:worker/replica:0/task:%d at %s: "
                                              "%s; waiting for it or a new address"
                                              % (index, address, why))
        return update(server_def, *args, **kwargs)

    eager.update_server_def = update_when_reachable
    stopped = threading.Event()

    def watch():
        seen = None
        while not stopped.wait(POLL_SECONDS):
            try:
                with open(path) as stream:
                    cluster = json.load(stream)
            except (OSError, ValueError):
                continue  # none yet (the file is replaced whole: never half-read)
            if cluster == seen:
                continue
            seen = cluster
            handler._server_def = with_workers(handler._server_def, cluster.get("worker", []))
            log("chief: the cluster changed; workers now at %s" % ", ".join(
                cluster.get("worker", [])))

    watcher = threading.Thread(target=watch, name="tfcluster-follow-moves", daemon=True)
    watcher.start()

    def stop():
        stopped.set()
        watcher.join()
        del eager.update_server_def  # TensorFlow's own again

    return stop


def worker_addresses(server_def):
    """(task index, host:port) of the worker job in SERVER_DEF."""
    for job in server_def.cluster.job:
        if job.name == "worker":
            return sorted(job.tasks.items())
    return []


def with_workers(server_def, workers):
    """A copy of SERVER_DEF whose worker tasks are at WORKERS."""
    copy = type(server_def)()
    copy.CopyFrom(server_def)
    for job in copy.cluster.job:
        if job.name == "worker":
            for index, address in enumerate(workers):
                job.tasks[index] = address
    return copy


def unreachable(address):
    """Why ADDRESS (host:port) takes no connection now; "" when it does."""
    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_SECONDS).close()
    except OSError as err:
        return str(err) or type(err).__name__
    return ""
