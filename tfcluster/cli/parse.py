"""The command line's argparse pieces: the parser, its value types, and the registry of
commands that builds only the named command's arguments (cli.py wires the arguments)."""
import argparse
import math
import os
import sys

from tfcluster.errors import UsageError
from tfcluster.runs.store import check_run_id
from tfcluster_agent.protocol import MIN_STALL_AFTER


def terminal_columns():
    """shutil.get_terminal_size().columns without shutil (its import, bz2, lzma and fnmatch,
    cost every command): $COLUMNS, else the terminal's, else 80."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


class Formatter(argparse.HelpFormatter):
    """argparse's help formatter, of which argparse makes one per argument added."""

    def __init__(self, prog, **kwargs):
        kwargs.setdefault("width", terminal_columns() - 2)  # as argparse's own default
        super().__init__(prog, **kwargs)


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error and exit status 2."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", Formatter)
        super().__init__(*args, **kwargs)

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


def _seconds(text):
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("expected seconds, not %r" % text) from None


def seconds(text):
    value = _seconds(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError("expected a finite number of seconds, not %r" % text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be more than 0")
    return value


def step(text):
    value = _integer(text, "a step number")
    if value < 0:
        raise argparse.ArgumentTypeError("must not be negative")
    return value


def threads(text):
    value = _integer(text, "a whole number")
    if value < 1:
        raise argparse.ArgumentTypeError("must be 1 or more, not %d" % value)
    return value


def niceness(text):
    value = _integer(text, "a niceness from 0 to 19")
    if not 0 <= value <= 19:
        raise argparse.ArgumentTypeError("must be from 0 (the default) to 19, not %d" % value)
    return value


def run_id(text):
    try:
        return check_run_id(text)
    except UsageError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


class Commands:
    """The subcommands' registry: every command is listed, but only ONLY's arguments are built
    (None: every command's). Building all of them cost each command's start."""

    def __init__(self, subparsers, only=None):
        self.subparsers, self.only = subparsers, only

    def builds(self, name):
        return self.only in (None, name)

    def add_parser(self, name, **kwargs):
        if self.builds(name):
            return self.subparsers.add_parser(name, **kwargs)
        # Listed (its name is a choice, its help a line of --help) without an ArgumentParser:
        # each one's start (its -h, groups and translations) cost every command.
        unbuilt = Unbuilt()
        self.subparsers.choices[name] = unbuilt
        if "help" in kwargs:
            self.subparsers._choices_actions.append(
                self.subparsers._ChoicesPseudoAction(name, (), kwargs["help"]))
        return unbuilt

    @property
    def choices(self):
        """{name: its parser}, as argparse's subparsers have it (an Unbuilt one for the others)."""
        return self.subparsers.choices


class Unbuilt:
    """A command's parser that this run does not parse with: what is added to it is dropped."""

    def add_argument(self, *args, **kwargs):
        pass

    def add_subparsers(self, *args, **kwargs):
        return self

    def add_parser(self, *args, **kwargs):
        return self


def named_command(argv, commands):
    """The command of COMMANDS that ARGV names, found without argparse; None when it names none."""
    takes_value = False
    for token in argv:
        if takes_value:
            takes_value = False
        elif token.startswith("-"):  # --runs-dir VALUE, or an abbreviation argparse accepts
            takes_value = "=" not in token and len(token) > 2 and "--runs-dir".startswith(token)
        else:
            return token if token in commands else None
    return None


def stall_seconds(text):
    """--stall-after: seconds, 0 to turn the watch off; no less than the watch can see."""
    value = _seconds(text)
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError("must be 0 (off) or more seconds, not %r" % text)
    if 0 < value < MIN_STALL_AFTER:
        raise argparse.ArgumentTypeError("must be 0 (off) or at least %g s (how often the watch "
                                         "looks), not %r" % (MIN_STALL_AFTER, text))
    return value
