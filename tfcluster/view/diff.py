"""`tfcluster diff RUN_A RUN_B`: what differs between two runs (code, packages per host, data,
arguments, environment, placement) and their final metrics side by side. `tfcluster rerun`'s
warnings are this comparison's code and packages rows."""
import os
import shlex

from tfcluster.hosts.inventory import Machine
from tfcluster.runs import store as runs
from tfcluster.runs.provenance import (DIFF_FILE, Provenance, differences, launch_arguments)

SECTIONS = ("code", "packages", "data", "arguments", "environment", "placement")
WIDE = 40  # a cell wider than this: the row is printed as lines of its own


def add_arguments(parser):
    parser.add_argument("run_a", metavar="RUN_A", help="run id")
    parser.add_argument("run_b", metavar="RUN_B", help="run id, compared with RUN_A")


def run(args):
    first, second = runs.load(args.runs_dir, args.run_a), runs.load(args.runs_dir, args.run_b)
    print("\n".join(diff_lines(first, second)))
    return 0


def diff_lines(a, b):
    """The comparison of runs A and B as the console shows it."""
    found = {name: rows for name, rows in compare(a, b) if rows}
    metrics = metric_rows(a, b)
    cells = [row for rows in list(found.values()) + [metrics] for row in rows]
    width = max([len(what) for what, *_ in cells] + [12])
    column = max([len(str(x)) for _, *pair in cells for x in pair if len(str(x)) <= WIDE] + [12])
    lines = ["  %-*s  %-*s  %s" % (width, "", column, a.id, b.id)]
    for section, rows in list(found.items()) + [("final metrics", metrics)]:
        lines.append("%s:" % section)
        for what, left, right in rows:
            if max(len(str(left)), len(str(right))) > WIDE:
                lines += ["  %s:" % what, "    %s: %s" % (a.id, left), "    %s: %s" % (b.id, right)]
            else:
                lines.append(("  %-*s  %-*s  %s" % (width, what, column, left, right)).rstrip())
    same = [name for name in SECTIONS if name not in found]
    if same:
        lines.append("no difference in: %s" % ", ".join(same))
    for record in (a, b):
        if record.provenance is None:
            lines.append("run %s has no provenance record (launched by an older tfcluster): "
                         "its code, packages and data are not known" % record.id)
    return lines


def rerun_warnings(original, new):
    """Where the code or the packages of run NEW differ from those of ORIGINAL, which it
    launches again."""
    return ["%s: %s in run %s, %s now" % (what, old, original.id, now)
            for name, rows in compare(original, new) if name in ("code", "packages")
            for what, old, now in rows]


def compare(a, b):
    """[(section, [(what, in A, in B)])] for SECTIONS: the rows that differ."""
    hosts_a, hosts_b = _hosts(a), _hosts(b)
    both = [h for h in hosts_a if h in hosts_b]
    return [("code", code_rows(a, b, hosts_a, hosts_b, both)),
            ("packages", package_rows(a, b, hosts_a, hosts_b, both)),
            ("data", data_rows(hosts_a, hosts_b, both)),
            ("arguments", argument_rows(a, b)),
            ("environment", _changed(_environment(a), _environment(b), "unset")),
            ("placement", placement_rows(a, b))]


def _provenance(record):
    return record.provenance or Provenance()


def _environment(record):
    """The tasks' common environment, the run's own id in it written RUN_ID: every run has
    another."""
    return {name: value.replace(record.id, "RUN_ID") if isinstance(value, str) else value
            for name, value in _provenance(record).env.items()}


def _label(machine):
    """A MachineRecord's host, as the console names it."""
    return Machine(**{k: v for k, v in machine.settings.items()
                      if k in Machine.field_names}).label


def _hosts(record):
    """{host label: the facts its preflight gave} of RECORD's machines."""
    return {_label(m): m.facts for m in record.machines}


def _changed(old, new, absent, prefix="", show=None):
    """Rows for the keys whose values differ between the dicts OLD and NEW, each value as
    SHOW(value) says it (default _cell), ABSENT for none."""
    show = show or _cell
    return [(prefix + key, *(absent if side.get(key) is None else show(side[key])
                             for side in (old, new)))
            for key in sorted(set(old) | set(new), key=str) if old.get(key) != new.get(key)]


def _cell(value, absent="-"):
    if value is None:
        return absent
    if isinstance(value, float):
        return "%.0f" % value if abs(value) >= 1000 else "%.4g" % value
    return str(value)


def _short(digest):
    return digest[:12] if digest else "not recorded"


def _controller(record):
    found = record.provenance
    if found is None:
        return "not recorded"
    if found.commit is None:
        return "not a git checkout"
    return found.commit[:12] + (" + " + DIFF_FILE if found.dirty else "")


def _diff_text(record):
    try:
        with open(os.path.join(record.dir, DIFF_FILE), "rb") as handle:
            return handle.read()
    except OSError:
        return b""


def code_rows(a, b, hosts_a, hosts_b, both):
    rows = []
    left, right = _controller(a), _controller(b)
    if left == right and left.endswith(DIFF_FILE) and _diff_text(a) != _diff_text(b):
        right += " (other changes)"
    if left != right:
        rows.append(("controller", left, right))
    if a.code_hash != b.code_hash:
        rows.append(("controller host code", _short(a.code_hash), _short(b.code_hash)))
    if _provenance(a).version != _provenance(b).version:
        rows.append(("tfcluster version", _cell(_provenance(a).version),
                     _cell(_provenance(b).version)))
    for host in both:
        old, new = hosts_a[host].get("code_hash"), hosts_b[host].get("code_hash")
        if old != new:
            rows.append(("%s code" % host, _short(old), _short(new)))
    return rows


def package_rows(a, b, hosts_a, hosts_b, both):
    """Per host: each package whose version differs, then the interpreter's and libraries'."""
    rows = []
    sets_a, sets_b = _provenance(a).packages, _provenance(b).packages
    for host in both:
        old, new = hosts_a[host], hosts_b[host]
        if old.get("packages_hash") != new.get("packages_hash") and \
                old.get("packages_hash") in sets_a and new.get("packages_hash") in sets_b:
            rows += [("%s %s" % (host, name), _cell(was, "none"), _cell(now, "none"))
                     for name, was, now in differences(sets_a[old["packages_hash"]],
                                                       sets_b[new["packages_hash"]])]
        versions = [dict(old.get("versions") or {}, python=old.get("python_version"),
                         tensorflow=old.get("tf_version")) for old in (old, new)]
        rows += _changed(versions[0], versions[1], "none", host + " ")
    return rows


def data_rows(hosts_a, hosts_b, both):
    rows = []
    for host in both:
        old, new = (hosts.get("data_hashes") or {} for hosts in (hosts_a[host], hosts_b[host]))
        rows += _changed(old, new, "none", host + " ", show=_short)
    return rows


def argument_rows(a, b):
    old, new = _provenance(a), _provenance(b)
    if old.command_line and new.command_line:
        rows = []
        left, right = (launch_arguments(p.command_line) for p in (old, new))
        if left != right:
            rows.append(("command line", shlex.join(left), shlex.join(right)))
        if old.cwd != new.cwd:
            rows.append(("working folder", _cell(old.cwd), _cell(new.cwd)))
        return rows
    # Runs without a recorded command line: what their records say.
    return _changed({"example": a.example, "smoke": a.smoke, "trainer arguments":
                     shlex.join(a.user_args), "tasks": a.cluster_spec},
                    {"example": b.example, "smoke": b.smoke, "trainer arguments":
                     shlex.join(b.user_args), "tasks": b.cluster_spec}, "none")


def _places(record):
    labels = {m.key: _label(m) for m in record.machines}
    return {label: "%s:%s%s" % (labels.get(entry.machine, entry.machine[1]), entry.port,
                                " GPU %s" % entry.cuda_visible_devices
                                if entry.cuda_visible_devices else "")
            for label, entry in record.tasks.items()}


def placement_rows(a, b):
    return _changed(_places(a), _places(b), "none")


def metric_rows(a, b):
    """The state, and each task's final results (TFCLUSTER_RESULT), side by side."""
    rows = [("state", str(a.state), str(b.state))]
    for label in sorted(set(a.results) | set(b.results)):
        old, new = a.results.get(label) or {}, b.results.get(label) or {}
        keys = [k for k in sorted(set(old) | set(new))
                if all(isinstance(r.get(k), (int, float, str, type(None))) for r in (old, new))
                and k != "task"]
        rows += [("%s %s" % (label, k), _cell(old.get(k)), _cell(new.get(k))) for k in keys]
    return rows
