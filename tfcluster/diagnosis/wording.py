"""Every sentence diagnosis says about a run's tasks, in one place: how a task ended, why the run
failed, what a TF1 task waits for in CreateSession, a stall and its cause, a straggler, and the
story of the first failure in the run's report. The other modules of diagnosis decide; these
functions only word what they decided."""
import signal
import time

from tfcluster.runs.record import TaskState
from tfcluster_agent import protocol as P


# ------------------------------------------------------------ how a task ended

def describe_exit(status, at=None, full=False):
    """How the task of STATUS (a TaskStatus) ended, its exit code decoded (128 + N: killed by
    signal N): "was killed by SIGKILL", "exited 1", "ended without an exit status" (its agent
    lost it), " at 12:00:03" added for AT (a time.time()). FULL, the run's failure's wording:
    "exited with status 1", "disappeared without an exit status"."""
    when = " at %s" % time.strftime("%H:%M:%S", time.localtime(at)) if at else ""
    code = None if status.state == TaskState.LOST else status.exit
    if status.state == TaskState.LOST and full:
        return "disappeared without an exit status" + when
    if code == P.DRAINED_EXIT:
        return "ended on the termination notice (status %d)%s" % (code, when)
    if code is not None and code > 128:
        try:
            return "was killed by %s%s" % (signal.Signals(code - 128).name, when)
        except ValueError:
            pass
    if full:
        return "exited with status %s%s" % (code, when)
    return ("exited %s" % code if code is not None else "ended without an exit status") + when


def joined_labels(labels):
    """"worker:0", "worker:0 and worker:1", "worker:0, worker:1 and ps:0"."""
    return labels[0] if len(labels) == 1 else ", ".join(labels[:-1]) + " and " + labels[-1]


# ------------------------------------------------------------ why the run failed

def task_failed(task, status):
    """The run's failure when TASK (its TaskStatus STATUS) ended: a chief or worker that failed,
    a ps that ended at all."""
    if task.job == "ps":
        return "%s on %s ended while the run was active (%s)" % (
            task.label, task.machine.address, describe_exit(status, full=True))
    return "%s on %s %s" % (task.label, task.machine.address, describe_exit(status, full=True))


def ps_never_listened(task, status):
    return "%s on %s %s before it listened on %s" % (
        task.label, task.machine.address, describe_exit(status, full=True), task.address)


# What a thread other than the main one runs the program's code for (diagnosis/stacks.py).
THREAD_KINDS = {"input": "input pipeline", "py_function": "py_function",
                "callback": "code on a TensorFlow thread"}


def blocked_in(blocked):
    """"stuck in f (a.py:3)", and what it waits for: ", which waits for the program's thread in
    g (a.py:9)". BLOCKED: a stacks.Blocked."""
    text = "stuck in %s" % blocked.frame
    feeders = blocked.feeder_frames
    if feeders:
        text += ", which waits for the program's thread%s in %s" % (
            "s" if len(feeders) > 1 else "", " or ".join(str(f) for f in feeders))
    return text


def culprit(task, status, at, frame, blocked=None):
    """"worker:1, which exited 0 at 12:01:07" (STATUS: it ended, AT: when), "worker:1, whose
    input pipeline is stuck in f (a.py:3)" (BLOCKED: the stacks.Blocked thread its main thread
    waits for), else "worker:1, which is stuck in f (a.py:3)" (FRAME: its own innermost frame)."""
    if status is not None and not status.alive:
        return "%s, which %s" % (task.label, describe_exit(status, at))
    if blocked:
        return "%s, whose %s is %s" % (task.label, THREAD_KINDS[blocked.what], blocked_in(blocked))
    return "%s, which is stuck in %s" % (task.label, frame)


def collective_aborted(task, status, culprits):
    """TASK failed when TensorFlow aborted a collective whose CULPRITS (their culprit() words)
    had left it."""
    return "%s waited in a collective for %s, until TensorFlow gave up (%s %s)" % (
        task.label, ", and ".join(culprits), task.label, describe_exit(status))


# ------------------------------------------------------------ stalls

def stalled_quietly(label, seconds, cpu):
    return "%s stalled for %d s (no output, %.1f s CPU)" % (label, seconds, cpu)


def stalled_waiting(label, seconds, peer):
    return "%s stalled for %d s (it only repeats TensorFlow's CreateSession wait for %s)" % (
        label, seconds, peer)


def resumed(label, why, seconds=None):
    """WHY: "output" (it printed) or "CPU" (it computes again), after SECONDS without output
    (None: not known, the stall was its repeated wait lines)."""
    if seconds is None:
        return "%s is no longer stalled: it printed" % label
    return "%s is no longer stalled: %s after %d s without output" % (
        label, "it printed" if why == "output" else "it uses CPU again", seconds)


def no_stacks_from(problem):
    return "WARNING no stacks from " + problem


def stacks_in(folder):
    return "stacks in %s (each task's main thread, innermost frame first):" % folder


def waits_in_collective(waiters, culprits):
    """WAITERS (labels) wait in a collective for the CULPRITS (their culprit() words)."""
    return "%s wait%s in a collective for %s" % (
        joined_labels(waiters), "s" if len(waiters) == 1 else "", ", and ".join(culprits))


def stopped_task(label):
    return "%s is stopped (SIGSTOP, or a debugger holds it)" % label


def no_python_stack(label):
    return "%s stalled with no Python stack" % label


def waits_in_tensorflow(label, frame):
    return "%s waits in TensorFlow, called from %s" % (label, frame)


def waits_for_own_code(label, blocked):
    """LABEL's main thread waits inside TensorFlow for BLOCKED (a stacks.Blocked)."""
    return "%s waits in TensorFlow for its %s, which is %s" % (
        label, THREAD_KINDS[blocked.what], blocked_in(blocked))


def blocked_thread_line(what, frames):
    """The line under a task's main thread in the stacks shown: the thread it waits for."""
    return "its %s: %s" % (THREAD_KINDS[what], frames)


def stuck_in(label, frame):
    return "%s is stuck in %s" % (label, frame)


def stalled_plainly(labels):
    """What is known when the stacks tell nothing: which tasks stalled."""
    return "%s stalled" % ", ".join(sorted(labels))


def run_stalled(cause):
    return "the run stalled: %s" % cause


# ------------------------------------------------------------ TF1's CreateSession waits

def waits_for(label, peer):
    return "%s waits in CreateSession for %s" % (label, peer)


def waits_for_stranger(label, peer, labels):
    return "%s, which is not in this run's cluster (%s)" % (waits_for(label, peer),
                                                            ", ".join(labels))


def not_running(status, at, known_end):
    """Why a peer is not running: it never started (STATUS None), its STATUS's state, or how it
    ended (KNOWN_END: its end was heard, AT)."""
    if status is None:
        return "it has not started"
    if not known_end:
        return "it is %s" % status.state
    return "it %s" % describe_exit(status, at)


def waits_for_stopped(label, peer, why):
    return "%s, which is not running: %s" % (waits_for(label, peer), why)


def waits_unasked(label, peer, machine, reason):
    return "%s, which is running; %s could not be asked whether it reaches it: %s" % (
        waits_for(label, peer), machine, reason)


def task_host(task):
    """"worker host 10.0.0.1": the machine of TASK, seen from its job."""
    return "%s host %s" % (task.job, task.machine.label)


def waits_unanswered(label, peer, host, address, machine, proxies):
    """PEER runs and HOST reaches it at ADDRESS; PROXIES: the proxy variables on MACHINE."""
    text = "%s: %s is running and %s reaches it at %s, but it does not answer TensorFlow" % (
        waits_for(label, peer), peer, host, address)
    if proxies:
        text += ("; %s has proxy variables (%s): does the program send gRPC through a proxy?"
                 % (machine, ", ".join(proxies)))
    return text


def waits_unreached(label, peer, host, address, outcome):
    return "%s: %s is running, but %s cannot reach %s at %s: %s" % (
        waits_for(label, peer), peer, host, peer, address, outcome)


# ------------------------------------------------------------ stragglers

def straggling(label, rate, unit, window, median, seconds):
    return ("%s is a straggler: %.3g %s over the last %gs, under half its peers' median (%.3g) "
            "for %ds" % (label, rate, unit, window, median, seconds))


def caught_up(label):
    return "%s caught up with its peers" % label


def straggled(label, seconds, since, worst):
    """The summary's line: LABEL straggled SECONDS from SINCE (a time), at WORST a fraction of
    the median."""
    return ("straggler: %s ran under half its peers' median rate for %ds from %s (at worst %.0f%% "
            "of it)" % (label, seconds, time.strftime("%H:%M:%S", time.localtime(since)),
                        100 * worst))


def slowest(label, wait):
    """LABEL is the busiest task of a synchronous run; the others wait WAIT of each step."""
    return "%s is the slowest: the others wait %.0f%% of each step for it" % (label, 100 * wait)


def no_longer_slowest(label):
    return "%s is no longer the one the others wait for" % label


def was_slowest(label, seconds, since, wait):
    """The summary's line: LABEL was the slowest for SECONDS from SINCE (a time); the others
    waited WAIT (the mean) of each step for it."""
    return ("slowest: %s held the others back for %ds from %s: they waited %.0f%% of each step "
            "for it" % (label, seconds, time.strftime("%H:%M:%S", time.localtime(since)),
                        100 * wait))


# ------------------------------------------------------------ the report

FIRST_FAILURE = "first failure"
STRAGGLER = "straggler"
SLOWEST = "slowest"


def story(followers, root, status, at):
    """"worker:0 and worker:1 failed after ps:0 was killed by SIGKILL at 12:00:03": the FOLLOWERS
    (labels) and the ROOT (a label) that failed first, its STATUS at AT."""
    return "%s failed after %s %s" % (joined_labels(followers), root, describe_exit(status, at))


def after(root):
    return "after %s" % root


def hint(text):
    return "hint: " + text


# ------------------------------------------------------------ lost machines and spares

def never_listened(labels, seconds):
    """The run's failure: the ps tasks LABELS did not listen within --start-timeout."""
    return "%s not listening after %gs (raise --start-timeout)" % (", ".join(labels), seconds)


def timed_out(seconds):
    return "the run exceeded --timeout %gs" % seconds


def interrupted(reason):
    """The run's end when REASON (a signal's name, `tfcluster stop`, ...) stopped it."""
    return "interrupted by %s" % reason


def machine_silent(labels, seconds):
    """Why machines LABELS are lost: their agents said nothing for SECONDS."""
    return "lost contact with %s for %gs: its agent stopped answering" % (
        joined_labels(labels), seconds)


def failed_on_machine(task_label, label, restarts):
    """Why machine LABEL is lost: TASK_LABEL failed there RESTARTS times."""
    return "%s failed %d time(s) on %s" % (task_label, restarts, label)


def no_spare_left(label, why):
    """The run's failure: machine LABEL is lost (WHY) and no spare can take its tasks."""
    return "%s (lost machine %s; no spare machine left to take its tasks: add hosts to the " \
           "inventory's [spare] group or pass --spares)" % (why, label)


def moved(label, spare, labels, whole, at=None, drained=False):
    """What a move did: LABELS left machine LABEL (lost, or DRAINED) for SPARE; WHOLE: every
    task restarted."""
    when = " at %s" % time.strftime("%H:%M:%S", time.localtime(at)) if at else ""
    return "moved %s from %s %s to spare %s%s; %s" % (
        joined_labels(labels), "drained" if drained else "lost", label, spare, when,
        "every task restarts from the last complete checkpoint" if whole
        else "the other tasks go on")
