"""Towers on one host's devices (mnist_towers, CIFAR-10's local mode): the devices they run on,
GPUs when the host has enough of them, else logical CPU devices, and their gradients' average.
Host side: TensorFlow and the standard library only."""


def make_devices(count):
    """(device type, [device names]) for COUNT towers; call before anything touches TensorFlow's
    devices, since logical devices can only be configured then."""
    import tensorflow as tf
    if count < 1:
        raise SystemExit("--num_devices must be at least 1")
    gpus = tf.config.list_physical_devices("GPU")
    if len(gpus) >= count:
        return "GPU", ["/device:GPU:%d" % i for i in range(count)]
    cpus = tf.config.list_physical_devices("CPU")
    made = tf.config.get_logical_device_configuration(cpus[0]) or []
    if count > 1 and len(made) < count:  # a process that made enough already keeps them
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(count)])
    return "CPU", ["/device:CPU:%d" % i for i in range(count)]


def device_config(config):
    """The session config with as many CPU devices as were made logical (sessions take their
    device count from their own ConfigProto, not from tf.config)."""
    import tensorflow as tf
    config.device_count["CPU"] = len(tf.config.list_logical_devices("CPU"))
    return config


def average_gradients(tower_grads):
    """[[grad per variable] per tower] -> [mean grad per variable]: the towers' sync point."""
    import tensorflow as tf
    return [tf.add_n(list(grads)) / float(len(grads)) for grads in zip(*tower_grads)]
