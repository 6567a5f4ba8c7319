"""One agent per machine, alive for the whole run: a local child process or one SSH channel. The
same link runs the agent's one-shot commands (`tfcluster sync`'s sync-list and sync-apply) on its
connection: the one channel to the hosts.

Every link has its own reader thread, which turns the agent's JSON lines into messages: replies to
a request go to the link's reply queue, events (started, output, exited...) to one queue shared by
all links, which the launcher waits on. Every call to a host has its own deadline and its own
thread, so a dead host never holds up the others.
"""
import collections
import os
import queue
import shlex
import signal
import subprocess
import threading
import time

from tfcluster.errors import TfclusterError
from tfcluster.hosts.ssh import ssh_connection
from tfcluster_agent import protocol as P

REPLIES = (P.Report, P.Accepted, P.Attached, P.Stopped, P.Collected, P.File, P.Error)
CLOSED = "closed"  # the event a link puts on the queue when its agent's stream ends


class HostError(TfclusterError):
    """A machine could not do what was asked; the message names it."""

    def __init__(self, machine, message):
        super().__init__("%s: %s" % (machine.label, message))
        self.machine = machine
        self.reason = message


class AgentLink:
    def __init__(self, machine, events):
        self.machine = machine
        self.events = events
        self.replies = queue.Queue()
        self.last_heard = time.monotonic()
        self.hello = None
        self.closed = False
        self.detaching = False
        self._stderr = collections.deque(maxlen=20)
        self._proc = self._connection = self._channel = None
        self._send_lock = threading.Lock()
        self._readers = []

    @property
    def agent_path(self):
        return self.machine.root.rstrip("/") + "/tfcluster_agent/agent.py"

    # ------------------------------------------------------------ opening
    def open(self, timeout=None, first=None):
        """Start the agent and wait for its hello; HostError with the reason otherwise.

        FIRST, a request, goes out at once behind the start (its reply: `reply_to`), so that
        starting the agent and its first answer cost one round trip, not two."""
        timeout = timeout or self.machine.connect_timeout + 20
        if not self._readers:
            self.spawn()
        if first is not None:
            self.send(first)
        reply = self._wait_reply(timeout, "to start its agent")
        if not isinstance(reply, P.Hello):
            raise HostError(self.machine, "the agent answered %r instead of hello" % (reply,))
        self.hello = reply
        return self

    def _transport(self):
        """The SSH transport to the machine, connected on first use; HostError when it cannot
        be."""
        try:
            if self._connection is None:
                connection = ssh_connection(self.machine)
                connection.open()
                connection.client.get_transport().set_keepalive(5)
                self._connection = connection
            return self._connection.client.get_transport()
        except FileNotFoundError as err:
            raise HostError(self.machine, missing_ssh_file(err)) from None
        except Exception as err:  # paramiko, socket and OS errors all mean "unreachable"
            raise HostError(self.machine, describe_connection_error(err, self.machine)) from None

    def spawn(self):
        """Start the agent (for a remote machine: connect and start it) without waiting for its
        hello; HostError when it cannot be started."""
        argv = agent_argv(self.machine.python, os.path.dirname(self.agent_path))
        try:
            if self.machine.is_local:
                # Its own session: a Ctrl-C in this terminal is the launcher's to handle.
                self._proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                              stderr=subprocess.PIPE, start_new_session=True)
                stdout, stderr = self._proc.stdout, self._proc.stderr
            else:
                transport = self._transport()
                self._channel = transport.open_session(timeout=self.machine.connect_timeout)
                self._channel.exec_command(shlex.join(argv))
                # Lines read straight off the channel: paramiko's files (makefile) print
                # tracebacks from their destructors when collected at interpreter exit.
                stdout = channel_lines(self._channel.recv)
                stderr = channel_lines(self._channel.recv_stderr)
        except FileNotFoundError as err:
            raise HostError(self.machine, no_python(self.machine) if self.machine.is_local
                            else missing_ssh_file(err)) from None
        except HostError:
            raise
        except Exception as err:  # paramiko, socket and OS errors all mean "unreachable"
            raise HostError(self.machine, describe_connection_error(err, self.machine)) from None
        self._readers = [threading.Thread(target=self._read, args=(stdout,), daemon=True),
                         threading.Thread(target=self._drain_stderr, args=(stderr,), daemon=True)]
        for reader in self._readers:
            reader.start()

    def _read(self, stream):
        try:
            for raw in stream:
                self.last_heard = time.monotonic()
                try:
                    msg = P.decode(raw.decode("utf-8", "replace"))
                except ValueError:
                    self._stderr.append(raw.decode("utf-8", "replace").rstrip())
                    continue
                if isinstance(msg, REPLIES) or isinstance(msg, P.Hello):
                    self.replies.put(msg)
                elif not isinstance(msg, P.Heartbeat):
                    self.events.put((self.machine.key, msg))
        except (OSError, EOFError):  # socket.error is OSError
            pass
        finally:
            _close_quietly(stream)  # its end: nothing else reads it
            self.closed = True
            self.replies.put(None)
            self.events.put((self.machine.key, CLOSED))

    def _drain_stderr(self, stream):
        try:
            for raw in stream:
                self._stderr.append(raw.decode("utf-8", "replace").rstrip())
        except (OSError, EOFError):  # socket.error is OSError
            pass
        finally:
            _close_quietly(stream)

    def _wait_reply(self, timeout, what):
        try:
            reply = self.replies.get(timeout=timeout)
        except queue.Empty:
            raise HostError(self.machine, "no answer within %gs %s" % (timeout, what)) from None
        if reply is None:
            self.replies.put(None)  # every later request fails the same way
            raise HostError(self.machine, self.failure())
        return reply

    def failure(self):
        """Why the agent's stream ended, in one line."""
        for reader in self._readers[1:]:  # its stderr's last lines may come after stdout's end
            reader.join(2)
        err = "\n".join(self._stderr)
        code = self._proc.poll() if self._proc is not None else (
            self._channel.recv_exit_status() if self._channel is not None and
            self._channel.exit_status_ready() else None)
        # No package there: no agent, not no Python.
        if "No module named 'tfcluster_agent'" in err:
            return ("no tfcluster agent at %s: run ansible-playbook playbooks/deploy.yml "
                    "(or `tfcluster sync` where the venv is there)" % self.agent_path)
        if code == 127 or ("No such file or directory" in err and self.machine.python in err):
            return no_python(self.machine)
        if "No module named 'tfcluster_agent." in err or "has no attribute 'main'" in err:
            # code deployed before the agent had its command line
            return ("the tfcluster code at %s is older than this controller's: run "
                    "ansible-playbook playbooks/deploy.yml (or `tfcluster sync`)"
                    % os.path.dirname(self.agent_path))
        last = err.strip().splitlines()[-1] if err.strip() else "connection closed"
        return "the agent ended (%s)" % last

    # ------------------------------------------------------------ one-shot commands
    COMMAND_SECONDS = 120  # one command's answer (a tar of a large user folder included)

    def command(self, args, stdin=b"", timeout=COMMAND_SECONDS, shared_lock=None):
        """(exit code, stdout, stderr) of the agent's command ARGS (`sync-list ...`, its
        package's command line) on the machine, fed STDIN: a process of its own beside any
        agent the link runs, holding a shared flock(1) of SHARED_LOCK (a path) where given.
        HostError when the machine or its Python cannot be reached (under SHARED_LOCK a missing
        Python is flock's exit code instead: lock only what a command before found there)."""
        argv = agent_argv(self.machine.python, os.path.dirname(self.agent_path), *args)
        code, out, err = self.run(["flock", "-s", shared_lock, *argv] if shared_lock else argv,
                                  stdin, timeout)
        if code == 127 or (code is None and self.machine.is_local):
            raise HostError(self.machine, no_python(self.machine))
        return code, out, err

    def run(self, argv, stdin=b"", timeout=COMMAND_SECONDS):
        """(exit code, stdout, stderr) of ARGV on the machine, fed STDIN: a local process, or a
        session on the link's SSH connection (made on first use, closed with the link); the
        exit code is None where the program is not there (a local machine). HostError when the
        machine cannot be reached or gives no answer within TIMEOUT seconds."""
        if self.machine.is_local:
            try:
                proc = subprocess.run(argv, input=stdin, capture_output=True, timeout=timeout)
            except FileNotFoundError:
                return None, b"", b""
            except subprocess.TimeoutExpired:
                raise HostError(self.machine, "no answer within %gs" % timeout) from None
            return proc.returncode, proc.stdout, proc.stderr
        try:
            channel = self._transport().open_session(timeout=self.machine.connect_timeout)
        except HostError:
            raise
        except Exception as err:  # paramiko, socket and OS errors all mean "unreachable"
            raise HostError(self.machine, describe_connection_error(err, self.machine)) from None
        channel.settimeout(timeout)
        try:
            channel.exec_command(shlex.join(argv))
            # The host may answer (an error) before reading everything: read while sending.
            out, err = bytearray(), bytearray()
            reader = threading.Thread(target=_drain, args=(channel, out, err), daemon=True)
            reader.start()
            try:
                channel.sendall(stdin)
            except OSError:
                pass  # the host stopped reading: its exit status and stderr say why
            channel.shutdown_write()
            reader.join(timeout)
            if not channel.status_event.wait(5):
                raise HostError(self.machine, "no answer within %gs" % timeout)
            return channel.recv_exit_status(), bytes(out), bytes(err)
        except HostError:
            raise
        except Exception as err:  # a channel broken mid-transfer: this machine failed
            raise HostError(self.machine, describe_connection_error(err, self.machine)) from None
        finally:
            channel.close()

    # ------------------------------------------------------------ talking
    def send(self, msg):
        if self.closed:
            raise HostError(self.machine, self.failure())
        data = P.encode(msg).encode()
        try:
            with self._send_lock:
                if self._proc is not None:
                    self._proc.stdin.write(data)
                    self._proc.stdin.flush()
                else:
                    self._channel.sendall(data)
        except Exception as err:  # a broken pipe or channel: the host is gone
            raise HostError(self.machine, "cannot reach the agent: %s" % (err or type(err).__name__)) \
                from None

    def request(self, msg, timeout, what="", collect=None):
        """Send MSG and wait for its reply; File messages on the way go to COLLECT. A link not
        open yet starts its agent first, MSG riding with the start (one round trip, not two)."""
        if self.hello is None:
            self.open(first=msg)
        else:
            self.send(msg)
        return self.reply_to(msg, timeout, what, collect)

    def reply_to(self, msg, timeout, what="", collect=None):
        """Wait for the reply to MSG, sent already."""
        deadline = time.monotonic() + timeout
        while True:
            reply = self._wait_reply(max(0.0, deadline - time.monotonic()), what or "to " + msg.kind)
            if isinstance(reply, P.File) and collect is not None:
                collect.append(reply)
                continue
            if isinstance(reply, P.Error):
                raise HostError(self.machine, reply.message)
            return reply

    CLOSE_WAIT = 2.0  # seconds a local agent left without a detach gets to end by itself

    def _end_local_agent(self):
        """Wait for the local agent to end; one still busy (a query of a stuck driver, while
        Ctrl-C ends `gpus --watch`) is killed with what it started in its session (nvidia-smi;
        tasks have sessions of their own), not left to end by itself later."""
        try:
            self._proc.wait(timeout=self.CLOSE_WAIT)
        except subprocess.TimeoutExpired:
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait(timeout=self.CLOSE_WAIT)

    def close(self, detach=False):
        """Leave the agent: with DETACH its tasks run on without a lease."""
        if self.closed and self._proc is None and self._connection is None:
            return
        try:
            if detach and not self.closed:
                self.send(P.Detach())
        except HostError:
            pass
        remote = self._channel is not None
        try:
            if self._proc is not None:
                self._proc.stdin.close()
                if not detach:
                    # Its tasks are stopped: it ends at once. Waiting keeps "nothing left" exact.
                    self._end_local_agent()
            if self._channel is not None:
                self._channel.shutdown_write()
                self._channel.close()
            if self._connection is not None:
                self._connection.close()
        except Exception:  # closing what is already broken
            pass
        self._connection = self._channel = None
        # The readers end with the channel: nothing of this link outlives the run.
        for reader in self._readers if remote else ():
            reader.join(1)


# The agent's package from the folder named after the code (sys.argv[1]); tfcluster_agent.main
# keeps its compiled code in the user's cache.
AGENT_BOOT = ("import os,sys;sys.path[0]=os.path.dirname(sys.argv[1]);import tfcluster_agent;"
              "tfcluster_agent.main(sys.argv[2:])")


def agent_argv(python, package_dir, *command):
    """How a launch starts the agent (COMMAND: serve), and how the controller runs the agent's
    other commands: -B, no compiled code next to the deployed code; -S, no `site`, whose .pth
    files cost every start (the agent is standard library only; its preflight finds the
    site folders itself, hostinfo.py); -c with the one boot line, not the package's __main__,
    whose runpy costs more imports. `ps` shows it as PACKAGE_DIR COMMAND."""
    return [python, "-B", "-S", "-c", AGENT_BOOT, package_dir, *(command or ("serve",))]


def _drain(channel, out, err):
    """A channel's stdout into OUT, then its stderr into ERR, until each ends."""
    while True:
        data = channel.recv(65536)
        if not data:
            break
        out += data
    while True:
        data = channel.recv_stderr(65536)
        if not data:
            break
        err += data


def channel_lines(recv):
    """The lines (bytes) RECV (a channel's recv or recv_stderr) delivers, until its end."""
    pending = bytearray()
    while True:
        data = recv(65536)
        if not data:
            break
        pending += data
        if b"\n" in data:  # a long line (a collected file) is split once, when it ends
            *lines, rest = pending.split(b"\n")
            pending = bytearray(rest)
            for line in lines:
                yield bytes(line) + b"\n"
    if pending:
        yield bytes(pending)


def _close_quietly(stream):
    try:
        stream.close()
    except Exception:  # closing what is already broken
        pass


def no_python(machine):
    return ("no Python at %s (tfcluster_python): run ansible-playbook playbooks/deploy.yml "
            "or set tfcluster_python" % machine.python)


def missing_ssh_file(err):
    return ("no file %s (ansible_ssh_private_key_file or known_hosts; a relative path is read "
            "from the inventory's folder)" % err.filename)


def describe_connection_error(err, machine):
    name = type(err).__name__
    text = str(err) or name
    if isinstance(err, TimeoutError) or "timed out" in text.lower():  # socket.timeout is one
        return ("cannot connect within %gs (tfcluster_connect_timeout): is the host up and "
                "reachable on port %d?" % (machine.connect_timeout, machine.ssh_port))
    if name == "AuthenticationException":
        return ("SSH authentication failed for user %s: set ansible_user and "
                "ansible_ssh_private_key_file" % (machine.user or "(default)"))
    if name == "BadHostKeyException" or "known_hosts" in text:
        return ("host key not trusted (%s): add it to known_hosts (ssh-keyscan) or set "
                "tfcluster_known_hosts" % text)
    if name == "NoValidConnectionsError" or isinstance(err, ConnectionRefusedError):
        return "connection refused on port %d: is sshd running?" % machine.ssh_port
    return "%s: %s" % (name, text)
