"""The host-side agent as a child process, spoken to over its stdin/stdout as the controller
does; the fixture `agent` (registered in tests/conftest.py) starts one per test."""
import os
import queue
import subprocess
import sys
import threading
import time

import pytest

from support import REPO
from tfcluster_agent import protocol as P

AGENT = os.path.join(REPO, "tfcluster_agent", "agent.py")


class AgentProcess:
    """`agent.py serve` as a child, with a reader thread: messages arrive on a queue."""

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, AGENT, "serve"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, start_new_session=True)
        self.messages = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        assert isinstance(self.next(P.Hello), P.Hello)

    def _read(self):
        for line in self.proc.stdout:
            self.messages.put(P.decode(line.decode()))
        self.messages.put(None)

    def send(self, msg):
        self.proc.stdin.write(P.encode(msg).encode())
        self.proc.stdin.flush()

    def next(self, kind, timeout=20):
        """The next message of KIND (others are kept in .seen)."""
        deadline = time.monotonic() + timeout
        while True:
            msg = self.messages.get(timeout=max(0.01, deadline - time.monotonic()))
            if msg is None or isinstance(msg, kind):
                return msg
            self.seen.append(msg)

    seen = []

    def close(self, detach=False):
        if detach:
            self.send(P.Detach())
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture
def agent(tmp_path):
    AgentProcess.seen = []
    proc = AgentProcess()
    yield proc
    # Whatever a test started, stop it even when the test failed.
    subprocess.run([sys.executable, AGENT, "stop", "--dir", str(tmp_path / "run"), "--grace", "1"],
                   capture_output=True, timeout=60)
    if proc.proc.poll() is None:
        proc.proc.kill()
