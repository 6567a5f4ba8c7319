"""Which reporter a command gets: the live table on a terminal, prefixed lines elsewhere.
Apart from report.py and live.py so that neither imports the other's module back."""
import sys

from tfcluster.view.report import PlainReporter


def make_reporter(plain=False, verbose=False, logs=False, stream=None):
    """The live view on a terminal; prefixed lines for pipes, CI, --plain and --logs."""
    stream = stream or sys.stdout
    if plain or logs or not (hasattr(stream, "isatty") and stream.isatty()):
        return PlainReporter(stream, verbose=verbose)
    from rich.console import Console  # here: only the live view draws with rich
    from tfcluster.view.live import LiveReporter
    console = Console(file=stream)
    if console.is_dumb_terminal:
        return PlainReporter(stream, verbose=verbose)
    return LiveReporter(verbose=verbose, console=console)
