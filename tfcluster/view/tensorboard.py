"""`tfcluster tensorboard RUN...`: serve the runs' collected event files with TensorBoard.

The launcher copies each host's `tensorboard/<task>/` folder into `runs/<id>/tensorboard/<task>/`;
with several runs, each gets its own name in TensorBoard (`--logdir_spec id:path,...`).

The profile plugin (xprof, in the viz extra) reads only a `--logdir`: one run that has profiles
(`tfcluster profile`, `runs/<id>/profile/<time>/plugins/profile/`) is served from its folder, its
event files as `tensorboard/<task>` and its profiles as `profile/<time>`.
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
        if not os.path.isdir(path):
            raise UsageError("run %s has no tensorboard folder (%s): its trainers wrote no "
                             "event files" % (run_id, path))
        if "," in path:
            raise UsageError("cannot serve %s: TensorBoard's --logdir_spec does not allow ',' "
                             "in a path" % path)
        parts.append("%s:%s" % (run_id, path))
    return ",".join(parts)


def command(run_dirs, port=6006, host=None):
    """The TensorBoard command line, after checking that the package is installed."""
    if importlib.util.find_spec("tensorboard") is None:
        raise UsageError("tensorboard is not installed: %s" % INSTALL)
    if len(run_dirs) == 1 and os.path.isdir(os.path.join(run_dirs[0], "profile")):
        logdir = ["--logdir", os.path.abspath(run_dirs[0])]
    else:
        logdir = ["--logdir_spec", logdir_spec(run_dirs)]
    argv = [sys.executable, "-m", "tensorboard.main"] + logdir + ["--port", str(port)]
    if host:
        argv += ["--host", host]
    return argv


def serve(run_dirs, port=6006, host=None):
    """Replace this process with TensorBoard (Ctrl-C stops it as usual)."""
    argv = command(run_dirs, port, host)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(argv[0], argv)
