"""Every Python process of a tfcluster task loads this first (tfcluster puts this folder at the
head of the task's PYTHONPATH): it lets the agent ask for the stacks of every thread with a
signal, with nothing for the program to add. Then it runs the sitecustomize the process would
have loaded without us (the user's, or the system's), if there is one.

faulthandler writes the stacks from its C signal handler, so a thread blocked inside TensorFlow
(or holding the GIL) does not keep them from being written. Each process appends them to
$TFCLUSTER_RUN_DIR/.stacks/PID.txt, after one header line that names its main thread and the
signal (tfcluster_agent/stall.py reads both). Standard library only; it never stops a program
from starting.

The profiler: a second signal (PROFILE_SIGNAL) is blocked in the main thread before any other
thread exists, so every thread TensorFlow starts inherits the block, and one small thread waits
for it in sigwait: no CPU and no Python handler until it comes, and it is answered even while
the main thread is blocked inside TensorFlow. On the signal it reads the port the agent claimed
from $TFCLUSTER_RUN_DIR/.profiler/PID.request, starts TensorFlow's profiler server there (once
TensorFlow is imported) and writes its answer to PID.answer (tfcluster_agent/profiler.py).
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


def _profiler_hook():
    import _thread
    import signal
    run_dir = os.environ.get("TFCLUSTER_RUN_DIR")
    if not run_dir:
        return
    signum = getattr(signal, "SIGRTMAX", 64) - 4  # tfcluster_agent/profiler.py PROFILE_SIGNAL
    signal.pthread_sigmask(signal.SIG_BLOCK, [signum])
    _thread.start_new_thread(_profiler_waiter, (os.path.join(run_dir, ".profiler"), signum))


def _profiler_waiter(folder, signum):
    import signal
    started = None
    while True:
        signal.sigwait([signum])
        pid = os.getpid()
        try:
            started, answer = _start_profiler(folder, pid, started)
        except Exception as err:  # said to the agent, never raised into the program
            answer = "error %s: %s" % (type(err).__name__, str(err).splitlines()[0] if str(err)
                                       else "")
        try:
            path = os.path.join(folder, "%d.answer" % pid)
            with open(path + ".tmp", "w") as handle:
                handle.write(answer + "\n")
            os.replace(path + ".tmp", path)
        except OSError:
            pass  # the agent names the task as not answering


def _start_profiler(folder, pid, started):
    """(port now served, the answer line): `listening PORT`, or `no-tensorflow ...`."""
    if started is not None:
        return started, "listening %d" % started
    tf = sys.modules.get("tensorflow")
    spec = getattr(tf, "__spec__", None)
    if tf is None or getattr(spec, "_initializing", False):
        return None, "no-tensorflow TensorFlow is not imported in this process (yet)"
    with open(os.path.join(folder, "%d.request" % pid)) as handle:
        port = int(handle.read().split()[0])
    tf.profiler.experimental.server.start(port)
    return port, "listening %d" % port


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
try:
    _profiler_hook()
except Exception:  # no profiler on demand for this process, but it runs
    pass
# Kept under a name of its own: the chained module takes the name sitecustomize, and the file
# faulthandler writes to must stay open.
sys.modules["_tfcluster_stacks"] = sys.modules[__name__]
_chain()  # its errors are reported by site.py, as they would be without us
