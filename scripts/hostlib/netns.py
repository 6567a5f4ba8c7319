"""The namespace hosts' network: bridge tfc-br0 (10.231.0.1/24) and, per host, a network
namespace whose eth0 is one end of a veth pair on the bridge. Only 10.231.0.0/24 and objects
named tfc-* are ever created or removed."""

import ipaddress
import shutil
from pathlib import Path

from .common import Fail, run, search_path, tool

PREFIX = "tfc-"
BRIDGE = "tfc-br0"
SUBNET = ipaddress.ip_network("10.231.0.0/24")
BRIDGE_ADDR = "10.231.0.1"
FW_COMMENT = "tfc-testhosts"


def ip(*args, check=True):
    return run([tool("ip"), *args], check=check)


def list_netns():
    p = ip("netns", "list", check=False)
    return sorted(line.split()[0] for line in p.stdout.splitlines()
                  if line.split() and line.split()[0].startswith(PREFIX))


def list_links():
    p = ip("-o", "link", "show", check=False)
    names = []
    for line in p.stdout.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            name = parts[1].strip().split("@")[0]
            if name.startswith(PREFIX):
                names.append(name)
    return sorted(names)


def netns_pids(ns):
    p = ip("netns", "pids", ns, check=False)
    return [int(x) for x in p.stdout.split() if x.isdigit()]


def addresses_overlapping(subnet):
    """(device, address/prefix) of this machine's IPv4 addresses inside SUBNET."""
    found = []
    for line in ip("-o", "-4", "addr", "show").stdout.splitlines():
        f = line.split()
        if len(f) >= 4 and f[2] == "inet" and \
                ipaddress.ip_interface(f[3]).network.overlaps(subnet):
            found.append((f[1], f[3]))
    return found


def check_subnet_free():
    for dev, addr in addresses_overlapping(SUBNET):
        if not dev.startswith(PREFIX):
            raise Fail(f"{SUBNET} is already used on {dev} ({addr}); "
                       "testhosts uses only that subnet, refusing", 2)
    for line in ip("-4", "route", "show").stdout.splitlines():
        dst = line.split()[0] if line.split() else ""
        if dst == "default":
            continue
        try:
            net = ipaddress.ip_network(dst, strict=False)
        except ValueError:
            continue
        if net.overlaps(SUBNET) and f"dev {BRIDGE}" not in line:
            raise Fail(f"a route to {dst} overlaps {SUBNET} ({line.strip()}); refusing", 2)


def add_bridge():
    ip("link", "add", BRIDGE, "type", "bridge", "stp_state", "0", "forward_delay", "0")
    ip("addr", "add", f"{BRIDGE_ADDR}/{SUBNET.prefixlen}", "dev", BRIDGE)
    ip("link", "set", BRIDGE, "up")


def add_namespace(ns, veth, addr):
    """Network namespace NS on the bridge: its eth0 = ADDR, the root end of the pair VETH."""
    ip("netns", "add", ns)
    ip("-n", ns, "link", "set", "lo", "up")
    ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
    ip("link", "set", veth, "master", BRIDGE)
    ip("link", "set", veth, "up")
    ip("-n", ns, "addr", "add", f"{addr}/{SUBNET.prefixlen}", "dev", "eth0")
    ip("-n", ns, "link", "set", "eth0", "up")


def remove_namespace(ns, veth):
    ip("netns", "del", ns, check=False)
    ip("link", "del", veth, check=False)  # gone with the namespace, unless that failed


def link_state(veth):
    """"up" while VETH exists and is not down, else "down"."""
    try:
        state = Path(f"/sys/class/net/{veth}/operstate").read_text().strip()
    except OSError:
        return "down"
    return "down" if state == "down" else "up"


# --------------------------------------------------------------------------
# firewall: only if iptables exists, br_netfilter hands bridged frames to it
# and the FORWARD policy is DROP (e.g. Docker installed). One tagged rule.

FW_RULE = ["FORWARD", "-i", BRIDGE, "-o", BRIDGE, "-m", "comment",
           "--comment", FW_COMMENT, "-j", "ACCEPT"]


def iptables_bin():
    return shutil.which("iptables", path=search_path())


def firewall_open():
    """Let the bridge forward between hosts where the FORWARD policy drops; True if it had to."""
    ipt = iptables_bin()
    try:
        bnf = Path("/proc/sys/net/bridge/bridge-nf-call-iptables").read_text().strip()
    except OSError:
        bnf = "0"  # br_netfilter not loaded: bridged frames skip iptables
    if not ipt or bnf != "1":
        return False
    p = run([ipt, "-w", "-S", "FORWARD"], check=False)
    if p.returncode != 0 or "-P FORWARD DROP" not in p.stdout:
        return False
    run([ipt, "-w", "-I", *FW_RULE])
    return True


def firewall_close():
    ipt = iptables_bin()
    if not ipt:
        return
    for _ in range(10):  # delete every copy of our tagged rule
        if run([ipt, "-w", "-C", *FW_RULE], check=False).returncode != 0:
            break
        run([ipt, "-w", "-D", *FW_RULE], check=False)


# The kernel keeps one neighbour (ARP) table for every network namespace together, 1024 entries
# at most by default (gc_thresh3): hosts that all reach each other need one entry per pair, 4,032
# for 64 hosts and 16,256 for 128, and past the limit connections fail with "neighbor table
# overflow" (the preflight's reachability check dials every pair).
NEIGHBOUR_LIMITS = "/proc/sys/net/ipv4/neigh/default/gc_thresh%d"


def neighbour_limits():
    """[gc_thresh1, gc_thresh2, gc_thresh3] as they are now."""
    return [int(Path(NEIGHBOUR_LIMITS % i).read_text()) for i in (1, 2, 3)]


def set_neighbour_limits(limits):
    for i, value in zip((1, 2, 3), limits):
        Path(NEIGHBOUR_LIMITS % i).write_text("%d\n" % value)


def raise_neighbour_limits(hosts):
    """Room for every pair of HOSTS (and the bridge) in the neighbour table; the limits as they
    were, to put back, or None when they were high enough."""
    before = neighbour_limits()
    needed = 2 * (hosts + 1) * (hosts + 1)  # twice the entries, as gc_thresh3 over gc_thresh2
    if before[2] >= needed:
        return None
    set_neighbour_limits([max(before[0], needed // 4), max(before[1], needed // 2), needed])
    return before
