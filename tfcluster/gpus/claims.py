"""A launch's GPUs: preflight, placement around busy/unhealthy/claimed GPUs, the claims on every
host, and with `launch --wait` the wait in each host's queue until all of it passes."""
import os
import signal
import time

from tfcluster.gpus import placement as gpus
from tfcluster.runs import store as runs
from tfcluster.errors import PreflightError, RunFailed
from tfcluster.runs.record import RunState
from tfcluster.spec.cluster import TRAINING_JOBS
from tfcluster_agent import protocol as P
from tfcluster_agent.supervisor import proc_stat, start_time

WAIT_POLL_SECONDS = 2.0
RACE_RETRIES = 3  # placements tried again at once when other runs claim GPUs in between


def claim(hosts, cluster, reports, run_id, wait=False):
    """Claim every assigned GPU on every host, all or none; [] or the GpuProblems why not."""
    plan = gpus.claim_plan(cluster, reports)
    machines = [m for m, _ in cluster.machines() if m.key in plan]
    found = answers(hosts, machines, lambda link: P.ClaimGpus(
        run=run_id, gpus=plan[link.machine.key], wait=wait), reports)
    if found:  # all or none: what some hosts gave us goes back (our queue places stay)
        hosts.each(lambda link: link.request(P.ClaimGpus(run=run_id, gpus={}, wait=wait),
                                             timeout=30), machines, timeout=40)
    return found


def join_queues(hosts, cluster, reports, run_id):
    """Take (or keep) this waiting run's place in the queue of every host whose GPUs it needs,
    before they are free: the runs waiting on a host start in the order they began waiting."""
    machines = [m for m, tasks in cluster.machines() if gpus.reported(reports, m) and any(
        t.gpus_listed or t.job in TRAINING_JOBS for t in tasks)]
    return answers(hosts, machines, lambda link: P.ClaimGpus(run=run_id, gpus={}, wait=True),
                   reports)


def answers(hosts, machines, message, reports):
    """Send MESSAGE(link) (a ClaimGpus) to every machine at once; the GpuProblems of the
    answers: GPUs another run holds, runs ahead in the queue, hosts that did not answer."""
    def ask(link):
        return link.request(message(link), timeout=30, what="to claim its GPUs").report

    outcomes = hosts.each(ask, machines, timeout=40)
    found = []
    for machine in machines:
        if machine.key in outcomes.failed:
            found.append(gpus.GpuProblem("%s: cannot claim its GPUs: %s" % (
                machine.label, outcomes.failed[machine.key].reason)))
            continue
        answer = outcomes.succeeded[machine.key]
        index = {g["uuid"]: i for i, g in gpus.facts(reports, machine).items()}
        taken = sorted(answer["taken"].items(), key=lambda item: index.get(item[0], -1))
        for uuid, holder in taken:
            found.append(gpus.GpuProblem("%s: GPU %s is claimed by %s: %s" % (
                machine.label, index.get(uuid, uuid), gpus.describe_claim(holder),
                gpus.WAIT_HINT), waitable=True, race=True))
        if answer["ahead"]:
            found.append(gpus.GpuProblem("%s: %d run(s) wait for its GPUs before this one (%s): "
                                         "%s" % (machine.label, len(answer["ahead"]), ", ".join(
                                             gpus.describe_claim(a) for a in answer["ahead"]),
                                             gpus.WAIT_HINT), True))
    return found


def hand_claims(specs, cluster, reports):
    """Name each task's GPUs in its spec: its supervisor holds their claims until it ends."""
    for task in cluster.tasks:
        known = gpus.facts(reports, task.machine)
        specs[task.label].gpu_uuids = [known[g]["uuid"] for g in gpus.devices(task)
                                       if g in known]


def failure(problems):
    """The preflight error: one line, or one line per GPU when GPUs are refused."""
    if any(isinstance(p, gpus.GpuProblem) for p in problems):
        return "preflight failed, nothing started:\n" + "\n".join("  " + p for p in problems)
    return "preflight failed, nothing started: " + "; ".join(problems)


def waitable(problem):
    """True for what passes by itself: claimed or busy GPUs, claimed or used ports."""
    return getattr(problem, "waitable", False)


def secure(launch, run_preflight, print_table):
    """(reports, cluster with its GPUs assigned and claimed) for LAUNCH, or PreflightError.

    RUN_PREFLIGHT() gives (reports, problems). With --wait, what can pass by itself is waited
    for (said once, then again only when it changes), in the hosts' queues."""
    options = launch.options
    share, wait = options.share_busy_gpus, options.wait
    said = None
    try:
        lost_races = 0
        while True:
            reports, problems = run_preflight()
            problems += gpus.problems(launch.cluster, reports, share)
            if wait:
                problems += join_queues(launch.hosts, launch.cluster, reports, launch.run_id)
            assigned = None
            if not problems:
                assigned = gpus.assign(launch.cluster, reports, share)
                problems = claim(launch.hosts, assigned, reports, launch.run_id, wait)
                if problems and lost_races < RACE_RETRIES and all(
                        getattr(p, "race", False) for p in problems):
                    lost_races += 1  # another run took them since the preflight: look again
                    continue
            if not problems:
                launch.record.waiting = None
                if said is not None:
                    launch.reporter.note("run %s: its GPUs and ports are free now, starting"
                                         % launch.run_id)
                print_table(reports)
                for line in gpus.warnings(launch.cluster, reports):
                    launch.reporter.note("warning: " + line)
                return reports, assigned
            if not wait or not all(waitable(p) for p in problems):
                print_table(reports)
                raise PreflightError(failure(problems))
            message = "; ".join(problems)
            if message != said:
                if said is None:
                    mark_waiting(launch)
                launch.reporter.note("run %s waits (--wait; Ctrl-C or `tfcluster stop %s` "
                                     "gives up): %s" % (launch.run_id, launch.run_id, message))
                said = message
            time.sleep(WAIT_POLL_SECONDS)
    except BaseException:
        if said is not None:
            import shutil  # here: not imported by every launch
            shutil.rmtree(launch.record.dir, ignore_errors=True)  # it only held the wait
        raise


def mark_waiting(launch):
    """A record `tfcluster stop RUN` finds: the waiting launcher's pid, checked by start time."""
    record = launch.record
    record.become(RunState.WAITING)
    record.created = runs.now()
    record.example, record.machines, record.tasks = launch.options.example.name, [], {}
    record.waiting = {"pid": os.getpid(), "start": start_time(os.getpid())}
    runs.save(record)


def stop_waiting(record, reporter, timeout=30):
    """Stop the launcher of RECORD if it still waits for GPUs; False when it is no waiting run."""
    waiting = record.waiting or {}
    if record.state is not RunState.WAITING or not waiting.get("pid"):
        return False
    pid = waiting["pid"]

    def alive():  # still the launcher it was (not a reused pid), and not a zombie
        fields = proc_stat(pid)
        return bool(fields) and fields[0] not in ("Z", "X") and \
            start_time(pid) == waiting.get("start")

    if alive():
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass  # it ended just now: the wait below sees it gone
        deadline = time.monotonic() + timeout
        while alive():
            if time.monotonic() > deadline:
                raise RunFailed("run %s: its launcher (pid %d) still waits after %gs"
                                 % (record.id, pid, timeout))
            time.sleep(0.05)
    else:  # its launcher died while waiting (kill -9): only this record is left of it
        record.become(RunState.STOPPED)
        record.ended = runs.now()
        runs.save(record)
    reporter.note("run %s: it was waiting for GPUs; it stopped, nothing was started and no "
                  "claim is left" % record.id)
    return True
