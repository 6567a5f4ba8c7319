"""The files each real data set's loader reads, and which of them a task command needs.

Standard library only: the agent checks them at preflight (a missing data set fails the launch
before anything starts), data.py loads them.
"""
import os

MNIST_FILES = {"train_x": "train-images-idx3-ubyte.gz", "train_y": "train-labels-idx1-ubyte.gz",
               "test_x": "t10k-images-idx3-ubyte.gz", "test_y": "t10k-labels-idx1-ubyte.gz"}
CIFAR_TRAIN_FILES = ["data_batch_%d.bin" % i for i in range(1, 6)]
CIFAR_TEST_FILE = "test_batch.bin"
CENSUS_FILES = {"train": "adult.data", "test": "adult.test"}
# Data sets stored as MNIST's four IDX files: a program reading one reads the other.
IDX_DATASETS = ("mnist", "fashion_mnist")

# How to get a data set where preflight found it missing.
FETCH_HINT = "put it there (`tfcluster data fetch {name} --dest {folder}` for a local host, " \
             "ansible-playbook playbooks/deploy.yml -e '{{\"datasets_names\": [\"{name}\"]}}' " \
             "for the cluster) or pass --smoke"


def cifar10_dir(data_dir):
    """DATA_DIR itself or the cifar-10-batches-bin folder the archive extracts to."""
    for candidate in (data_dir, os.path.join(data_dir, "cifar-10-batches-bin")):
        if os.path.exists(os.path.join(candidate, CIFAR_TEST_FILE)):
            return candidate
    return data_dir


def files(name, data_dir):
    """(folder, file names) the loader of data set NAME reads below DATA_DIR."""
    if name in IDX_DATASETS:
        return data_dir, list(MNIST_FILES.values())
    if name == "cifar10":
        return cifar10_dir(data_dir), CIFAR_TRAIN_FILES + [CIFAR_TEST_FILE]
    if name == "census":
        return data_dir, list(CENSUS_FILES.values())
    raise ValueError("unknown data set %r" % name)


def paths(name, data_dir):
    """The paths of the files the loader of data set NAME reads below DATA_DIR."""
    folder, names = files(name, data_dir)
    return [os.path.join(folder, n) for n in names]


def missing_files(name, data_dir):
    """The files of data set NAME absent from DATA_DIR (empty: all there)."""
    return [os.path.basename(p) for p in paths(name, data_dir) if not os.path.exists(p)]


def option(argv, flag):
    """The last value of --FLAG in ARGV (argparse keeps the last), or None."""
    value = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg[len(flag) + 1:]
    return value


def needed(command, dataset):
    """(data set, folder) COMMAND reads from disk, or None: the example reads DATASET unless its
    arguments pick another (--dataset=digits, synthetic); --data_dir says where. A program made
    for MNIST may read Fashion-MNIST (--dataset=fashion_mnist), and a CIFAR-10 one too."""
    if not dataset:
        return None
    import shlex
    try:
        argv = shlex.split(command)
    except ValueError:
        return None
    chosen = option(argv, "--dataset") or dataset
    folder = option(argv, "--data_dir")
    readable = (dataset,) + (("fashion_mnist",) if dataset in IDX_DATASETS + ("cifar10",) else ())
    if chosen not in readable or not folder:
        return None
    return chosen, folder
