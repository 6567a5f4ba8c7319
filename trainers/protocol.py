"""What crosses the boundary between a host and the controller, standard library only.

Imported by the agent, the trainers and the controller alike, so the two sides cannot drift:
- the lines a task prints to report metrics and its final result;
- the messages the agent and the controller exchange (JSON lines, see `Message`).

A program of your own reports progress by printing, on its standard output, one line per point:

    TFCLUSTER_METRIC {"step": 120, "loss": 0.53, "examples_per_s": 840.0, "accuracy": 0.81}

and at the end one result line with the same keys and its totals:

    TFCLUSTER_RESULT {"loss": 0.31, "initial_loss": 2.30, "accuracy": 0.90, "global_step": 400,
                      "train_time_s": 12.1, "examples_per_s": 1050.0}

or, with this file on its PYTHONPATH (tfcluster puts it there), `protocol.report_metric(...)` and
`protocol.report_result(...)`.
"""
import json
import math
import sys

METRIC_PREFIX = "TFCLUSTER_METRIC "
RESULT_PREFIX = "TFCLUSTER_RESULT "

# The result schema every example reports; example-specific extras may follow.
RESULT_KEYS = ("loss", "initial_loss", "accuracy", "global_step", "train_time_s", "examples_per_s")


def _clean(values):
    """JSON-safe scalars: numbers as floats/ints, NaN and infinities as None."""
    clean = {}
    for key, value in values.items():
        if value is None:
            continue
        if hasattr(value, "item"):  # numpy scalars
            value = value.item()
        if isinstance(value, float) and not math.isfinite(value):
            value = None
        clean[str(key)] = value
    return clean


def metric_line(step, loss=None, examples_per_s=None, **scalars):
    values = dict(step=int(step), loss=loss, examples_per_s=examples_per_s, **scalars)
    return METRIC_PREFIX + json.dumps(_clean(values), sort_keys=True)


def report_metric(step, loss=None, examples_per_s=None, stream=None, **scalars):
    """Print one metrics point for the controller (and flush: it must arrive now)."""
    stream = stream or sys.stdout
    stream.write(metric_line(step, loss, examples_per_s, **scalars) + "\n")
    stream.flush()


def report_result(results, stream=None):
    stream = stream or sys.stdout
    stream.write(RESULT_PREFIX + json.dumps(_clean(results), sort_keys=True) + "\n")
    stream.flush()


def parse_line(line):
    """("metric" | "result", dict) for a reporting line, else None."""
    for kind, prefix in (("metric", METRIC_PREFIX), ("result", RESULT_PREFIX)):
        if line.startswith(prefix):
            try:
                value = json.loads(line[len(prefix):])
            except ValueError:
                return None
            return (kind, value) if isinstance(value, dict) else None
    return None
