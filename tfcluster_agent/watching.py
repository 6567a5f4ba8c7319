"""What the agent passes on from a machine's tasks as it happens: their start (pid), the port
each listens on, their output in whole lines, and their end, standard library only. The tasks'
supervisors are the agent's children (their stdout carries the output); an agent attached to
an existing run folder follows the tasks' log files and records instead."""
import os
import time

from tfcluster_agent import protocol as P
from tfcluster_agent import supervisor as S

CHUNK = 256 * 1024


class Task:
    def __init__(self, name, port=None, supervisor=None, offset=0):
        self.name = name
        self.port = port
        self.supervisor = supervisor  # our child, whose stdout carries the task's output
        self.offset = offset          # followed log files (attach): bytes already sent
        self.partial = b""
        self.pid_sent = False
        self.listening = port is None
        self.exit_sent = False


class TaskWatching:
    """The Agent's half that watches its tasks (self.tasks: name -> Task, self.run_dir,
    self.send)."""

    def _emit_output(self, task, data, final=False):
        data = task.partial + data
        cut = len(data) if final else data.rfind(b"\n") + 1
        task.partial = data[cut:]
        if cut:
            self.send(P.Output(name=task.name, text=data[:cut].decode("utf-8", "replace")))

    def _follow_file(self, task, final):
        path = os.path.join(self.run_dir, task.name + ".log")
        try:
            with open(path, "rb") as handle:
                handle.seek(task.offset)
                data = handle.read(CHUNK)
        except OSError:
            return
        task.offset += len(data)
        if data or final:
            self._emit_output(task, data, final)

    def watch(self, readable=()):
        """Pass on output, starts, listening ports and exits; True while something is pending."""
        pending, ends = False, []
        for task in self.tasks.values():
            if task.exit_sent:
                continue
            if not task.pid_sent:
                record = S.read_json(os.path.join(self.run_dir, task.name + ".pid"))
                if record:
                    task.pid_sent = True
                    self.send(P.Started(name=task.name, pid=record["pid"], time=time.time()))
            if not task.listening:
                from tfcluster_agent.hostinfo import port_is_listening
                task.listening = port_is_listening(task.port)
                if task.listening:
                    self.send(P.Listening(name=task.name, port=task.port))
                pending = pending or not task.listening
            ended = False
            if task.supervisor is not None:
                fd = task.supervisor.stdout.fileno()
                if fd in readable:
                    try:
                        data = os.read(fd, CHUNK)
                    except BlockingIOError:
                        data = None
                    if data:
                        self._emit_output(task, data)
                    elif data == b"":
                        ended = task.supervisor.wait() is not None
                        self._emit_output(task, b"", final=True)
            else:
                state = S.task_state(self.run_dir, task.name)
                self._follow_file(task, final=not state["alive"])
                ended = not state["alive"]
                pending = True
            if ended:
                task.exit_sent = True
                ends.append((S.end_time(self.run_dir, task.name) or time.time(), task.name))
        # The ends found in one pass go out in the order they happened (a ps killed, then the
        # workers it took down), not in this loop's.
        for at, name in sorted(ends):
            state = S.task_state(self.run_dir, name)
            self.send(P.Exited(name=name, code=state["exit"], state=state["state"], ended=at))
        return pending
