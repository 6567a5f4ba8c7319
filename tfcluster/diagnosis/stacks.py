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


def main_thread(text):
    """The frames (innermost first) of the main thread of the task's first Python process that
    sent its stacks; [] when none did."""
    main = threads = current = None
    for line in text.splitlines():
        process = PROCESS.match(line)
        if process:
            if main and threads and threads.get(main):
                break  # the first process with a main thread dump is the task's program
            main, threads, current = (process.group(3) or "").lower(), {}, None
            continue
        thread = THREAD.match(line)
        if thread and threads is not None:
            current = threads.setdefault(thread.group(1).lower(), [])
            continue
        frame = FRAME.match(line)
        if frame and current is not None:
            current.append(Frame(frame.group(3), frame.group(1), int(frame.group(2))))
    return (threads or {}).get(main) or []


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


def _culprit(task, states, ended_at, frames):
    return wording.culprit(task, states.get(task.label), ended_at.get(task.label),
                           own_frame(frames))


def stall_cause(cluster, states, ended_at, stacks, stalled):
    """One line naming what the STALLED tasks (labels) wait for, from STACKS ({label: text}),
    the tasks' STATES ({label: TaskStatus}) and ENDED_AT ({label: time.time()})."""
    frames = {t.label: main_thread(stacks.get(t.label, "")) for t in cluster.tasks}
    in_tf = {label: any(f.in_tensorflow for f in fr) for label, fr in frames.items()}
    training = [t for t in cluster.tasks if t.job in TRAINING_JOBS]
    stuck = [t for t in cluster.tasks if t.label in stalled]
    waiters = [t for t in stuck if t in training and in_tf[t.label]]
    # Collectives: every worker of a cluster without ps takes part in each one.
    if waiters and not cluster.job_tasks("ps") and len(training) > 1:
        culprits = [t for t in training if t not in waiters and (
            not states.get(t.label) or not states[t.label].alive or
            (frames[t.label] and not in_tf[t.label]))]
        if culprits:
            return wording.waits_in_collective(
                [t.label for t in waiters],
                [_culprit(t, states, ended_at, frames[t.label]) for t in culprits])
    parts = []
    for task in stuck:
        mine = frames[task.label]
        if not mine and stopped(stacks.get(task.label, "")):
            parts.append(wording.stopped_task(task.label))
        elif not mine:
            parts.append(wording.no_python_stack(task.label))
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
