"""One line of advice for known failures: after a failed run, the failed tasks' logs are matched
against a small table, and each hint whose patterns all appear is printed once."""
import functools
import os
import re

from tfcluster.diagnosis import wording

# Only the end of a log is read: a traceback is there, and a huge log stays cheap.
TAIL_BYTES = 256 * 1024

# Keras 3's own files; tf-keras lives in tf_keras/src/ and must not match.
KERAS3 = r"(?<!tf_)keras/src/"
LEGACY_KERAS = ("Keras 3 (TensorFlow 2.16+) cannot run model.fit across workers: relaunch with "
                "--env TF_USE_LEGACY_KERAS=1 (it uses tf-keras, which deploy installs)")

# (patterns that must all be in one log, the hint). The texts are TensorFlow's own errors.
HINTS = (
    # MultiWorkerMirroredStrategy: keras-team/keras#20585.
    ((r"unsupported type \(<class 'tensorflow\.python\.distribute\.values\.PerReplica'>\) "
      r"to a Tensor", KERAS3), LEGACY_KERAS),
    # ParameterServerStrategy: keras-team/keras#18624.
    ((r"To use this dataset, you need to pass this dataset to "
      r"ClusterCoordinator\.create_per_worker_dataset", KERAS3), LEGACY_KERAS),
    ((r"No module named 'tf_keras'",),
     "TF_USE_LEGACY_KERAS=1 needs the tf-keras package: deploy again (`tfcluster deploy`) "
     "or pip install tf-keras at the TensorFlow version"),
    # TF1 sessions: a ps refused a step's RunGraph as a request id it had seen recently.
    ((r"The same \w+ \(\w+\) request was received twice",),
     "TensorFlow's check for repeated requests refused a step (\"request was received twice\"): "
     "TensorFlow's runtime failed, not the program, at random in long runs with many steps a "
     "second; relaunch with --restarts N and tfcluster restarts the failed task"),
)
@functools.lru_cache(maxsize=1)
def compiled():
    """HINTS' patterns compiled, when a failed run first needs them."""
    return tuple((tuple(re.compile(p) for p in patterns), hint) for patterns, hint in HINTS)


def read_tail(path):
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, os.path.getsize(path) - TAIL_BYTES))
            return handle.read().decode("utf-8", "replace")
    except OSError:
        return ""


def hints_for(texts):
    """The hints, in table order and each once, whose patterns all match one of TEXTS."""
    found = []
    for patterns, hint in compiled():
        if hint not in found and any(all(p.search(text) for p in patterns) for text in texts):
            found.append(hint)
    return found


def print_hints(reporter, record_dir, log_names):
    """Print the hints for the logs LOG_NAMES (files in RECORD_DIR), one "hint:" line each."""
    for hint in hints_for([read_tail(os.path.join(record_dir, name)) for name in log_names]):
        reporter.note(wording.hint(hint))
