"""One connection per machine (invoke's local runner or a Fabric SSH connection) and the agent calls.

A connection is opened lazily and closed by `close()`; commands return invoke Result objects.
Fanning out over machines collects every machine's outcome, never stopping at the first error.
"""
import base64
import concurrent.futures
import json
import os
import shlex
import shutil
import socket
import threading

from tfcluster.errors import TfclusterError


class HostError(TfclusterError):
    """A machine could not do what was asked; the message names it."""

    def __init__(self, machine, message):
        super().__init__("%s: %s" % (machine.label, message))
        self.machine = machine
        self.reason = message


class HostSession:
    def __init__(self, machine):
        self.machine = machine
        self._connection = None
        self._lock = threading.Lock()

    @property
    def agent_path(self):
        return self.machine.root.rstrip("/") + "/trainers/agent.py"

    def _open(self):
        if self._connection is None:
            if self.machine.is_local:
                import invoke
                self._connection = invoke.Context()
            else:
                self._connection = _ssh_connection(self.machine)
        return self._connection

    def run(self, argv, timeout=60):
        """Run ARGV on the machine; returns invoke's Result (exited, stdout, stderr)."""
        command = shlex.join(argv)
        try:
            with self._lock:
                connection = self._open()
            return connection.run(command, hide=True, warn=True, timeout=timeout, in_stream=False)
        except HostError:
            raise
        except Exception as err:  # paramiko, socket and invoke errors all mean "unreachable"
            raise HostError(self.machine, describe_connection_error(err, self.machine)) from None

    def agent(self, *args, timeout=60):
        """Call the task agent; returns its JSON answer."""
        result = self.run([self.machine.python, self.agent_path] + list(args), timeout=timeout)
        if result.exited != 0:
            raise HostError(self.machine, agent_failure(result, self.machine, self.agent_path))
        try:
            return json.loads(result.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise HostError(self.machine, "the agent answered %r instead of JSON"
                            % result.stdout[-200:]) from None

    def get(self, remote_path, local_path):
        if self.machine.is_local:
            shutil.copyfile(remote_path, local_path)
            return
        with self._lock:
            connection = self._open()
        connection.get(remote_path, local_path)

    def close(self):
        if self._connection is not None and not self.machine.is_local:
            self._connection.close()
        self._connection = None


def encode(obj):
    return base64.b64encode(json.dumps(obj).encode()).decode()


def agent_failure(result, machine, agent_path):
    err = (result.stderr or result.stdout or "").strip()
    last = err.splitlines()[-1] if err else "exit %d" % result.exited
    if result.exited == 127 or "No such file or directory" in err and machine.python in err:
        return ("no Python at %s (tfcluster_python): run ansible-playbook playbooks/deploy.yml "
                "or set tfcluster_python" % machine.python)
    if "can't open file" in err:
        return ("no tfcluster agent at %s: run ansible-playbook playbooks/deploy.yml"
                % agent_path)
    return "agent failed: %s" % last


def describe_connection_error(err, machine):
    name = type(err).__name__
    text = str(err) or name
    if isinstance(err, socket.timeout) or "timed out" in text.lower():
        return ("cannot connect within %gs (tfcluster_connect_timeout): is the host up and "
                "reachable on port %d?" % (machine.connect_timeout, machine.ssh_port))
    if name == "AuthenticationException":
        return ("SSH authentication failed for user %s: set ansible_user and "
                "ansible_ssh_private_key_file" % (machine.user or "(default)"))
    if name in ("SSHException", "BadHostKeyException") and "known_hosts" in text or \
            "not found in known_hosts" in text or name == "BadHostKeyException":
        return ("host key not trusted (%s): add it to known_hosts (ssh-keyscan) or set "
                "tfcluster_known_hosts" % text)
    if name == "NoValidConnectionsError" or isinstance(err, ConnectionRefusedError):
        return "connection refused on port %d: is sshd running?" % machine.ssh_port
    if name == "CommandTimedOut":
        return "command did not finish in time (%s)" % text
    return "%s: %s" % (name, text)


def _ssh_connection(machine):
    import fabric
    import paramiko
    connect_kwargs = {"banner_timeout": machine.connect_timeout,
                      "auth_timeout": machine.connect_timeout}
    if machine.key_file:
        connect_kwargs["key_filename"] = os.path.expanduser(machine.key_file)
    connection = fabric.Connection(machine.address, user=machine.user, port=machine.ssh_port,
                                   connect_timeout=machine.connect_timeout,
                                   connect_kwargs=connect_kwargs)
    # Host key checking stays on: Fabric's default policy would add unknown keys silently.
    connection.client.set_missing_host_key_policy(paramiko.RejectPolicy())
    known = os.path.expanduser("~/.ssh/known_hosts")
    if os.path.exists(known):
        connection.client.load_host_keys(known)
    if machine.known_hosts:
        connection.client.load_host_keys(os.path.expanduser(machine.known_hosts))
    return connection


class Hosts:
    """Sessions for every machine of a cluster, with parallel calls that collect per-machine outcomes."""

    def __init__(self, machines):
        self.sessions = {m.key: HostSession(m) for m in machines}
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(32, len(machines))))

    def session(self, machine):
        return self.sessions[machine.key]

    def each(self, call, machines=None, timeout=None):
        """{machine key: result or exception} of CALL(session) on every machine, in parallel."""
        targets = [self.sessions[m.key] for m in machines] if machines else list(self.sessions.values())
        futures = {self._pool.submit(call, s): s for s in targets}
        outcomes = {}
        done, pending = concurrent.futures.wait(futures, timeout=timeout)
        for future in done:
            session = futures[future]
            try:
                outcomes[session.machine.key] = future.result()
            except Exception as err:  # collected per machine; the caller decides
                outcomes[session.machine.key] = err
        for future in pending:
            session = futures[future]
            outcomes[session.machine.key] = HostError(session.machine, "no answer within %gs" % timeout)
        return outcomes

    def close(self):
        for session in self.sessions.values():
            try:
                session.close()
            except Exception:
                pass
        self._pool.shutdown(wait=False, cancel_futures=True)
