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




def remove_tree(path):
    """PATH and what is in it, as far as it can be removed; symbolic links are removed, never
    followed (PATH too, where the task replaced its folder by one). By hand: shutil's import
    would cost each supervisor ~16 ms at its task's end, before the end is told."""
    if os.path.islink(path):
        _quietly(os.unlink, path)
        return
    for top, dirs, files in os.walk(path, topdown=False):
        for entry in files + dirs:
            inner = os.path.join(top, entry)
            remove = os.unlink if entry in files or os.path.islink(inner) else os.rmdir
            _quietly(remove, inner)
    _quietly(os.rmdir, path)


def _quietly(remove, path):
    try:
        remove(path)
    except OSError:
        pass
