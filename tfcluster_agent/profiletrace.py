"""One trace of several TensorFlow profiler servers at once, run by path with a host's
TensorFlow interpreter by the agent (profiler.py):

  PYTHON ROOT/tfcluster_agent/profiletrace.py HOST:PORT,HOST:PORT,... FOLDER DURATION_MS

TensorFlow writes FOLDER/plugins/profile/TIMESTAMP/HOST_PORT.xplane.pb per server, the layout
TensorBoard's profile plugin reads. The client is TensorFlow's own profiler extension, loaded
alone from the installed package (what tf.profiler.experimental.client.trace calls): importing
all of TensorFlow would take seconds of the traced host's CPU, and as long again to wait before
the trace starts. Nothing of this package: its folder leaves sys.path first.
"""
import sys

del sys.path[0]  # this folder: its modules are no top-level modules of that interpreter

PLUGIN = "_pywrap_profiler_plugin"


def profiler_client():
    """TensorFlow's profiler client extension, or None where it is not where 2.x keeps it."""
    import importlib.machinery
    import importlib.util
    import os
    spec = importlib.util.find_spec("tensorflow")
    if spec is None or not spec.origin:
        return None
    path = os.path.join(os.path.dirname(spec.origin), "python", "profiler", "internal",
                        PLUGIN + ".so")
    if not os.path.exists(path):
        return None
    loader = importlib.machinery.ExtensionFileLoader(PLUGIN, path)
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(PLUGIN, loader))
    loader.exec_module(module)
    return module


def main(argv):
    import time
    addresses, folder, duration_ms = argv[0], argv[1], int(argv[2])
    client = profiler_client()
    start = time.time()
    if client is not None:
        # What client.trace passes: the servers, no worker list, dataset ops, the default options.
        client.trace(addresses, folder, "", True, duration_ms, 3, {})
    else:
        import tensorflow as tf
        start = time.time()
        tf.profiler.experimental.client.trace(
            ",".join("grpc://" + a for a in addresses.split(",")), folder, duration_ms,
            num_tracing_attempts=3)
    # When the trace was asked for and when the files were written, for the record.
    print("window %.3f %.3f" % (start, time.time()))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Exception as err:  # one line for the controller: what kept the trace from being taken
        print("%s: %s" % (type(err).__name__, " ".join(str(err).split())[:400]))
        sys.exit(1)
