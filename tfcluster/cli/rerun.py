"""`tfcluster rerun RUN`: launch RUN again with the arguments it was launched with, from the
folder it was launched from; the launch warns where the code or the packages differ from RUN's
(view/diff.py). The values RUN got through --env are in no record: they are given again."""
import os
import shlex

from tfcluster.cli.arguments import build_parser
from tfcluster.cli.commands import cmd_launch, env_file, env_item
from tfcluster.cli.parse import run_id
from tfcluster.errors import UsageError
from tfcluster.runs import store as runs
from tfcluster.runs.provenance import HIDDEN, launch_arguments


def add_arguments(parser):
    parser.add_argument("run", metavar="RUN", help="run id")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="the value of a variable RUN got through --env, which no record "
                             "keeps (repeatable)")
    parser.add_argument("--env-file", metavar="FILE", help="NAME=VALUE lines, as --env")
    parser.add_argument("--run-id", type=run_id, help="the new run's folder name "
                                                      "(default: time-example-random)")


def run(args):
    original = runs.load(args.runs_dir, args.run)
    recorded = original.provenance.command_line if original.provenance else []
    if "launch" not in recorded:
        raise UsageError("run %s has no recorded launch command line (launched by an older "
                         "tfcluster, or not from the command line): launch it again with "
                         "`tfcluster launch`" % original.id)
    given = env_file(args.env_file) if args.env_file else {}
    given.update(env_item(item, "--env") for item in args.env)
    arguments = launch_arguments(recorded)
    argv = with_values(arguments, given, original.id)
    where = original.provenance.cwd
    if not where or not os.path.isdir(where):
        raise UsageError("run %s was launched from %s, which is gone: its relative paths "
                         "(inventory, --cmd) would mean other files there; launch it again "
                         "with `tfcluster launch`" % (original.id, where))
    end = argv.index("--") if "--" in argv else len(argv)
    # The command line this launch is, its --env values hidden as the original's are.
    ours = ["--runs-dir", os.path.abspath(args.runs_dir)] + arguments[:end] + (
        ["--run-id", args.run_id] if args.run_id else [])
    here = os.getcwd()
    os.chdir(where)  # the relative paths of the arguments, as they were
    try:
        launch = build_parser("launch").parse_args(
            ours[:2] + argv[:end] + ours[2 + end:])
        launch.trainer_args = argv[end + 1:]
        launch.command_line = ["tfcluster"] + ours + arguments[end:]
        launch.rerun_of = original.id
        launch.runs_dir_given = True
        print("tfcluster: launching run %s again: tfcluster %s" % (
            original.id, shlex.join(arguments)), flush=True)
        return cmd_launch(launch)
    finally:
        os.chdir(here)


def with_values(arguments, given, run_id):
    """ARGUMENTS with each hidden --env value replaced by GIVEN's ({name: value}); a usage error
    for a hidden name not given, or a given name RUN_ID had no --env for."""
    argv, hidden = [], []
    for at, token in enumerate(arguments):
        if token == "--":
            argv += arguments[at:]
            break
        item = token[len("--env="):] if token.startswith("--env=") else \
            token if at and arguments[at - 1] == "--env" else ""
        name = item[:-len(HIDDEN) - 1] if item.endswith("=" + HIDDEN) else None
        if name:
            hidden.append(name)
            token = token[:-len(HIDDEN)] + given.get(name, HIDDEN)
        argv.append(token)
    missing = [n for n in hidden if n not in given]
    if missing:
        raise UsageError("run %s got %s through --env, whose value%s no record keeps: give %s "
                         "again (tfcluster rerun %s %s)" % (
                             run_id, ", ".join(missing), "s" if len(missing) > 1 else "",
                             "them" if len(missing) > 1 else "it", run_id,
                             " ".join("--env %s=..." % n for n in missing)))
    unknown = sorted(set(given) - set(hidden))
    if unknown:
        raise UsageError("run %s had no --env %s: a rerun launches with the same arguments "
                         "(use `tfcluster launch` for others)" % (run_id, ", ".join(unknown)))
    return argv
