"""What an interpreter (tfcluster_python, often not the agent's own) says about its TensorFlow:
run by path, `PYTHON ROOT/tfcluster_agent/tfprobe.py locate|import`, by the agent's preflight
(hostinfo.python_report). Standard library only, and nothing of this package: its folder leaves
sys.path before anything is imported.

  locate   where the interpreter would import TensorFlow from, with its mtime ("" when nowhere)
  import   TensorFlow imported as the trainers import it; its version, then Python's
  path     the folders it imports from (sys.path), one a line
"""
import sys

del sys.path[0]  # this folder: its modules are no top-level modules of that interpreter


def locate():
    import importlib.util
    import os
    spec = importlib.util.find_spec("tensorflow")
    return repr((os.path.realpath(spec.origin), os.path.getmtime(spec.origin))) \
        if spec and spec.origin else ""


def import_tensorflow():
    """As trainers/common/bootstrap.import_tensorflow: without Keras 3 or tf-keras (their
    optimizers, which TensorFlow's __init__ imports when it can), without the cycle collector's
    passes over the import's objects."""
    import gc
    gc.disable()
    sys.modules["keras"] = sys.modules["tf_keras"] = None
    import tensorflow as tf
    return "%s\n%s" % (tf.__version__, sys.version.split()[0])


if __name__ == "__main__":
    print({"locate": locate, "import": import_tensorflow,
           "path": lambda: "\n".join(sys.path)}[sys.argv[1]]())
