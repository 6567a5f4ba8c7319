"""A task's own temporary folder: made before the task starts, removed by its supervisor when it
ends, so that what a killed program leaves there, and the bytecode of TensorFlow's autograph
modules, which TensorFlow never removes, does not pile up in a host's /tmp. Standard library
only."""
import os


def private_tmp(parent, name):
    """A new folder of the task NAME's own (0700) under PARENT, or None where none can be made.
    mkdir never takes a folder that is there already, so nobody can hand the task one."""
    for _ in range(3):
        path = os.path.join(parent, "tfcluster-%s-%s" % (name, os.urandom(6).hex()))
        try:
            os.mkdir(path, 0o700)
            return path
        except FileExistsError:
            continue
        except OSError:
            return None
    return None

