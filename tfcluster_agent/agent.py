#!/usr/bin/env python3
"""tfcluster agent: one per machine per run, alive for the whole run, standard library only.

`agent.py serve` talks to the controller over its stdin/stdout (a local pipe or one SSH channel),
one JSON message per line (tfcluster_agent/protocol.py): it answers the preflight, starts the machine's
tasks (each under a supervisor, see supervisor.py), and pushes events as they happen: started,
listening, output lines, exited. The controller sends start / stop / collect / detach and a ping
every second, which keeps the run's lease; a controller that vanishes without a detach lets the
lease run out and the supervisors stop the tasks.

`agent.py serve` attached to an existing run folder (from a new shell: status, logs, stop) reads
the folder's records and follows its log files instead.
"""
# Its start is each host's cost per launch: only what the first message needs is imported here;
# the rest (argparse, hostinfo, threading, base64...) where it is used.
import _thread
import os
import select
import sys
import time

# The deployed code stays as deploy left it (its hash is checked): no __pycache__ next to it
# (started through __main__.py, compiled modules go to the user's cache instead).
if not sys.pycache_prefix:
    sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tfcluster_agent import jsonc as json  # noqa: E402
from tfcluster_agent import protocol as P  # noqa: E402
from tfcluster_agent import supervisor as S  # noqa: E402
from tfcluster_agent.reach import ReachRequests  # noqa: E402
from tfcluster_agent.watching import CHUNK, Task, TaskWatching  # noqa: E402

is_task_name = S.is_task_name

HEARTBEAT_SECONDS = 1.0
TICK = 0.05  # while a port is awaited or a folder is followed without supervisors of ours


class Agent(ReachRequests, TaskWatching):
    def __init__(self, out=None):
        self.out = out or sys.stdout.buffer
        self.connected = True
        self.detached = False
        self.run_dir = None
        self.lease = 0.0
        self.tasks = {}
        self._claims = None
        self._gpu_claims = None
        self.send_lock = _thread.allocate_lock()
        self.stopping = None  # (done event or None, names, ports, result, deadline)
        self.stalls = None    # a stall.StallWatch once the controller asks for one
        # A stop thread that is done writes here, so the loop answers at once, not a tick later.
        self.wake_read, self.wake_write = os.pipe()
        os.set_blocking(self.wake_read, False)
        os.set_blocking(self.wake_write, False)

    @property
    def claims(self):
        if self._claims is None:
            from tfcluster_agent.hostinfo import PortClaims
            self._claims = PortClaims()
        return self._claims

    @property
    def gpu_claims(self):
        if self._gpu_claims is None:
            from tfcluster_agent.gpuclaims import GpuClaims
            self._gpu_claims = GpuClaims()
        return self._gpu_claims

    # ------------------------------------------------------------ talking
    def send(self, msg):
        if not self.connected or self.detached:
            return
        with self.send_lock:
            try:
                self.out.write(P.encode(msg).encode())
                self.out.flush()
            except (BrokenPipeError, OSError):
                self.connected = False

    def handle(self, msg):
        if self.run_dir and not self.detached and self.lease:
            S.write_atomic(os.path.join(self.run_dir, ".lease"), "")
        try:
            getattr(self, "on_" + msg.kind)(msg)
        except (OSError, ValueError, KeyError, TypeError) as err:
            self.send(P.Error(message="%s: %s" % (msg.kind, err)))

    def on_ping(self, msg):
        pass

    def on_preflight(self, msg):
        from tfcluster_agent.hostinfo import preflight_report
        self.close_listeners()  # a preflight again (launch --wait): its ports are checked anew
        cache, warning = msg.cache_dir or None, None
        if msg.cache_dir.startswith("~"):  # this host's own cache folder
            from tfcluster_agent.cachedir import cache_folder
            cache, warning = cache_folder(msg.workdir and os.path.join(msg.workdir, ".cache"))
        report = preflight_report(msg.python, msg.ports, msg.code_dir, cache, msg.datasets,
                                  msg.nvidia_smi, lambda: set(self.gpu_claims.held))
        report["cache_warning"] = warning
        report["port_holders"] = self.claims.claim(
            [int(p) for p in msg.ports], "a launch in its preflight, agent pid %d" % os.getpid())
        for port in report["port_holders"]:
            report["ports"][port] = False
        from tfcluster_agent.shares import preflight_facts
        report.update(preflight_facts(msg.workdir, msg.fence_file))
        self.send(P.Report(report=report))
        from tfcluster_agent import taskspec  # noqa: F401  the start's, while records are written

    def on_claim_gpus(self, msg):
        self.send(P.Report(report=self.gpu_claims.claim(msg.gpus, msg.run, msg.wait)))

    def on_gpu_query(self, msg):
        from tfcluster_agent import gpuinfo
        self.send(P.Report(report=gpuinfo.host_gpus(msg.nvidia_smi, set(self.gpu_claims.held))))

    def on_start(self, msg):
        from tfcluster_agent.taskspec import TaskSpec
        self.close_listeners()
        specs = [TaskSpec.from_json(spec) for spec in msg.tasks]
        for spec in specs:
            if not is_task_name(spec.name):
                raise ValueError("bad task name %r" % spec.name)
        if msg.restart:
            if msg.run_dir != self.run_dir:
                raise ValueError("restart in a run this agent did not start")
            for spec in specs:
                old = self.tasks.get(spec.name)
                if old is None or not old.exit_sent:
                    raise ValueError("task %s is not ended, it cannot restart" % spec.name)
        elif self.run_dir:
            raise ValueError("this agent already runs %s" % self.run_dir)
        before = set(self.claims.held)
        try:
            self._start(msg, specs)
        except BaseException:  # a start that failed keeps no claim it took
            self.claims.release(keep=before)
            if self._gpu_claims is not None:
                self._gpu_claims.release()
            raise
        # The agent keeps the GPU claims for the run's life (a restarted task finds its GPUs
        # still its own); each task's supervisor holds its own too, for a detached run.
        self.send(P.Accepted())

    def _start(self, msg, specs):
        # Every port is claimed before anything is made or started; then a task's supervisor
        # holds its claim.
        from tfcluster_agent.shares import run_id
        taken = self.claims.claim([int(s.port) for s in specs if s.port],
                                  "run " + run_id(msg.run_dir, msg.launch))
        if taken:
            raise ValueError("port(s) %s claimed by %s: nothing started" % (
                ", ".join(taken), "; ".join(sorted(set(taken.values())))))
        if not msg.restart:
            from tfcluster_agent.shares import make_run_folder
            make_run_folder(msg.run_dir, msg.launch)  # made here or refused, never adopted
            self.run_dir, self.lease = msg.run_dir, float(msg.lease)
            S.write_atomic(os.path.join(self.run_dir, ".lease"), "")
            if not self.lease:
                S.write_atomic(os.path.join(self.run_dir, ".detached"), "")
        for spec in specs:
            name = spec.name
            if msg.restart:
                os.unlink(os.path.join(self.run_dir, name + ".status"))
                os.unlink(os.path.join(self.run_dir, name + ".pid"))
            claim = self.claims.take(spec.port)
            gpu_claims = [] if self._gpu_claims is None else self._gpu_claims.take(spec.gpu_uuids)
            try:
                proc = S.fork(self.run_dir, name, self.lease, spec, keep_fd=claim,
                              keep_fds=gpu_claims)
            finally:
                for fd in ([claim] if claim is not None else []) + gpu_claims:
                    os.close(fd)
            watched = spec.port if spec.await_listening else None
            self.tasks[name] = Task(name, watched, proc)

    def on_attach(self, msg):
        self.run_dir = msg.run_dir
        states = {}
        for name in S.task_names(msg.run_dir):
            if not is_task_name(name):
                continue
            offset = 0
            if not msg.from_start:
                try:
                    offset = os.path.getsize(os.path.join(msg.run_dir, name + ".log"))
                except OSError:
                    pass
            task = self.tasks[name] = Task(name, offset=offset)
            task.pid_sent = True
            states[name] = S.task_state(msg.run_dir, name)
            # What the log holds now goes out before the answer, so a reader has it all.
            self._follow_file(task, final=False)
        self.send(P.Attached(tasks=states))

    def on_stop(self, msg):
        if not self.run_dir:  # this agent started nothing: there is nothing of ours to stop
            self.send(P.Stopped(tasks={}, busy_ports=[], remaining=[]))
            return
        names = [n for n in (msg.names or list(self.tasks) or S.task_names(self.run_dir))
                 if is_task_name(n)]
        # A task whose exit was sent has its status written: nothing of it to stop or wait for.
        result = {n: "not running" for n in names if n in self.tasks and self.tasks[n].exit_sent}
        ports = [int(p) for p in msg.ports]
        deadline = time.monotonic() + msg.drain + msg.grace + 15
        drain_until = time.monotonic() + msg.drain
        if msg.drain and len(result) < len(names):
            # The termination notice, before anything is stopped: the tasks save and exit.
            S.write_atomic(os.path.join(self.run_dir, P.DRAIN_FILE), json.dumps(
                {"reason": msg.reason, "stop_at": time.time() + msg.drain}))
        if len(result) == len(names):
            self.stopping = (None, names, ports, result, deadline)  # no thread to wait for
            return
        import threading

        def stop_all():
            def stop_one(name):
                # A task asked to stop as it starts: wait until its supervisor has recorded it.
                task, deadline = self.tasks.get(name), time.monotonic() + 10
                pid_file = os.path.join(self.run_dir, name + ".pid")
                while task is not None and task.supervisor is not None and \
                        task.supervisor.poll() is None and not os.path.exists(pid_file) and \
                        time.monotonic() < deadline:
                    time.sleep(0.02)
                while time.monotonic() < drain_until and \
                        S.task_state(self.run_dir, name)["alive"]:
                    time.sleep(0.05)
                result[name] = S.stop_task(self.run_dir, name, msg.grace)
            threads = [threading.Thread(target=stop_one, args=(n,)) for n in names
                       if n not in result]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            done.set()
            try:
                os.write(self.wake_write, b"!")
            except BlockingIOError:
                pass  # the loop has wake-ups pending already

        done = threading.Event()
        threading.Thread(target=stop_all, daemon=True).start()
        self.stopping = (done, names, ports, result, deadline)

    def on_new_cluster(self, msg):
        if not self.run_dir:
            raise ValueError("no run here to tell of a new cluster")
        S.write_atomic(os.path.join(self.run_dir, P.CLUSTER_FILE), json.dumps(msg.cluster))
        self.send(P.Accepted())

    def on_watch_stalls(self, msg):
        from tfcluster_agent.stall import StallWatch
        self.stalls = StallWatch(self.run_dir, self.tasks, msg.names, msg.stall_after, self.send)

    def on_take_stacks(self, msg):
        from tfcluster_agent.stall import answer_take_stacks
        answer_take_stacks(msg, self.send)

    def on_start_profilers(self, msg):
        from tfcluster_agent.profiler import answer
        answer(msg, self.send, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

    on_trace_profile = on_profile_files = on_start_profilers

    def on_collect(self, msg):
        count = 0
        for folder in msg.folders if self.run_dir else ():
            top = os.path.join(self.run_dir, folder)
            for root, _, files in os.walk(top):
                for name in sorted(files):
                    path = os.path.join(root, name)
                    import base64  # only for a run that has files to send
                    with open(path, "rb") as handle:
                        data = base64.b64encode(handle.read()).decode()
                    self.send(P.File(path=os.path.relpath(path, self.run_dir), data=data))
                    count += 1
        self.send(P.Collected(count=count))

    def on_detach(self, msg):
        if self.run_dir:
            S.write_atomic(os.path.join(self.run_dir, ".detached"), "")
        self.detached = True

    def _finish_stop(self):
        done, names, ports, result, deadline = self.stopping
        if done is not None and not done.is_set():
            return
        ours = [self.tasks[n] for n in names if n in self.tasks]
        if any(not t.exit_sent for t in ours) and time.monotonic() < deadline:
            return  # their last output and exit status are still on the way
        from tfcluster_agent.hostinfo import port_is_free
        busy = [p for p in ports if not port_is_free(p)]
        if busy and time.monotonic() < deadline:
            return
        self.stopping = None
        self.send(P.Stopped(tasks=result, busy_ports=busy,
                            remaining=[n for n in names if S.task_state(self.run_dir, n)["alive"]]))

    def serve(self, stdin_fd=0):
        os.umask(0o077)
        # uname's node name is socket.gethostname() without importing socket.
        self.send(P.Hello(pid=os.getpid(), hostname=os.uname().nodename, boot_id=S.boot_id()))
        buffer, stdin_open, last_beat = b"", True, 0.0
        while True:
            fds = [t.supervisor.stdout.fileno() for t in self.tasks.values()
                   if t.supervisor is not None and not t.exit_sent]
            if stdin_open:
                fds.append(stdin_fd)
            busy = self.watch() or self.stopping is not None
            if self.stopping is not None:
                fds.append(self.wake_read)
            if not stdin_open and not fds and self.stopping is None:
                return
            timeout = TICK if busy else max(0.0, last_beat + HEARTBEAT_SECONDS - time.monotonic())
            readable, _, _ = select.select(fds, [], [], timeout)
            if self.wake_read in readable:
                os.read(self.wake_read, 64)
            if stdin_fd in readable:
                data = os.read(stdin_fd, CHUNK)
                if not data:
                    stdin_open = False  # the controller left; without a detach the lease runs out
                buffer += data
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        try:
                            self.handle(P.decode(line.decode()))
                        except ValueError as err:
                            self.send(P.Error(message=str(err)))
            self.watch(readable)
            if self.stalls is not None:
                self.stalls.poll()
            if self.stopping is not None:
                self._finish_stop()
            if time.monotonic() - last_beat >= HEARTBEAT_SECONDS:
                last_beat = time.monotonic()
                self.send(P.Heartbeat())
                if self._gpu_claims is not None:
                    self._gpu_claims.touch()


if __name__ == "__main__":  # `agent.py COMMAND` by hand: the package's command line
    import runpy
    runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "__main__.py"),
                   run_name="__main__")
