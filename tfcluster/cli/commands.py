"""What each command does: argument checks, then the rooms' work. The rooms' modules are
imported when a command first uses them (tfcluster.lazy): each command pays for its own."""
import json
import os
import sys

from tfcluster.cli.arguments import COMMAND_MODULES, DEFAULT_INVENTORY
from tfcluster.errors import UsageError
from tfcluster.lazy import lazy

catalog = lazy("tfcluster.spec.catalog")
console = lazy("tfcluster.view.console")
data_fetch = lazy("tfcluster.data.fetch")
gpu_table = lazy("tfcluster.gpus.table")
inventory = lazy("tfcluster.hosts.inventory")
launcher = lazy("tfcluster.launch.launcher")
launch_options = lazy("tfcluster.launch.options")
fanout = lazy("tfcluster.hosts.fanout")
manage = lazy("tfcluster.cli.manage")
plan = lazy("tfcluster.launch.plan")
plot = lazy("tfcluster.view.plot")
preflight = lazy("tfcluster.launch.preflight")
provenance = lazy("tfcluster.runs.provenance")
report = lazy("tfcluster.view.report")
runs = lazy("tfcluster.runs.store")
spec = lazy("tfcluster.spec.cluster")
sync = lazy("tfcluster.deploy.sync")
tensorboard = lazy("tfcluster.view.tensorboard")

COUNT_FLAGS = (("ps", "ps"), ("worker", "workers"), ("chief", "chief"), ("evaluator", "evaluators"))


def cmd_launch(args):
    user_args = list(args.trainer_args)
    if args.cmd and args.example:
        raise UsageError("give an example name or --cmd, not both")
    if args.cmd:
        example = catalog.custom_example(args.cmd, args.success or "chief")
    elif args.example:
        example = catalog.get_example(args.example)
    else:
        raise UsageError("name an example (`tfcluster examples` lists them) or pass --cmd")
    if args.smoke and args.cmd:
        raise UsageError("--smoke is for built-in examples; your --cmd decides its own settings")
    if args.detach and (args.stall_after is not None or args.on_stall is not None):
        raise UsageError("--stall-after and --on-stall need the launcher to watch the run: drop "
                         "them, or drop --detach")
    if args.detach and args.profile_at is not None:
        raise UsageError("--profile-at needs the launcher to follow the run's steps: drop it and "
                         "run `tfcluster profile RUN` when you want, or drop --detach")
    catalog.check_trainer_args(example, user_args)  # before anything starts
    if args.resume:
        runs.load(args.runs_dir, args.resume)  # a one-line error when there is no such run
    # Before anything starts, not after the run.
    if args.runs_dir_given:
        runs.writable_dir(args.runs_dir, "--runs-dir")
    else:
        runs.writable_dir(args.runs_dir, "the runs folder", "run from a folder you can write to, "
                          "or pass --runs-dir DIR")
    extra_env = env_file(args.env_file) if args.env_file else {}
    for item in args.env:
        name, value = env_item(item, "--env")
        extra_env[name] = value
    # A count flag given as 'all' is None: every slot of that group.
    counts = {job: getattr(args, flag) for job, flag in COUNT_FLAGS if hasattr(args, flag)}
    planned = None
    if not (args.sync or args.baseline):  # those start agents after a sync, or twice
        planned = planned_launch(args.inventory, example, counts, args.spares)
    try:
        return launch_planned(args, example, counts, extra_env, user_args, planned)
    except BaseException:
        if planned is not None:
            planned[1].close()  # its agents, when the launch failed before it took them
        raise


def planned_launch(inventory_path, example, counts, spares=0):
    """(cluster, its Hosts) with the local agents starting: the launcher's modules are imported
    while they do (an agent's start is the longest wait of a short launch)."""
    cluster = plan.make_cluster(inventory_path, inventory.load_slots(inventory_path),
                                plan.launch_counts(example, counts), example, spares)
    hosts = fanout.Hosts([m for m, _ in cluster.machines()] + cluster.spares)
    hosts.spawn_local()
    return cluster, hosts


def launch_planned(args, example, counts, extra_env, user_args, planned):
    options = launch_options.LaunchOptions(
        example=example, runs_dir=args.runs_dir, run_id=args.run_id, detach=args.detach,
        timeout=args.timeout, user_args=tuple(user_args), smoke=args.smoke, counts=counts,
        intra_op_threads=args.intra_op_threads, inter_op_threads=args.inter_op_threads,
        nice=args.nice,
        start_timeout=args.start_timeout, finish_grace=args.finish_grace,
        stop_grace=args.stop_grace, drain_grace=args.drain_grace, resume=args.resume,
        lease=args.lease, cwd=args.cwd,
        env=extra_env, restarts=args.restarts or 0, lost_contact=args.lost_contact,
        spares=args.spares,
        baseline=args.baseline, wait=args.wait, share_busy_gpus=args.share_busy_gpus,
        stall_after=args.stall_after, on_stall=args.on_stall or "report",
        straggler_after=args.straggler_after, profile_at=args.profile_at,
        profile_unsafe=args.profile_unsafe,
        command_line=tuple(getattr(args, "command_line", None)
                           or ["tfcluster"] + provenance.hidden_argv(args.argv)),
        rerun_of=getattr(args, "rerun_of", None))
    if args.sync:
        sync.sync(args.inventory)
    # --logs shows the raw streams: every line, as the tasks wrote them.
    reporter = console.make_reporter(args.plain, args.verbose or args.logs, args.logs, sys.stdout)
    try:
        return launcher.launch(args.inventory, options, inventory.load_slots, reporter, planned)
    finally:
        reporter.close()


def env_item(item, where):
    """(NAME, VALUE) of a NAME=VALUE item; the error never repeats the value, which may be secret."""
    name, sep, value = item.partition("=")
    if not sep or not name or name[0].isdigit() or not name.replace("_", "a").isalnum():
        raise UsageError("%s: %r is not NAME=VALUE with a name of letters, digits and _"
                         % (where, name if sep else "(no '=')"))
    return name, value


def env_file(path):
    try:
        with open(path) as handle:
            lines = handle.read().splitlines()
    except OSError as err:
        raise UsageError("--env-file %s: %s" % (path, err.strerror)) from None
    items = {}
    for number, line in enumerate(lines, 1):
        if line.strip() and not line.lstrip().startswith("#"):
            name, value = env_item(line.strip(), "--env-file %s line %d" % (path, number))
            items[name] = value
    return items


def cmd_spec(args):
    if args.cluster_spec_string is not None:
        if args.inventory:
            raise UsageError("give -i INVENTORY or --cluster-spec, not both")
        jobs = spec.parse_cluster_spec(args.cluster_spec_string)
        if args.format not in ("json", "cluster_spec"):
            raise UsageError("--cluster-spec prints as --format json or cluster_spec")
        print(json.dumps(jobs) if args.format == "json" else spec.format_cluster_spec(jobs))
        return 0
    slots = inventory.load_slots(args.inventory or DEFAULT_INVENTORY)
    counts = None
    if args.example:
        example = catalog.get_example(args.example)
        counts = {job: example.topology.get(job, 0) for job in inventory.JOBS}
    cluster = spec.build_cluster(slots, counts)
    if not cluster.tasks:
        raise UsageError("inventory has no hosts in ps, worker, chief or evaluator groups")
    print(spec.render(cluster, args.format))
    return 0


def cmd_check(args):
    cluster = spec.build_cluster(inventory.require_slots(args.inventory))
    preflight.check_hosts(cluster, report.PlainReporter())
    return 0


def cmd_gpus(args):
    return gpu_table.show(inventory.require_slots(args.inventory), args.watch)


def cmd_sync(args):
    sync.sync(args.inventory, args.code)
    return 0


def cmd_examples(args):
    examples = catalog.load_catalog()
    if args.inventory:
        tasks = spec.job_counts(inventory.require_slots(args.inventory))
        print("%s: %s" % (args.inventory, catalog.inventory_shape(tasks, examples)))
    for name, example in examples.items():
        topology = " ".join("%d %s" % (n, job) for job, n in example.topology.items() if n)
        if not args.inventory:
            print("%-22s %-22s %s" % (name, topology, example.description))
            continue
        why = catalog.unfit(example, tasks)
        print("%-22s %-22s %s" % (name, topology, "runs" if why is None else "no: " + why))
    return 0


def cmd_status(args):
    return manage.status(args.runs_dir, args.run)


def cmd_logs(args):
    return manage.logs(args.runs_dir, args.run, args.task, args.follow)


def cmd_stop(args):
    return manage.stop(args.runs_dir, args.run, args.grace)


def cmd_drain(args):
    return manage.drain(args.runs_dir, args.run, args.grace, args.drain_grace)


def cmd_runs(args):
    return manage.history(args.runs_dir)


def cmd_data(args):
    if args.data_command != "fetch":
        raise UsageError("usage: tfcluster data fetch NAME --dest DIR")
    data_fetch.fetch(args.name, os.path.abspath(args.dest), source=args.source)
    return 0


def cmd_module(args):
    """deploy, diff, init, rerun, wheelhouse: the module of the command's name does the work."""
    return lazy(COMMAND_MODULES[args.command]).run(args)


def cmd_plot(args):
    if args.output and not args.output.lower().endswith(".svg"):
        raise UsageError("-o %s: the picture is SVG: name a FILE ending in .svg" % args.output)
    run_dirs = [runs.load(args.runs_dir, run_id).dir for run_id in args.runs]
    output = args.output or (os.path.join(run_dirs[0], plot.FILE) if len(run_dirs) == 1
                             else "metrics-compare.svg")
    plot.write_svg(run_dirs, output)
    print("tfcluster: wrote %s" % output)
    return 0


def cmd_tensorboard(args):
    tensorboard.serve([runs.load(args.runs_dir, run_id).dir for run_id in args.runs],
                      args.port, args.host)


def cmd_stacks(args):
    return manage.stacks(args.runs_dir, args.run)


def cmd_profile(args):
    return manage.profile(args.runs_dir, args.run, args.duration, args.tasks, unsafe=args.unsafe)


# The commands that read an inventory or start agents: tfcluster_agent/cachedir.py.
CACHING = {"launch", "spec", "check", "gpus", "sync", "deploy", "status", "logs", "stop", "drain",
           "stacks", "profile"}
COMMANDS = {"launch": cmd_launch, "spec": cmd_spec, "check": cmd_check, "gpus": cmd_gpus,
            "sync": cmd_sync, "examples": cmd_examples,
            "status": cmd_status, "logs": cmd_logs, "stop": cmd_stop, "drain": cmd_drain,
            "runs": cmd_runs,
            "data": cmd_data, "plot": cmd_plot, "tensorboard": cmd_tensorboard,
            "deploy": cmd_module, "init": cmd_module, "wheelhouse": cmd_module,
            "diff": cmd_module, "rerun": cmd_module,
            "stacks": cmd_stacks, "profile": cmd_profile}
