"""Machines no firewall fences (docs/security.md): each is named once per launch, since
TensorFlow's servers listen on every address and run any graph they are sent."""


def port_span(ports):
    """"2222-2224, 4000": runs of three or more consecutive ports as ranges."""
    runs = []
    for port in sorted(set(ports)):
        if runs and port == runs[-1][-1] + 1:
            runs[-1].append(port)
        else:
            runs.append([port])
    return ", ".join("%d-%d" % (r[0], r[-1]) if len(r) > 2 else ", ".join(map(str, r))
                     for r in runs)


def unfenced_warnings(cluster, reports):
    """One line per SSH machine whose preflight found no firewall fence."""
    lines = []
    for machine, tasks in cluster.machines():
        report = reports.get(machine.key)
        ports = [t.port for t in tasks if t.port]
        if machine.is_local or not ports or report is None or report.fenced is not False:
            continue
        lines.append("%s: no firewall fences TensorFlow's port(s) %s here: anyone on its "
                     "network can connect, and TensorFlow runs any graph it is sent; an "
                     "administrator fences them with `tfcluster deploy --system` (docs/labs.md)"
                     % (machine.label, port_span(ports)))
    return lines
