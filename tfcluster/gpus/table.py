"""`tfcluster gpus`: one table of every GPU of the inventory's hosts and who holds it.

One round trip per host, all hosts at once, through their agents (GpuQuery)."""
import contextlib
import signal
import sys
import threading
import time

from tfcluster.gpus import placement as gpus
from tfcluster.hosts.fanout import Hosts
from tfcluster_agent import protocol as P

COLUMNS = ("HOST", "GPU", "NAME", "MEMORY MiB", "UTIL", "HEALTH", "HOLDER")
CLEAR = "\033[H\033[J"


def machines_of(slots):
    seen = {}
    for slot in slots:
        seen.setdefault(slot.machine.key, slot.machine)
    return list(seen.values())


def query(hosts, machines):
    """Outcomes: each host's GPU facts, every host at once."""
    def ask(link):
        return link.request(P.GpuQuery(nvidia_smi=link.machine.nvidia_smi), timeout=30,
                            what="to the GPU query").report

    return hosts.each(ask, machines, timeout=max(m.connect_timeout for m in machines) + 40)


def rows(machines, outcomes):
    """The table's rows, and one warning line per host whose GPU facts are partly unknown."""
    table, notes = [], []
    for machine in machines:
        if machine.key in outcomes.failed:
            table.append((machine.label, "-", "unreachable: " + outcomes.failed[machine.key].reason,
                          "", "", "", ""))
            continue
        found = outcomes.succeeded[machine.key]
        if gpus.host_error(found):
            table.append((machine.label, "-", "ERROR: " + found["error"], "", "", "", ""))
            continue
        if not found["gpus"]:
            why = found.get("absent") or found.get("error") or "nvidia-smi lists none"
            table.append((machine.label, "-", "no GPU (%s)" % why, "", "", "", ""))
            continue
        if found.get("warning"):
            notes.append("warning: %s: %s" % (machine.label, found["warning"]))
        for gpu in found["gpus"]:
            memory = "%s/%s" % tuple("?" if v is None else v
                                     for v in (gpu["memory_used"], gpu["memory_total"]))
            util = "?" if gpu["utilization"] is None else "%d%%" % gpu["utilization"]
            table.append((machine.label, str(gpu["index"]), gpu["name"], memory, util,
                          gpus.health_short(gpu), gpus.holder(gpu, machine) or "free"))
    return table, notes


def render(table):
    widths = [max(len(str(r[i])) for r in [COLUMNS] + table) for i in range(len(COLUMNS) - 1)]
    return "\n".join("  ".join(str(cell).ljust(w) for cell, w in zip(row, widths)) + "  " +
                     str(row[-1]) for row in [COLUMNS] + table)


def show(slots, watch=None, out=None):
    """Print the table (again every WATCH seconds, in place, until Ctrl-C); 1 when a host did
    not answer or its nvidia-smi failed."""
    out = out or sys.stdout
    machines = machines_of(slots)
    try:
        with ctrl_c_ends(watch), Hosts(machines) as hosts:
            while True:
                table, notes = rows(machines, query(hosts, machines))
                text = "\n".join([render(table)] + notes)
                if watch:
                    out.write("%s%s  every %gs, Ctrl-C ends\n" % (
                        CLEAR, time.strftime("%H:%M:%S"), watch))
                out.write(text + "\n")
                out.flush()
                if not watch:
                    return 1 if any(r[1] == "-" and r[2].startswith(("unreachable", "ERROR"))
                                    for r in table) else 0
                time.sleep(watch)
    except KeyboardInterrupt:
        return 0


@contextlib.contextmanager
def ctrl_c_ends(watch):
    """With WATCH, Ctrl-C (SIGINT) raises KeyboardInterrupt even in a process started with SIGINT
    ignored, as every background job (`&`) of a shell without job control is: the watch has no
    other end, and its header promises it. The disposition found is put back after."""
    if not watch or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
