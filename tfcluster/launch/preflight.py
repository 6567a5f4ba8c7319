"""Preflight: every machine checked in parallel, through its agent, before anything starts."""
import functools
import os

from tfcluster.gpus import placement as gpus
from tfcluster.launch import reach
from tfcluster.spec.catalog import code_root
from tfcluster.errors import PreflightError, Problem
from tfcluster.hosts.fanout import Hosts
from tfcluster.runs import store as runs
from tfcluster.runs.provenance import package_warnings
from tfcluster.runs.record import PreflightReport
from tfcluster_agent import datafiles
from tfcluster_agent import protocol as P
from tfcluster_agent.hostcode import code_hash

# The agent imports TensorFlow once per interpreter and install; later preflights use the cache.
IMPORT_SECONDS = 150


@functools.lru_cache(maxsize=1)  # the controller's code does not change within a command
def controller_code_hash():
    return code_hash(code_root())


def runs_this_checkout(machine):
    """A local slot whose code is this very checkout cannot be stale."""
    return machine.is_local and os.path.realpath(machine.root) == os.path.realpath(code_root())


def check_machine(link, ports, datasets):
    """The agent's preflight report of LINK's machine (a dict), for PORTS and DATASETS."""
    machine = link.machine
    # The host's own cache: TensorFlow is imported once per interpreter and install, not at
    # every launch (16 test hosts on one machine would import it 16 times a launch).
    request = P.Preflight(python=machine.python, ports=ports, code_dir=machine.root,
                          cache_dir="~", datasets=datasets, nvidia_smi=machine.nvidia_smi,
                          workdir=machine.workdir, fence_file=machine.fence_file)
    return link.request(request, timeout=IMPORT_SECONDS, what="to the preflight").report


def check_spares(hosts, spares):
    """(the SPARES whose agent answers with a working Python, [why each other one is left
    out]): a spare's link is opened at the start, so that its loss is seen too."""
    if not spares:
        return [], []
    outcomes = hosts.each(lambda link: check_machine(link, [], []), spares,
                          timeout=max(m.connect_timeout for m in spares) + IMPORT_SECONDS + 30)
    ready, problems = [], []
    for machine in spares:
        if machine.key in outcomes.failed:
            problems.append("spare %s left out: %s" % (machine.label,
                                                       outcomes.failed[machine.key].reason))
            continue
        report = PreflightReport.from_json(outcomes.succeeded[machine.key])
        if not report.python_ok:
            problems.append("spare %s left out: %s" % (machine.label, report.error))
        else:
            ready.append(machine)
    return ready, problems


def preflight(hosts, cluster, expect_code=True, data_needs=None):
    """Open every machine's agent and check it; returns ({machine key: PreflightReport},
    [problem]).
    DATA_NEEDS: {machine key: [[data set, folder]]} whose files must be there."""
    data_needs = data_needs or {}
    controller_hash = controller_code_hash()

    def check(link):
        ports = [t.port for t in cluster.tasks if t.machine.key == link.machine.key and t.port]
        return check_machine(link, ports, data_needs.get(link.machine.key, []))

    machines = [m for m, _ in cluster.machines()]
    outcomes = hosts.each(check, machines,
                          timeout=max(m.connect_timeout for m in machines) + IMPORT_SECONDS + 30)
    problems, reports = [], {}
    for machine in machines:
        if machine.key in outcomes.failed:
            reason = outcomes.failed[machine.key].reason
            reports[machine.key] = PreflightReport.unreachable(reason)
            problems.append("%s: %s" % (machine.label, reason))
            continue
        report = reports[machine.key] = PreflightReport.from_json(outcomes.succeeded[machine.key])
        if not report.python_ok:
            problems.append("%s: %s" % (machine.label, report.error))
        holders = report.port_holders
        busy = [p for p, free in report.ports.items() if not free and p not in holders]
        if busy:
            problems.append(Problem("%s: port(s) %s already in use: stop what uses them "
                                    "(`tfcluster stop`) or set tfcluster_port_base"
                                    % (machine.label, ", ".join(busy)), waitable=True))
        if holders:
            problems.append(Problem("%s: port(s) %s claimed by %s: wait for it, stop it "
                                    "(`tfcluster stop`) or set tfcluster_port_base" % (
                                        machine.label, ", ".join(holders),
                                        "; ".join(sorted(set(holders.values())))),
                                    waitable=True))
        for name, folder in data_needs.get(machine.key, []):
            absent = report.missing_data.get(folder)
            if absent:
                problems.append("%s: data set %s missing in %s (%s): %s" % (
                    machine.label, name, folder, ", ".join(absent),
                    datafiles.FETCH_HINT.format(name=name, folder=folder)))
        if expect_code and report.code_hash != controller_hash and \
                not runs_this_checkout(machine):
            problems.append("%s: its trainer code differs from this checkout's: run "
                            "`tfcluster sync -i INVENTORY` (or launch with --sync)" % machine.label)
    versions = {r.tf_version for r in reports.values() if r.tf_version}
    if len(versions) > 1:
        listing = ", ".join("%s=%s" % (m.label, reports[m.key].tf_version)
                            for m in machines if reports[m.key].tf_version)
        problems.append("TensorFlow versions differ (%s): deploy the same version everywhere"
                        % listing)
    if not problems:  # every host is ready: can each reach the ports its tasks will dial?
        problems += reach.check(hosts, cluster)
    return reports, problems


def check_checkpoint_folder(runs_dir, resume, run_id):
    """A launch with --resume RESUME writes RESUME's checkpoint folder: PreflightError when
    another run that is still going (not RUN_ID) writes it, RESUME itself or another run that
    resumes it. A launch without --resume writes a folder of its own, new with its run."""
    if not resume:
        return
    for record in runs.all_runs(runs_dir):
        if record.id != run_id and record.active and resume in (record.id, record.checkpoints_of):
            raise PreflightError(
                "--resume %s: its checkpoint folder is being written by run %s (%s): wait for "
                "it to end or stop it (`tfcluster stop %s`); nothing was started"
                % (resume, record.id, record.state, record.id))


def print_preflight(reporter, cluster, reports):
    controller_hash = controller_code_hash()
    reporter.out("%-22s %-9s %-10s %-5s %-5s %-12s %s" % ("HOST", "REACHED", "TF", "CPUS", "GPUS",
                                                           "PORTS", "CODE"))
    for machine, tasks in cluster.machines():
        report = reports[machine.key]
        if not report.reached:
            reporter.out("%-22s %-9s %s" % (machine.label, "no", report.error))
            continue
        ports = report.ports
        busy = [p for p, free in ports.items() if not free]
        code = report.code_hash
        reporter.out("%-22s %-9s %-10s %-5s %-5s %-12s %s" % (
            machine.label, "yes", report.tf_version or "MISSING",
            "?" if report.cpus is None else report.cpus, gpus.preflight_cell(report),
            ("busy " + ",".join(busy)) if busy else "%d free" % len(ports),
            "same" if code == controller_hash or runs_this_checkout(machine)
            else ("stale" if code else "missing")))
    for machine, _ in cluster.machines():  # a host without a usable home caches elsewhere
        if reports[machine.key].cache_warning:
            reporter.note("warning: %s: %s" % (machine.label, reports[machine.key].cache_warning))


def check_hosts(cluster, reporter):
    """`tfcluster check`: the preflight alone, with a per-host table."""
    with Hosts([m for m, _ in cluster.machines()]) as hosts:
        reports, problems = preflight(hosts, cluster)
    problems += gpus.problems(cluster, reports)
    print_preflight(reporter, cluster, reports)
    for line in gpus.warnings(cluster, reports) + package_warnings(
            [m for m, _ in cluster.machines()], reports):
        reporter.note("warning: " + line)
    if problems:
        raise PreflightError("preflight failed: " + "; ".join(problems))
    reporter.note("all %d host(s) ready" % len(reports))
