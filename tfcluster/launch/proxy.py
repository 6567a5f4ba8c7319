"""Proxy variables must not send gRPC's cluster connections through a proxy.

gRPC dials through `grpc_proxy`, `https_proxy` or `http_proxy` when they are set, and a lab's
proxy cannot reach the cluster's ports (or does not answer): the tasks then wait forever in
CreateSession or a collective. A task whose environment has any proxy variable (from the
controller for local tasks, from its host, or from --env) gets `no_grpc_proxy` listing every
cluster address. That list is read by gRPC alone, so the proxies still serve everything else
(downloads, experiment trackers); the exemptions gRPC took from `no_proxy` before stay in it.
"""
from tfcluster_agent.hostinfo import proxy_facts


def task_exemptions(cluster, reports, user_env):
    """{task label: no_grpc_proxy value} for the tasks whose environment names a proxy, and
    the note saying so once ("" when no task's does)."""
    cluster_hosts = sorted({t.machine.tf_host for t in cluster.tasks if t.port})
    given = proxy_facts(user_env)
    exemptions, where = {}, {}
    for task in cluster.tasks:
        host = reports[task.machine.key].proxy_env or {"proxies": []}
        names = host["proxies"] + given["proxies"]
        if not names:
            continue
        # What gRPC would exempt without us: no_grpc_proxy when set, else no_proxy.
        effective = dict(host, **given)
        kept = effective.get("no_grpc_proxy", effective.get("no_proxy", ""))
        entries = cluster_hosts + [e.strip() for e in kept.split(",")
                                   if e.strip() and e.strip() not in cluster_hosts]
        exemptions[task.label] = ",".join(entries)
        if host["proxies"]:
            where.setdefault(", ".join(host["proxies"]), []).append(task.machine.label)
    if not exemptions:
        return exemptions, ""
    found = ["%s on %s" % (names, ", ".join(dict.fromkeys(labels)))
             for names, labels in where.items()]
    if given["proxies"]:
        found.append("--env " + ", ".join(given["proxies"]))
    return exemptions, ("proxy variables set (%s): tasks get no_grpc_proxy=%s, so gRPC reaches "
                        "the cluster directly; other traffic still uses the proxy"
                        % ("; ".join(found), ",".join(cluster_hosts)))


def exempt_cluster(specs, cluster, reports, user_env):
    """Put each task's no_grpc_proxy into SPECS ({label: TaskSpec}); the note, or ""."""
    exemptions, note = task_exemptions(cluster, reports, user_env)
    for label, value in exemptions.items():
        specs[label].env["no_grpc_proxy"] = value
    return note
