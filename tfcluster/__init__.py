"""tfcluster: launch TensorFlow's own distributed runtime on the machines of an Ansible inventory."""

__version__ = "0.1.0"
