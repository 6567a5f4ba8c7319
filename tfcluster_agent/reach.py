"""Can this host open TCP connections to its peers' ports? Standard library only.

Before a run's tasks start nothing listens on their ports, so for the preflight's reachability
check every agent listens on its claimed ports for a moment (`Listeners`: the kernel completes
the handshakes, nothing is read or written) while every agent connects to the ports its tasks
will dial (`probe`). During a run the controller asks the same `probe` of a waiting task's host.
"""
import _socket
import errno
import os
import select
import time

BACKLOG = 1024  # connections the kernel completes for us without an accept

REFUSED = "refused"
TIMED_OUT = "timed out"
REACHED = "reached"
# Seconds a connection may take: a firewall that drops packets shows as a timeout.
REACH_SECONDS = 5.0
# What errno a failed connect leaves, in the words the controller prints.
_ERRNO_WORDS = {errno.ECONNREFUSED: REFUSED, errno.ETIMEDOUT: TIMED_OUT,
                errno.EHOSTUNREACH: "no route to host", errno.ENETUNREACH: "network unreachable"}


class Listeners:
    """Listening sockets on a run's ports, until close()."""

    def __init__(self):
        self.sockets = []

    def listen(self, ports):
        """Listen on every port of PORTS (every address, as TensorFlow's servers bind);
        {port (str): why not} for those that failed."""
        failed = {}
        for port in ports:
            sock = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
            try:
                sock.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
                sock.bind(("", int(port)))
                sock.listen(BACKLOG)
            except OSError as err:
                sock.close()
                failed[str(port)] = err.strerror or str(err)
                continue
            self.sockets.append(sock)
        return failed

    def close(self):
        for sock in self.sockets:
            sock.close()
        self.sockets = []


def _connect(host, port):
    """A socket connecting to HOST:PORT without blocking, or the reason there is none."""
    try:
        _socket.inet_aton(host)  # an address already: the resolver's first call costs more
        address = (host, int(port))
    except OSError:
        # A str name goes through the idna codec, whose first use imports re, stringprep and
        # unicodedata (a launch's wait); an ASCII name needs none.
        name = host.encode() if host.isascii() else host
        try:
            address = _socket.getaddrinfo(name, int(port), _socket.AF_INET,
                                          _socket.SOCK_STREAM)[0][4]
        except OSError:
            return None, "cannot resolve %s" % host
    sock = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
    sock.setblocking(False)
    code = sock.connect_ex(address)
    if code in (0, errno.EINPROGRESS):
        return sock, None
    sock.close()
    return None, _ERRNO_WORDS.get(code, os.strerror(code))


def probe(targets, timeout):
    """{key: "reached" | "refused" | "timed out" | another reason} for TARGETS, [key, host,
    port] triples: one connection each, all at once, none waiting past TIMEOUT seconds."""
    results, pending = {}, {}
    for key, host, port in targets:
        sock, reason = _connect(host, port)
        if sock is None:
            results[key] = reason
        else:
            pending[sock.fileno()] = (key, sock)
    poller = select.poll()
    for fd in pending:
        poller.register(fd, select.POLLOUT)
    deadline = time.monotonic() + timeout
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        for fd, _ in poller.poll(left * 1000):
            key, sock = pending.pop(fd)
            poller.unregister(fd)
            code = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_ERROR)
            results[key] = REACHED if code == 0 else _ERRNO_WORDS.get(code, os.strerror(code))
            sock.close()
    for key, sock in pending.values():
        results[key] = TIMED_OUT
        sock.close()
    return results


class ReachRequests:
    """The agent's answers to the reachability requests (protocol.Listen, Reach); mixed
    into agent.Agent, whose send() and run_dir they use."""

    _listeners = None

    def close_listeners(self):
        """Before a preflight or a start: the ports are the tasks' again."""
        if self._listeners is not None:
            self._listeners.close()

    def on_listen(self, msg):
        from tfcluster_agent import protocol as P
        if self.run_dir:
            raise ValueError("this agent runs tasks already: it listens for no check")
        self.close_listeners()
        self._listeners = Listeners()
        self.send(P.Report(report={"failed": self._listeners.listen(msg.ports)}))

    def on_reach(self, msg):
        """A Report at once, before tasks run; while they run (the message has an id) a Probed
        event from a thread of its own, so that their output keeps flowing meanwhile."""
        from tfcluster_agent import protocol as P
        if not msg.id:
            self.send(P.Report(report={"results": probe(msg.targets, msg.timeout)}))
            return
        import threading

        def answer():
            self.send(P.Probed(id=msg.id, results=probe(msg.targets, msg.timeout)))
        threading.Thread(target=answer, daemon=True).start()
