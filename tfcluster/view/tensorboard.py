"""`tfcluster tensorboard RUN...`: serve the runs' collected event files with TensorBoard.

The launcher copies each host's `tensorboard/<task>/` folder into `runs/<id>/tensorboard/<task>/`;
with several runs, each gets its own name in TensorBoard (`--logdir_spec id:path,...`). A run's
profiles (`tfcluster profile`, `runs/<id>/profile/<time>/plugins/profile/`) are served beside
them as `<id>-profile`, for the profile plugin (the viz extra installs it).
"""
import importlib.util
import os
import sys

from tfcluster.errors import UsageError

INSTALL = "pip install 'tfcluster[viz]'"


def logdir_spec(run_dirs):
    """"id:path,id:path" for the runs' tensorboard folders; a usage error when one has none."""
    parts = []
    for run_dir in run_dirs:
        run_id = os.path.basename(os.path.normpath(run_dir))
        path = os.path.abspath(os.path.join(run_dir, "tensorboard"))
        profiles = os.path.abspath(os.path.join(run_dir, "profile"))
        found = [(name, folder) for name, folder in ((run_id, path),
                                                      (run_id + "-profile", profiles))
                 if os.path.isdir(folder)]
        if not found:
            raise UsageError("run %s has no tensorboard folder (%s): its trainers wrote no "
                             "event files, and it has no profile (`tfcluster profile`)"
                             % (run_id, path))
        for name, folder in found:
            if "," in folder:
                raise UsageError("cannot serve %s: TensorBoard's --logdir_spec does not allow "
                                 "',' in a path" % folder)
            parts.append("%s:%s" % (name, folder))
    return ",".join(parts)


def command(run_dirs, port=6006, host=None):
    """The TensorBoard command line, after checking that the package is installed."""
    if importlib.util.find_spec("tensorboard") is None:
        raise UsageError("tensorboard is not installed: %s" % INSTALL)
    argv = [sys.executable, "-m", "tensorboard.main", "--logdir_spec", logdir_spec(run_dirs),
            "--port", str(port)]
    if host:
        argv += ["--host", host]
    return argv


def serve(run_dirs, port=6006, host=None):
    """Replace this process with TensorBoard (Ctrl-C stops it as usual)."""
    argv = command(run_dirs, port, host)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(argv[0], argv)
