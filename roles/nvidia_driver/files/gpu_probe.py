"""Run a small matmul on every GPU TensorFlow sees and compare it with numpy's result.

Run by the nvidia_driver role's `verify` entry point with the hosts' TensorFlow interpreter.
Prints one JSON line: {"version", "gpus" (TensorFlow's count), "ran" (GPU indices whose result
was right, computed on that GPU), "errors" {index: text}}; TensorFlow's own log goes to stderr.
"""
import gc
import json
import os
import sys

# `import tensorflow` loads Keras 3 (and scikit-learn, matplotlib) unless told to use tf-keras's
# lighter path: ~2 s of CPU the matmul does not need (trainers.common.bootstrap does the same).
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
# As the trainers import it (trainers/common/bootstrap.py): the cycle collector's passes over
# the import's objects (a quarter of its CPU) paused, tf-keras's optimizers not imported eagerly.
gc.disable()
sys.modules["tf_keras"] = None

result = {"version": None, "gpus": 0, "ran": [], "errors": {}}
try:
    import numpy as np
    import tensorflow as tf
except Exception as error:  # noqa: BLE001 - any import failure is the answer
    result["errors"]["import"] = "%s: %s" % (type(error).__name__, error)
    print(json.dumps(result))
    sys.exit(0)

result["version"] = tf.__version__
# No silent fallback to the CPU: a kernel that cannot run on the GPU must raise.
tf.config.set_soft_device_placement(False)
gpus = tf.config.list_physical_devices("GPU")
result["gpus"] = len(gpus)
a = np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32)
expected = a @ a
for index in range(len(gpus)):
    try:
        with tf.device("/GPU:%d" % index):
            product = tf.linalg.matmul(tf.constant(a), tf.constant(a))
        if not product.device.endswith("GPU:%d" % index):
            raise RuntimeError("the matmul ran on %s" % product.device)
        if not np.allclose(product.numpy(), expected, rtol=1e-2, atol=1e-2):
            raise RuntimeError("the matmul's result is wrong")
        result["ran"].append(index)
    except Exception as error:  # noqa: BLE001 - reported per GPU
        result["errors"][str(index)] = "%s: %s" % (type(error).__name__, str(error)[-500:])
print(json.dumps(result))
