"""What stalled tasks wait for, read from their stacks (tfcluster_agent/stall.py writes them):
the innermost frames of each task's main thread, and the cause of a stall in one line.

MultiWorkerMirroredStrategy's workers meet in every collective: when some wait inside
TensorFlow while another is stuck outside it, or has exited, that other one is the cause.
"""
import re

from tfcluster.diagnosis import wording
from tfcluster.spec.cluster import TRAINING_JOBS
from tfcluster_agent.values import value_class

FRAME = re.compile(r'^\s*File "(.*)", line (\d+) in (.*)$')
THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-fA-F]+)")
PROCESS = re.compile(r"^# pid (\d+) \((.*)\).*?(?:, main thread (0x[0-9a-fA-F]+))?$")
PROCESS_STATE = re.compile(r"^# pid \d+ \(.*\) state (\S)", re.M)
LIBRARY_PARTS = ("/site-packages/", "/dist-packages/", "/lib/python")
TENSORFLOW_PARTS = ("/tensorflow/", "/keras/", "/tf_keras/")


@value_class(frozen=True)
class Frame:
    function: str
    file: str
    line: int

    @property
    def short_file(self):
        """tensorflow/python/eager/execute.py for a package's file, train.py for others."""
        for part in ("/site-packages/", "/dist-packages/"):
            if part in self.file:
                return self.file.split(part, 1)[1]
        return self.file.rsplit("/", 1)[-1]

    def __str__(self):
        return "%s (%s:%d)" % (self.function, self.short_file, self.line)

    @property
    def in_library(self):
        return self.file.startswith("<") or any(p in self.file for p in LIBRARY_PARTS)

    @property
    def in_tensorflow(self):
        return any(p in self.file for p in TENSORFLOW_PARTS)


def threads(text):
    """[(main, frames)] of every Python thread of the task's first Python process that sent its
    stacks, the main thread first (MAIN: it is), each thread's frames innermost first; [] when
    no process sent any."""
    main = found = current = None
    for line in text.splitlines():
        process = PROCESS.match(line)
        if process:
            if main and found and found.get(main):
                break  # the first process with a main thread dump is the task's program
            main, found, current = (process.group(3) or "").lower(), {}, None
            continue
        thread = THREAD.match(line)
        if thread and found is not None:
            current = found.setdefault(thread.group(1).lower(), [])
            continue
        frame = FRAME.match(line)
        if frame and current is not None:
            current.append(Frame(frame.group(3), frame.group(1), int(frame.group(2))))
    found = found or {}
    return [(ident == main, frames) for ident, frames in
            sorted(found.items(), key=lambda item: item[0] != main) if frames]


def main_thread(text):
    """The frames (innermost first) of the main thread of the task's first Python process that
    sent its stacks; [] when none did."""
    return next((frames for main, frames in threads(text) if main), [])


def stopped(text):
    """True when every process of the task is stopped (state T or t)."""
    found = [m.group(1) for m in PROCESS_STATE.finditer(text)]
    return bool(found) and all(state in "Tt" for state in found)


def innermost(frames, count=3):
    """"f (a.py:3) < g (a.py:9)": where the main thread is, innermost first, and the program's
    own frame that called into a library ("... < main (train.py:30)")."""
    if not frames:
        return "no Python stack"
    shown = [str(f) for f in frames[:count]]
    own = own_frame(frames)
    if own not in frames[:count]:
        shown[-1:] = ["...", str(own)]
    return " < ".join(shown)


def own_frame(frames):
    """The innermost frame of the program's own code (not the standard library's, not a
    package's): where it is stuck, in its own terms."""
    return next((f for f in frames if not f.in_library), frames[0] if frames else None)


def inside_tensorflow(frames):
    """True when the thread is inside TensorFlow now: a TensorFlow frame comes before (inside)
    its innermost own frame. A Keras callback that blocks is the program's own code, stuck."""
    for frame in frames:
        if frame.in_tensorflow:
            return True
        if not frame.in_library:
            return False
    return False


@value_class(frozen=True)
class Blocked:
    """A thread other than the main one, blocked in the program's own code while the main thread
    waits inside TensorFlow: WHAT it is (a wording.THREAD_KINDS key), its FRAMES (innermost
    first), and FEEDERS: when it waits for another of the program's threads, the frames of
    those the program started that are blocked in its own code."""
    what: str
    frames: tuple
    feeders: tuple = ()

    @property
    def frame(self):
        return own_frame(self.frames)

    @property
    def feeder_frames(self):
        return [own_frame(frames) for frames in self.feeders]


INPUT_PARTS = ("/python/data/", "/data_adapter", "/data_utils.py")  # tf.data, Keras' adapters
PY_FUNCTION_FILE = "/python/ops/script_ops.py"
THREAD_WAITS = ("/threading.py", "/queue.py")  # a wait for another thread of the program


def run_for_tensorflow(frames):
    """What a thread runs the program's code for when TensorFlow called it (a TensorFlow frame
    outside its innermost own frame): "input" (a tf.data generator, a Keras data adapter's
    worker; whatever it calls, TensorFlow waits for it), "py_function" or "callback" (not inside
    TensorFlow itself); None for any other thread."""
    own = own_frame(frames)
    if own is None or own.in_library:
        return None
    callers = [f for f in frames[frames.index(own) + 1:] if f.in_tensorflow]
    if not callers:
        return None
    if any(part in f.file for f in callers for part in INPUT_PARTS):
        return "input"
    if any(f.file.endswith(PY_FUNCTION_FILE) for f in callers):
        return "py_function"
    # A replica's thread (MirroredStrategy) that waits inside TensorFlow is no program code stuck.
    return None if inside_tensorflow(frames) else "callback"


def waits_for_a_thread(frames):
    """True when the innermost frame is a queue's, a lock's or an event's wait."""
    return bool(frames) and any(part in frames[0].file for part in THREAD_WAITS)


def blocked_for_tensorflow(text):
    """The Blocked thread TensorFlow waits for in a task's stacks TEXT, or None. Its main thread
    waits inside TensorFlow, and TensorFlow runs the program's code on another thread that is
    there: a generator or py_function only shows while it runs, so in a stall it is blocked.
    The program's own threads (idle helpers as well) are named only as what that one waits for,
    when it waits in a queue, lock or event."""
    found = threads(text)
    if not found or not found[0][0] or not inside_tensorflow(found[0][1]):
        return None
    for _, frames in found[1:]:
        what = run_for_tensorflow(frames)
        if what:
            feeders = ()
            if waits_for_a_thread(frames):
                feeders = tuple(tuple(theirs) for _, theirs in found[1:]
                                if not any(f.in_tensorflow for f in theirs)
                                and not own_frame(theirs).in_library
                                and not waits_for_a_thread(theirs))
            return Blocked(what, tuple(frames), feeders)
    return None


def _culprit(task, states, ended_at, frames, blocked=None):
    return wording.culprit(task, states.get(task.label), ended_at.get(task.label),
                           own_frame(frames), blocked)


def stall_cause(cluster, states, ended_at, stacks, stalled):
    """One line naming what the STALLED tasks (labels) wait for, from STACKS ({label: text}),
    the tasks' STATES ({label: TaskStatus}) and ENDED_AT ({label: time.time()})."""
    texts = {t.label: stacks.get(t.label, "") for t in cluster.tasks}
    frames = {label: main_thread(text) for label, text in texts.items()}
    in_tf = {label: inside_tensorflow(fr) for label, fr in frames.items()}
    blocked = {label: blocked_for_tensorflow(text) for label, text in texts.items()}
    training = [t for t in cluster.tasks if t.job in TRAINING_JOBS]
    stuck = [t for t in cluster.tasks if t.label in stalled]
    waiters = [t for t in stuck if t in training and in_tf[t.label] and not blocked[t.label]]
    # Collectives: every worker of a cluster without ps takes part in each one.
    if waiters and not cluster.job_tasks("ps") and len(training) > 1:
        culprits = [t for t in training if t not in waiters and (
            not states.get(t.label) or not states[t.label].alive or blocked[t.label] or
            (frames[t.label] and not in_tf[t.label]))]
        if culprits:
            return wording.waits_in_collective(
                [t.label for t in waiters],
                [_culprit(t, states, ended_at, frames[t.label], blocked[t.label])
                 for t in culprits])
    parts = []
    for task in stuck:
        mine = frames[task.label]
        if not mine and stopped(stacks.get(task.label, "")):
            parts.append(wording.stopped_task(task.label))
        elif not mine:
            parts.append(wording.no_python_stack(task.label))
        elif blocked[task.label]:
            parts.append(wording.waits_for_own_code(task.label, blocked[task.label]))
        elif in_tf[task.label]:
            parts.append(wording.waits_in_tensorflow(task.label, own_frame(mine)))
        else:
            parts.append(wording.stuck_in(task.label, own_frame(mine)))
    return "; ".join(parts) or None


TF_TASK = re.compile(r"/job:(\w+)/replica:\d+/task:(\d+)")


def collective_abort_cause(cluster, states, ended_at, task, tail):
    """When TASK failed because TensorFlow aborted a collective (a peer stopped sending
    heartbeats), the line naming that peer: "worker:0 waited in a collective for worker:1,
    which exited 0 at 12:01:07 ..."; None otherwise. TAIL: TASK's last lines."""
    text = "\n".join(tail)
    if "Collective ops is aborted" not in text:
        return None
    named = {"%s:%s" % m for m in TF_TASK.findall(text)} - {task.label}
    failed_at = ended_at.get(task.label, float("inf"))
    gone = [t for t in cluster.tasks if t.job in TRAINING_JOBS and t is not task
            and t.label in states and not states[t.label].alive
            and ended_at.get(t.label, 0) <= failed_at and (not named or t.label in named)]
    if not gone:
        return None
    return wording.collective_aborted(task, states[task.label],
                                      [_culprit(t, states, ended_at, []) for t in gone])
