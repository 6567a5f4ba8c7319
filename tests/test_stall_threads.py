"""Hangs off the main thread, named from captured stacks (tests/data/stacks/, see its README):
a task whose main thread waits inside TensorFlow while TensorFlow waits for the program's own
code on another thread (a tf.data generator, a py_function, a Keras Sequence's workers, and the
program's thread that a generator waits for). Idle helper threads are never blamed."""
import os

import pytest

from support import REPO
from support.fakehosts import cluster_of
from support.task_output import IN_COLLECTIVE, WAITING, states
from tfcluster.diagnosis import stacks as diagnose

SAMPLES = os.path.join(REPO, "tests", "data", "stacks")


def sample(name):
    with open(os.path.join(SAMPLES, name + ".txt")) as handle:
        return handle.read()


def cause_of(workers, ps=0, stalled=None):
    """The stall cause of a cluster whose worker:N has the stacks WORKERS[N] (sample names)."""
    cluster = cluster_of(ps=ps, workers=len(workers))
    stacks = {"worker:%d" % n: sample(name) for n, name in enumerate(workers)}
    labels = set(stacks) if stalled is None else stalled
    return diagnose.stall_cause(cluster, states(**{"worker_%d" % n: 1 for n in range(
        len(workers))}), {}, stacks, labels)


def test_a_collective_waits_for_the_worker_whose_generator_is_blocked_on_a_read():
    """Captured from tests/programs/mwms_generator_hang.py: before, both workers read "waits in
    TensorFlow, called from <module>"."""
    assert cause_of(["generator-waiting-worker", "generator-blocked"]) == (
        "worker:0 waits in a collective for worker:1, whose input pipeline is stuck in records "
        "(mwms_generator_hang.py:21)")
    # Only worker:0 stalled so far: worker:1 is named all the same.
    assert cause_of(["generator-waiting-worker", "generator-blocked"], stalled={"worker:0"}) \
        .startswith("worker:0 waits in a collective for worker:1, whose input pipeline")


@pytest.mark.parametrize("name, cause", [
    ("generator-blocked", "waits in TensorFlow for its input pipeline, which is stuck in "
                          "records (mwms_generator_hang.py:21)"),
    ("py-function-blocked", "waits in TensorFlow for its py_function, which is stuck in "
                            "read_feed (thread_stacks.py:44)"),
    ("keras-sequence-blocked", "waits in TensorFlow for its input pipeline, which is stuck in "
                               "read_feed (thread_stacks.py:44)"),
    ("generator-waits-for-thread",
     "waits in TensorFlow for its input pipeline, which is stuck in fed (thread_stacks.py:60), "
     "which waits for the program's threads in heartbeat (thread_stacks.py:29) or read_feed "
     "(thread_stacks.py:44)"),
])
def test_each_kind_of_thread_is_named_where_it_is_blocked(name, cause):
    """A worker beside a ps (no collective): its own line names the thread."""
    assert cause_of(["generator-waiting-worker", name], ps=1, stalled={"worker:1"}) == \
        "worker:1 " + cause
    assert cause_of([name, "generator-waiting-worker"]) == \
        "worker:1 waits in a collective for worker:0, whose " + cause.split(" its ", 1)[1] \
        .replace(", which is stuck", " is stuck", 1)


def test_the_stacks_shown_name_the_blocked_thread_under_the_main_one():
    blocked = diagnose.blocked_for_tensorflow(sample("keras-sequence-blocked"))
    assert blocked.what == "input" and str(blocked.frame) == "read_feed (thread_stacks.py:44)"
    assert diagnose.innermost(list(blocked.frames)) == \
        "read_feed (thread_stacks.py:44) < __getitem__ (thread_stacks.py:54) < get_index " \
        "(tf_keras/src/utils/data_utils.py:648)"


def test_idle_helper_threads_are_never_blamed():
    """Helpers in queue.get, time.sleep and Event.wait, a generator between two items: in every
    worker, in one worker only, or beside a ps, the cause stays the main thread's."""
    idle = "worker:%d waits in TensorFlow, called from idle (thread_stacks.py:76)"
    assert diagnose.blocked_for_tensorflow(sample("idle-helpers")) is None
    assert cause_of(["idle-helpers", "idle-helpers"]) == "; ".join(idle % n for n in (0, 1))
    assert cause_of(["generator-waiting-worker", "idle-helpers"]) == (
        "worker:0 waits in TensorFlow, called from <module> (mwms_generator_hang.py:42); "
        + idle % 1)
    assert cause_of(["idle-helpers", "idle-helpers"], ps=1, stalled={"worker:1"}) == idle % 1


def test_a_keras_callback_that_blocks_is_the_program_stuck_not_tensorflow():
    """The main thread in the program's own code called back from Keras' fit is stuck in that
    code: it is no waiter of the collective."""
    callback = diagnose.stall_cause(
        cluster_of(ps=0, workers=2), states(worker_0=1, worker_1=1), {},
        {"worker:0": IN_COLLECTIVE, "worker:1": WAITING.replace(
            '/home/u/train.py", line 40 in <module>',
            '/v/lib/python3.11/site-packages/tf_keras/src/callbacks.py", line 9 in on_batch_end\n'
            '  File "/home/u/train.py", line 40 in <module>')},
        {"worker:0", "worker:1"})
    assert callback == ("worker:0 waits in a collective for worker:1, which is stuck in "
                        "wait_for_data (train.py:14)")


def test_a_replica_thread_waiting_inside_tensorflow_is_no_program_code_stuck():
    """MirroredStrategy runs the program's step on a thread per replica: one that waits inside
    TensorFlow is not blamed, one blocked in the program's own code is."""
    site = "/v/lib/python3.11/site-packages/tensorflow/python/"
    replica = ["Thread 0x00000000000000bb (most recent call first):",
               '  File "/home/u/train.py", line 12 in step',
               '  File "%sdistribute/mirrored_run.py", line 9 in run' % site,
               '  File "/usr/lib/python3.11/threading.py", line 1045 in _bootstrap_inner', ""]
    in_tf = ['  File "%seager/execute.py", line 53 in quick_execute' % site]
    for inside, blamed in ((in_tf, None), ([], "callback")):
        text = IN_COLLECTIVE.replace("Current thread", "\n".join(
            replica[:1] + inside + replica[1:]) + "Current thread")
        blocked = diagnose.blocked_for_tensorflow(text)
        assert (blocked and blocked.what) == blamed, text
    assert diagnose.stall_cause(cluster_of(ps=1, workers=1), states(worker_0=1), {},
                                {"worker:0": text}, {"worker:0"}) == \
        "worker:0 waits in TensorFlow for its code on a TensorFlow thread, which is stuck in " \
        "step (train.py:12)"
