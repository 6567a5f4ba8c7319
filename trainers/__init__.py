"""The example trainers: one program each (`python -m trainers.NAME`; CIFAR-10 is the package
cifar10/), over their shared library, trainers.common. Host side: never imports tfcluster.

Every program has `build_parser()`, its flags, and `run(options, cluster, dataset=None)`:
OPTIONS a dict (or the parsed flags) over the flags' defaults, CLUSTER a
common.bootstrap.ClusterInfo (None where a program can run alone), DATASET a common.data.Dataset
to train on instead of the one its flags name; it returns the task's result dict (None for a
task that only serves). Its `__main__` is `bootstrap.entry(build_parser, run)`, the one place
that reads the command line and the environment. Inside, the same names do the same jobs, as in
tensorflow/models: `load_dataset` (what the flags name), `build_inputs` (a task's training
batches), `build_model`, `train_step` (one step), `evaluate` ((loss, accuracy) on held-out data)
and `train` (a task's loop, returning its result).

A user's own program may write `from trainers import protocol` for the metrics and result lines
(tfcluster_agent.protocol: standard library only).
"""
from tfcluster_agent import protocol  # noqa: F401  (for user programs, see above)
