"""Every Python process of a tfcluster task loads this first (tfcluster puts this folder at the
head of the task's PYTHONPATH): it lets the agent ask for the stacks of every thread with a
signal, with nothing for the program to add. Then it runs the sitecustomize the process would
have loaded without us (the user's, or the system's), if there is one.

faulthandler writes the stacks from its C signal handler, so a thread blocked inside TensorFlow
(or holding the GIL) does not keep them from being written. Each process appends them to
$TFCLUSTER_RUN_DIR/.stacks/PID.txt, after one header line that names its main thread and the
signal (tfcluster_agent/stall.py reads both). Standard library only; it never stops a program
from starting.
"""
import os  # both loaded already when site.py imports this
import sys


def _register():
    import _thread
    import faulthandler
    import signal
    run_dir = os.environ.get("TFCLUSTER_RUN_DIR")
    if not run_dir:
        return None
    folder = os.path.join(run_dir, ".stacks")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    signum = getattr(signal, "SIGRTMAX", 64) - 3
    fd = os.open(os.path.join(folder, "%d.txt" % os.getpid()),
                 os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    handle = os.fdopen(fd, "w")
    # This runs on the main thread. faulthandler prints thread ids as 0x and 16 hex digits.
    handle.write("tfcluster-stacks pid %d signal %d main 0x%016x\n"
                 % (os.getpid(), signum, _thread.get_ident()))
    handle.flush()
    faulthandler.register(signum, file=handle, all_threads=True, chain=False)
    return handle  # kept open: faulthandler writes to its descriptor


def _chain():
    """Load the sitecustomize that the rest of sys.path holds, under the same name."""
    import importlib.machinery
    import importlib.util
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


try:
    _stacks_file = _register()
except Exception:  # no stacks on demand for this process, but it runs
    _stacks_file = None
# Kept under a name of its own: the chained module takes the name sitecustomize, and the file
# faulthandler writes to must stay open.
sys.modules["_tfcluster_stacks"] = sys.modules[__name__]
_chain()  # its errors are reported by site.py, as they would be without us
