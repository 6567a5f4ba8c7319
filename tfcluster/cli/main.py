"""The program: the arguments (cli/arguments.py) to a command (cli/commands.py), its error to one
line and an exit code.

Exit codes: 0 success, 1 run failed, 2 usage or bad input, 3 preflight failed,
124 --timeout, 130 interrupted.
"""
try:
    import os
    import sys

    from tfcluster.cli.arguments import DEFAULT_RUNS_DIR, build_parser
    from tfcluster.cli.commands import CACHING, COMMANDS, runs
    from tfcluster.cli.parse import named_command
    from tfcluster.errors import TfclusterError
except KeyboardInterrupt:  # Ctrl-C while the program loads (the console script imports us)
    raise SystemExit(130) from None


def run():
    """The program (console script, `python -m tfcluster`): main(), then the process ends
    without the interpreter's shutdown, a cost of every command's. Each command closes what it
    opened; the standard streams are flushed here."""
    try:
        code = main()
    except KeyboardInterrupt:  # Ctrl-C before main's own handler: no traceback either
        code = 130
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except OSError:  # a reader that went away (`tfcluster runs | head -1`)
            pass
    os._exit(code)


def replace_unencodable(streams):
    """A character the terminal cannot encode shows as '?' instead of ending the command (a
    launch mid-run): the tasks' logs keep their bytes."""
    for stream in streams:
        if getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="replace")


def main(argv=None):
    replace_unencodable((sys.stdout, sys.stderr))
    argv = full = list(sys.argv[1:] if argv is None else argv)
    # Everything after a bare `--` goes to the trainer untouched.
    trainer_args = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    try:
        # Imports the named command's module; with none named (`tfcluster --help`, a mistyped
        # command) the list of commands is all argparse needs.
        parser = build_parser(named_command(argv, COMMANDS) or "")
        args, rest = parser.parse_known_args(argv)
        # A command's list of positionals may come after its options too (`init DIR --user U
        # HOST ...`): argparse leaves those over.
        spread = getattr(args, "spread", None)
        if rest and (not spread or any(item.startswith("-") for item in rest)):
            parser.error("unrecognized arguments: %s" % " ".join(rest))
        if rest:
            getattr(args, spread).extend(rest)
        args.trainer_args, args.argv = trainer_args, full
        # An error about the default names no --runs-dir: none was given.
        args.runs_dir_given = args.runs_dir is not None
        args.runs_dir = args.runs_dir if args.runs_dir_given else DEFAULT_RUNS_DIR
        if args.command in CACHING:
            runs.keep_caches(args.runs_dir)
        if not args.command:
            parser.print_help()
            return 2
        return COMMANDS[args.command](args) or 0
    except TfclusterError as err:
        print("tfcluster: error: %s" % err, file=sys.stderr, flush=True)
        return err.exit_code
    except KeyboardInterrupt:  # Ctrl-C: the command stopped what it started, no traceback
        return 130
    except BrokenPipeError:  # a reader that went away (`tfcluster examples | head -1`)
        sys.stdout = open(os.devnull, "w")
        return 0
