"""A stand-in for a TensorFlow task, for launcher tests that need no TensorFlow.

ps tasks listen on their TF_CONFIG port until stopped. Workers behave as FAKE_<JOB>_<INDEX>
says: "exit:N:S" exits with N after S seconds, "forever" runs until stopped; the default is exit 0
after 1 s. Each task prints its TF_CONFIG task and the result line. "drain" (a ps too, which tfcluster gives no notice of its own) runs until
the termination notice appears ($TFCLUSTER_DRAIN_FILE), then says so and exits 42, as a trainer
that checkpointed on it.
"""
import json
import os
import socket
import sys
import time

config = json.loads(os.environ["TF_CONFIG"])
job, index = config["task"]["type"], config["task"]["index"]
print("fake %s:%d starting, python %s" % (job, index, sys.executable), flush=True)
print("flags: %s" % " ".join(sys.argv[1:]), flush=True)
behaviour = os.environ.get("FAKE_%s_%d" % (job.upper(), index), "exit:0:1")


def drain_when_noticed():
    if os.path.exists(os.environ["TFCLUSTER_DRAIN_FILE"]):
        with open(os.environ["TFCLUSTER_DRAIN_FILE"]) as handle:
            print("termination notice: %s" % handle.read(), flush=True)
        sys.exit(42)


if job == "ps":
    host, port = config["cluster"]["ps"][index].rsplit(":", 1)
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("", int(port)))
    server.listen()
    server.settimeout(0.1)
    print("listening on %s" % port, flush=True)
    while True:
        if behaviour == "drain":
            drain_when_noticed()
        try:
            connection, _ = server.accept()
            connection.close()
        except socket.timeout:
            pass
if behaviour.startswith(("failonce:", "foreveronce:")):
    # The first start fails or runs until killed (leaving MARKER behind), a restart succeeds.
    kind, marker = behaviour.split(":", 1)
    first = "exit:3:0.5" if kind == "failonce" else "forever"
    behaviour = "exit:0:0.5" if os.path.exists(marker) else first
    open(marker, "a").close()
if behaviour in ("forever", "drain"):
    while True:
        print("working", flush=True)
        for _ in range(5):
            if behaviour == "drain":
                drain_when_noticed()
            time.sleep(0.1)
_, code, delay = behaviour.split(":")
time.sleep(float(delay))
print('TFCLUSTER_RESULT {"task": "%s:%d", "accuracy": 0.5}' % (job, index), flush=True)
sys.exit(int(code))
