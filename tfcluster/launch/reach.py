"""Preflight reachability: before any task starts, every host connects to each port its tasks
will dial, through whatever firewall stands between them.

Nothing listens on those ports yet, so every machine's agent listens on its tasks' claimed ports
for the moment of the check (protocol.Listen), then every machine connects to its peers' ports
(protocol.Reach). A port that cannot be reached is a one-line refusal naming both ends, exit 3,
instead of a run whose workers wait forever in CreateSession.
"""
from tfcluster.errors import Problem
from tfcluster_agent import protocol as P
from tfcluster_agent.reach import REACH_SECONDS, REACHED

# The tasks that dial others: TF1 workers and chiefs dial the ps tasks and each other, a TF2
# chief (or MultiWorkerMirroredStrategy's workers) every worker and ps. A ps only serves, and
# an evaluator reads checkpoints.
DIALING_JOBS = ("chief", "worker")


def targets(cluster, machine):
    """[(task, its peer)] for every server task a task of MACHINE dials, each peer once."""
    seen, found = set(), []
    for task in cluster.tasks:
        if task.machine.key != machine.key or task.job not in DIALING_JOBS:
            continue
        for peer in cluster.tasks:
            if peer.port and peer is not task and peer.label not in seen:
                seen.add(peer.label)
                found.append((task, peer))
    return found


def check(hosts, cluster, timeout=REACH_SECONDS):
    """Problems: one line per unreachable port, naming the dialing host and the task dialled."""
    machines = [m for m, _ in cluster.machines()]
    ports = {m.key: [t.port for t in cluster.tasks if t.machine.key == m.key and t.port]
             for m in machines}
    plans = {m.key: targets(cluster, m) for m in machines}
    listening, problems = _ask(hosts, [m for m in machines if ports[m.key]],
                               lambda m: P.Listen(ports=ports[m.key]), 30,
                               "to listen for the reachability check")
    for machine in machines:
        failed = listening.get(machine.key, {}).get("failed")
        if failed:
            problems.append(Problem("%s: cannot listen on port(s) %s for the reachability "
                                    "check: %s" % (machine.label, ", ".join(failed),
                                                   "; ".join(sorted(set(failed.values()))))))
    if problems:
        return problems
    answers, problems = _ask(hosts, [m for m in machines if plans[m.key]], lambda m: P.Reach(
        targets=[[peer.label, peer.machine.tf_host, peer.port] for _, peer in plans[m.key]],
        timeout=timeout), timeout + 30, "to the reachability check")
    unreachable = {}  # (peer, outcome) -> [(dialing machine, its task)], to say each once
    for machine in machines:
        for task, peer in plans[machine.key] if machine.key in answers else ():
            outcome = answers[machine.key]["results"].get(peer.label, "no answer")
            if outcome != REACHED:
                unreachable.setdefault((peer, outcome), []).append((machine, task))
    for (peer, outcome), dialing in unreachable.items():
        jobs = "/".join(sorted({task.job for _, task in dialing}))
        problems.append(Problem("%s host%s %s cannot reach %s at %s: %s" % (
            jobs, "s" if len(dialing) > 1 else "", ", ".join(m.label for m, _ in dialing),
            peer.label, peer.address, outcome)))
    return problems


def _ask(hosts, machines, request, timeout, what):
    """({machine key: its Report's dict}, [problem]): REQUEST(machine) sent to every machine of
    MACHINES at once; a machine that fails it is a problem."""
    outcomes = hosts.each(lambda link: link.request(request(link.machine), timeout=timeout,
                                                    what=what).report, machines,
                          timeout=timeout + 10)
    return outcomes.succeeded, [Problem(_agent_problem(m, outcomes.failed[m.key]))
                                for m in machines if m.key in outcomes.failed]


def _agent_problem(machine, err):
    if "not a tfcluster message" in err.reason:  # an agent older than the reachability check
        return ("%s: its tfcluster agent is older than this controller: run `tfcluster sync "
                "-i INVENTORY` (or launch with --sync)" % machine.label)
    return "%s: %s" % (machine.label, err.reason)
