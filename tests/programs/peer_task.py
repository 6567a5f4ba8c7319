"""A stand-in for a TensorFlow task whose workers depend on the ps, for the hang and root-cause
tests (no TensorFlow: each task starts in milliseconds).

ps tasks listen on their TF_CONFIG port and keep every connection open until they end. A worker
does what PEER_<JOB>_<INDEX> says:
- "train": connect to ps:0, then report a metrics point every 0.2 s (its own examples/s,
  measured as the trainers do) until the ps's connection closes: then exit 1, as a TF1 worker
  whose ps died fails with UnavailableError;
- "createsession:MARKER": once the file MARKER exists, print TensorFlow's CreateSession line
  for ps:0 every second, as a TF1 worker does (every 10 s) while it cannot reach its ps.
"""
import json
import os
import select
import socket
import sys
import time

config = json.loads(os.environ["TF_CONFIG"])
job, index = config["task"]["type"], config["task"]["index"]
print("peer %s:%d starting" % (job, index), flush=True)
if job == "ps":
    port = int(config["cluster"]["ps"][index].rsplit(":", 1)[1])
    server = socket.create_server(("", port))
    print("listening on %d" % port, flush=True)
    held = []
    while True:
        held.append(server.accept()[0])  # kept open: the worker sees it close when we die
behaviour = os.environ.get("PEER_%s_%d" % (job.upper(), index), "train")
host, port = config["cluster"]["ps"][0].rsplit(":", 1)
if behaviour.startswith("createsession:"):
    marker = behaviour.split(":", 1)[1]
    while not os.path.exists(marker):
        time.sleep(0.1)
    while True:
        print("I0000 00:00:%.6f %8d master.cc:278] CreateSession still waiting for response "
              "from worker: /job:ps/replica:0/task:0" % (time.time(), os.getpid()), flush=True)
        time.sleep(1)
deadline = time.monotonic() + 60
while True:  # the ps starts at the same time: TensorFlow's clients wait for it too
    try:
        connection = socket.create_connection((host, int(port)), timeout=30)
        break
    except ConnectionRefusedError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.1)
step, last = 0, time.monotonic()
while True:
    if select.select([connection], [], [], 0.2)[0] and not connection.recv(1):
        print("lost the connection to ps:0 at %s:%s" % (host, port), flush=True)
        sys.exit(1)
    step += 1
    now = time.monotonic()
    print('TFCLUSTER_METRIC {"step": %d, "examples_per_s": %.1f}' % (step, 32 / (now - last)),
          flush=True)
    last = now
