"""One trace of several TensorFlow profiler servers at once, run by path with a host's
TensorFlow interpreter by the agent (profiler.py):

  PYTHON ROOT/tfcluster_agent/profiletrace.py HOST:PORT,HOST:PORT,... FOLDER DURATION_MS

TensorFlow writes FOLDER/plugins/profile/TIMESTAMP/HOST_PORT.xplane.pb per server, the layout
TensorBoard's profile plugin reads. Nothing of this package: its folder leaves sys.path first.
"""
import sys

del sys.path[0]  # this folder: its modules are no top-level modules of that interpreter


def main(argv):
    addresses, folder, duration_ms = argv[0], argv[1], int(argv[2])
    import tensorflow as tf
    services = ",".join("grpc://" + address for address in addresses.split(","))
    tf.profiler.experimental.client.trace(services, folder, duration_ms,
                                          num_tracing_attempts=3)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Exception as err:  # one line for the controller: what kept the trace from being taken
        print("%s: %s" % (type(err).__name__, " ".join(str(err).split())[:400]))
        sys.exit(1)
