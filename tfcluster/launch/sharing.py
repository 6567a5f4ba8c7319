"""Machines that share folders, as lab hosts do (a home on NFS, docs/labs.md): a workdir several
machines of a run share (their preflights report the same token, tfcluster_agent/shares.py)
gets one run folder for the run and in it one folder per machine, `<workdir>/<run-id>/<host>/`,
so no machine finds "its" folder made by another; the launch's token tells the first machine's
folder from one another launch made.
"""
import os

from tfcluster.spec.cluster import Cluster
from tfcluster_agent.shares import safe_name
from tfcluster_agent.values import replace


def shared_groups(machines, tokens):
    """[[machine, ...]] of MACHINES whose TOKENS ({machine key: folder token or None}) are the
    same, two or more to a group, in the order given."""
    groups = {}
    for machine in machines:
        token = tokens.get(machine.key)
        if token:
            groups.setdefault(token, []).append(machine)
    return [group for group in groups.values() if len(group) > 1]


def subfolder_names(group, reports):
    """{machine key: its folder's name} inside a run folder GROUP's machines share: the host
    name each one's agent reported, else (unknown, or two alike) its address."""
    names = {m.key: safe_name(reports[m.key].hostname or "") for m in group}
    if len(set(names.values())) < len(group) or not all(n.strip("._") for n in names.values()):
        names = {m.key: safe_name(m.label) for m in group}
    return names


def place_spare(cluster, spare):
    """SPARE with a run folder of its own inside a shared one when CLUSTER's machines have
    theirs (it had no preflight of their folders: it joins the run later)."""
    if any(m.run_subdir for m, _ in cluster.machines()):
        return replace(spare, run_subdir=safe_name(spare.label))
    return spare


def place_run_folders(cluster, reports):
    """CLUSTER with a run folder of its own (Machine.run_subdir) for every machine whose
    workdir another machine of the run shares; CLUSTER itself when none does."""
    machines = [m for m, _ in cluster.machines()]
    tokens = {m.key: reports[m.key].workdir_id for m in machines if m.key in reports}
    renamed = {}
    for group in shared_groups(machines, tokens):
        for key, name in subfolder_names(group, reports).items():
            renamed[key] = name
    if not renamed:
        return cluster
    return Cluster(replace(t, machine=replace(t.machine, run_subdir=renamed[t.machine.key]))
                   if t.machine.key in renamed else t for t in cluster.tasks)


def launch_token(cluster):
    """The token a launch writes into a run folder machines share ("" when none does): the
    first machine of the launch makes the folder, the others find it made by this launch."""
    if not any(m.run_subdir for m, _ in cluster.machines()):
        return ""
    return "%d-%s" % (os.getpid(), os.urandom(8).hex())
