"""The examples catalog (trainers/catalog.yml) and per-task command rendering."""
import json
import os
import shlex
from dataclasses import dataclass

import jinja2
import yaml

from tfcluster.errors import UsageError

POLICIES = ("chief", "worker0", "all_workers")


def trainers_dir():
    import trainers
    return os.path.dirname(os.path.abspath(trainers.__file__))


@dataclass(frozen=True)
class Example:
    name: str
    description: str
    command: str
    topology: dict
    success: str = "all_workers"
    args: str = ""
    smoke: str = ""
    seed: str = ""
    real: str = ""
    # False: one task per worker slot with all its GPUs, for programs that use several devices.
    task_per_gpu: bool = True


def load_catalog(path=None):
    path = path or os.path.join(trainers_dir(), "catalog.yml")
    with open(path) as handle:
        entries = yaml.safe_load(handle) or {}
    catalog = {}
    for name, entry in entries.items():
        example = Example(name=name, **entry)
        if example.success not in POLICIES:
            raise ValueError("catalog %s: %s has success %r, expected one of %s"
                             % (path, name, example.success, ", ".join(POLICIES)))
        catalog[name] = example
    return catalog


def get_example(name, catalog=None):
    catalog = catalog if catalog is not None else load_catalog()
    if name not in catalog:
        raise UsageError("unknown example %r: choose one of %s (or pass --cmd 'your command')"
                         % (name, ", ".join(sorted(catalog))))
    return catalog[name]


def custom_example(command, success):
    """A user's own program: every task of the inventory runs COMMAND."""
    return Example(name="custom", description="user command", command=command, topology={},
                   success=success)


_ENV = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=False)


def render(template, variables, what):
    try:
        return _ENV.from_string(template).render(**variables).strip()
    except jinja2.TemplateError as err:
        raise UsageError("cannot render %s: %s (check the {{ variables }} it uses)"
                         % (what, err)) from None


def task_variables(cluster, task, run_dir, checkpoint_dir, user_args):
    """What a command template may use."""
    machine = task.machine
    jobs = cluster.jobs()
    flags = cluster.flags(task)
    return {
        "python": shlex.quote(machine.python), "job": task.job, "index": task.index,
        "task": task, "label": task.label, "flags": shlex.join(flags),
        "ps_hosts": ",".join(jobs.get("ps", [])), "worker_hosts": ",".join(jobs.get("worker", [])),
        "chief_hosts": ",".join(jobs.get("chief", [])),
        "num_workers": len(jobs.get("worker", [])), "num_ps": len(jobs.get("ps", [])),
        "cluster_spec": shlex.quote(cluster.cluster_spec_string()),
        "tf_config": shlex.quote(json.dumps(cluster.tf_config(task))),
        "num_gpus": len(task.cuda_visible_devices.split(",")) if task.cuda_visible_devices else 0,
        "root": machine.root, "data_dir": machine.data_dir, "run_dir": run_dir,
        "checkpoint_dir": checkpoint_dir, "user_args": shlex.join(user_args),
    }


def task_command(example, cluster, task, run_dir, checkpoint_dir, user_args=(), smoke=False):
    variables = task_variables(cluster, task, run_dir, checkpoint_dir, list(user_args))
    args_template = example.smoke if smoke else example.args
    variables["args"] = render(args_template or "", variables, "the arguments of " + example.name)
    command = render(example.command, variables, "the command of " + example.name)
    if example.name != "custom" and user_args:
        command += " " + shlex.join(user_args)
    return command
