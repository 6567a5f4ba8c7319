"""A TF1 between-graph program at its smallest: the ps serves; each worker creates a session on
its server, puts a variable on ps:0, reads it back and exits 0.

TF1_DROP_EXEMPTION lists tasks (e.g. "worker:1") that remove the no_grpc_proxy tfcluster gives
them before TensorFlow starts, as a program that sets its own proxy settings would: with a proxy
in the environment, such a task waits in CreateSession for good.
"""
import json
import os

if os.environ["TFCLUSTER_TASK"] in os.environ.get("TF1_DROP_EXEMPTION", "").split(","):
    os.environ.pop("no_grpc_proxy", None)

# No Keras here: tf-keras's import instead of Keras 3's (~1.4 s of CPU less per task).
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
import tensorflow as tf  # noqa: E402  (after the environment is final: gRPC reads it once)

tf.compat.v1.disable_eager_execution()
config = json.loads(os.environ["TF_CONFIG"])
job, index = config["task"]["type"], config["task"]["index"]
server = tf.distribute.Server(tf.train.ClusterSpec(config["cluster"]), job_name=job,
                              task_index=index)
if job == "ps":
    server.join()
with tf.compat.v1.device("/job:ps/task:0"):
    variable = tf.compat.v1.get_variable("v%d" % index, initializer=42.0)
# Only the ps and this worker: the other worker's fate is not this one's.
session_config = tf.compat.v1.ConfigProto(device_filters=["/job:ps", "/job:worker/task:%d" % index])
with tf.compat.v1.Session(server.target, config=session_config) as session:
    session.run(variable.initializer)
    print("variable on ps:0 = %g" % session.run(variable), flush=True)
