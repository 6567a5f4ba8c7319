"""Reading TensorFlow profiler traces in the tests (tests/test_profile_launch.py, and
tests/measurements.py)."""
import importlib.util
import os


def xplane_module():
    """TensorFlow's XSpace protobuf module, loaded alone (no TensorFlow import)."""
    spec = importlib.util.find_spec("tensorflow")
    path = os.path.join(os.path.dirname(spec.origin), "tsl", "profiler", "protobuf",
                        "xplane_pb2.py")
    module_spec = importlib.util.spec_from_file_location("tfcluster_test_xplane_pb2", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module
