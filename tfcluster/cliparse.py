"""The command line's argparse pieces: the parser, its value types, and the registry of
commands that builds only the named command's arguments (cli.py wires the arguments)."""
import argparse
import math

from tfcluster.errors import UsageError


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error and exit status 2."""

    def error(self, message):
        self.exit(2, "tfcluster: error: %s (see %s --help)\n" % (message, self.prog))


def _integer(text, expected):
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("expected %s, not %r" % (expected, text)) from None


def count(text):
    if text == "all":
        return None
    value = _integer(text, "a number or 'all'")
    if value < 0:
        raise argparse.ArgumentTypeError("must not be negative")
    return value


def seconds(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("expected seconds, not %r" % text) from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError("expected a finite number of seconds, not %r" % text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be more than 0")
    return value


def threads(text):
    value = _integer(text, "a whole number")
    if value < 1:
        raise argparse.ArgumentTypeError("must be 1 or more, not %d" % value)
    return value


def run_id(text):
    from tfcluster.runs import check_run_id
    try:
        return check_run_id(text)
    except UsageError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


class Commands:
    """The subcommands' registry: every command is listed, but only ONLY's arguments are built
    (None: every command's). Building all of them cost each command's start 25 ms."""

    def __init__(self, subparsers, only=None):
        self.subparsers, self.only = subparsers, only

    def builds(self, name):
        return self.only in (None, name)

    def add_parser(self, name, **kwargs):
        parser = self.subparsers.add_parser(name, **kwargs)
        return parser if self.builds(name) else Unbuilt()

    @property
    def choices(self):
        """{name: its parser}, as argparse's subparsers have it."""
        return {name: parser if self.builds(name) else Unbuilt()
                for name, parser in self.subparsers.choices.items()}


class Unbuilt:
    """A command's parser that this run does not parse with: what is added to it is dropped."""

    def add_argument(self, *args, **kwargs):
        pass

    def add_subparsers(self, *args, **kwargs):
        return self

    def add_parser(self, *args, **kwargs):
        return self


def named_command(argv, commands):
    """The command of COMMANDS that ARGV names, found without argparse; None when unsure (every
    command's parser is built then, and argparse says what is wrong)."""
    takes_value = False
    for token in argv:
        if takes_value:
            takes_value = False
        elif token.startswith("-"):  # --runs-dir VALUE, or an abbreviation argparse accepts
            takes_value = "=" not in token and len(token) > 2 and "--runs-dir".startswith(token)
        else:
            return token if token in commands else None
    return None
