"""The examples catalog (tfcluster/spec/catalog.yml) and per-task command rendering."""
import argparse
import functools
import importlib
import json
import os
import re
import shlex

import trainers
from tfcluster.errors import UsageError
from tfcluster_agent.values import value_class

POLICIES = ("chief", "worker0", "all_workers")
# The built-in trainer a catalog command runs: `python -m trainers.NAME`.
TRAINER_MODULE = re.compile(r"-m\s+(trainers(?:\.\w+)+)")
# Read by the controller alone, so it is no host code: editing it makes no host stale.
CATALOG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "catalog.yml")


def trainers_dir():
    return os.path.dirname(os.path.abspath(trainers.__file__))


def code_root():
    """The folder holding the host packages (tfcluster_agent, trainers): this checkout, or
    site-packages for an installed tfcluster."""
    return os.path.dirname(trainers_dir())


@value_class(frozen=True)
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
    # What --restarts restarts when a worker fails: the task alone, or every task ("job": the
    # programs whose workers cannot rejoin, like MultiWorkerMirroredStrategy's all-reduce).
    restart: str = "task"
    # What moving a lost machine's tasks to a spare restarts (docs/spares.md): the moved tasks
    # alone, or every task from the last checkpoint ("job": programs whose peers keep the old
    # addresses, like ParameterServerStrategy's ClusterCoordinator, or cannot rejoin).
    move: str = "task"
    # The trainer's flags that make it synchronous ((dest, value) pairs, as its parser reads
    # them): a move then restarts every task too, since a synchronous step waits for every worker.
    sync_when: tuple = ()
    # The data set its `args` read from disk; preflight checks its files on every machine.
    dataset: str = ""
    # Groups it can also take tasks from, beyond its topology's (count flags: `--chief 1`).
    can_use: tuple = ()

    def needs(self):
        """{job: tasks} its topology needs: the groups an inventory must have."""
        return {job: n for job, n in self.topology.items() if n}


def load_catalog(path=None):
    import yaml  # here: a --cmd launch reads no catalog
    path = path or CATALOG
    with open(path) as handle:
        entries = yaml.safe_load(handle) or {}
    catalog = {}
    for name, entry in entries.items():
        entry["can_use"] = tuple(entry.get("can_use", ()))
        entry["sync_when"] = tuple(sorted((entry.get("sync_when") or {}).items()))
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
                   success=success, move="job")


@functools.lru_cache(maxsize=None)
def _jinja():
    import jinja2  # here: a --cmd launch renders no template
    return jinja2, jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=False)


def render(template, variables, what):
    if "{" not in template:  # no template syntax: nothing to render, no jinja2 to import
        return template.strip()
    jinja2, environment = _jinja()
    try:
        return environment.from_string(template).render(**variables).strip()
    except jinja2.TemplateError as err:
        reason = (str(err) or type(err).__name__).splitlines()[0]
        raise UsageError("cannot render %s: %s (check the {{ variables }} it uses)"
                         % (what, reason)) from None


def task_variables(cluster, task, run_dir, checkpoint_dir, user_args):
    """What a command template may use. Every text value is quoted for /bin/sh: a template
    writes {{ data_dir }}/mnist, never "{{ data_dir }}"."""
    machine = task.machine
    jobs = cluster.jobs()
    flags = cluster.flags(task)
    quote = shlex.quote
    return {
        "python": quote(machine.python), "job": task.job, "index": task.index,
        "task": task, "label": quote(task.label), "flags": shlex.join(flags),
        "ps_hosts": quote(",".join(jobs.get("ps", []))),
        "worker_hosts": quote(",".join(jobs.get("worker", []))),
        "chief_hosts": quote(",".join(jobs.get("chief", []))),
        "num_workers": len(jobs.get("worker", [])), "num_ps": len(jobs.get("ps", [])),
        "cluster_spec": quote(cluster.cluster_spec_string()),
        "tf_config": quote(json.dumps(cluster.tf_config(task))),
        # What the task sees: its CUDA_VISIBLE_DEVICES after gpus.assign().
        "num_gpus": len([d for d in (task.cuda_visible_devices or "").split(",") if d.strip()]),
        "root": quote(machine.root), "data_dir": quote(machine.data_dir),
        "run_dir": quote(run_dir), "checkpoint_dir": quote(checkpoint_dir),
        "user_args": shlex.join(user_args),
    }


def task_command(example, cluster, task, run_dir, checkpoint_dir, user_args=(), smoke=False):
    variables = task_variables(cluster, task, run_dir, checkpoint_dir, list(user_args))
    args_template = example.smoke if smoke else example.args
    variables["args"] = render(args_template or "", variables, "the arguments of " + example.name)
    command = render(example.command, variables,
                     "--cmd" if example.name == "custom" else "the command of " + example.name)
    if example.name != "custom" and user_args:
        command += " " + shlex.join(user_args)
    return command


def moves_whole(example, user_args=(), smoke=False):
    """True when moving a lost machine's tasks restarts every task from the checkpoint: the
    example says so (move: job), or its flags, with USER_ARGS after them, make it synchronous
    (sync_when; read by the trainer's own parser, which imports no TensorFlow)."""
    if example.move == "job":
        return True
    found = TRAINER_MODULE.search(example.command)
    if not example.sync_when or not found:
        return False
    parser = importlib.import_module(found.group(1)).build_parser()
    given = shlex.split((example.smoke if smoke else example.args) or "") + list(user_args)
    parsed, _ = parser.parse_known_args(given)
    return all(str(getattr(parsed, dest, None)).lower() == str(value).lower()
               for dest, value in example.sync_when)


def check_templates(example, cluster):
    """Render every task's command (with and without --smoke) with placeholder folders, so a
    template error is a UsageError before preflight rather than after it."""
    for task in cluster.tasks:
        run_dir = task.machine.workdir.rstrip("/") + "/RUN-ID"
        for smoke in (False, True):
            task_command(example, cluster, task, run_dir, run_dir + "/checkpoints", smoke=smoke)


class _Refused(Exception):
    """argparse's error, raised instead of ending the program."""


def check_trainer_args(example, user_args):
    """USER_ARGS (after a bare --) against the built-in trainer's own parser, on the controller
    before anything starts: a UsageError naming a wrong flag and the closest valid one. The
    trainers build their parsers without importing TensorFlow."""
    found = TRAINER_MODULE.search(example.command)
    if not user_args or not found:
        return  # nothing given, or a program of the user's
    import difflib  # here: only a mistyped trainer argument is matched
    module = found.group(1)
    parser = importlib.import_module(module).build_parser()
    parser.prog = "python -m " + module  # what its --help shows

    def refuse(message):
        raise _Refused(message)
    parser.error = refuse
    try:
        _, unknown = parser.parse_known_args(list(user_args))
    except _Refused as err:
        raise UsageError("%s's trainer: %s (see `%s --help`)" % (example.name, err, parser.prog)) \
            from None
    if unknown:
        flag = unknown[0].split("=", 1)[0]
        if not flag.startswith("-"):
            raise UsageError("%s's trainer takes flags only, not %r: pass --FLAG=VALUE (see `%s "
                             "--help`)" % (example.name, unknown[0], parser.prog))
        flags = [option for action in parser._actions for option in action.option_strings
                 if option.startswith("--") and not isinstance(action, argparse._HelpAction)]
        closest = difflib.get_close_matches(flag, flags, n=1, cutoff=0) or flags[:1]
        raise UsageError("%s's trainer has no flag %s: the closest is %s (see `%s --help`)"
                         % (example.name, flag, closest[0], parser.prog))


def plural(count, job):
    return "%d %s%s" % (count, job, "s" if count != 1 and job != "ps" else "")


def unfit(example, tasks):
    """Why an inventory with TASKS ({job: tasks it offers}) cannot run EXAMPLE, or None."""
    for job, wanted in example.needs().items():
        have = tasks.get(job, 0)
        if not have:
            return "needs %s: the inventory has no %s group" % (plural(wanted, job), job)
        if have < wanted:
            return "needs %s: the inventory has %d" % (plural(wanted, job), have)
    return None


def inventory_shape(tasks, catalog):
    """One line on what an inventory with TASKS ({job: tasks}) runs: its tasks, the built-in
    examples that fit it, and what --cmd programs can use."""
    jobs = [plural(tasks[job], job) for job in ("chief", "worker", "ps", "evaluator")
            if tasks.get(job)]
    shape = ", ".join(jobs) + ("" if tasks.get("ps") else ", no ps")
    fitting = [name for name, example in catalog.items() if unfit(example, tasks) is None]
    strategies = ("programs with a ps (between-graph replication, ParameterServerStrategy)"
                  if tasks.get("ps") else "programs using MultiWorkerMirroredStrategy")
    line = "%s: %s%s--cmd %s" % (shape, ", ".join(fitting), " and " if fitting else "",
                                 strategies)
    if not tasks.get("ps"):
        line += "; the ps examples need a ps group"
    return line

