"""The end of a run on the console: one row per task with the results its trainer reported."""
from tfcluster.spec.cluster import TRAINING_JOBS
from tfcluster_agent.protocol import RESULT_KEYS

SUMMARY_KEYS = tuple(k for k in RESULT_KEYS if k != "initial_loss")


def print_summary(reporter, cluster, record, causes=(), row_notes=None):
    """CAUSES: lines naming why the run failed or lagged (the Diagnosis's report()); ROW_NOTES:
    {label: a note at the end of its row} ("first failure", "after ps:0", "straggler")."""
    results = record.results
    row_notes = row_notes or {}
    keys = [k for k in SUMMARY_KEYS if any(k in r for r in results.values())]
    reporter.out()
    reporter.out("%-12s %-18s %-11s %-5s" % ("TASK", "HOST", "STATE", "EXIT")
                 + "".join(" %14s" % k for k in keys)
                 + ("  DEVICES" if any("devices" in r for r in results.values()) else ""))
    for task in cluster.tasks:
        entry = record.tasks[task.label]
        row = "%-12s %-18s %-11s %-5s" % (task.label, task.machine.address, entry.state,
                                          "-" if entry.exit is None else entry.exit)
        result = results.get(task.label, {})
        row += "".join(" %14s" % _fmt(result.get(k)) for k in keys)
        if any("devices" in r for r in results.values()):
            row += "  %-14s" % (",".join(d.replace("/device:", "") for d in result["devices"])
                                if result.get("devices") else "-")
        if entry.restarts:
            row += "  (restarted %d time(s))" % entry.restarts
        if task.label in row_notes:
            row += "  (%s)" % row_notes[task.label]
        reporter.out(row.rstrip())
    total = aggregate_examples_per_s(cluster, results)
    if total:
        reporter.out("cluster throughput: %s examples/s (sum over %d training task(s))"
                     % (_fmt(total), sum(1 for t in cluster.tasks if t.job in TRAINING_JOBS
                                         and results.get(t.label, {}).get("examples_per_s"))))
    for move in record.moves:
        reporter.out("moved %s from %s to spare %s at %s (%s; %s restarted)" % (
            ", ".join(move.tasks), move.lost, move.spare, move.time, move.why,
            "every task" if move.scope == "job" else "the moved tasks alone"))
    for line in causes:
        reporter.out(line)
    reporter.out("run %s %s" % (record.id, record.state))


def aggregate_examples_per_s(cluster, results):
    return sum(results.get(t.label, {}).get("examples_per_s") or 0
               for t in cluster.tasks if t.job in TRAINING_JOBS)


def _fmt(value):
    if value is None:
        return "-"
    if isinstance(value, float):
        return "%.0f" % value if abs(value) >= 1000 else "%.4g" % value
    return str(value)
